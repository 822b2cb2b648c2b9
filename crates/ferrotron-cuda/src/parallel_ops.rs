//! `Autodiff<Cuda>` trains the models, whose layers call the region collectives of
//! `ferrotron-parallel`. The trait's defaults (identity on a group of one, otherwise a host
//! round trip in f32 that returns the tensor's own dtype) are correct for our tensors, so one rank
//! per GPU works now; device-side NCCL overrides replace them later without touching the model.
//! The impl sits in this crate (the trait's crate cannot name our backend without a cycle).

use crate::backend::Cuda;

impl ferrotron_parallel::ParallelOps for Cuda {}
// `FusedOps` (the supertrait) is in `fused_ops.rs`.
