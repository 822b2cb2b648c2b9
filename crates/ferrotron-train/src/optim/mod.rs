//! The optimizer and what sets its rate: Ferrotron's own AdamW (Megatron's weight-decay
//! exemptions, moments saved under the parameters' stable names), its flat state for the
//! device-resident steps, the CPU offload of part of that state, and the learning-rate
//! schedules (Megatron's `OptimizerParamScheduler` as pure functions of the position).
//!
//! Both state forms live on one `AdamW`: the per-parameter moments (`adamw.rs`) are what the
//! host step updates and what checkpoints, restores and the tests' references read; the flat
//! buffers (`flat_adamw.rs`) are what the device steps update in a few launches. The optimizer
//! moves its state between the forms when a caller needs the other one, so a run never keeps
//! both.

pub(crate) mod adamw;
pub(crate) mod flat_adamw;
pub(crate) mod lr_schedule;
pub(crate) mod offload;

pub use adamw::{AdamW, AdamWConfig};
