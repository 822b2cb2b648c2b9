//! Stopping a parallel run is a decision every rank takes together: a non-finite loss is seen by
//! all ranks when they read the step's shared statistics (so all fail, none waits in a
//! collective), and a stop request on one rank's flag is agreed by a device all-reduce read with
//! them, before anyone saves and leaves.

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

#[test]
fn ranks_with_peers_agree_on_a_stop_where_they_next_read_their_steps() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_data(dir.path());
    let stored = plan(
        dir.path(),
        layout(),
        2,
        8,
        json!({
            "checkpoint": {"dir": dir.path().join("ckpt")},
            "training": {"log_interval": 3}
        }),
    );
    let options = options(dir.path());
    options.stop.request();
    let outcomes = train_world(&stored, &options).expect("the run stops cleanly");
    // the flag is seen before step 1, but the ranks agree (and read) only at the logged step 3
    for outcome in &outcomes {
        assert_eq!(outcome.summary.stopped, Some(StopReason::Signal));
        assert_eq!(outcome.summary.iteration, 3);
        assert_eq!(outcome.summary.losses.len(), 3);
    }
    let checkpoint = outcomes[0]
        .summary
        .checkpoint
        .as_ref()
        .expect("a checkpoint was saved");
    assert!(
        checkpoint.ends_with("iter_0000003"),
        "{}",
        checkpoint.display()
    );
    assert!(crate::checkpoint::is_committed(checkpoint));
}
