//! Megatron's precision-aware optimizer (`--use-precision-aware-optimizer --exp-avg-dtype bf16
//! --exp-avg-sq-dtype bf16`) on thread ranks: the moments are kept in bf16 (what a checkpoint
//! holds is bf16-representable), the run trains as the fp32-state run does to bf16's rounding
//! of the moments, and it is deterministic. Resume is in `resume.rs`.

use std::path::Path;

use serde_json::{Value, json};

use super::fixture::{Layout, train_and_save, write_data};
use crate::checkpoint::read_safetensors;

/// The recipe keys of bf16 optimizer states.
pub(super) fn bf16_states() -> Value {
    json!({"training": {"optimizer": {
        "use_precision_aware_optimizer": true, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"
    }}})
}

/// The losses of a 4-step run of `layout` with `states` (saving at the end into `dir/name`),
/// and every moment value of its checkpoint.
fn train(dir: &Path, name: &str, layout: Layout, states: Value) -> (Vec<f64>, Vec<f32>) {
    let (losses, folder) = train_and_save(dir, name, layout, states);
    let mut moments = Vec::new();
    for entry in std::fs::read_dir(&folder).expect("checkpoint folder") {
        let path = entry.expect("entry").path();
        let file = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        if file.starts_with("optimizer") {
            for (_, tensor) in read_safetensors(&path).expect("optimizer shard") {
                moments.extend(tensor.values);
            }
        }
    }
    (losses, moments)
}

/// Data parallelism (the replicated step) and tp 2 × pp 2 × dp 2 (the per-chunk step), both
/// with the distributed optimizer the precision-aware one needs.
fn zero1_layouts() -> [Layout; 2] {
    [
        Layout {
            dp: 2,
            distributed_optimizer: true,
            ..Layout::alone()
        },
        Layout {
            tp: 2,
            pp: 2,
            dp: 2,
            distributed_optimizer: true,
            ..Layout::alone()
        },
    ]
}

#[test]
fn bf16_states_are_stored_in_bf16_and_train_as_fp32_ones_do() {
    for layout in zero1_layouts() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_data(dir.path());
        let (fp32_losses, fp32_moments) = train(dir.path(), "fp32", layout, json!({}));
        let (bf16_losses, bf16_moments) = train(dir.path(), "bf16", layout, bf16_states());
        let (again, _) = train(dir.path(), "bf16-again", layout, bf16_states());
        assert_eq!(bf16_losses, again, "{layout:?}: deterministic");

        let bf16 = |x: f32| burn::tensor::bf16::from_f32(x).to_f32() == x;
        assert!(!bf16_moments.is_empty());
        assert!(
            bf16_moments.iter().all(|&m| bf16(m)),
            "{layout:?}: every stored moment is a bf16 value"
        );
        assert!(
            !fp32_moments.iter().all(|&m| bf16(m)),
            "{layout:?}: fp32 moments are not all bf16 values (the check can fail)"
        );
        assert_eq!(bf16_losses.len(), fp32_losses.len());
        // Steps 1 and 2 update from moments the first step computed exactly, so they agree to
        // the bit; later steps read rounded moments.
        assert_eq!(bf16_losses[..2], fp32_losses[..2], "{layout:?}");
        assert_ne!(
            bf16_losses, fp32_losses,
            "{layout:?}: rounding the moments shows"
        );
        for (b, f) in bf16_losses.iter().zip(&fp32_losses) {
            assert!(
                (b - f).abs() <= 1e-3 * f.abs(),
                "{layout:?}: bf16 states {bf16_losses:?} against fp32 {fp32_losses:?}"
            );
        }
    }
}

/// The recipe keys of bf16 main gradients (Megatron's `--main-grads-dtype bf16`).
pub(super) fn bf16_main_grads() -> Value {
    json!({"training": {"optimizer": {
        "use_precision_aware_optimizer": true, "main_grads_dtype": "bf16"
    }}})
}

/// Summed in bf16 over four microbatches (and over replicas, and per chunk), the gradients
/// train as the fp32 sums do to bf16's rounding of the sums, deterministically.
#[test]
fn bf16_main_grads_train_as_fp32_sums_do() {
    let alone = Layout {
        distributed_optimizer: true,
        ..Layout::alone()
    };
    for layout in std::iter::once(alone).chain(zero1_layouts()) {
        let dir = tempfile::tempdir().expect("tempdir");
        write_data(dir.path());
        let fp32_sums = json!({"training": {"optimizer": {"use_precision_aware_optimizer": true}}});
        let (fp32_losses, _) = train(dir.path(), "fp32", layout, fp32_sums);
        let (bf16_losses, _) = train(dir.path(), "bf16", layout, bf16_main_grads());
        let (again, _) = train(dir.path(), "bf16-again", layout, bf16_main_grads());
        assert_eq!(bf16_losses, again, "{layout:?}: deterministic");
        assert_eq!(bf16_losses.len(), fp32_losses.len());
        // The first loss is computed before any update.
        assert_eq!(bf16_losses[0], fp32_losses[0], "{layout:?}");
        assert_ne!(
            bf16_losses, fp32_losses,
            "{layout:?}: rounding the sums shows"
        );
        for (b, f) in bf16_losses.iter().zip(&fp32_losses) {
            assert!(
                (b - f).abs() <= 1e-2 * f.abs(),
                "{layout:?}: bf16 sums {bf16_losses:?} against fp32 {fp32_losses:?}"
            );
        }
    }
}
