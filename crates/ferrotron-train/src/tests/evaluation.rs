//! Which validation batches each evaluation reads (`eval_batches.rs`): by default Megatron's,
//! moving on by `eval_iters` global batches per evaluation, so no two evaluations share a batch;
//! with `training.eval_batches: fixed` the first `eval_iters` global batches every time, as
//! before. Either way every data-parallel size reads the same samples in the same microbatches,
//! and a resumed run evaluates the batches of an uninterrupted one.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use ferrotron_data::Tokenizer;
use serde_json::{Value, json};

use super::LOSS_TOLERANCE;
use super::fixture::{Layout, options, plan, train_alone, train_world, write_data};
use crate::checkpoint::{CheckpointInfo, CheckpointStore};
use crate::run::pending::DeviceValues;
use crate::run::resume::ResumeState;
use crate::run::setup::RunSetup;
use crate::run::training_loop::{Lead, RankStep, training_loop};
use crate::{Microbatch, PendingStats, StepContext, StepStats, StopReason, TrainError};

/// The fixture's global batch, microbatch and sequence length.
const GLOBAL_BATCH: u64 = 8;
const MICRO_BATCH: usize = 2;
const SEQ: usize = 16;
const EVAL_ITERS: u64 = 2;

/// An evaluation's iteration and microbatches.
type Evaluation = (u64, Vec<Microbatch>);

/// Records the microbatches of every evaluation with the iteration it follows.
#[derive(Default)]
struct Evaluations {
    seen: Rc<RefCell<Vec<Evaluation>>>,
    iteration: u64,
}

impl RankStep for Evaluations {
    fn step(&mut self, _: &[Microbatch], context: StepContext) -> Result<PendingStats, TrainError> {
        self.iteration = context.iteration;
        Ok(PendingStats::ready(StepStats {
            loss: 1.0,
            lm_loss: 1.0,
            grad_norm: 1.0,
            clip_coefficient: 1.0,
            lr: context.lr,
        }))
    }

    fn evaluate(&mut self, microbatches: &[Microbatch]) -> Result<f64, TrainError> {
        self.seen
            .borrow_mut()
            .push((self.iteration, microbatches.to_vec()));
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

/// Five iterations, an evaluation every two (at 2, 4 and the last, 5): the evaluations data-
/// parallel rank `rank` of `size` reads, and the run's setup (its validation split).
fn evaluations(dir: &Path, extra: Value, (rank, size): (u32, u32)) -> (Vec<Evaluation>, RunSetup) {
    write_data(dir);
    let mut settings = json!({
        "training": {"eval_interval": 2, "eval_iters": EVAL_ITERS},
        "data": {"split": "80,20,0"}
    });
    super::fixture::merge(&mut settings, extra);
    let plan = plan(dir, Layout::alone(), 1, 5, settings);
    let tokenizer = Tokenizer::from_recipe(&plan.recipe.data.tokenizer).expect("tokenizer");
    let setup = RunSetup::new(&plan, &tokenizer).expect("setup");
    let mut recorder = Evaluations::default();
    let seen = recorder.seen.clone();
    let lead = if rank == 0 { Lead::Yes } else { Lead::No };
    training_loop(
        &plan,
        &setup,
        &options(dir),
        ResumeState::fresh(),
        None,
        lead,
        (rank, size),
        &mut recorder,
    )
    .expect("the run succeeds");
    let seen = seen.borrow().clone();
    (seen, setup)
}

/// Validation samples `range`, as microbatches.
fn microbatches(setup: &RunSetup, range: std::ops::Range<u64>) -> Vec<Microbatch> {
    let valid = setup.data.valid.as_ref().expect("a validation split");
    let samples: Vec<Vec<u32>> = range
        .map(|i| valid.sample(i).expect("a validation sample"))
        .collect();
    samples
        .chunks(MICRO_BATCH)
        .map(|chunk| Microbatch::from_samples(chunk, SEQ).expect("whole samples"))
        .collect()
}

/// Rank `rank` of `size`'s microbatches of the `EVAL_ITERS` global batches from `start`, as
/// Megatron's sampler hands them out: each global batch in turn, each rank its contiguous part.
fn megatron_share(setup: &RunSetup, start: u64, (rank, size): (u32, u32)) -> Vec<Microbatch> {
    let share = GLOBAL_BATCH / u64::from(size);
    (0..EVAL_ITERS)
        .flat_map(|batch| {
            let first = start + batch * GLOBAL_BATCH + u64::from(rank) * share;
            microbatches(setup, first..first + share)
        })
        .collect()
}

#[test]
fn successive_evaluations_read_megatrons_next_batches_on_every_rank() {
    // Megatron evaluates in its loop at 2 and 4, its iterator at sample 0 and then one
    // evaluation (2 × 8 samples) on, and after training at sample 32; the last iteration, 5,
    // is that evaluation here.
    let positions = [(2, 0), (4, 16), (5, 32)];
    for share in [(0, 1), (0, 2), (1, 2)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (seen, setup) = evaluations(dir.path(), json!({}), share);
        let expected: Vec<Evaluation> = positions
            .iter()
            .map(|&(iteration, start)| (iteration, megatron_share(&setup, start, share)))
            .collect();
        assert_eq!(seen, expected, "rank {share:?}");
        for (i, (at, batches)) in seen.iter().enumerate() {
            for (later, other) in &seen[i + 1..] {
                assert_ne!(
                    batches, other,
                    "the evaluations at {at} and {later} read the same"
                );
            }
        }
    }
}

/// Megatron's `--eval-iters 0`: no evaluation in the loop, after training or on the test split
/// (`do_valid` and `do_test` are false), though the recipe splits the corpus three ways: zero
/// samples asked of a split build none (as Megatron's builder), so nothing is read either.
#[test]
fn no_eval_iters_evaluates_nothing_not_even_at_the_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    let none = json!({"training": {"eval_iters": 0}, "data": {"split": "60,20,20"}});
    let (seen, setup) = evaluations(dir.path(), none, (0, 1));
    assert!(setup.data.valid.is_none() && setup.data.test.is_none());
    assert_eq!(seen, Vec::new());
    let dir = tempfile::tempdir().expect("tempdir");
    let some = json!({"training": {"eval_iters": 1}, "data": {"split": "60,20,20"}});
    let (seen, _) = evaluations(dir.path(), some, (0, 1));
    let at: Vec<u64> = seen.iter().map(|(iteration, _)| *iteration).collect();
    assert_eq!(
        at,
        [2, 4, 5, 5],
        "validation at 2, 4 and the end, then the test split"
    );
}

#[test]
fn fixed_evaluations_read_the_first_batches_every_time_as_before() {
    let fixed = json!({"training": {"eval_batches": "fixed"}});
    let dir = tempfile::tempdir().expect("tempdir");
    let (seen, setup) = evaluations(dir.path(), fixed.clone(), (0, 1));
    // before `eval_batches` existed: the first eval_iters × global_batch samples of a split of
    // that many, read in order
    let valid = setup.data.valid.as_ref().expect("a validation split");
    let before = microbatches(&setup, 0..EVAL_ITERS * GLOBAL_BATCH);
    assert_eq!(
        seen,
        [2, 4, 5]
            .map(|iteration| (iteration, before.clone()))
            .to_vec()
    );
    assert!(valid.len() >= EVAL_ITERS * GLOBAL_BATCH);
    // two ranks read the same microbatches between them
    let mut both = Vec::new();
    for rank in 0..2 {
        let dir = tempfile::tempdir().expect("tempdir");
        let (seen, _) = evaluations(dir.path(), fixed.clone(), (rank, 2));
        assert!(seen.windows(2).all(|pair| pair[0].1 == pair[1].1));
        both.extend(seen[0].1.clone());
    }
    assert_eq!(both.len(), before.len());
    assert!(before.iter().all(|microbatch| both.contains(microbatch)));
}

/// `(step, eval loss)` of every evaluation in a metrics file.
fn eval_losses(jsonl: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(jsonl)
        .expect("metrics.jsonl")
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).expect("a JSON line"))
        .filter(|record| record["kind"] == "eval")
        .map(|record| {
            (
                record["step"].as_u64().expect("step"),
                record["eval_loss"].as_f64().expect("eval_loss"),
            )
        })
        .collect()
}

#[test]
fn a_resumed_run_evaluates_the_batches_of_an_uninterrupted_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_data(dir.path());
    let run = |name: &str| {
        json!({
            "training": {"eval_interval": 2, "eval_iters": 1},
            "data": {"split": "80,20,0"},
            "checkpoint": {"dir": dir.path().join(name).join("ckpt"), "resume": "auto"},
            "logging": {"jsonl": dir.path().join(name).join("metrics.jsonl")}
        })
    };
    let straight = plan(dir.path(), Layout::alone(), 2, 5, run("straight"));
    train_alone(&straight, &options(&dir.path().join("straight"))).expect("the straight run");

    let split = plan(dir.path(), Layout::alone(), 2, 5, run("split"));
    let mut first = options(&dir.path().join("split"));
    first.exit_interval = Some(3);
    let stopped = train_alone(&split, &first).expect("the first part");
    assert_eq!(stopped.summary.stopped, Some(StopReason::ExitInterval));
    let resumed = train_alone(&split, &options(&dir.path().join("split"))).expect("the rest");
    assert_eq!(resumed.summary.start_iteration, 3);

    let straight = eval_losses(&dir.path().join("straight/metrics.jsonl"));
    let split = eval_losses(&dir.path().join("split/metrics.jsonl"));
    assert_eq!(straight.iter().map(|e| e.0).collect::<Vec<_>>(), [2, 4, 5]);
    let bits = |losses: &[(u64, f64)]| {
        losses
            .iter()
            .map(|&(step, loss)| (step, loss.to_bits()))
            .collect::<Vec<_>>()
    };
    assert_eq!(bits(&split), bits(&straight));
}

#[test]
fn data_parallel_ranks_evaluate_as_one_rank_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_data(dir.path());
    // an evaluation every iteration, over more validation samples than one epoch of the split
    let settings = |name: &str| {
        json!({
            "training": {"eval_interval": 1, "eval_iters": EVAL_ITERS},
            "data": {"split": "85,15,0"},
            "logging": {"jsonl": dir.path().join(name).join("metrics.jsonl")}
        })
    };
    // one evaluation's worth of samples is one epoch of the split: its size
    let epoch = {
        let mut one_evaluation = settings("epoch");
        super::fixture::merge(
            &mut one_evaluation,
            json!({"training": {"eval_batches": "fixed", "eval_iters": 1}}),
        );
        let plan = plan(dir.path(), Layout::alone(), 2, 4, one_evaluation);
        let tokenizer = Tokenizer::from_recipe(&plan.recipe.data.tokenizer).expect("tokenizer");
        let setup = RunSetup::new(&plan, &tokenizer).expect("setup");
        setup.data.valid.expect("a validation split").len()
    };
    assert_ne!(
        epoch % (2 * MICRO_BATCH as u64),
        0,
        "{epoch}: a multiple of dp × micro batch"
    );
    assert!(
        epoch < 5 * EVAL_ITERS * GLOBAL_BATCH,
        "{epoch}: the evaluations fit one epoch"
    );
    let one = plan(dir.path(), Layout::alone(), 2, 4, settings("one"));
    train_alone(&one, &options(&dir.path().join("one"))).expect("the one-rank run");
    let layout = Layout {
        dp: 2,
        ..Layout::alone()
    };
    let two = plan(dir.path(), layout, 2, 4, settings("two"));
    train_world(&two, &options(&dir.path().join("two"))).expect("the data-parallel run");

    let one = eval_losses(&dir.path().join("one/metrics.jsonl"));
    let two = eval_losses(&dir.path().join("two/metrics.jsonl"));
    assert_eq!(one.iter().map(|e| e.0).collect::<Vec<_>>(), [1, 2, 3, 4]);
    assert_eq!(one.len(), two.len());
    for (&(step, a), &(_, b)) in one.iter().zip(&two) {
        let relative = (a - b).abs() / a.abs();
        assert!(
            relative <= LOSS_TOLERANCE,
            "step {step}: one rank {a}, two {b} ({relative:e})"
        );
    }
}
