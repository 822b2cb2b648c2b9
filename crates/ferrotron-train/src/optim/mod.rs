//! The optimizer and what sets its rate: Ferrotron's own AdamW (Megatron's weight-decay
//! exemptions, moments saved under the parameters' stable names), its flat state for the
//! device-resident steps, the CPU offload of part of that state, and the learning-rate
//! schedules (Megatron's `OptimizerParamScheduler` as pure functions of the position).
//!
//! Both state forms live on one `AdamW`, and every training step updates the flat one
//! (`flat_adamw.rs`: master weights and moments in one fp32 buffer per group, a few launches a
//! step). The per-parameter form (`adamw.rs`) stays for what reads or writes one parameter at
//! a time — a checkpoint's load and restore, and the public [`AdamW::step`], the arithmetic the
//! flat update is tested against to the bit — and the optimizer moves its state between the
//! forms when a caller needs the other one. Why not one form: the flat layout is a function of
//! the step (buckets, families, ZeRO-1 parts) that a checkpoint, written under global names for
//! any layout, must not depend on.

pub(crate) mod adamw;
pub(crate) mod flat_adamw;
pub(crate) mod lr_schedule;
pub(crate) mod offload;

pub use adamw::{AdamW, AdamWConfig};
