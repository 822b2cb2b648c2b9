//! Choosing a cuBLASLt algorithm by timing the heuristic's candidates on the real operands.
//!
//! The heuristic ranks algorithms with a model of the chip; its first choice is not always the
//! fastest on a transformer's shapes, and every GEMM of a step repeats thousands of times, so a
//! few milliseconds of timing when a shape is first seen can pay for itself many times over.
//! `FERROTRON_GEMM_TUNE` (`off`/`0`/`composed` turn it off) switches this on or off; off, the
//! heuristic's first candidate is used as before.
//!
//! Different algorithms may round differently (split-K orders its partial sums), so the choice
//! is part of a run's numerics: it is made once per problem and process, from candidates the
//! heuristic lists in a fixed order, and ties (within [`TIE`]) go to the earlier candidate so
//! timing noise between equal algorithms does not flip the choice.
#![allow(unsafe_code)]

use std::sync::OnceLock;

use cudarc::cublaslt::{result::CublasError, sys};
use cudarc::driver::{result as driver, sys as dsys};

/// Candidates asked of the heuristic.
pub(crate) const CANDIDATES: usize = 8;
/// Timed calls per candidate (after one warm-up call).
const REPEATS: usize = 3;
/// A later candidate must beat the best so far by this fraction to be chosen.
const TIE: f64 = 0.02;

/// Whether GEMMs are tuned (read once per process).
pub(crate) fn enabled() -> bool {
    static CELL: OnceLock<bool> = OnceLock::new();
    crate::switches::enabled(&CELL, "FERROTRON_GEMM_TUNE")
}

/// The candidate (an index into `algos`) that ran fastest, and each candidate's mean time in
/// microseconds (`None` where it failed to run). `launch` queues one GEMM with the given
/// algorithm on `stream`; a candidate whose launch fails is skipped, so the result is always a
/// candidate that ran, or the first when none did (the caller's own call reports its error).
pub(crate) fn fastest(
    algos: &[sys::cublasLtMatmulAlgo_t],
    stream: dsys::CUstream,
    mut launch: impl FnMut(&sys::cublasLtMatmulAlgo_t) -> Result<(), CublasError>,
) -> (usize, Vec<Option<f64>>) {
    let times: Vec<Option<f64>> = algos
        .iter()
        .map(|algo| time_one(stream, || launch(algo)))
        .collect();
    (choose(&times), times)
}

/// The index of the fastest time, earlier candidates winning ties within [`TIE`].
fn choose(times: &[Option<f64>]) -> usize {
    let mut best: Option<(usize, f64)> = None;
    for (i, t) in times.iter().enumerate() {
        let Some(t) = *t else { continue };
        match best {
            Some((_, b)) if t >= b * (1.0 - TIE) => {}
            _ => best = Some((i, t)),
        }
    }
    best.map_or(0, |(i, _)| i)
}

/// Mean microseconds of one call, timed with events after a warm-up; `None` if any call or
/// event fails.
fn time_one(
    stream: dsys::CUstream,
    mut launch: impl FnMut() -> Result<(), CublasError>,
) -> Option<f64> {
    let flags = dsys::CUevent_flags::CU_EVENT_DEFAULT;
    let start = driver::event::create(flags).ok()?;
    let end = driver::event::create(flags).ok()?;
    let timed = (|| {
        launch().ok()?;
        // SAFETY: live events recorded on the device's live stream, waited for before reading.
        unsafe { driver::event::record(start, stream) }.ok()?;
        for _ in 0..REPEATS {
            launch().ok()?;
        }
        unsafe {
            driver::event::record(end, stream).ok()?;
            driver::event::synchronize(end).ok()?;
            driver::event::elapsed(start, end).ok()
        }
    })();
    // SAFETY: created above, destroyed once; nothing queued refers to them after the sync.
    unsafe {
        let _ = driver::event::destroy(start);
        let _ = driver::event::destroy(end);
    }
    timed.map(|ms| f64::from(ms) * 1e3 / REPEATS as f64)
}

#[cfg(test)]
mod tests {
    use super::choose;

    #[test]
    fn the_fastest_candidate_wins_and_near_ties_keep_the_earlier_one() {
        assert_eq!(choose(&[Some(10.0), Some(8.0), Some(9.0)]), 1);
        assert_eq!(choose(&[Some(10.0), Some(9.9), Some(9.85)]), 0);
        assert_eq!(choose(&[None, Some(12.0), Some(11.0)]), 2);
        assert_eq!(choose(&[None, None]), 0);
        assert_eq!(choose(&[]), 0);
    }
}
