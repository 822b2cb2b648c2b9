//! Choosing among cuDNN's execution plans for an attention graph by timing them on the real
//! operands, as `blas/tune.rs` does for the GEMMs' algorithms.
//!
//! The heuristics rank engine configs with a model of the chip; the first is not always the
//! fastest at a transformer's shapes (for the GEMMs, timing eight candidates gained 1.4–2.5 % of
//! a step), and attention is 13–24 % of a dense step. Every layer repeats the same two graphs,
//! so timing the first few candidates once per shape costs milliseconds. A graph with one
//! candidate is not timed. Different plans may round differently, so the choice is remembered
//! on disk beside the kernel cache (`<kernel cache>/<arch>/attention/`, keyed by the graph, the
//! device's name, cuDNN's version and the candidates' count) and a rerun or a resume keeps its
//! numbers bit for bit. The recipe's `runtime.attention_tune: false` keeps the first plan.

use std::path::{Path, PathBuf};

use crate::blas::tune::{choice_path, choose, time_one};
use crate::engine::device::CudaDevice;
use crate::error::Result;

/// Plans finalised and timed per graph when tuning. cuDNN offered 2–5 configs per graph at the
/// bench's shapes (tools/README.md), so a fifth is left untimed where there is one.
const CANDIDATES: usize = 4;

/// How many plans to finalise for a graph: [`CANDIDATES`] when tuning, else the first.
pub(super) fn candidates() -> usize {
    if crate::switches::paths().attention_tune {
        CANDIDATES
    } else {
        1
    }
}

/// The plan (an index below `count`) to keep for the graph described by `problem` on `device`:
/// the one remembered, else the fastest of `run`ning each on the device's stream (then
/// remembered). `run` writes the graph's real outputs; the caller's own run follows.
pub(super) fn pick(
    device: &CudaDevice,
    problem: &str,
    count: usize,
    mut run: impl FnMut(usize) -> Result<()>,
) -> usize {
    if count <= 1 {
        return 0;
    }
    let dir =
        crate::engine::kernel_cache::disk_cache_dir(device.arch()).map(|d| d.join("attention"));
    let name = device.name().unwrap_or_else(|_| device.arch().to_string());
    let name = format!("{name} cuDNN {}", super::version().unwrap_or(0));
    if let Some(index) = remembered(dir.as_deref(), problem, &name, count) {
        return index;
    }
    let times: Vec<Option<f64>> = (0..count)
        .map(|index| time_one(device.cu_stream(), || run(index)))
        .collect();
    let index = choose(&times);
    tracing::debug!(problem, ?times, index, "cuDNN attention plans timed");
    remember(dir.as_deref(), problem, &name, index, count);
    index
}

fn path(dir: &Path, problem: &str, device: &str) -> PathBuf {
    choice_path(dir, problem, device).with_extension("plan")
}

/// The stored index, if the file was written for the same number of candidates.
fn decode(text: &str, count: usize) -> Option<usize> {
    let mut fields = text.split_whitespace().map(str::parse::<usize>);
    let index = fields.next()?.ok()?;
    let stored = fields.next()?.ok()?;
    (stored == count && index < count).then_some(index)
}

fn remembered(dir: Option<&Path>, problem: &str, device: &str, count: usize) -> Option<usize> {
    let text = std::fs::read_to_string(path(dir?, problem, device)).ok()?;
    decode(&text, count)
}

/// Remembers a choice (best effort: a cache that cannot be written only costs a re-timing).
fn remember(dir: Option<&Path>, problem: &str, device: &str, index: usize, count: usize) {
    let Some(dir) = dir else { return };
    let path = path(dir, problem, device);
    if let Err(err) =
        crate::engine::kernel_cache::write_atomically(&path, &format!("{index} {count}\n"))
    {
        tracing::warn!(path = %path.display(), %err, "cannot remember an attention plan choice");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_choice_holds_only_for_the_same_candidates() {
        assert_eq!(decode("2 4\n", 4), Some(2));
        // cuDNN offers another number of plans: time again
        assert_eq!(decode("2 4\n", 3), None);
        assert_eq!(decode("4 4\n", 4), None);
        assert_eq!(decode("garbage", 4), None);
        assert_eq!(decode("", 4), None);
    }

    #[test]
    fn choices_are_kept_per_graph_and_device() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = Some(dir.path());
        assert_eq!(remembered(d, "fwd b 4", "H200 cuDNN 91900", 3), None);
        remember(d, "fwd b 4", "H200 cuDNN 91900", 1, 3);
        assert_eq!(remembered(d, "fwd b 4", "H200 cuDNN 91900", 3), Some(1));
        assert_eq!(remembered(d, "bwd b 4", "H200 cuDNN 91900", 3), None);
        assert_eq!(remembered(d, "fwd b 4", "H200 cuDNN 92000", 3), None);
        assert_eq!(remembered(None, "fwd b 4", "H200 cuDNN 91900", 3), None);
    }
}
