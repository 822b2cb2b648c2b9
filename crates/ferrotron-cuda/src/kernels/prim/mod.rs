//! The generic kernel families burn's tensor ops map onto one to one: element-wise maps and
//! casts, reductions (including the column sums and sums of squares the fused kernels and the
//! gradient norm need), indexing, scans, sorts and random fills.

pub(crate) mod column_sum;
mod copies;
pub mod elementwise;
pub mod index;
pub mod random;
pub mod reduce;
pub mod scan;
pub mod sort;
pub(crate) mod sum_squares;
