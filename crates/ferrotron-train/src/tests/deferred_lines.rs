//! When the loop reads a step's statistics. A device step's statistics are read one step late,
//! once the next step is queued behind it, so the device never runs dry while the host logs;
//! evaluation, checkpoints, stops and the last step still read everything first; a host step
//! is read at once. Driven by a step that only records when it is queued and read, so the order
//! is the loop's alone.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use burn::tensor::Tensor;
use ferrotron_data::Tokenizer;
use serde_json::{Value, json};

use super::fixture::{Layout, options, plan, write_data};
use crate::checkpoint::{CheckpointInfo, CheckpointStore};
use crate::run::pending::DeviceValues;
use crate::run::resume::ResumeState;
use crate::run::setup::RunSetup;
use crate::run::training_loop::{Lead, RankStep, training_loop};
use crate::{CpuBackend, Microbatch, PendingStats, StepContext, StepStats, TrainError};

/// Records `queue N`, `read N` and `evaluate`; step `fail`'s read is a non-finite error and
/// "another rank" asks to stop after step `stop`.
struct Recorder {
    events: Rc<RefCell<Vec<String>>>,
    waits: bool,
    fail: Option<u64>,
    stop: Option<u64>,
    queued: u64,
}

impl RankStep for Recorder {
    fn step(&mut self, _: &[Microbatch], context: StepContext) -> Result<PendingStats, TrainError> {
        let iteration = context.iteration;
        self.queued = iteration;
        self.events.borrow_mut().push(format!("queue {iteration}"));
        let events = self.events.clone();
        let fail = self.fail == Some(iteration);
        let read = move |_: &[f32]| {
            events.borrow_mut().push(format!("read {iteration}"));
            if fail {
                return Err(TrainError::NonFinite {
                    iteration,
                    what: "the loss",
                    value: f64::NAN,
                });
            }
            let loss = iteration as f64;
            Ok(StepStats {
                loss,
                lm_loss: loss,
                grad_norm: 1.0,
                clip_coefficient: 1.0,
                lr: context.lr,
            })
        };
        Ok(PendingStats::later(None, read, self.waits))
    }

    fn evaluate(&mut self, _: &[Microbatch]) -> Result<f64, TrainError> {
        self.events.borrow_mut().push("evaluate".into());
        Ok(0.5)
    }

    fn save(
        &mut self,
        _: &CheckpointStore,
        info: &CheckpointInfo<'_>,
    ) -> Result<Option<PathBuf>, TrainError> {
        let iteration = info.state.iteration;
        self.events.borrow_mut().push(format!("save {iteration}"));
        Ok(Some(PathBuf::from(format!("iter_{iteration:07}"))))
    }

    fn reserve_snapshot(&mut self) {
        self.events.borrow_mut().push("reserve".into());
    }

    /// With `stop`, the recorder plays a rank with peers, one of which asks to stop once step
    /// `stop` is queued.
    fn has_peers(&self) -> bool {
        self.stop.is_some()
    }

    fn agree_stop(&self, local: bool) -> DeviceValues {
        let any = local || self.stop == Some(self.queued);
        let flag = Tensor::<CpuBackend, 1>::from_floats(
            [if any { 1.0 } else { 0.0 }],
            &Default::default(),
        );
        DeviceValues::new(vec![flag])
    }
}

/// What a run did: the recorder's events, the run's outcome and the JSONL's train lines (step,
/// loss, consumed samples).
struct Run {
    order: Vec<String>,
    outcome: Result<(), TrainError>,
    lines: Vec<(u64, f64, u64)>,
}

/// Runs `iterations` steps of the fixture's data through `recorder`.
fn run_with(dir: &Path, iterations: u64, mut recorder: Recorder, extra: Value) -> Run {
    write_data(dir);
    let jsonl = dir.join("metrics.jsonl");
    let mut settings = json!({"logging": {"jsonl": jsonl}});
    super::fixture::merge(&mut settings, extra);
    let plan = plan(dir, Layout::alone(), 1, iterations, settings);
    let tokenizer = Tokenizer::from_recipe(&plan.recipe.data.tokenizer).expect("tokenizer");
    let setup = RunSetup::new(&plan, &tokenizer).expect("setup");
    let events = recorder.events.clone();
    let outcome = training_loop(
        &plan,
        &setup,
        &options(dir),
        ResumeState::fresh(),
        None,
        Lead::Yes,
        (0, 1),
        &mut recorder,
    )
    .map(|_| ());
    let lines = std::fs::read_to_string(&jsonl)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).expect("a JSON line"))
        .filter(|record| record["kind"] == "train")
        .map(|record| {
            (
                record["step"].as_u64().expect("step"),
                record["loss"].as_f64().expect("loss"),
                record["consumed_samples"]
                    .as_u64()
                    .expect("consumed samples"),
            )
        })
        .collect();
    let order = events.borrow().clone();
    Run {
        order,
        outcome,
        lines,
    }
}

fn recorder(waits: bool, fail: Option<u64>, stop: Option<u64>) -> Recorder {
    Recorder {
        events: Rc::new(RefCell::new(Vec::new())),
        waits,
        fail,
        stop,
        queued: 0,
    }
}

fn run(dir: &Path, iterations: u64, waits: bool, fail: Option<u64>, extra: Value) -> Run {
    run_with(dir, iterations, recorder(waits, fail, None), extra)
}

fn events(list: &[&str]) -> Vec<String> {
    list.iter().map(|e| (*e).to_owned()).collect()
}

#[test]
fn a_device_step_is_read_once_the_next_one_is_queued() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Run {
        order,
        outcome,
        lines,
    } = run(dir.path(), 4, true, None, json!({}));
    outcome.expect("the run succeeds");
    assert_eq!(
        order,
        events(&[
            "queue 1", "queue 2", "read 1", "queue 3", "read 2", "queue 4", "read 3", "read 4"
        ])
    );
    // every step still has its own line, with its own loss and position in the data
    assert_eq!(
        lines,
        vec![(1, 1.0, 8), (2, 2.0, 16), (3, 3.0, 24), (4, 4.0, 32)]
    );
}

/// A run with asynchronous saves page-locks its snapshot's memory once, after its first step
/// is queued; a run that saves synchronously, or not at all, does not.
#[test]
fn only_asynchronous_saves_reserve_their_snapshot_after_the_first_step() {
    for (async_save, dir) in [(true, true), (false, true), (true, false)] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let checkpoint = if dir {
            json!({"dir": tmp.path().join("ckpt"), "async_save": async_save, "interval": 100})
        } else {
            json!({"async_save": async_save})
        };
        let Run { order, outcome, .. } =
            run(tmp.path(), 3, true, None, json!({"checkpoint": checkpoint}));
        outcome.expect("the run succeeds");
        let reserve: &[&str] = if async_save && dir { &["reserve"] } else { &[] };
        let save: &[&str] = if dir { &["save 3"] } else { &[] };
        let want = [
            &["queue 1"][..],
            reserve,
            &["queue 2", "read 1", "queue 3", "read 2", "read 3"],
            save,
        ]
        .concat();
        assert_eq!(order, events(&want), "async {async_save}, dir {dir}");
    }
}

#[test]
fn a_host_step_is_read_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Run {
        order,
        outcome,
        lines,
    } = run(dir.path(), 3, false, None, json!({}));
    outcome.expect("the run succeeds");
    assert_eq!(
        order,
        events(&[
            "queue 1", "read 1", "queue 2", "read 2", "queue 3", "read 3"
        ])
    );
    assert_eq!(lines, vec![(1, 1.0, 8), (2, 2.0, 16), (3, 3.0, 24)]);
}

#[test]
fn evaluation_reads_every_queued_step_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Run {
        order,
        outcome,
        lines,
    } = run(
        dir.path(),
        4,
        true,
        None,
        json!({"training": {"eval_interval": 2, "eval_iters": 1}, "data": {"split": "80,20,0"}}),
    );
    outcome.expect("the run succeeds");
    assert_eq!(
        order,
        events(&[
            "queue 1", "queue 2", "read 1", "read 2", "evaluate", "queue 3", "queue 4", "read 3",
            "read 4", "evaluate"
        ])
    );
    assert_eq!(
        lines.iter().map(|l| l.0).collect::<Vec<_>>(),
        vec![1, 2, 3, 4]
    );
}

#[test]
fn a_log_interval_averages_the_steps_it_covers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Run {
        order,
        outcome,
        lines,
    } = run(
        dir.path(),
        5,
        true,
        None,
        json!({"training": {"log_interval": 2}}),
    );
    outcome.expect("the run succeeds");
    // steps 1 and 2 are read after step 3 is queued, 3 and 4 after 5; 5 is the last
    assert_eq!(
        order,
        events(&[
            "queue 1", "queue 2", "queue 3", "read 1", "read 2", "queue 4", "queue 5", "read 3",
            "read 4", "read 5"
        ])
    );
    assert_eq!(lines, vec![(2, 1.5, 16), (4, 3.5, 32), (5, 5.0, 40)]);
}

#[test]
fn a_non_finite_step_read_late_still_fails_the_run_naming_its_step() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Run {
        order,
        outcome,
        lines,
    } = run(dir.path(), 4, true, Some(2), json!({}));
    let err = outcome.expect_err("step 2 is not finite");
    assert!(
        matches!(err, TrainError::NonFinite { iteration: 2, .. }),
        "{err:?}"
    );
    // step 3 was queued behind it; nothing after the failed read
    assert_eq!(
        order,
        events(&["queue 1", "queue 2", "read 1", "queue 3", "read 2"])
    );
    assert_eq!(lines, vec![(1, 1.0, 8)]);
}

#[test]
fn another_ranks_stop_reads_and_logs_the_deferred_step() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Run {
        order,
        outcome,
        lines,
    } = run_with(dir.path(), 4, recorder(true, None, Some(2)), json!({}));
    outcome.expect("a stop is a clean end");
    // the vote queued with step 2 is read with it once step 3 is queued: every rank stops
    // there, after reading (and logging) step 3 too
    assert_eq!(
        order,
        events(&[
            "queue 1", "queue 2", "read 1", "queue 3", "read 2", "read 3"
        ])
    );
    assert_eq!(lines, vec![(1, 1.0, 8), (2, 2.0, 16), (3, 3.0, 24)]);
}
