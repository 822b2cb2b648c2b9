//! The training loop of one rank: set up (data, model, optimizer, resume), then steps with
//! logging, evaluation, checkpoints and the stop/exit conditions. It takes a [`Plan`], never
//! YAML, and reports through telemetry and its return value; printing is the progress display's.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use ferrotron_data::{GptData, Tokenizer, build_gpt_data, rank_batch_indices};
use ferrotron_model::{GptModel, ModelConfig};
use ferrotron_plan::Plan;
use ferrotron_recipe::{Recipe, ResumePolicy};
use ferrotron_telemetry::{JsonlWriter, Metrics, MetricsServer, Progress, StepMetrics};
use serde::Serialize;

use crate::checkpoint::{CheckpointStore, ModelShape};
use crate::resume::{ResumeState, resume_from, save_checkpoint};
use crate::step::{Microbatch, StepContext, evaluate, train_step};
use crate::{AdamW, AdamWConfig, LrSchedule, StopFlag, TrainError};

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
    /// The newest checkpoint written by this run.
    pub checkpoint: Option<PathBuf>,
    /// The run stopped early on a signal or the exit interval.
    pub stopped: Option<StopReason>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Signal,
    ExitInterval,
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
}

/// Train `plan` on this process (one rank) on `device`.
pub fn train<B: AutodiffBackend>(
    plan: &Plan,
    options: &RunOptions,
    device: &B::Device,
) -> Result<RunSummary, TrainError> {
    if plan.world_size != 1 {
        return Err(TrainError::Config(format!(
            "this build trains on one rank; the plan has {} ranks (the parallel layouts arrive with their own issue)",
            plan.world_size
        )));
    }
    let recipe = runtime_recipe(plan);
    if let Some(threads) = recipe.runtime.threads {
        use_cpu_threads(threads);
    }
    let global_batch = u64::from(plan.global_batch_size);
    let train_iters = plan.train_iters;
    let seed = recipe.training.seed;

    let tokenizer = Tokenizer::from_recipe(&recipe.data.tokenizer)?;
    let eval_samples = if recipe.training.eval_interval > 0 {
        recipe.training.eval_iters * global_batch
    } else {
        0
    };
    let data = build_gpt_data(
        &recipe.data,
        recipe.model.seq_length,
        seed,
        [train_iters * global_batch, eval_samples, 0],
        &tokenizer,
    )?;

    let model_config =
        ModelConfig::from_model_with_vocab(&recipe.model, plan.vocab_size, plan.padded_vocab_size)?;
    B::seed(device, seed);
    let mut model: GptModel<B> = model_config.init(device);
    let mut optimizer = AdamW::<B::InnerBackend>::new(
        AdamWConfig::from_recipe(&recipe.training.optimizer),
        model.no_weight_decay_params(),
    );
    let schedule = LrSchedule::from_recipe(&recipe, train_iters)?;
    let shape = ModelShape::of(&recipe.model, plan.padded_vocab_size);
    let store = recipe
        .checkpoint
        .dir
        .as_ref()
        .map(|dir| CheckpointStore::new(dir, recipe.checkpoint.keep_last));

    let mut state = ResumeState::fresh();
    let mut resumed_from = None;
    if let Some(found) = resume_source(&recipe, store.as_ref())? {
        let (loaded, resumed) =
            resume_from::<B>(&found, model, &mut optimizer, &shape, &recipe, device)?;
        model = loaded;
        state = resumed;
        resumed_from = Some(found);
    }
    let progress = Progress::new(train_iters, state.iteration);
    if let Some(found) = resumed_from {
        progress.message(&format!(
            "resumed from {} at iteration {} ({} samples consumed)",
            found.display(),
            state.iteration,
            state.consumed_samples
        ));
    }

    write_run_dir(&options.run_dir, plan, &recipe)?;
    let metrics = Metrics::new(&recipe.name, 0)?;
    let _server: Option<MetricsServer> = match &recipe.logging.prometheus {
        Some(prometheus) => {
            let server = metrics.serve(&prometheus.address, prometheus.port)?;
            (options.announce)(&format!("http://{}/metrics", server.local_addr()));
            Some(server)
        }
        None => None,
    };
    let mut jsonl = match &recipe.logging.jsonl {
        Some(path) => Some(JsonlWriter::open(Path::new(path))?),
        None => None,
    };

    let context = LoopContext {
        plan,
        recipe: &recipe,
        data: &data,
        schedule: &schedule,
        shape: &shape,
        store: store.as_ref(),
        options,
    };
    let outcome = run_loop(
        &context,
        model,
        &mut optimizer,
        state,
        &metrics,
        &mut jsonl,
        &progress,
        device,
    );
    progress.finish();
    outcome
}

struct LoopContext<'a> {
    plan: &'a Plan,
    recipe: &'a Recipe,
    data: &'a GptData,
    schedule: &'a LrSchedule,
    shape: &'a ModelShape,
    store: Option<&'a CheckpointStore>,
    options: &'a RunOptions,
}

/// Sums since the last log line, for interval averages as Megatron prints them.
#[derive(Default)]
struct Interval {
    steps: u64,
    loss: f64,
    lm_loss: f64,
}

#[allow(clippy::too_many_arguments)]
fn run_loop<B: AutodiffBackend>(
    context: &LoopContext<'_>,
    mut model: GptModel<B>,
    optimizer: &mut AdamW<B::InnerBackend>,
    mut state: ResumeState,
    metrics: &Metrics,
    jsonl: &mut Option<JsonlWriter>,
    progress: &Progress,
    device: &B::Device,
) -> Result<RunSummary, TrainError> {
    let plan = context.plan;
    let recipe = context.recipe;
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
        checkpoint: None,
        stopped: None,
    };
    let eval_batches = eval_batches(context)?;
    let mut interval = Interval::default();
    let mut interval_start = Instant::now();

    while state.iteration < train_iters {
        let iteration = state.iteration + 1;
        let microbatches = rank_microbatches(context, state.consumed_samples)?;
        let lr = context
            .schedule
            .lr(iteration, state.consumed_tokens + tokens_per_iteration);
        let step_context = StepContext {
            iteration,
            seed: training.seed,
            lr,
            clip_grad: training.clip_grad,
        };
        let (next, stats) = train_step(model, optimizer, &microbatches, step_context, device)?;
        model = next;
        state.iteration = iteration;
        state.consumed_samples += u64::from(global_batch);
        state.consumed_tokens += tokens_per_iteration;
        summary.iteration = iteration;
        summary.last_loss = Some(stats.loss);
        interval.steps += 1;
        interval.loss += stats.loss;
        interval.lm_loss += stats.lm_loss;

        let last = iteration == train_iters;
        if iteration.is_multiple_of(training.log_interval) || last {
            let elapsed = interval_start.elapsed().as_secs_f64().max(1e-9);
            let steps = interval.steps as f64;
            let step_seconds = elapsed / steps;
            let flops_per_second = plan.flops_per_iteration / step_seconds;
            let per_gpu = flops_per_second / f64::from(plan.world_size);
            let step_metrics = StepMetrics {
                step: iteration,
                loss: interval.loss / steps,
                lr,
                grad_norm: stats.grad_norm,
                tokens_per_second: tokens_per_iteration as f64 / step_seconds,
                tflops_per_gpu: per_gpu / 1e12,
                mfu: per_gpu / plan.hardware.peak_flops,
                step_seconds,
                memory_bytes: ferrotron_telemetry::process_memory_bytes(),
            };
            metrics.record_step(&step_metrics);
            progress.update(&step_metrics);
            if let Some(writer) = jsonl.as_mut() {
                writer.write(&Record::Train {
                    metrics: &step_metrics,
                    lm_loss: interval.lm_loss / steps,
                    consumed_samples: state.consumed_samples,
                    consumed_tokens: state.consumed_tokens,
                })?;
            }
            interval = Interval::default();
            interval_start = Instant::now();
        }

        let eval_due = training.eval_interval > 0
            && (iteration.is_multiple_of(training.eval_interval) || last)
            && !eval_batches.is_empty();
        if eval_due {
            let eval_loss = evaluate(&model.valid(), &eval_batches, device);
            summary.last_eval_loss = Some(eval_loss);
            metrics.record_eval(iteration, eval_loss);
            progress.message(&format!(
                "iteration {iteration}: validation loss {eval_loss:.4}, perplexity {:.2}",
                eval_loss.exp()
            ));
            if let Some(writer) = jsonl.as_mut() {
                writer.write(&Record::Eval {
                    step: iteration,
                    eval_loss,
                    eval_perplexity: eval_loss.exp(),
                })?;
            }
            // evaluation time is not training throughput
            interval_start = Instant::now();
        }

        let stop = if context.options.stop.requested() {
            Some(StopReason::Signal)
        } else if context
            .options
            .exit_interval
            .is_some_and(|n| n > 0 && iteration.is_multiple_of(n) && !last)
        {
            Some(StopReason::ExitInterval)
        } else {
            None
        };
        let interval_due = recipe
            .checkpoint
            .interval
            .is_some_and(|n| n > 0 && iteration.is_multiple_of(n));
        if let Some(store) = context.store
            && (interval_due || last || stop.is_some())
        {
            let path = save_checkpoint(
                store,
                &model,
                optimizer,
                &state,
                plan,
                recipe,
                context.shape,
            )?;
            progress.message(&format!(
                "iteration {iteration}: saved checkpoint {}",
                path.display()
            ));
            summary.checkpoint = Some(path);
        }
        if let Some(reason) = stop {
            let why = match reason {
                StopReason::Signal => "stop requested (signal)",
                StopReason::ExitInterval => "exit interval reached",
            };
            let saved = match &summary.checkpoint {
                Some(path) => format!("checkpoint {}", path.display()),
                None => "no checkpoint (checkpoint.dir is not set)".to_owned(),
            };
            progress.message(&format!("iteration {iteration}: {why}; {saved}"));
            summary.stopped = Some(reason);
            break;
        }
    }
    Ok(summary)
}

/// The recipe as the runtime uses it: the plan's resolved copy with the real vocabulary
/// recorded (so the loss and sampling ignore Megatron's padding rows) and `extends` dropped
/// (it is already merged).
fn runtime_recipe(plan: &Plan) -> Recipe {
    let mut recipe = plan.recipe.clone();
    recipe.model.vocab_size = Some(plan.vocab_size);
    recipe.extends = None;
    recipe
}

/// Size the CPU backend's worker pool (`runtime.threads`). The pool is process-wide and can be
/// sized only before its first use; a later request is reported and ignored.
fn use_cpu_threads(threads: u32) {
    if let Err(e) = rayon::ThreadPoolBuilder::new()
        .num_threads(threads as usize)
        .build_global()
    {
        tracing::warn!("runtime.threads = {threads} not applied: {e}");
    }
}

/// Which checkpoint to continue from, by `checkpoint.resume`.
fn resume_source(
    recipe: &Recipe,
    store: Option<&CheckpointStore>,
) -> Result<Option<PathBuf>, TrainError> {
    match recipe.checkpoint.resume_policy() {
        ResumePolicy::Never => Ok(None),
        ResumePolicy::Auto => match store {
            Some(store) => Ok(store.latest()?.map(|c| c.path)),
            None => Ok(None),
        },
        ResumePolicy::Path(path) => {
            let path = PathBuf::from(path);
            if crate::checkpoint::is_committed(&path) {
                Ok(Some(path))
            } else {
                Err(TrainError::checkpoint(
                    &path,
                    "checkpoint.resume names a folder that is not a committed checkpoint",
                ))
            }
        }
    }
}

/// The microbatches of this rank's share of the global batch that starts at `consumed`.
fn rank_microbatches(
    context: &LoopContext<'_>,
    consumed: u64,
) -> Result<Vec<Microbatch>, TrainError> {
    let plan = context.plan;
    let seq_length = context.recipe.model.seq_length as usize;
    let indices = rank_batch_indices(consumed, plan.global_batch_size, 0, plan.degrees.dp);
    let samples = indices
        .map(|i| context.data.train.sample(i))
        .collect::<Result<Vec<_>, _>>()?;
    samples
        .chunks(plan.micro_batch_size as usize)
        .map(|chunk| Microbatch::from_samples(chunk, seq_length))
        .collect()
}

/// The fixed validation batches every evaluation uses: `eval_iters` global batches from the
/// start of the validation split, so successive evaluations are comparable.
fn eval_batches(context: &LoopContext<'_>) -> Result<Vec<Microbatch>, TrainError> {
    let training = &context.recipe.training;
    let Some(valid) = context.data.valid.as_ref() else {
        return Ok(Vec::new());
    };
    if training.eval_interval == 0 {
        return Ok(Vec::new());
    }
    let seq_length = context.recipe.model.seq_length as usize;
    let count = (training.eval_iters * u64::from(context.plan.global_batch_size)).min(valid.len());
    let samples = (0..count)
        .map(|i| valid.sample(i))
        .collect::<Result<Vec<_>, _>>()?;
    samples
        .chunks(context.plan.micro_batch_size as usize)
        .map(|chunk| Microbatch::from_samples(chunk, seq_length))
        .collect()
}

/// `plan.json` and the resolved recipe beside the checkpoints, so a run directory explains
/// itself without the recipe file that started it.
fn write_run_dir(run_dir: &Path, plan: &Plan, recipe: &Recipe) -> Result<(), TrainError> {
    plan.write_to(run_dir).map_err(|e| {
        TrainError::Config(format!(
            "cannot write plan.json into {}: {e}",
            run_dir.display()
        ))
    })?;
    crate::resume::write_recipe(run_dir, recipe)
}
