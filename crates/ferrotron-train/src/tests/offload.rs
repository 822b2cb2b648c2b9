//! Megatron's optimizer CPU offload (`--optimizer-cpu-offload --optimizer-offload-fraction`) on
//! thread ranks: the offloaded groups' update is the kernel the in-device one is on the CPU, so
//! every layout trains to the same bits with the whole optimizer offloaded or none, in fp32 and
//! bf16 weights, fp32 and bf16 moments, fp32 and bf16 gradient sums, and saves the same
//! checkpoint; half of it offloaded gives the same bits on one data rank and the parallel
//! tolerances on several (see below).

use std::path::Path;

use serde_json::{Value, json};

use super::fixture::{Layout, merge, train_and_save, write_data};
use super::optimizer_states::{bf16_main_grads, bf16_states};
use super::{LOSS_TOLERANCE, WEIGHT_TOLERANCE};
use crate::checkpoint::read_safetensors;

/// The recipe keys of an offload of `fraction` (with the precision-aware optimizer it needs).
pub(super) fn offloaded(fraction: f64) -> Value {
    json!({"training": {"optimizer": {
        "use_precision_aware_optimizer": true,
        "optimizer_cpu_offload": true,
        "optimizer_offload_fraction": fraction
    }}})
}

/// The losses of a 4-step run of `layout` with `extra`, and every tensor of its final
/// checkpoint (weights and optimizer states, by file and name).
fn train(
    dir: &Path,
    name: &str,
    layout: Layout,
    extra: Value,
) -> (Vec<f64>, Vec<(String, Vec<u32>)>) {
    let (losses, folder) = train_and_save(dir, name, layout, extra);
    let mut files: Vec<_> = std::fs::read_dir(&folder)
        .expect("checkpoint folder")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    let mut tensors = Vec::new();
    for path in files {
        let file = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        for (tensor, values) in read_safetensors(&path).expect("shard") {
            let bits = values.values.iter().map(|v| v.to_bits()).collect();
            tensors.push((format!("{file}:{tensor}"), bits));
        }
    }
    tensors.sort();
    (losses, tensors)
}

#[test]
fn an_offloaded_optimizer_trains_and_saves_the_in_device_bits_on_every_layout() {
    let zero1 = |layout: Layout| Layout {
        distributed_optimizer: true,
        ..layout
    };
    for (layout, states) in [
        (zero1(Layout::alone()), json!({})),
        (
            zero1(Layout {
                dp: 2,
                ..Layout::alone()
            }),
            bf16_states(),
        ),
        (
            zero1(Layout {
                tp: 2,
                pp: 2,
                dp: 2,
                ..Layout::alone()
            }),
            json!({"precision": {"dtype": "bf16"}}),
        ),
        (
            zero1(Layout {
                cp: 2,
                dp: 2,
                ..Layout::alone()
            }),
            json!({}),
        ),
        // the host's AdamW reading bf16 gradient sums
        (zero1(Layout::alone()), bf16_main_grads()),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        write_data(dir.path());
        let with = |mut extra: Value, more: Value| {
            merge(&mut extra, more);
            extra
        };
        let in_device = with(
            states.clone(),
            json!({"training": {"optimizer": {"use_precision_aware_optimizer": true}}}),
        );
        let (losses, tensors) = train(dir.path(), "device", layout, in_device);
        assert!(!tensors.is_empty());
        for fraction in [1.0, 0.5] {
            let name = format!("offload-{fraction}");
            let (offload_losses, offload_tensors) = train(
                dir.path(),
                &name,
                layout,
                with(states.clone(), offloaded(fraction)),
            );
            // Offloading part of the optimizer splits its groups where the offloaded part ends;
            // under ZeRO-1 that moves the boundaries of each rank's part, and so the order in
            // which the gradient norm's squares are summed: the clipping factor may then differ
            // by an ulp (it does not without clipping), everything else is exact.
            let exact = fraction == 1.0 || layout.dp == 1;
            if exact {
                assert_eq!(offload_losses, losses, "{layout:?} {states} {name}: losses");
            }
            for (got, want) in offload_losses.iter().zip(&losses) {
                assert!(
                    (got - want).abs() <= LOSS_TOLERANCE * want.abs(),
                    "{layout:?} {states} {name}: {offload_losses:?} against {losses:?}"
                );
            }
            let names =
                |t: &[(String, Vec<u32>)]| t.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
            assert_eq!(
                names(&offload_tensors),
                names(&tensors),
                "{layout:?} {states} {name}"
            );
            for ((tensor, got), (_, want)) in offload_tensors.iter().zip(&tensors) {
                for (&got, &want) in got.iter().zip(want) {
                    let (got, want) = (f32::from_bits(got), f32::from_bits(want));
                    assert!(
                        if exact {
                            got.to_bits() == want.to_bits()
                        } else {
                            (got - want).abs() <= WEIGHT_TOLERANCE
                        },
                        "{layout:?} {states} {name}: {tensor}: {got} against {want}"
                    );
                }
            }
        }
    }
}
