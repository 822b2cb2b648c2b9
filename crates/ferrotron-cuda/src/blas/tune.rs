//! Choosing a cuBLASLt algorithm by timing the heuristic's candidates on the real operands.
//!
//! The heuristic ranks algorithms with a model of the chip; its first choice is not always the
//! fastest on a transformer's shapes, and every GEMM of a step repeats thousands of times, so a
//! few milliseconds of timing when a shape is first seen can pay for itself many times over.
//! The recipe's `runtime.gemm_tune` switches this on or off; off, the
//! heuristic's first candidate is used as before.
//!
//! Different algorithms may round differently (split-K orders its partial sums), so the choice
//! is part of a run's numerics. Ties (within [`TIE`]) go to the earlier candidate, and every
//! choice is remembered on disk beside the kernel cache (`<kernel cache>/<arch>/gemm/`, one
//! small file per problem, keyed by the problem, the device's name and cuBLASLt's version,
//! written atomically like the kernels), so a resumed run, a rerun or another rank of the same
//! machine multiplies with the algorithms the first run chose and keeps its numbers bit for
//! bit, where timing afresh could flip a near tie.
#![allow(unsafe_code)]

use std::path::{Path, PathBuf};

use cudarc::cublaslt::{result::CublasError, sys};
use cudarc::driver::{result as driver, sys as dsys};

use crate::engine::device::CudaDevice;

/// Candidates asked of the heuristic: the count every GPU measurement so far ran with. With it,
/// gpt-1.3b's fc2 data-gradient and two weight-gradient GEMMs ran 3–9 % slower than PyTorch's
/// cuBLAS calls on the same shapes (one H200, `tools/gemm_ceiling.py`; tools/README.md); timing more
/// of the heuristic's list is the next thing to measure (tools/README.md).
pub(crate) const CANDIDATES: usize = 8;
/// Timed calls per candidate (after one warm-up call).
const REPEATS: usize = 3;
/// A later candidate must beat the best so far by this fraction to be chosen.
const TIE: f64 = 0.02;

/// Whether GEMMs are tuned (the recipe's `runtime.gemm_tune`).
pub(crate) fn enabled() -> bool {
    crate::switches::paths().gemm_tune
}

/// The candidate (an index into `algos`) that ran fastest, and each candidate's mean time in
/// microseconds (`None` where it failed to run). `launch` queues one GEMM with the given
/// algorithm on `stream`; a candidate whose launch fails is skipped, so the result is always a
/// candidate that ran, or the first when none did (the caller's own call reports its error).
fn fastest(
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

/// How many algorithms to ask the heuristic for: [`CANDIDATES`] when tuning, else its best
/// guess alone.
pub(crate) fn asked() -> usize {
    if enabled() { CANDIDATES } else { 1 }
}

/// The algorithms among the heuristic's first `count` results that it says can run, in its
/// order; an error when there is none.
pub(crate) fn usable(
    found: &[sys::cublasLtMatmulHeuristicResult_t],
    count: i32,
) -> Result<Vec<sys::cublasLtMatmulAlgo_t>, CublasError> {
    let candidates: Vec<_> = found
        .iter()
        .take(count.max(0) as usize)
        .filter(|h| h.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
        .map(|h| h.algo)
        .collect();
    if candidates.is_empty() {
        return Err(CublasError(
            sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED,
        ));
    }
    Ok(candidates)
}

/// The candidate to keep for `problem` (a description of the GEMM that names everything the
/// choice depends on) on `device`: the one remembered for this device and library, else the
/// fastest of `launch`ing each on `device`'s stream (then remembered).
pub(crate) fn pick(
    device: &CudaDevice,
    problem: &str,
    candidates: &[sys::cublasLtMatmulAlgo_t],
    launch: impl FnMut(&sys::cublasLtMatmulAlgo_t) -> Result<(), CublasError>,
) -> usize {
    let dir = store_dir(device.arch());
    // SAFETY: a version query with no arguments (the library is loaded by now).
    let version = unsafe { sys::cublasLtGetVersion() };
    let name = device.name().unwrap_or_else(|_| device.arch().to_string());
    let name = format!("{name} cuBLASLt {version}");
    if let Some(pick) = remembered(dir.as_deref(), problem, &name, candidates) {
        return pick;
    }
    let (pick, times) = fastest(candidates, device.cu_stream(), launch);
    tracing::debug!(problem, ?times, pick, "cuBLASLt candidates timed");
    remember(dir.as_deref(), problem, &name, pick, &candidates[pick]);
    pick
}

/// Where this device's choices live (`None`: the kernel cache is off, choices stay in memory).
fn store_dir(arch: &str) -> Option<PathBuf> {
    crate::engine::kernel_cache::disk_cache_dir(arch).map(|d| d.join("gemm"))
}

/// The file of one problem's choice: a hash of the problem and of what could change the
/// candidates (`device`: the device's name and the library's version).
pub(crate) fn choice_path(dir: &Path, problem: &str, device: &str) -> PathBuf {
    let mut hasher = blake3::Hasher::new();
    for part in [problem, device] {
        hasher.update(part.as_bytes());
        hasher.update(&[0]);
    }
    dir.join(format!("{}.algo", &hasher.finalize().to_hex()[..32]))
}

/// A choice as stored: the candidate's index, then its algorithm's words.
fn encode(index: usize, algo: &sys::cublasLtMatmulAlgo_t) -> String {
    let words: Vec<String> = algo.data.iter().map(u64::to_string).collect();
    format!("{index} {}\n", words.join(" "))
}

/// The stored index, if the file names a candidate that is still there with the same words.
fn decode(text: &str, algos: &[sys::cublasLtMatmulAlgo_t]) -> Option<usize> {
    let mut fields = text.split_whitespace().map(str::parse::<u64>);
    let index = usize::try_from(fields.next()?.ok()?).ok()?;
    let words: Vec<u64> = fields.collect::<Result<_, _>>().ok()?;
    (algos.get(index)?.data.as_slice() == words.as_slice()).then_some(index)
}

/// The choice remembered for this problem on this device, if any.
fn remembered(
    dir: Option<&Path>,
    problem: &str,
    device: &str,
    algos: &[sys::cublasLtMatmulAlgo_t],
) -> Option<usize> {
    let text = std::fs::read_to_string(choice_path(dir?, problem, device)).ok()?;
    decode(&text, algos)
}

/// Remembers a choice (best effort: a cache that cannot be written only costs a re-timing).
fn remember(
    dir: Option<&Path>,
    problem: &str,
    device: &str,
    index: usize,
    algo: &sys::cublasLtMatmulAlgo_t,
) {
    let Some(dir) = dir else { return };
    let path = choice_path(dir, problem, device);
    if let Err(err) = crate::engine::kernel_cache::write_atomically(&path, &encode(index, algo)) {
        tracing::warn!(path = %path.display(), %err, "cannot remember a GEMM algorithm choice");
    }
}

/// The index of the fastest time, earlier candidates winning ties within [`TIE`].
pub(crate) fn choose(times: &[Option<f64>]) -> usize {
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
pub(crate) fn time_one<E>(
    stream: dsys::CUstream,
    mut launch: impl FnMut() -> Result<(), E>,
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
        // SAFETY: as above; `end` is synchronised before its time is read.
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
    use super::*;

    fn algo(seed: u64) -> sys::cublasLtMatmulAlgo_t {
        sys::cublasLtMatmulAlgo_t {
            data: std::array::from_fn(|i| seed * 100 + i as u64),
        }
    }

    #[test]
    fn a_stored_choice_is_used_only_while_its_candidate_is_unchanged() {
        let algos = [algo(1), algo(2), algo(3)];
        let text = encode(2, &algos[2]);
        assert_eq!(decode(&text, &algos), Some(2));
        // Another library may list other candidates, or fewer.
        assert_eq!(decode(&text, &[algo(1), algo(2), algo(9)]), None);
        assert_eq!(decode(&text, &algos[..2]), None);
        assert_eq!(decode("garbage", &algos), None);
        assert_eq!(decode("", &algos), None);
    }

    #[test]
    fn choices_are_kept_per_problem_and_device() {
        let dir = tempfile::tempdir().expect("tempdir");
        let algos = [algo(1), algo(2)];
        let d = Some(dir.path());
        assert_eq!(remembered(d, "m 1 n 2", "H200", &algos), None);
        remember(d, "m 1 n 2", "H200", 1, &algos[1]);
        assert_eq!(remembered(d, "m 1 n 2", "H200", &algos), Some(1));
        assert_eq!(remembered(d, "m 1 n 3", "H200", &algos), None);
        assert_eq!(remembered(d, "m 1 n 2", "H100", &algos), None);
        assert_eq!(remembered(None, "m 1 n 2", "H200", &algos), None);
    }

    #[test]
    fn the_fastest_candidate_wins_and_near_ties_keep_the_earlier_one() {
        assert_eq!(choose(&[Some(10.0), Some(8.0), Some(9.0)]), 1);
        assert_eq!(choose(&[Some(10.0), Some(9.9), Some(9.85)]), 0);
        assert_eq!(choose(&[None, Some(12.0), Some(11.0)]), 2);
        assert_eq!(choose(&[None, None]), 0);
        assert_eq!(choose(&[]), 0);
    }
}
