//! The stock burn-cuda backend keeps the composed defaults: it is run as a single-GPU correctness
//! reference for ferrotron-cuda. The impl lives here because of the orphan rule.

use crate::FusedOps;

/// Composed defaults: stock burn-cuda keeps its own arithmetic.
impl FusedOps for burn::backend::Cuda {}
