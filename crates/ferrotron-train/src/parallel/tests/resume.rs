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

/// Pure data parallelism runs the replicated device step (`crate::replicas`): plain, and ZeRO-1
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

fn check(layout: Layout) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_data(dir.path());
    let with_store = |name: &str| {
        json!({"checkpoint": {
            "dir": dir.path().join(name), "interval": 2, "keep_last": 2, "resume": "auto"
        }})
    };
    let straight_plan = plan(dir.path(), layout, 2, 4, with_store("straight"));
    let straight = train_world(&straight_plan, &options(&dir.path().join("straight-run")))
        .expect("the straight run trains");

    let split_plan = plan(dir.path(), layout, 2, 4, with_store("split"));
    let mut first_half = options(&dir.path().join("split-run"));
    first_half.exit_interval = Some(2);
    let stopped = train_world(&split_plan, &first_half).expect("the first half trains");
    assert_eq!(stopped[0].summary.stopped, Some(StopReason::ExitInterval));
    assert_eq!(stopped[0].summary.iteration, 2);
    let resumed = train_world(&split_plan, &options(&dir.path().join("split-run")))
        .expect("the second half trains");
    assert_eq!(resumed[0].summary.start_iteration, 2);

    let mut halves = stopped[0].summary.losses.clone();
    halves.extend(&resumed[0].summary.losses);
    let bits = |xs: &[f64]| xs.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&halves), bits(&straight[0].summary.losses));
    let straight_weights = assemble(straight.into_iter().flat_map(|o| o.params));
    let resumed_weights = assemble(resumed.into_iter().flat_map(|o| o.params));
    assert_eq!(straight_weights, resumed_weights);
}
