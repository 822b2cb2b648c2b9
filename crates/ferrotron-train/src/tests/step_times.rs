//! The step time of every logged line is the wall time of its steps, device completion
//! included: the first line, a line whose step evaluates, and the last line too. A GPU step is
//! queued and its statistics are read later, and a read waits for every step queued before it,
//! so a read made once the next step is queued returns only when that step is done as well.
//! Driven by a device queue in miniature with those semantics, through the real loop.

use std::cell::Cell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use ferrotron_data::Tokenizer;
use serde_json::{Value, json};

use super::fixture::{Layout, options, plan, write_data};
use crate::checkpoint::{CheckpointInfo, CheckpointStore};
use crate::run::pending::DeviceValues;
use crate::run::resume::ResumeState;
use crate::run::setup::RunSetup;
use crate::run::training_loop::{LoopContext, RankStep, Reporter, run_iterations};
use crate::{Microbatch, PendingStats, StepContext, StepStats, TrainError};

/// The device time of one step: long against the loop's own host work, which a loaded 2-core
/// machine stretched past 100 ms (with 50 ms steps a line read 3.5 steps), so the bounds below
/// still tell one step from two.
const STEP: Duration = Duration::from_millis(250);
/// The device time of one evaluation, which no step's time may include.
const EVALUATION: Duration = Duration::from_millis(400);

/// A device that runs each step for `STEP` once the steps queued before it are done; reading a
/// step's statistics, or evaluating, waits until every queued step is done (as a read queued
/// behind them on a GPU stream does).
#[derive(Default)]
struct QueuedDevice {
    idle_at: Rc<Cell<Option<Instant>>>,
}

fn wait_for(idle_at: &Cell<Option<Instant>>) {
    if let Some(left) = idle_at
        .get()
        .and_then(|idle| idle.checked_duration_since(Instant::now()))
    {
        std::thread::sleep(left);
    }
}

impl RankStep for QueuedDevice {
    fn step(&mut self, _: &[Microbatch], context: StepContext) -> Result<PendingStats, TrainError> {
        let now = Instant::now();
        let starts = self.idle_at.get().map_or(now, |idle| idle.max(now));
        self.idle_at.set(Some(starts + STEP));
        let idle_at = self.idle_at.clone();
        let read = move |_: &[f32]| {
            wait_for(&idle_at);
            Ok(StepStats {
                loss: 1.0,
                lm_loss: 1.0,
                grad_norm: 1.0,
                clip_coefficient: 1.0,
                lr: context.lr,
            })
        };
        Ok(PendingStats::later(None, read, true))
    }

    fn evaluate(&mut self, _: &[Microbatch]) -> Result<f64, TrainError> {
        wait_for(&self.idle_at);
        std::thread::sleep(EVALUATION);
        Ok(0.5)
    }

    fn save(
        &mut self,
        _: &CheckpointStore,
        _: &CheckpointInfo<'_>,
    ) -> Result<Option<PathBuf>, TrainError> {
        unreachable!("the test recipes save nothing")
    }

    fn has_peers(&self) -> bool {
        false
    }

    fn agree_stop(&self, _: bool) -> DeviceValues {
        unreachable!("a rank alone stops on its own flag")
    }
}

/// `(step, step_seconds)` of every logged line of a 6-step run, and the step-time histogram's
/// count and sum.
fn run(training: Value) -> (Vec<(u64, f64)>, f64, f64) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_data(dir.path());
    let jsonl = dir.path().join("metrics.jsonl");
    let settings = json!({
        "logging": {"jsonl": jsonl}, "training": training, "data": {"split": "80,20,0"}
    });
    let plan = plan(dir.path(), Layout::alone(), 1, 6, settings);
    let tokenizer = Tokenizer::from_recipe(&plan.recipe.data.tokenizer).expect("tokenizer");
    let setup = RunSetup::new(&plan, &tokenizer).expect("setup");
    let options = options(dir.path());
    let state = ResumeState::fresh();
    let mut reporter =
        Reporter::start(&plan, &setup.recipe, &options, &state, None).expect("reporter");
    let context = LoopContext {
        plan: &plan,
        setup: &setup,
        options: &options,
        dp_rank: 0,
        dp_size: 1,
    };
    run_iterations(
        &context,
        &mut QueuedDevice::default(),
        state,
        Some(&mut reporter),
    )
    .expect("the run succeeds");
    let lines = std::fs::read_to_string(&jsonl)
        .expect("metrics.jsonl")
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).expect("a JSON line"))
        .filter(|record| record["kind"] == "train")
        .map(|record| {
            let step = record["step"].as_u64().expect("step");
            (step, record["step_seconds"].as_f64().expect("step_seconds"))
        })
        .collect();
    let text = reporter.metrics_text();
    let value = |name: &str| -> f64 {
        let line = text
            .lines()
            .find(|line| line.starts_with(&format!("{name}{{")))
            .unwrap_or_else(|| panic!("{name} missing from\n{text}"));
        line.rsplit(' ')
            .next()
            .and_then(|number| number.parse().ok())
            .unwrap_or_else(|| panic!("bad value in {line}"))
    };
    (
        lines,
        value("ferrotron_step_seconds_count"),
        value("ferrotron_step_seconds_sum"),
    )
}

/// Every line's step time is one step's, within what a loaded machine's sleeps may add; the
/// histogram holds every step once, with the lines' times.
fn check(training: Value, logged: &[u64]) {
    let (lines, count, sum) = run(training.clone());
    assert_eq!(
        lines.iter().map(|line| line.0).collect::<Vec<_>>(),
        logged,
        "{training}"
    );
    let step = STEP.as_secs_f64();
    for &(at, seconds) in &lines {
        assert!(
            (0.8 * step..1.75 * step).contains(&seconds),
            "{training}: step {at} took {seconds} s, a step is {step} s: {lines:?}"
        );
    }
    assert_eq!(count, 6.0);
    let mut previous = 0;
    let total: f64 = lines
        .iter()
        .map(|&(at, seconds)| {
            let steps = at - previous;
            previous = at;
            seconds * steps as f64
        })
        .sum();
    assert!(
        (sum - total).abs() <= 1e-6 * total,
        "{training}: the histogram holds {sum} s, the lines {total} s"
    );
}

#[test]
fn every_line_times_its_steps_to_their_completion_the_last_one_too() {
    check(json!({"log_interval": 1}), &[1, 2, 3, 4, 5, 6]);
}

/// Lines at an evaluation read their step at once (the evaluation needs it): their time is
/// still one step's, and the evaluation's own time is no step's.
#[test]
fn a_line_read_for_an_evaluation_times_its_step_and_not_the_evaluation() {
    check(
        json!({"log_interval": 1, "eval_interval": 2, "eval_iters": 1}),
        &[1, 2, 3, 4, 5, 6],
    );
}

#[test]
fn a_line_of_several_steps_times_each_of_them() {
    check(json!({"log_interval": 4}), &[4, 6]);
}
