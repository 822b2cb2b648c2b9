//! Seeding and seeded initialisation go through the process-wide RNG lock of
//! `ferrotron-parallel` (see its `process_rng.rs`), which the CPU backend's dropout marks take
//! too.
pub(crate) use ferrotron_parallel::with_process_rng;
