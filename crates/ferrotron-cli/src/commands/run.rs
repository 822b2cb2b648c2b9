//! `recipe run`: load a recipe, plan it, train it. The training crate does the work; this edge
//! resolves the recipe, hands the world and the backend to `launch` (one rank, thread ranks in
//! this process, or one rank of a process world started by srun/torchrun), picks the run
//! directory and the signal handling, writes the run manifest, and turns the outcome into an exit code (`crate::exit`: 0 finished or stopped
//! cleanly, 1 invalid recipe or failed run, 2 bad usage or unreadable recipe, 3 diverged).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use ferrotron_plan::Plan;
use ferrotron_recipe::{Backend, LoadedRecipe, Recipe};
use ferrotron_telemetry::{RunDetails, RunManifest, RunStatus};
use ferrotron_train::{RunOptions, RunSummary, StopFlag, StopReason, TrainError};

use super::launch::{CommArg, Launch, World};
use crate::exit;
use crate::failure::{catching, describe, say, sayln};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum BackendArg {
    Cpu,
    Cuda,
    BurnCuda,
}

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    pub source: super::resolve::RecipeArgs,
    /// Compute backend (default: the recipe's `runtime.backend`).
    #[arg(long, value_enum)]
    pub backend: Option<BackendArg>,
    /// Where plan.json and the resolved recipe go (default: the checkpoint directory's parent,
    /// else `runs/<name>`).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Save a checkpoint and stop when the iteration is a multiple of N (Megatron's
    /// `--exit-interval`); `resume: auto` continues from there on the next run.
    #[arg(long, value_name = "N")]
    pub exit_interval: Option<u64>,
    /// Ranks to run, as threads of this process on the CPU backend (default: the recipe's
    /// `cluster` nodes × gpus_per_node when it has that section, else 1). Under srun or
    /// torchrun each process runs one rank of the launcher's world instead.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub world_size: Option<u32>,
    /// Start N processes on this machine, one rank each, as torchrun's `--nproc-per-node`
    /// does: their logs merged here, Ctrl-C and SIGTERM forwarded to all (each saves and
    /// exits), and when one fails the others are stopped and its error and code are the run's.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub nproc_per_node: Option<u32>,
    /// Communicators of a `--backend cuda` run: `auto` (NCCL when the world has several
    /// ranks), `nccl` (also on one GPU) or `tcp` (through the host; ranks may share a GPU).
    #[arg(long, value_enum, env = "FERROTRON_COMM", default_value = "auto")]
    pub comm: CommArg,
    /// Train even when the plan says it does not fit in memory (it may be killed partway).
    #[arg(long)]
    pub force: bool,
    /// Resolve the recipe, check its files, plan it and print the brief; train nothing.
    #[arg(long)]
    pub dry_run: bool,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    ferrotron_launch::local::follow_launcher()?;
    let loaded = match args.source.load() {
        Ok(loaded) => loaded,
        Err(code) => return Ok(code),
    };
    if let Err(code) = super::resolve::check_files(&loaded) {
        return Ok(code);
    }
    if let Some(nproc) = args.nproc_per_node {
        return launch_local_ranks(&args, nproc);
    }
    // Past the recipe, whatever goes wrong is the run failing (a missing GPU, an unwritable run
    // directory), not the usage.
    match train_loaded(&args, &loaded) {
        Ok(code) => Ok(code),
        Err(err) => {
            sayln!("error: {}", describe(&err));
            Ok(exit::code(exit::FAILED))
        }
    }
}

/// The recipe is valid and its files are there: start one process per rank (each loads it again).
fn launch_local_ranks(args: &Args, nproc: u32) -> anyhow::Result<ExitCode> {
    if ferrotron_launch::LaunchEnv::detect().is_ok_and(|env| env.is_some()) {
        sayln!(
            "error: --nproc-per-node starts the ranks itself; under srun or torchrun leave it out"
        );
        return Ok(exit::code(exit::USAGE));
    }
    if let Some(size) = args.world_size.filter(|&size| size != nproc) {
        sayln!("error: --world-size {size} disagrees with --nproc-per-node {nproc}; give one");
        return Ok(exit::code(exit::USAGE));
    }
    let child_args = ferrotron_launch::local::child_args(std::env::args_os().skip(1));
    Ok(match ferrotron_launch::local::launch(nproc, &child_args)? {
        None => exit::code(exit::SUCCESS),
        Some(failure) => {
            sayln!("error: {}", failure.describe());
            // A rank killed by a signal has no code of its own: the run failed.
            exit::code(failure.code().unwrap_or(exit::FAILED))
        }
    })
}

fn train_loaded(args: &Args, loaded: &LoadedRecipe) -> anyhow::Result<ExitCode> {
    let recipe = &loaded.recipe;
    let backend = match args.backend {
        Some(BackendArg::Cpu) => Backend::Cpu,
        Some(BackendArg::Cuda) => Backend::Cuda,
        Some(BackendArg::BurnCuda) => Backend::BurnCuda,
        None => recipe.runtime.backend,
    };
    ferrotron_telemetry::init_tracing(recipe.logging.format);
    crate::nccl_env::log();

    let world = World::detect(args.world_size, recipe)?;
    let launch = match Launch::select(backend, world, args.comm) {
        Ok(launch) => launch,
        Err(err) => {
            sayln!("error: {}", describe(&err));
            return Ok(exit::code(exit::USAGE));
        }
    };
    let cluster = launch.cluster(recipe)?;
    let tokenizer = match super::resolve::tokenizer(recipe) {
        Ok(tokenizer) => tokenizer,
        Err(code) => return Ok(code),
    };
    let vocab = Ok(tokenizer.vocab_size());
    let plan = match super::resolve::plan_or_report(loaded, Some(cluster), |_| vocab) {
        Ok(plan) => plan,
        Err(code) => return Ok(code),
    };
    launch.check_plan(&plan)?;
    let lead = launch.rank() == 0;
    if !plan.memory.fits && !args.force {
        if lead {
            say!("{}", does_not_fit(&plan));
        }
        return Ok(exit::code(exit::FAILED));
    }
    if let Err(code) = super::hf_import::init_from(loaded, &plan, lead)? {
        return Ok(code);
    }
    if lead {
        say!("{}", brief(&plan, &launch));
    }
    if args.dry_run {
        sayln!("dry run: the recipe, its files and its plan are fine; nothing was trained");
        return Ok(exit::code(exit::SUCCESS));
    }

    let run_dir = run_dir(args, recipe);
    // One provenance record per run: the lead rank's (the only process of a thread world).
    let mut manifest = if lead {
        Some(
            RunManifest::start(
                &run_dir,
                &serde_json::to_value(&plan.recipe)?,
                ferrotron_telemetry::PlanRecord::of(&plan)?,
                RunDetails {
                    seed: plan.recipe.training.seed,
                    data_cache_keys: None,
                    hosts: launch.hosts(),
                    environment: launch.environment(),
                },
            )
            .context(
                "writing the run manifest in the run directory (--run-dir; by default the \
                 parent of checkpoint.dir, else runs/<name>)",
            )?,
        )
    } else {
        None
    };
    let options = RunOptions {
        run_dir,
        stop: StopFlag::on_signals().context("installing the SIGTERM/SIGINT handlers")?,
        exit_interval: args.exit_interval,
        announce: announce_metrics,
        memory: launch.memory_probe(),
    };
    match catching(|| launch.train(&plan, &tokenizer, &options)) {
        Ok(summary) => {
            let status = match summary.stopped {
                Some(_) => RunStatus::Stopped,
                None => RunStatus::Finished,
            };
            if let Some(manifest) = manifest.as_mut() {
                manifest.record_data_cache_keys(summary.data_cache_keys.clone())?;
                manifest.finish(status, 0)?;
            }
            if lead {
                say!(
                    "{}",
                    closing(&summary, args, plan.recipe.training.log_interval as usize)
                );
            }
            Ok(exit::code(exit::SUCCESS))
        }
        // A refused checkpoint, missing data, a lost peer: the run failed. A non-finite loss
        // or norm has its own code: the recipe diverged, the machine did not fail.
        Err(err) => {
            let message = describe(&err);
            let diverged = matches!(
                err.downcast_ref::<TrainError>(),
                Some(TrainError::NonFinite { .. })
            );
            let code = if diverged {
                exit::DIVERGED
            } else {
                exit::FAILED
            };
            // The manifest first: with stderr gone (a dead log reader) the print cannot land,
            // and the record must not be left saying `running`.
            if let Some(manifest) = manifest.as_mut() {
                manifest.fail(&message, i32::from(code))?;
            }
            sayln!("{}error: {message}", launch.log_prefix());
            Ok(exit::code(code))
        }
    }
}

/// Why a plan that does not fit is not started: its numbers, and what to change. Starting it
/// would allocate until the allocator or the OOM killer aborts the process, with nothing saved.
fn does_not_fit(plan: &Plan) -> String {
    let m = &plan.memory;
    let b = &m.per_gpu_bytes;
    let gib = |bytes: u64| bytes as f64 / f64::from(1u32 << 30);
    format!(
        "error: the plan does not fit: {:.1} GiB needed on the most loaded {} (rank {}, stage {}), {:.1} GiB available\n  \
         weights {:.1} GiB, gradients {:.1} GiB, optimizer {:.1} GiB, activations {:.1} GiB (`recipe plan --explain` has every term)\n\
         help: enable recompute (recompute.granularity: full), the distributed optimizer or more tensor/pipeline parallelism; --force tries anyway\n",
        gib(b.total),
        if plan.cluster.gpu == ferrotron_recipe::GpuKind::Cpu {
            "CPU rank"
        } else {
            "GPU"
        },
        m.most_loaded_rank,
        m.most_loaded_stage,
        gib(m.limit_bytes),
        gib(b.weights),
        gib(b.gradients),
        gib(b.optimizer),
        gib(b.activations),
    )
}

fn announce_metrics(address: &str) {
    sayln!("prometheus metrics at {address}");
}

/// `--run-dir`, else the checkpoint directory's parent, else `runs/<name>`.
fn run_dir(args: &Args, recipe: &Recipe) -> PathBuf {
    if let Some(dir) = &args.run_dir {
        return dir.clone();
    }
    recipe
        .checkpoint
        .dir
        .as_deref()
        .map(Path::new)
        .and_then(Path::parent)
        .filter(|parent| !parent.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| Path::new("runs").join(&recipe.name))
}

/// A few lines of the plan: what will run, how big, how long per step in theory.
fn brief(plan: &Plan, launch: &Launch) -> String {
    let d = &plan.degrees;
    let params = plan.parameters.total as f64;
    let precision = match (launch.on_cpu(), plan.recipe.precision.dtype) {
        (_, ferrotron_recipe::Dtype::Fp32) => "fp32",
        (true, _) => {
            "fp32 (the CPU backend computes in fp32; precision.dtype applies on GPU backends)"
        }
        (_, ferrotron_recipe::Dtype::Bf16) => "bf16 compute, fp32 master weights and gradients",
        (_, ferrotron_recipe::Dtype::Fp16) => "fp16",
    };
    format!(
        "run {}: {:.2}M parameters, {} layers, hidden {}, seq {}, vocab {} (padded {})\n\
         layout: world {} (tp {} pp {} cp {} ep {} dp {}), global batch {} = {} microbatch(es) of {}\n\
         {} iterations, {:.3} GFLOP per iteration, precision {}\n",
        plan.recipe.name,
        params / 1e6,
        plan.recipe.model.num_layers,
        plan.recipe.model.hidden_size,
        plan.recipe.model.seq_length,
        plan.vocab_size,
        plan.padded_vocab_size,
        plan.world_size,
        d.tp,
        d.pp,
        d.cp,
        d.ep,
        d.dp,
        plan.global_batch_size,
        plan.num_microbatches,
        plan.micro_batch_size,
        plan.train_iters,
        plan.flops_per_iteration / 1e9,
        precision,
    )
}

fn closing(summary: &RunSummary, args: &Args, log_interval: usize) -> String {
    let mut out = String::new();
    let what = match summary.stopped {
        Some(StopReason::Signal) => "stopped on request",
        Some(StopReason::ExitInterval) => "stopped at the exit interval",
        None if summary.start_iteration >= summary.train_iters => "already complete",
        None => "finished",
    };
    out.push_str(&format!(
        "{what} at iteration {} of {}",
        summary.iteration, summary.train_iters
    ));
    // The three losses have one name each, the same in the logs, metrics.jsonl and the report.
    if let Some(loss) = summary.last_loss {
        out.push_str(&format!(", last-step loss {loss:.4}"));
    }
    let recent = &summary.losses[summary.losses.len().saturating_sub(log_interval)..];
    if recent.len() > 1 {
        let mean = recent.iter().sum::<f64>() / recent.len() as f64;
        out.push_str(&format!(
            ", interval loss {mean:.4} (mean of the last {} steps)",
            recent.len()
        ));
    }
    if let Some(eval) = summary.last_eval_loss {
        out.push_str(&format!(", validation loss {eval:.4}"));
    }
    if let Some(test) = summary.test_loss {
        out.push_str(&format!(", test loss {test:.4}"));
    }
    out.push('\n');
    if let Some(checkpoint) = &summary.checkpoint {
        out.push_str(&format!("checkpoint: {}\n", checkpoint.display()));
        if summary.stopped.is_some() {
            let overrides: String = args
                .source
                .overrides
                .iter()
                .map(|o| format!(" --set '{o}'"))
                .collect();
            out.push_str(&format!(
                "continue with: recipe run {}{overrides}\n",
                args.source.recipe.display()
            ));
        }
        out.push_str(&format!(
            "sample from it: recipe sample {} --prompt \"ROMEO:\" --max-tokens 200\n",
            checkpoint.display()
        ));
    }
    out
}
