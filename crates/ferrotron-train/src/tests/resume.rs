//! A parallel run stopped at a checkpoint and resumed continues exactly where the uninterrupted
//! run goes: pipeline stages, data-parallel ranks and the distributed optimizer's sharded moments
//! all come back through the sharded checkpoint format.

use serde_json::json;

use super::fixture::{Layout, assemble, options, plan, train_world, write_data};
use crate::StopReason;

#[test]
fn resumed_parallel_run_matches_uninterrupted_bit_for_bit() {
    check(Layout {
        tp: 1,
        pp: 2,
        vpp: 1,
        dp: 2,
        distributed_optimizer: true,
        ..Layout::default()
    });
}

/// Pure data parallelism runs the replicated device step (`crate::step::replicas`): plain, and ZeRO-1
/// whose parts of the flat state are joined for the checkpoint and cut again after it.
#[test]
fn resumed_data_parallel_run_matches_uninterrupted_bit_for_bit() {
    for distributed_optimizer in [false, true] {
        check(Layout {
            tp: 1,
            pp: 1,
            vpp: 1,
            dp: 2,
            distributed_optimizer,
            ..Layout::default()
        });
    }
}

/// Asynchronous saves every step: the save of step 1 is still in flight when step 2 saves (and
/// settles it), the stop at step 3 waits for its own; the resume from step 3 continues exactly.
#[test]
fn a_run_saving_asynchronously_resumes_bit_for_bit() {
    check_saving(
        Layout {
            tp: 2,
            pp: 2,
            vpp: 1,
            dp: 1,
            ..Layout::default()
        },
        Saving::Async,
    );
}

/// Megatron's precision-aware optimizer with both moments in bf16: a checkpoint stores them
/// widened to f32 and a resume rounds them back to the same bits, under the distributed
/// optimizer's replicated (dp2) and per-chunk (pp2·dp2) state.
#[test]
fn a_run_with_bf16_optimizer_states_resumes_bit_for_bit() {
    for pp in [1, 2] {
        check_with(
            zero1_dp2(pp),
            Saving::Sync,
            super::optimizer_states::bf16_states(),
        );
    }
}

/// Data parallel 2 with the distributed optimizer, over `pp` stages.
fn zero1_dp2(pp: u32) -> Layout {
    Layout {
        tp: 1,
        pp,
        vpp: 1,
        dp: 2,
        distributed_optimizer: true,
        ..Layout::default()
    }
}

/// Megatron's optimizer CPU offload under asynchronous saves every step: the snapshot shares the
/// offloaded groups' host buffers with the writer rather than copying them, and the next update
/// writes new ones; what the writer wrote resumes exactly, under the distributed optimizer's
/// replicated (dp2, half offloaded) and per-chunk (pp2·dp2, all) state.
#[test]
fn a_run_with_an_offloaded_optimizer_saving_asynchronously_resumes_bit_for_bit() {
    for (pp, fraction) in [(1, 0.5), (2, 1.0)] {
        check_with(
            zero1_dp2(pp),
            Saving::Async,
            super::offload::offloaded(fraction),
        );
    }
}

fn check(layout: Layout) {
    check_saving(layout, Saving::Sync);
}

fn check_saving(layout: Layout, saving: Saving) {
    check_with(layout, saving, json!({}));
}

#[derive(Clone, Copy, PartialEq)]
enum Saving {
    /// Every second step, stopped after step 2.
    Sync,
    /// `checkpoint.async_save` every step, stopped after step 3.
    Async,
}

/// Stopped after a save and resumed against straight through, with `extra` in both recipes.
fn check_with(layout: Layout, saving: Saving, extra: serde_json::Value) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_data(dir.path());
    let (interval, stop_at) = match saving {
        Saving::Sync => (2, 2),
        Saving::Async => (1, 3),
    };
    let with_store = |name: &str| {
        let mut recipe = json!({"checkpoint": {
            "dir": dir.path().join(name), "interval": interval, "keep_last": 2, "resume": "auto",
            "async_save": saving == Saving::Async
        }});
        super::fixture::merge(&mut recipe, extra.clone());
        recipe
    };
    let straight_plan = plan(dir.path(), layout, 2, 4, with_store("straight"));
    let straight = train_world(&straight_plan, &options(&dir.path().join("straight-run")))
        .expect("the straight run trains");

    let split_plan = plan(dir.path(), layout, 2, 4, with_store("split"));
    let mut first_half = options(&dir.path().join("split-run"));
    first_half.exit_interval = Some(stop_at);
    let stopped = train_world(&split_plan, &first_half).expect("the first half trains");
    assert_eq!(stopped[0].summary.stopped, Some(StopReason::ExitInterval));
    assert_eq!(stopped[0].summary.iteration, stop_at);
    let newest = stopped[0]
        .summary
        .checkpoint
        .as_ref()
        .expect("a checkpoint");
    assert!(newest.ends_with(format!("iter_{stop_at:07}")), "{newest:?}");
    let resumed = train_world(&split_plan, &options(&dir.path().join("split-run")))
        .expect("the second half trains");
    assert_eq!(resumed[0].summary.start_iteration, stop_at);

    let mut halves = stopped[0].summary.losses.clone();
    halves.extend(&resumed[0].summary.losses);
    let bits = |xs: &[f64]| xs.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&halves), bits(&straight[0].summary.losses));
    let straight_weights = assemble(straight.into_iter().flat_map(|o| o.params));
    let resumed_weights = assemble(resumed.into_iter().flat_map(|o| o.params));
    assert_eq!(straight_weights, resumed_weights);
}
