//! Stopping a parallel run is a decision every rank takes together: a non-finite loss is seen by
//! all ranks after the loss reduction (so all fail, none waits in a collective), and a stop
//! request on one rank's flag is agreed by an all-reduce before anyone saves and leaves.

use serde_json::json;

use super::fixture::{Layout, options, plan, train_world, write_data};
use crate::{StopReason, TrainError};

fn layout() -> Layout {
    Layout {
        tp: 1,
        pp: 2,
        vpp: 1,
        dp: 2,
        ..Layout::default()
    }
}

#[test]
fn a_non_finite_loss_stops_every_rank_before_the_update() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_data(dir.path());
    let exploding = plan(
        dir.path(),
        layout(),
        2,
        4,
        json!({"training": {"optimizer": {"lr": 1e30}, "clip_grad": 0.0}}),
    );
    let err = train_world(&exploding, &options(dir.path())).expect_err("the loss explodes");
    let message = err.to_string();
    assert!(matches!(err, TrainError::NonFinite { .. }), "{err:?}");
    assert!(
        message.contains("is NaN") || message.contains("is inf"),
        "{message}"
    );
    assert!(
        message.contains("stopping before the optimizer step"),
        "{message}"
    );
}

#[test]
fn a_stop_request_stops_every_rank_after_one_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_data(dir.path());
    let stored = plan(
        dir.path(),
        layout(),
        2,
        4,
        json!({"checkpoint": {"dir": dir.path().join("ckpt")}}),
    );
    let options = options(dir.path());
    // the flag is shared by the thread ranks, as SIGTERM's is; each rank reads it at its own time
    options.stop.request();
    let outcomes = train_world(&stored, &options).expect("the run stops cleanly");
    for outcome in &outcomes {
        assert_eq!(outcome.summary.stopped, Some(StopReason::Signal));
        assert_eq!(outcome.summary.iteration, 1);
    }
    let checkpoint = outcomes[0]
        .summary
        .checkpoint
        .as_ref()
        .expect("a checkpoint was saved");
    assert!(crate::checkpoint::is_committed(checkpoint));
}
