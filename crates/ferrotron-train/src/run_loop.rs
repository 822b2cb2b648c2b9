//! The iteration loop every rank runs, one rank or many: fetch the rank's share of the global
//! batch, step, and keep the cadence — logging, evaluation, checkpoints, the signal and exit
//! conditions. What a step *is* (one model, or pipeline chunks with collectives) sits behind
//! [`RankStep`]; what gets printed and written (metrics, JSONL, TensorBoard, progress) is the
//! [`Reporter`]'s, which only global rank 0 has.

use std::path::{Path, PathBuf};
use std::time::Instant;

use ferrotron_data::{BlendedDataset, rank_batch_indices};
use ferrotron_plan::Plan;
use ferrotron_recipe::{GpuKind, Recipe};
use ferrotron_telemetry::{
    IterationCounts, JsonlWriter, MemoryProbe, Metrics, MetricsServer, Progress, StepMetrics,
    TensorBoardWriter,
};
use serde::Serialize;

use crate::checkpoint::{CheckpointInfo, CheckpointStore};
use crate::resume::ResumeState;
use crate::setup::{RunSetup, write_run_dir};
use crate::{Microbatch, PendingStats, StepContext, StepStats, StopFlag, TrainError};

/// How the caller wants the run to go, beyond the plan.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Where `plan.json` and the resolved `recipe.yaml` go.
    pub run_dir: PathBuf,
    /// Set by SIGTERM/SIGINT (or the caller) to stop after the current step.
    pub stop: StopFlag,
    /// Save and stop when the iteration is a multiple of this (Megatron's `--exit-interval`).
    pub exit_interval: Option<u64>,
    /// Called once the Prometheus exporter listens, with its address.
    pub announce: fn(&str),
    /// The memory each logged step reports: resident memory on the CPU, device memory on a GPU.
    pub memory: MemoryProbe,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    /// The iteration the run started after (0 when fresh).
    pub start_iteration: u64,
    /// The last completed iteration.
    pub iteration: u64,
    pub train_iters: u64,
    /// Loss of the last step (language model + auxiliary).
    pub last_loss: Option<f64>,
    pub last_eval_loss: Option<f64>,
    /// The test-set loss, evaluated once when training reaches its last iteration.
    pub test_loss: Option<f64>,
    /// The newest checkpoint written by this run.
    pub checkpoint: Option<PathBuf>,
    /// The run stopped early on a signal or the exit interval.
    pub stopped: Option<StopReason>,
    /// The loss of every step this run made, in order (on every rank of a parallel run: the
    /// global mean over data- and context-parallel ranks, from the last pipeline stage).
    pub losses: Vec<f64>,
    /// Cache keys of the data indices the run read (train, valid, test): its data provenance.
    pub data_cache_keys: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Signal,
    ExitInterval,
}

/// Whether this rank reports (metrics, JSONL, progress, run folder): global rank 0 only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lead {
    Yes,
    No,
}

/// What every rank does once its model exists, one rank or many: the lead rank's reporter, the
/// loop over `step` reading data-parallel share `dp` (rank, size), and the reporter's last word.
#[expect(
    clippy::too_many_arguments,
    reason = "the loop's inputs, each named once"
)]
pub(crate) fn run_rank_loop(
    plan: &Plan,
    setup: &RunSetup,
    options: &RunOptions,
    state: ResumeState,
    resumed_from: Option<&Path>,
    lead: Lead,
    (dp_rank, dp_size): (u32, u32),
    step: &mut dyn RankStep,
) -> Result<RunSummary, TrainError> {
    let mut reporter = match lead {
        Lead::Yes => Some(Reporter::start(
            plan,
            &setup.recipe,
            options,
            &state,
            resumed_from,
        )?),
        Lead::No => None,
    };
    let context = LoopContext {
        plan,
        setup,
        options,
        dp_rank,
        dp_size,
    };
    let outcome = run_loop(&context, step, state, reporter.as_mut());
    if let Some(reporter) = &reporter {
        reporter.finish(outcome.is_ok());
    }
    outcome
}

/// The model side of a rank, as the loop drives it. `RankModel` is the one implementation; the
/// loop takes it as a trait object so that it reads as the algorithm and is compiled once, not
/// once per backend.
pub(crate) trait RankStep {
    /// Queue one step; its statistics are read when the loop needs them (see [`PendingStats`]).
    fn step(
        &mut self,
        microbatches: &[Microbatch],
        context: StepContext,
    ) -> Result<PendingStats, TrainError>;
    /// Mean validation loss (the same value on every rank).
    fn evaluate(&mut self, microbatches: &[Microbatch]) -> Result<f64, TrainError>;
    /// Save a checkpoint (collective: every rank calls it at the same iteration).
    fn save(
        &mut self,
        store: &CheckpointStore,
        info: &CheckpointInfo<'_>,
    ) -> Result<PathBuf, TrainError>;
    /// Whether `local` holds on any rank. A stop must be agreed, or the ranks that go on would
    /// wait forever for those that stopped.
    fn any_rank(&self, local: bool) -> Result<bool, TrainError>;
}

/// What the loop reads, shared by every rank of the process.
pub(crate) struct LoopContext<'a> {
    pub plan: &'a Plan,
    pub setup: &'a RunSetup,
    pub options: &'a RunOptions,
    /// This rank's data-parallel index and the data-parallel size (cp excluded: context-parallel
    /// peers read the same samples and split each sequence).
    pub dp_rank: u32,
    pub dp_size: u32,
}

/// One line of the metrics JSONL: a logged training step or an evaluation.
#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum Record<'a> {
    Train {
        #[serde(flatten)]
        metrics: &'a StepMetrics,
        lm_loss: f64,
        consumed_samples: u64,
        consumed_tokens: u64,
    },
    Eval {
        step: u64,
        eval_loss: f64,
        eval_perplexity: f64,
    },
    Test {
        step: u64,
        test_loss: f64,
        test_perplexity: f64,
    },
}

/// Rank 0's outputs: Prometheus metrics, the JSONL file, TensorBoard events, the progress
/// display, the run folder.
pub(crate) struct Reporter {
    metrics: Metrics,
    _server: Option<MetricsServer>,
    jsonl: Option<JsonlWriter>,
    tensorboard: Option<TensorBoardWriter>,
    progress: Progress,
}

impl Reporter {
    pub(crate) fn start(
        plan: &Plan,
        recipe: &Recipe,
        options: &RunOptions,
        state: &ResumeState,
        resumed_from: Option<&Path>,
    ) -> Result<Self, TrainError> {
        let progress = Progress::new(plan.train_iters, state.iteration);
        if let Some(found) = resumed_from {
            progress.message(&format!(
                "resumed from {} at iteration {} ({} samples consumed)",
                found.display(),
                state.iteration,
                state.consumed_samples
            ));
        }
        write_run_dir(&options.run_dir, plan, recipe)?;
        let metrics = Metrics::new(&recipe.name, 0)?;
        let server = match &recipe.logging.prometheus {
            Some(prometheus) => {
                let server = metrics.serve(&prometheus.address, prometheus.port)?;
                (options.announce)(&format!("http://{}/metrics", server.local_addr()));
                Some(server)
            }
            None => None,
        };
        let jsonl = match &recipe.logging.jsonl {
            Some(path) => Some(JsonlWriter::open_resumed(Path::new(path), state.iteration)?),
            None => None,
        };
        let tensorboard = match &recipe.logging.tensorboard {
            Some(dir) => Some(TensorBoardWriter::create(Path::new(dir), state.iteration)?),
            None => None,
        };
        Ok(Reporter {
            metrics,
            _server: server,
            jsonl,
            tensorboard,
            progress,
        })
    }

    /// Closes the progress display: with the closing line when the run `succeeded`, without
    /// it when it failed (the error follows).
    pub(crate) fn finish(&self, succeeded: bool) {
        if succeeded {
            self.progress.finish();
        } else {
            self.progress.abandon();
        }
    }

    fn message(&self, text: &str) {
        self.progress.message(text);
    }

    /// A logged training step: Prometheus, the progress line, the JSONL and TensorBoard.
    fn log_step(
        &mut self,
        step: &StepMetrics,
        lm_loss: f64,
        state: &ResumeState,
    ) -> Result<(), TrainError> {
        self.metrics.record_step(step);
        self.progress.update(step);
        if let Some(writer) = self.jsonl.as_mut() {
            writer.write(&Record::Train {
                metrics: step,
                lm_loss,
                consumed_samples: state.consumed_samples,
                consumed_tokens: state.consumed_tokens,
            })?;
        }
        if let Some(writer) = self.tensorboard.as_mut() {
            let scalars = [
                ("lm loss", Some(lm_loss)),
                ("loss", Some(step.loss)),
                ("learning-rate", Some(step.lr)),
                ("grad-norm", Some(step.grad_norm)),
                ("throughput/tokens_per_s", Some(step.tokens_per_second)),
                ("throughput/tflops_per_gpu", Some(step.tflops_per_gpu)),
                ("mfu", step.mfu),
                ("iteration-time", Some(step.step_seconds)),
                ("memory/bytes", Some(step.memory_bytes as f64)),
            ];
            let known: Vec<(&str, f64)> = scalars
                .into_iter()
                .filter_map(|(tag, value)| Some((tag, value?)))
                .collect();
            writer.scalars(step.step, &known)?;
        }
        Ok(())
    }

    fn log_eval(&mut self, iteration: u64, eval_loss: f64) -> Result<(), TrainError> {
        self.metrics.record_eval(iteration, eval_loss);
        self.message(&format!(
            "iteration {iteration}: validation loss {eval_loss:.4}, perplexity {:.2}",
            eval_loss.exp()
        ));
        if let Some(writer) = self.jsonl.as_mut() {
            writer.write(&Record::Eval {
                step: iteration,
                eval_loss,
                eval_perplexity: eval_loss.exp(),
            })?;
        }
        if let Some(writer) = self.tensorboard.as_mut() {
            writer.scalars(
                iteration,
                &[
                    ("validation loss", eval_loss),
                    ("validation ppl", eval_loss.exp()),
                ],
            )?;
        }
        Ok(())
    }

    fn log_test(&mut self, iteration: u64, test_loss: f64) -> Result<(), TrainError> {
        self.message(&format!(
            "iteration {iteration}: test loss {test_loss:.4}, perplexity {:.2}",
            test_loss.exp()
        ));
        if let Some(writer) = self.jsonl.as_mut() {
            writer.write(&Record::Test {
                step: iteration,
                test_loss,
                test_perplexity: test_loss.exp(),
            })?;
        }
        if let Some(writer) = self.tensorboard.as_mut() {
            writer.scalars(
                iteration,
                &[("test loss", test_loss), ("test ppl", test_loss.exp())],
            )?;
        }
        Ok(())
    }

    fn saved(&self, iteration: u64, path: &Path) {
        self.message(&format!(
            "iteration {iteration}: saved checkpoint {}",
            path.display()
        ));
    }

    fn stopped(&self, iteration: u64, reason: StopReason, checkpoint: Option<&Path>) {
        let why = match reason {
            StopReason::Signal => "stop requested (signal)",
            StopReason::ExitInterval => "exit interval reached",
        };
        let saved = match checkpoint {
            Some(path) => format!("checkpoint {}", path.display()),
            None => "no checkpoint (checkpoint.dir is not set)".to_owned(),
        };
        self.message(&format!("iteration {iteration}: {why}; {saved}"));
    }
}

/// Sums since the last log line, for interval averages as Megatron prints them.
struct Interval {
    steps: u64,
    loss: f64,
    lm_loss: f64,
    /// When the interval's first step could start: the previous interval's last step done.
    start: Instant,
}

impl Interval {
    fn new() -> Self {
        Interval {
            steps: 0,
            loss: 0.0,
            lm_loss: 0.0,
            start: Instant::now(),
        }
    }
}

/// A logged step whose statistics were left on the device: its line is written once the next
/// step is queued behind it. Reading a queued step waits for the device to finish it; read
/// right after queueing it, the device would then sit idle while the host logs, fetches the next
/// batch and queues that step's first kernels (a gap measured at 1–2 % of a step on one H200
/// with `log_interval: 1`). One step later the device has that step to run during the wait.
struct DeferredLine {
    iteration: u64,
    lr: f64,
    state: ResumeState,
}

pub(crate) fn run_loop(
    context: &LoopContext<'_>,
    stepper: &mut dyn RankStep,
    mut state: ResumeState,
    mut reporter: Option<&mut Reporter>,
) -> Result<RunSummary, TrainError> {
    let plan = context.plan;
    let recipe = &context.setup.recipe;
    let training = &recipe.training;
    let seq_length = recipe.model.seq_length as usize;
    let global_batch = plan.global_batch_size;
    let tokens_per_iteration = u64::from(global_batch) * seq_length as u64;
    let train_iters = plan.train_iters;
    let mut summary = RunSummary {
        start_iteration: state.iteration,
        iteration: state.iteration,
        train_iters,
        last_loss: None,
        last_eval_loss: None,
        test_loss: None,
        checkpoint: None,
        stopped: None,
        losses: Vec::new(),
        data_cache_keys: context.setup.data.cache_keys(),
    };
    let eval_batches = match context.setup.data.valid.as_ref() {
        Some(valid) if context.setup.recipe.training.eval_interval > 0 => {
            batches_of(context, valid)?
        }
        _ => Vec::new(),
    };
    let mut interval = Interval::new();
    let mut deferred: Option<DeferredLine> = None;
    // The step-time histogram observes the wall time since the previous iteration ended (its
    // logging, evaluation and checkpoint done): a queued (device-resident) step returns before
    // it ran, so the call's own time would be the host's enqueue time, while this span also
    // holds the wait where the host reads the queue.
    let mut iteration_end = Instant::now();
    let mut unread: Vec<PendingStats> = Vec::new();

    while state.iteration < train_iters {
        let iteration = state.iteration + 1;
        fail::fail_point!("train-step");
        let microbatches = rank_microbatches(context, state.consumed_samples)?;
        let lr = context
            .setup
            .schedule
            .lr(iteration, state.consumed_tokens + tokens_per_iteration);
        let step_context = StepContext {
            iteration,
            seed: training.seed,
            lr,
            clip_grad: training.clip_grad,
        };
        let pending = stepper.step(&microbatches, step_context)?;
        let queued = pending.waits();
        state.iteration = iteration;
        state.consumed_samples += u64::from(global_batch);
        state.consumed_tokens += tokens_per_iteration;
        summary.iteration = iteration;
        unread.push(pending);
        if let Some(line) = deferred.take() {
            let newest = unread.pop();
            let stats = read_queued(&mut unread, &mut summary, &mut interval)?;
            unread.extend(newest);
            if let (Some(stats), Some(reporter)) = (stats, reporter.as_deref_mut()) {
                log_line(reporter, context, &line, &stats, &interval)?;
            }
            interval = Interval::new();
        }

        let last = iteration == train_iters;
        let log_due = iteration.is_multiple_of(training.log_interval) || last;
        let eval_due = training.eval_interval > 0
            && (iteration.is_multiple_of(training.eval_interval) || last)
            && !eval_batches.is_empty();
        let interval_due = recipe
            .checkpoint
            .interval
            .is_some_and(|n| n > 0 && iteration.is_multiple_of(n));
        let stop_requested = context.options.stop.requested();
        let exit_due = context
            .options
            .exit_interval
            .is_some_and(|n| n > 0 && iteration.is_multiple_of(n) && !last);
        // The host reads the queued steps only when it must: to log, evaluate, save or stop. A
        // non-finite step surfaces here, before anything is saved (a deferred line's step one
        // iteration later, still before anything is saved).
        let must_read = last || eval_due || interval_due || stop_requested || exit_due;
        let defer = log_due && !must_read && queued;
        let stats = if must_read || (log_due && !defer) {
            read_queued(&mut unread, &mut summary, &mut interval)?
        } else {
            None
        };
        interval.steps += 1;
        if let Some(reporter) = reporter.as_deref_mut() {
            reporter.metrics.record_iteration(IterationCounts {
                seconds: iteration_end.elapsed().as_secs_f64(),
                tokens: tokens_per_iteration,
                samples: u64::from(global_batch),
            });
        }

        let line = DeferredLine {
            iteration,
            lr,
            state,
        };
        if defer {
            deferred = Some(line);
        } else if log_due {
            if let (Some(stats), Some(reporter)) = (stats, reporter.as_deref_mut()) {
                log_line(reporter, context, &line, &stats, &interval)?;
            }
            interval = Interval::new();
        }

        if eval_due {
            let eval_loss = stepper.evaluate(&eval_batches)?;
            summary.last_eval_loss = Some(eval_loss);
            if let Some(reporter) = reporter.as_deref_mut() {
                reporter.log_eval(iteration, eval_loss)?;
            }
            // evaluation time is not training throughput
            interval.start = Instant::now();
        }
        if last && let Some(test) = context.setup.data.test.as_ref() {
            let test_loss = stepper.evaluate(&batches_of(context, test)?)?;
            summary.test_loss = Some(test_loss);
            if let Some(reporter) = reporter.as_deref_mut() {
                reporter.log_test(iteration, test_loss)?;
            }
        }

        let stop = if stepper.any_rank(stop_requested)? {
            Some(StopReason::Signal)
        } else if exit_due {
            Some(StopReason::ExitInterval)
        } else {
            None
        };
        if stop.is_some() {
            // Another rank's stop: this rank's queued steps are read before it saves.
            let stats = read_queued(&mut unread, &mut summary, &mut interval)?;
            if let (Some(line), Some(stats), Some(reporter)) =
                (deferred.take(), stats, reporter.as_deref_mut())
            {
                log_line(reporter, context, &line, &stats, &interval)?;
            }
        }
        if let Some(store) = context.setup.store.as_ref()
            && (interval_due || last || stop.is_some())
        {
            let info = CheckpointInfo {
                state,
                plan,
                recipe,
                shape: &context.setup.shape,
            };
            let path = stepper.save(store, &info)?;
            if let Some(reporter) = reporter.as_deref() {
                reporter.saved(iteration, &path);
            }
            summary.checkpoint = Some(path);
        }
        if let Some(reason) = stop {
            if let Some(reporter) = reporter.as_deref() {
                reporter.stopped(iteration, reason, summary.checkpoint.as_deref());
            }
            summary.stopped = Some(reason);
            break;
        }
        iteration_end = Instant::now();
    }
    Ok(summary)
}

/// The line of the log interval ending at `line`'s step, whose statistics are `stats`.
fn log_line(
    reporter: &mut Reporter,
    context: &LoopContext<'_>,
    line: &DeferredLine,
    stats: &StepStats,
    interval: &Interval,
) -> Result<(), TrainError> {
    let plan = context.plan;
    let tokens_per_iteration =
        u64::from(plan.global_batch_size) * u64::from(context.setup.recipe.model.seq_length);
    let steps = interval.steps as f64;
    let step_seconds = interval.start.elapsed().as_secs_f64().max(1e-9) / steps;
    let per_gpu = plan.flops_per_iteration / step_seconds / f64::from(plan.world_size);
    let step_metrics = StepMetrics {
        step: line.iteration,
        loss: interval.loss / steps,
        lr: line.lr,
        grad_norm: stats.grad_norm,
        tokens_per_second: tokens_per_iteration as f64 / step_seconds,
        tflops_per_gpu: per_gpu / 1e12,
        // A CPU rank's peak is the planner's nominal one: no utilisation to report.
        mfu: (plan.cluster.gpu != GpuKind::Cpu).then(|| per_gpu / plan.hardware.peak_flops),
        step_seconds,
        memory_bytes: context.options.memory.bytes(),
    };
    reporter.log_step(&step_metrics, interval.lm_loss / steps, &line.state)
}

/// Reads the queued steps in order into the run's losses and the log interval's sums; the last
/// one's statistics (for the log line) come back. A non-finite step is the error here.
fn read_queued(
    unread: &mut Vec<PendingStats>,
    summary: &mut RunSummary,
    interval: &mut Interval,
) -> Result<Option<StepStats>, TrainError> {
    let mut last = None;
    for pending in unread.drain(..) {
        let step = pending.read()?;
        summary.last_loss = Some(step.loss);
        summary.losses.push(step.loss);
        interval.loss += step.loss;
        interval.lm_loss += step.lm_loss;
        last = Some(step);
    }
    Ok(last)
}

/// The microbatches of this rank's share of the global batch that starts at `consumed`.
fn rank_microbatches(
    context: &LoopContext<'_>,
    consumed: u64,
) -> Result<Vec<Microbatch>, TrainError> {
    let plan = context.plan;
    let seq_length = context.setup.recipe.model.seq_length as usize;
    let indices = rank_batch_indices(
        consumed,
        plan.global_batch_size,
        context.dp_rank,
        context.dp_size,
    );
    let samples = indices
        .map(|i| context.setup.data.train.sample(i))
        .collect::<Result<Vec<_>, _>>()?;
    samples
        .chunks(plan.micro_batch_size as usize)
        .map(|chunk| Microbatch::from_samples(chunk, seq_length))
        .collect()
}

/// The fixed validation batches every evaluation uses: `eval_iters` global batches from the
/// start of the validation split (this rank's data-parallel share of them), so successive
/// evaluations are comparable.
/// `eval_iters` global batches of `dataset`, this rank's share, as microbatches.
fn batches_of(
    context: &LoopContext<'_>,
    valid: &BlendedDataset,
) -> Result<Vec<Microbatch>, TrainError> {
    let training = &context.setup.recipe.training;
    let seq_length = context.setup.recipe.model.seq_length as usize;
    let count = (training.eval_iters * u64::from(context.plan.global_batch_size)).min(valid.len());
    let count = u32::try_from(count).unwrap_or(u32::MAX);
    let samples = rank_batch_indices(0, count, context.dp_rank, context.dp_size)
        .map(|i| valid.sample(i))
        .collect::<Result<Vec<_>, _>>()?;
    samples
        .chunks(context.plan.micro_batch_size as usize)
        .map(|chunk| Microbatch::from_samples(chunk, seq_length))
        .collect()
}
