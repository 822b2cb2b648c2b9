//! The iteration loop every rank runs, one rank or many: fetch the rank's share of the global
//! batch, step, and keep the cadence — logging, evaluation, checkpoints, the signal and exit
//! conditions. What a step *is* (one model, or pipeline chunks with collectives) sits behind
//! [`RankStep`]; what gets printed and written (metrics, JSONL, TensorBoard, progress) is the
//! [`Reporter`]'s, which only global rank 0 has.
//!
//! Steps are queued and their statistics read only where the loop needs them — a logged step, an
//! evaluation, a checkpoint, the exit interval, the last step — all queued steps at once, in one
//! host read (`crate::run::pending`). Those iterations are the same on every rank, and so is what
//! is read, so decisions taken from it are the ranks' common ones: a non-finite step fails all of
//! them, and a stop (SIGTERM/SIGINT, which some ranks may see an iteration before others) is agreed
//! there by a device all-reduce of the ranks' flags read with the statistics. Megatron's
//! `--exit-signal-handler` agrees every iteration by reading an all-gather, a host synchronisation
//! per step; here a signal takes effect at the next logged step (one iteration later when that
//! step's read is deferred), the price of no host read between them. A rank alone has nobody to
//! agree with and stops on its flag after the step it is in.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ferrotron_data::{BlendedDataset, rank_batch_indices};
use ferrotron_plan::Plan;
use ferrotron_recipe::{GpuKind, Recipe};
use ferrotron_telemetry::{
    IterationCounts, JsonlWriter, MemoryProbe, Metrics, MetricsServer, Progress, StepMetrics,
    TensorBoardWriter,
};
use serde::Serialize;

use crate::checkpoint::{CheckpointInfo, CheckpointStore, write_recipe};
use crate::run::eval_batches::eval_start;
use crate::run::pending::{DeviceValues, read_together};
use crate::run::resume::ResumeState;
use crate::run::setup::RunSetup;
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
pub(crate) fn training_loop(
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
    let outcome = run_iterations(&context, step, state, reporter.as_mut());
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
    /// Save a checkpoint (collective: every rank calls it at the same iteration): the committed
    /// folder, or `None` while a writer thread writes it (`checkpoint.async_save`) until
    /// [`Self::settle_save`].
    fn save(
        &mut self,
        store: &CheckpointStore,
        info: &CheckpointInfo<'_>,
    ) -> Result<Option<PathBuf>, TrainError>;
    /// Sets aside what an asynchronous save's snapshot reads into (a GPU's page-locked host
    /// memory), once the first step has laid the optimizer's state out: page-locking gigabytes
    /// takes seconds, which the first save's next update would otherwise wait for.
    fn reserve_snapshot(&mut self) {}
    /// The first step is queued: the backend's per-op timing starts over from here.
    fn first_step_queued(&mut self) {}
    /// Wait for the save in flight and agree that every rank's part committed (collective):
    /// its iteration and folder, `None` when no save is in flight.
    fn settle_save(&mut self) -> Result<Option<(u64, PathBuf)>, TrainError> {
        Ok(None)
    }
    /// Whether the rank has peers to agree with on stopping: alone, it stops on its own flag.
    fn has_peers(&self) -> bool;
    /// Queues the agreement on stopping: a value above 0 when `local` holds on any rank, read
    /// with the queued steps' statistics. A stop must be agreed, or the ranks that go on would
    /// wait forever for those that stopped.
    fn agree_stop(&self, local: bool) -> DeviceValues;
    /// Every group's members issued the same collectives so far (debug builds check it after
    /// each step: `ferrotron_dist::OrderDigest`); nothing to check for a rank alone.
    fn agree_on_order(&self) -> Result<(), TrainError> {
        Ok(())
    }
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

    /// The Prometheus exposition of the run's metrics (the step-time histogram's tests read it).
    #[cfg(test)]
    pub(crate) fn metrics_text(&self) -> String {
        self.metrics.encode_text()
    }

    /// An asynchronous save started: training stopped for `stall` (the snapshot's host values
    /// taken; the device's are read by the writer while the next step runs).
    fn saving(&self, iteration: u64, stall: Duration) {
        self.message(&format!(
            "iteration {iteration}: checkpoint snapshot taken (training stopped {:.2} s), \
             being read and written in the background",
            stall.as_secs_f64()
        ));
    }

    /// A committed checkpoint; `stall`, where the save stopped training, for how long.
    fn saved(&self, iteration: u64, path: &Path, stall: Option<Duration>) {
        let stall = stall.map_or_else(String::new, |stall| {
            format!(" (training stopped {:.2} s)", stall.as_secs_f64())
        });
        self.message(&format!(
            "iteration {iteration}: saved checkpoint {}{stall}",
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

/// `plan.json` and the resolved recipe in the run directory (beside the checkpoints, by
/// default), so it explains itself without the recipe file that started it.
fn write_run_dir(run_dir: &Path, plan: &Plan, recipe: &Recipe) -> Result<(), TrainError> {
    plan.write_to(run_dir).map_err(|e| {
        TrainError::Config(format!(
            "cannot write plan.json into {}: {e}",
            run_dir.display()
        ))
    })?;
    write_recipe(run_dir, recipe)
}

/// Sums since the last log line, for interval averages as Megatron prints them.
#[derive(Default)]
struct Interval {
    steps: u64,
    loss: f64,
    lm_loss: f64,
}

/// When the steps finished, as far as the host can tell: the wall time of each step, device
/// completion included, for the log lines' step time and the step-time histogram.
///
/// A queued step's statistics are read later, and a read waits for every step queued before it
/// (the device runs them in order and the read queues behind them): a deferred line's read,
/// made once the next step is queued, returns only when that next step is done too. Timing a
/// line from the end of the previous read would give the next step's time to this line, twice
/// the time to the first line and nothing to a line whose step was finished by an earlier read
/// (the last step, or one that evaluates or saves: ~0.1 ms and an MFU of 300,000 % on a GPU).
/// So the clock notes the moments when everything queued is done (a read returns; a host step
/// returns from `step`) and the steps queued since the previous such moment share the time
/// between the two. Time spent evaluating and saving is left out, as Megatron stops its
/// interval timer for both.
struct StepClock {
    /// The last moment nothing queued was left to run (or the run's start).
    settled: Instant,
    /// Steps queued since `settled`.
    unsettled: u64,
    /// The seconds of settled steps no log line has taken yet, oldest first.
    timed: VecDeque<f64>,
    /// What each step counts in the histogram besides its time.
    counts: IterationCounts,
}

impl StepClock {
    fn new(tokens: u64, samples: u64) -> Self {
        StepClock {
            settled: Instant::now(),
            unsettled: 0,
            timed: VecDeque::new(),
            counts: IterationCounts {
                seconds: 0.0,
                tokens,
                samples,
            },
        }
    }

    /// A step was queued; one that does not `wait` for a device is already done.
    fn queued(&mut self, waits: bool, metrics: Option<&Metrics>) {
        self.unsettled += 1;
        if !waits {
            self.settle(metrics);
        }
    }

    /// Every step queued so far is done now: they share the time since the last such moment,
    /// each observed by the step-time histogram.
    fn settle(&mut self, metrics: Option<&Metrics>) {
        if self.unsettled == 0 {
            return;
        }
        let now = Instant::now();
        let seconds = now.duration_since(self.settled).as_secs_f64() / self.unsettled as f64;
        for _ in 0..self.unsettled {
            self.timed.push_back(seconds);
            if let Some(metrics) = metrics {
                metrics.record_iteration(IterationCounts {
                    seconds,
                    ..self.counts
                });
            }
        }
        self.settled = now;
        self.unsettled = 0;
    }

    /// The time since the last settled moment was not the steps' (an evaluation, a save): left
    /// out, when nothing is queued (as after either, which read every step first).
    fn leave_out(&mut self) {
        if self.unsettled == 0 {
            self.settled = Instant::now();
        }
    }

    /// The wall time of the oldest `steps` settled steps: a log interval's.
    fn take(&mut self, steps: u64) -> f64 {
        let steps = (steps as usize).min(self.timed.len());
        self.timed.drain(..steps).sum()
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

pub(crate) fn run_iterations(
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
    let valid = context
        .setup
        .data
        .valid
        .as_ref()
        .filter(|_| training.eval_interval > 0);
    let mut interval = Interval::default();
    let mut clock = StepClock::new(tokens_per_iteration, u64::from(global_batch));
    let mut deferred: Option<DeferredLine> = None;
    let mut unread: Vec<PendingStats> = Vec::new();
    // the ranks' agreement on stopping, queued at the last read point and not read yet
    let mut vote: Option<DeviceValues> = None;
    let has_peers = stepper.has_peers();

    let first_iteration = state.iteration + 1;
    while state.iteration < train_iters {
        let iteration = state.iteration + 1;
        fail::fail_point!("train-step", |what| -> Result<RunSummary, TrainError> {
            ferrotron_dist::fault::die(what)
        });
        let microbatches = rank_microbatches(context, state.consumed_samples)?;
        let lr = context.setup.schedule.lr(iteration, state.consumed_tokens);
        let step_context = StepContext {
            iteration,
            seed: training.seed,
            lr,
            clip_grad: training.clip_grad,
        };
        // The first step of this process is where the model's buffers, the pool and anything
        // NCCL still connects lazily meet: free device memory on either side of its queueing
        // (allocations happen as work is queued, so no wait is needed to see them).
        let first = iteration == first_iteration;
        if first {
            context.options.memory.log_device("before the first step");
        }
        let pending = stepper.step(&microbatches, step_context)?;
        if cfg!(debug_assertions) {
            stepper.agree_on_order()?;
        }
        if first {
            context
                .options
                .memory
                .log_device("after queueing the first step");
            stepper.first_step_queued();
            if recipe.checkpoint.async_save && context.setup.store.is_some() {
                stepper.reserve_snapshot();
            }
        }
        let queued = pending.waits();
        clock.queued(queued, metrics(&reporter));
        state.iteration = iteration;
        state.consumed_samples += u64::from(global_batch);
        state.consumed_tokens += tokens_per_iteration;
        summary.iteration = iteration;
        unread.push(pending);
        // whether the ranks agreed to stop, in a read of this iteration
        let mut agreed_stop = false;
        if let Some(line) = deferred.take() {
            let newest = unread.pop();
            let (stats, stop) = read_queued(
                &mut unread,
                vote.take(),
                &mut summary,
                &mut interval,
                &mut clock,
                metrics(&reporter),
            )?;
            agreed_stop |= stop;
            unread.extend(newest);
            end_interval(
                &mut reporter,
                context,
                &line,
                stats,
                &mut interval,
                &mut clock,
            )?;
        }

        let last = iteration == train_iters;
        let log_due = iteration.is_multiple_of(training.log_interval) || last;
        let eval_due =
            valid.is_some() && (iteration.is_multiple_of(training.eval_interval) || last);
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
        // iteration later, still before anything is saved). Every rank reads at the same
        // iterations, and ranks with peers agree on a stop only there (see the module docs): a
        // rank alone stops on its own flag at once.
        let must_read =
            last || eval_due || interval_due || exit_due || (stop_requested && !has_peers);
        if has_peers && (must_read || log_due) {
            vote = Some(stepper.agree_stop(stop_requested));
        }
        let defer = log_due && !must_read && queued;
        let stats = if must_read || (log_due && !defer) {
            let (stats, stop) = read_queued(
                &mut unread,
                vote.take(),
                &mut summary,
                &mut interval,
                &mut clock,
                metrics(&reporter),
            )?;
            agreed_stop |= stop;
            stats
        } else {
            None
        };
        interval.steps += 1;

        let line = DeferredLine {
            iteration,
            lr,
            state,
        };
        if defer {
            deferred = Some(line);
        } else if log_due {
            end_interval(
                &mut reporter,
                context,
                &line,
                stats,
                &mut interval,
                &mut clock,
            )?;
        }

        if eval_due && let Some(valid) = valid {
            let start = eval_start(training, iteration, global_batch);
            let eval_loss = stepper.evaluate(&eval_microbatches(context, valid, start)?)?;
            summary.last_eval_loss = Some(eval_loss);
            if let Some(reporter) = reporter.as_deref_mut() {
                reporter.log_eval(iteration, eval_loss)?;
            }
            clock.leave_out();
        }
        if last && let Some(test) = context.setup.data.test.as_ref() {
            let test_loss = stepper.evaluate(&eval_microbatches(context, test, 0)?)?;
            summary.test_loss = Some(test_loss);
            if let Some(reporter) = reporter.as_deref_mut() {
                reporter.log_test(iteration, test_loss)?;
            }
        }

        let signalled = if has_peers {
            agreed_stop
        } else {
            stop_requested
        };
        let stop = if signalled {
            Some(StopReason::Signal)
        } else if exit_due {
            Some(StopReason::ExitInterval)
        } else {
            None
        };
        if stop.is_some() {
            // Another rank's stop: this rank's queued steps are read before it saves.
            let (stats, _) = read_queued(
                &mut unread,
                vote.take(),
                &mut summary,
                &mut interval,
                &mut clock,
                metrics(&reporter),
            )?;
            if let Some(line) = deferred.take() {
                end_interval(
                    &mut reporter,
                    context,
                    &line,
                    stats,
                    &mut interval,
                    &mut clock,
                )?;
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
            let start = Instant::now();
            // the previous save in flight, committed before this one starts
            if let Some((saved, path)) = stepper.settle_save()? {
                report_saved(&reporter, &mut summary, saved, path, None);
            }
            match stepper.save(store, &info)? {
                Some(path) => {
                    let stall = Some(start.elapsed());
                    report_saved(&reporter, &mut summary, iteration, path, stall);
                }
                None if last || stop.is_some() => {
                    if let Some((saved, path)) = stepper.settle_save()? {
                        let stall = Some(start.elapsed());
                        report_saved(&reporter, &mut summary, saved, path, stall);
                    }
                }
                None => {
                    if let Some(reporter) = reporter.as_deref() {
                        reporter.saving(iteration, start.elapsed());
                    }
                }
            }
            clock.leave_out();
        }
        if let Some(reason) = stop {
            if let Some(reporter) = reporter.as_deref() {
                reporter.stopped(iteration, reason, summary.checkpoint.as_deref());
            }
            summary.stopped = Some(reason);
            break;
        }
    }
    Ok(summary)
}

/// A committed checkpoint: the lead rank says so, and it is the run's newest.
fn report_saved(
    reporter: &Option<&mut Reporter>,
    summary: &mut RunSummary,
    iteration: u64,
    path: PathBuf,
    stall: Option<Duration>,
) {
    if let Some(reporter) = reporter.as_deref() {
        reporter.saved(iteration, &path, stall);
    }
    summary.checkpoint = Some(path);
}

/// The lead rank's metrics, where the step-time histogram goes.
fn metrics<'a>(reporter: &'a Option<&mut Reporter>) -> Option<&'a Metrics> {
    reporter.as_deref().map(|reporter| &reporter.metrics)
}

/// Ends the log interval whose last step is `line`'s (statistics `stats`): every rank takes its
/// steps' time off the clock, the lead rank writes its line.
fn end_interval(
    reporter: &mut Option<&mut Reporter>,
    context: &LoopContext<'_>,
    line: &DeferredLine,
    stats: Option<StepStats>,
    interval: &mut Interval,
    clock: &mut StepClock,
) -> Result<(), TrainError> {
    let ended = std::mem::take(interval);
    let seconds = clock.take(ended.steps);
    match (stats, reporter.as_deref_mut()) {
        (Some(stats), Some(reporter)) => log_line(reporter, context, line, &stats, &ended, seconds),
        _ => Ok(()),
    }
}

/// The line of the log interval ending at `line`'s step, whose statistics are `stats` and whose
/// steps took `seconds` of wall time.
fn log_line(
    reporter: &mut Reporter,
    context: &LoopContext<'_>,
    line: &DeferredLine,
    stats: &StepStats,
    interval: &Interval,
    seconds: f64,
) -> Result<(), TrainError> {
    let plan = context.plan;
    let tokens_per_iteration =
        u64::from(plan.global_batch_size) * u64::from(context.setup.recipe.model.seq_length);
    let steps = interval.steps as f64;
    let step_seconds = seconds.max(1e-9) / steps;
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

/// Reads the queued steps in order into the run's losses and the log interval's sums, and the
/// ranks' `vote` on stopping with them, in one host read; the last step's statistics (for the
/// log line) and whether the ranks agreed to stop come back. A non-finite step is the error
/// here.
fn read_queued(
    unread: &mut Vec<PendingStats>,
    vote: Option<DeviceValues>,
    summary: &mut RunSummary,
    interval: &mut Interval,
    clock: &mut StepClock,
    metrics: Option<&Metrics>,
) -> Result<(Option<StepStats>, bool), TrainError> {
    let (steps, stop) = read_together(std::mem::take(unread), vote)?;
    let mut last = None;
    for step in steps {
        summary.last_loss = Some(step.loss);
        summary.losses.push(step.loss);
        interval.loss += step.loss;
        interval.lm_loss += step.lm_loss;
        last = Some(step);
    }
    // Nothing queued before the read is left to run: those steps are done now.
    clock.settle(metrics);
    Ok((last, stop))
}

/// The microbatches of this rank's share of the training global batch that starts at
/// `consumed`.
fn rank_microbatches(
    context: &LoopContext<'_>,
    consumed: u64,
) -> Result<Vec<Microbatch>, TrainError> {
    global_batch_microbatches(context, &context.setup.data.train, consumed)
}

/// This rank's microbatches of the `eval_iters` global batches of `dataset` from sample `start`,
/// each global batch shared over the data-parallel ranks as a training batch is, so any number
/// of ranks evaluates the same samples in the same microbatches.
fn eval_microbatches(
    context: &LoopContext<'_>,
    dataset: &BlendedDataset,
    start: u64,
) -> Result<Vec<Microbatch>, TrainError> {
    let global_batch = u64::from(context.plan.global_batch_size);
    let mut microbatches = Vec::new();
    for batch in 0..context.setup.recipe.training.eval_iters {
        let first = start + batch * global_batch;
        microbatches.extend(global_batch_microbatches(context, dataset, first)?);
    }
    Ok(microbatches)
}

/// The microbatches of this rank's share of the global batch of `dataset` that starts at sample
/// `first`.
fn global_batch_microbatches(
    context: &LoopContext<'_>,
    dataset: &BlendedDataset,
    first: u64,
) -> Result<Vec<Microbatch>, TrainError> {
    let plan = context.plan;
    let seq_length = context.setup.recipe.model.seq_length as usize;
    let indices = rank_batch_indices(
        first,
        plan.global_batch_size,
        context.dp_rank,
        context.dp_size,
    );
    let samples = indices
        .map(|i| dataset.sample(i))
        .collect::<Result<Vec<_>, _>>()?;
    samples
        .chunks(plan.micro_batch_size as usize)
        .map(|chunk| Microbatch::from_samples(chunk, seq_length))
        .collect()
}
