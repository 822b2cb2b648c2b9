//! The stock burn-cuda backend takes the default (host round-trip) collectives: it is run as a
//! single-GPU correctness reference for ferrotron-cuda, never in a multi-rank layout, so no
//! device-side NCCL path is worth writing for it. The impl lives here because of the orphan rule
//! (its `FusedOps` impl, the composed defaults, lives in ferrotron-ops).

use crate::ParallelOps;

impl ParallelOps for burn::backend::Cuda {}
