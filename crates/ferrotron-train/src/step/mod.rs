//! One optimizer step: forward and backward over a rank's microbatches (`backward.rs`: by
//! recomputed ranges, fenced for thread ranks), the gradients exchanged with the rank's peers,
//! the global norm and its clipping coefficient (`clip.rs`), the finiteness guard, the update.
//!
//! The exchange is what differs between layouts, and it has three forms: none (a rank alone),
//! replicas (the whole model on every rank of a data-parallel group, `replicas.rs`), and
//! per chunk (pipeline stages, context or expert parallelism, `per_chunk.rs`). The first two are
//! the whole-model step (`whole_model.rs`), the third the pipeline's; both gather gradients into
//! the optimizer's flat buffers and share the bucket-by-bucket reduction (`BucketReduction`).
//!
//! Why the host step (`train_step_deferred` on a backend without a device-resident step) is not
//! folded into the device step: its numbers are the golden curves, and they are not the device
//! step's. The host step clips with the f64 `clip_coefficient` of an f64 norm summed per
//! tensor, checks the loss and the norm before it updates (so `train_step` applies nothing on a
//! non-finite value), and steps the per-parameter AdamW state; the device step sums `Σ g²` over
//! the flat buffers in f32, computes the coefficient in f32 and applies it inside the flat
//! update. Both agree to the bit only when nothing is clipped (`whole_model.rs`'s
//! device-vs-host test); merging them would move every CPU curve that clips.

pub(crate) mod backward;
pub(crate) mod clip;
pub(crate) mod per_chunk;
pub(crate) mod replicas;
mod whole_model;

pub use whole_model::{Microbatch, StepContext, StepStats, evaluate, train_step};
pub(crate) use whole_model::{check_finite, device_step, train_step_deferred};
