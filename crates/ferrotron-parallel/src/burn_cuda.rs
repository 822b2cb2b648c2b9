//! The stock burn-cuda backend takes the default (host round-trip) collectives: it is run as a
//! single-GPU correctness reference for ferrotron-cuda, never in a multi-rank layout, so no
//! device-side NCCL path is worth writing for it. The impl lives here because of the orphan rule.

use crate::{FusedOps, ParallelOps};

impl ParallelOps for burn::backend::Cuda {}

/// Composed defaults: stock burn-cuda keeps its own arithmetic.
impl FusedOps for burn::backend::Cuda {}
