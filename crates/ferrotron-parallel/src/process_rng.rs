//! The CPU backend's random generator is one per process (`burn-flex` keeps it in a static), so
//! thread ranks — and tests running side by side — would otherwise interleave their draws. Every
//! seeding, every seeded initialisation and every re-keying of the stream (the default
//! [`ParallelOps::rng_mark`] and [`ParallelOps::rng_restore`]) goes through this lock, so a
//! model built from a seed is the same model whatever else the process is doing, a rank's
//! dropout marks included. (Dropout draws during a step are not covered: with dropout > 0 thread
//! ranks are valid but not bit-reproducible.)
//!
//! [`ParallelOps::rng_mark`]: crate::ParallelOps::rng_mark
//! [`ParallelOps::rng_restore`]: crate::ParallelOps::rng_restore

use std::sync::Mutex;

static PROCESS_RNG: Mutex<()> = Mutex::new(());

/// Run `body` (seeding, or seeding and drawing) with the process RNG to itself. Not reentrant:
/// `body` must not mark or restore the generator itself.
pub fn with_process_rng<R>(body: impl FnOnce() -> R) -> R {
    let _alone = PROCESS_RNG
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    body()
}
