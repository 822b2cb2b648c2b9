//! Parallelism written once, on burn tensors, against communicators.
//!
//! Every layout (tensor, sequence, context, expert, pipeline and data parallelism) is the
//! single-rank arithmetic split over ranks. This crate holds the pieces every layer of that
//! split shares, so the model and the runtime never see a concrete communicator or a backend's
//! internals:
//!
//! - [`DynComm`]/[`Comm`]: an object-safe communicator, so one `ParallelContext` type serves
//!   thread ranks, TCP processes and NCCL alike without generics leaking into every model type;
//! - [`ParallelContext`]: a rank's groups (tp, cp, ep, etp, dp, dp_cp, edp, pp, embedding);
//! - [`ShardSpec`]/[`ParamRole`]: where a local tensor sits in the global one-rank tensor and how
//!   its gradient is reduced, the contract between model, optimizer and checkpoints;
//! - [`ParallelOps`] and [`collectives`]: Megatron's conjugate region operators as autodiff
//!   ops with their own backward;
//! - [`recompute`]: activation recomputation as graph cuts the trainer's backward re-runs;
//! - [`end_fp8_step`]: the fp8 scaling state's step end, amaxes max-reduced over the groups.
//!
//! The fused operators (`FusedOps`, a supertrait of [`ParallelOps`]) live in `ferrotron-ops`.

mod autodiff;
#[cfg(feature = "burn-cuda")]
mod burn_cuda;
mod comm;
mod context;
mod fp8_step;
pub mod host;
mod ops;
pub mod prefetch;
mod process_rng;
pub mod recompute;
mod recompute_autodiff;
mod shard;
mod solo;

pub mod collectives;

#[cfg(test)]
mod tests;

pub use comm::{Comm, DynComm};
pub use context::ParallelContext;
pub use ferrotron_dist::{CommError, GroupLabel, ReduceOp};
pub use fp8_step::end_fp8_step;
pub use ops::{InFlight, ParallelOps, Wait};
pub use process_rng::with_process_rng;
pub use shard::{ParamRole, ShardError, ShardSpec, Split};
pub use solo::solo;
