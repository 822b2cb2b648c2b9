//! Multi-rank steps keep their statistics on the device, as the one-rank step does: each rank
//! reads them to the host once per logged step (every queued step's losses, norm and clipping
//! coefficient and the agreed stop flag together, `crate::run::host_read`), never per step or per
//! microbatch. A read on a GPU waits for every kernel queued, so each extra one leaves the device
//! idle while the host queues the next step.
//!
//! Evaluations and checkpoint saves read at their own points (a validation loss, a failure flag
//! before the commit); these runs have neither, so every read counted is a step's.

use serde_json::json;

use super::fixture::{Layout, options, plan, train_world, write_data};

const STEPS: u64 = 8;
const LOG_INTERVAL: u64 = 4;

/// Each rank's host reads over `STEPS` steps of `layout`, logged every `LOG_INTERVAL`.
fn reads_per_rank(layout: Layout) -> Vec<u64> {
    let dir = tempfile::tempdir().expect("tempdir");
    write_data(dir.path());
    let plan = plan(
        dir.path(),
        layout,
        2,
        STEPS,
        json!({"training": {"log_interval": LOG_INTERVAL}}),
    );
    let outcomes = train_world(&plan, &options(dir.path())).expect("the run trains");
    for outcome in &outcomes {
        assert_eq!(outcome.summary.losses.len(), STEPS as usize);
    }
    outcomes.iter().map(|outcome| outcome.host_reads).collect()
}

fn check(layout: Layout) {
    let reads = reads_per_rank(layout);
    let logged = STEPS / LOG_INTERVAL;
    eprintln!("{layout:?}: host reads per rank {reads:?}");
    assert!(
        reads.iter().all(|&reads| reads <= logged),
        "{layout:?}: host reads per rank {reads:?} over {STEPS} steps, {logged} of them logged"
    );
}

#[test]
fn tensor_parallel_steps_read_the_host_once_per_logged_step() {
    check(Layout {
        tp: 2,
        ..Layout::alone()
    });
}

#[test]
fn pipeline_steps_read_the_host_once_per_logged_step() {
    check(Layout {
        pp: 2,
        ..Layout::alone()
    });
}

#[test]
fn tensor_and_pipeline_parallel_steps_read_the_host_once_per_logged_step() {
    check(Layout {
        tp: 2,
        pp: 2,
        ..Layout::alone()
    });
}
