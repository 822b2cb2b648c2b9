//! One optimizer step: forward and backward over a rank's microbatches (`backward.rs`: by
//! recomputed ranges, fenced for thread ranks), each microbatch's gradients gathered into the
//! optimizer's flat buffers, exchanged with the rank's peers, the global norm and its clipping
//! coefficient (`clip.rs`), the finiteness guard, the update over the flat buffers.
//!
//! The exchange is what differs between layouts, in three forms: none (a rank alone), replicas
//! (the whole model on every rank of a data-parallel group, `replicas.rs`) and per chunk
//! (pipeline stages, context or expert parallelism, `per_chunk.rs`). None and replicas are one
//! step (`whole_model.rs`); both it and the per-chunk step reduce through the same
//! bucket-by-bucket `BucketReduction` over a `GroupReduction` (`replicas.rs`).
//!
//! Why the per-chunk step stays a step of its own, measured on the thread worlds (loss and
//! weight bits of 18 layouts, before and after): it is not the whole-model step with another
//! exchange. It runs the pipeline schedule over several chunks, not one model's microbatches;
//! its reported loss is each data rank's f64 mean summed in rank order on the host (the host
//! all-reduce's arithmetic, which every rank must agree on to stop together), where the
//! replicated step averages the f32 losses on the device; and its clipping coefficient is the
//! host's f64 one computed on the device (`exact_device_clip_coefficient`), where the
//! replicated step uses an f32 one. Running dp2, dp2 + ZeRO-1 and tp2 + SP through the
//! per-chunk step changes their loss bits, and their weights too (the clipping). One step over
//! both would take a trait of hooks each with two bodies (the driver, which parameters are
//! laid out, which ranks count in `Σ g²`, the loss reduction, the clipping arithmetic, the
//! gather after the update), longer than the two steps it would replace.

pub(crate) mod backward;
pub(crate) mod clip;
pub(crate) mod per_chunk;
pub(crate) mod replicas;
mod whole_model;

pub use whole_model::{Microbatch, StepContext, StepStats, evaluate, train_step};
pub(crate) use whole_model::{StatsRead, check_finite, train_step_deferred, whole_model_step};
