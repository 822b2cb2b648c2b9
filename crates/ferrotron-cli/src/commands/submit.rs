//! `recipe submit`: plan a recipe for a cluster, write the sbatch script that asks Slurm for
//! exactly that layout, and submit it (or print it with `--dry-run`). Also the `--submit` half
//! of `recipe sweep`, which sends a sweep's members as one job array.
//!
//! The script runs this same executable under `srun`, so the job trains with the binary that
//! planned it; each task finds its rank in Slurm's environment (`recipe run` does that).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;

use crate::exit;
use ferrotron_launch::{SbatchScript, SlurmOptions, TaskCommand};
use ferrotron_recipe::{Backend, Cluster, GpuKind};
use ferrotron_sweep::{Member, SweepSpec, prepare_array};

/// Scheduling options shared by `recipe submit` and `recipe sweep --submit`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct SlurmArgs {
    /// Slurm partition (`--partition`).
    #[arg(long, value_name = "P")]
    pub partition: Option<String>,
    /// Wall-clock limit, in any form sbatch accepts (`4:00:00`, `2-00:00:00`).
    #[arg(long, value_name = "T")]
    pub time: Option<String>,
    /// Account to charge (`--account`).
    #[arg(long, value_name = "A")]
    pub account: Option<String>,
    /// Quality of service (`--qos`).
    #[arg(long, value_name = "Q")]
    pub qos: Option<String>,
    /// CPU cores per task (default: the recipe's `runtime.threads`, if set).
    #[arg(long, value_name = "N")]
    pub cpus_per_task: Option<u32>,
    /// Memory per node (`--mem`, e.g. `200G`).
    #[arg(long, value_name = "SIZE")]
    pub mem: Option<String>,
    /// Job name (default: the recipe's or the sweep's name).
    #[arg(long, value_name = "NAME")]
    pub job_name: Option<String>,
    /// Seconds before the time limit at which every rank gets SIGTERM to save and stop.
    #[arg(long, value_name = "SECONDS", default_value_t = 120)]
    pub signal_seconds: u32,
    /// Directory for job logs, `<name>-<job id>.out` (default: `logs`, for sweeps
    /// `<sweep dir>/logs`).
    #[arg(long, value_name = "DIR")]
    pub log_dir: Option<PathBuf>,
    /// Another sbatch option, written into the script as is (repeatable):
    /// `--sbatch-arg=--constraint=h100`.
    #[arg(long = "sbatch-arg", value_name = "OPTION", allow_hyphen_values = true)]
    pub sbatch_args: Vec<String>,
    /// Sweeps: at most this many members running at once (`--array=…%N`).
    #[arg(long, value_name = "N")]
    pub array_parallel: Option<u32>,
}

impl SlurmArgs {
    fn options(&self, default_log_dir: PathBuf) -> SlurmOptions {
        SlurmOptions {
            job_name: self.job_name.clone(),
            partition: self.partition.clone(),
            time: self.time.clone(),
            account: self.account.clone(),
            qos: self.qos.clone(),
            cpus_per_task: self.cpus_per_task,
            mem: self.mem.clone(),
            signal_seconds: self.signal_seconds,
            log_dir: self.log_dir.clone().unwrap_or(default_log_dir),
            extra: self.sbatch_args.clone(),
            array_parallel: self.array_parallel,
        }
    }
}

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    pub source: super::resolve::RecipeArgs,
    /// Nodes to run on (default: the recipe's `cluster.nodes`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub nodes: Option<u32>,
    /// GPUs, i.e. tasks, per node (default: the recipe's `cluster.gpus_per_node`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub gpus_per_node: Option<u32>,
    #[command(flatten)]
    pub slurm: SlurmArgs,
    /// `--run-dir` for the job's `recipe run`.
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// Another argument for the job's `recipe run` (repeatable): `--run-arg=--exit-interval=500`.
    #[arg(long = "run-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub run_args: Vec<String>,
    /// Where to write the script (default: `<log dir>/<job name>.sbatch`).
    #[arg(long, value_name = "FILE")]
    pub script: Option<PathBuf>,
    /// Print the script instead of submitting it.
    #[arg(long)]
    pub dry_run: bool,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let loaded = match args.source.load() {
        Ok(loaded) => loaded,
        Err(code) => return Ok(code),
    };
    let recipe = &loaded.recipe;
    let mut cluster = recipe.cluster.clone().unwrap_or(Cluster {
        nodes: 1,
        gpus_per_node: 1,
        gpu: match recipe.runtime.backend {
            Backend::Cpu => GpuKind::Cpu,
            Backend::Cuda | Backend::BurnCuda => GpuKind::default(),
        },
    });
    cluster.nodes = args.nodes.unwrap_or(cluster.nodes);
    cluster.gpus_per_node = args.gpus_per_node.unwrap_or(cluster.gpus_per_node);
    let plan = match super::resolve::plan_or_report(
        &loaded,
        Some(cluster),
        ferrotron_data::tokenizer_vocab_size,
    ) {
        Ok(plan) => plan,
        Err(code) => return Ok(code),
    };

    let mut task_args = vec!["run".to_owned(), args.source.recipe.display().to_string()];
    for set in &args.source.overrides {
        task_args.extend(["--set".to_owned(), set.clone()]);
    }
    if let Some(dir) = &args.run_dir {
        task_args.extend(["--run-dir".to_owned(), dir.display().to_string()]);
    }
    task_args.extend(args.run_args.iter().cloned());
    let command = TaskCommand {
        program: std::env::current_exe().context("finding this executable for the job")?,
        args: task_args,
    };
    let options = args.slurm.options(PathBuf::from("logs"));
    let script = SbatchScript::for_run(&plan, &command, &options);
    if args.dry_run {
        print!("{}", script.text());
        return Ok(ExitCode::SUCCESS);
    }
    let path = args
        .script
        .clone()
        .unwrap_or_else(|| options.log_dir.join(format!("{}.sbatch", script.job_name)));
    let what = format!(
        "{} rank(s) on {} node(s)",
        plan.world_size, plan.cluster.nodes
    );
    submit(&script, &path, &what)
}

/// `recipe sweep --submit`: every valid, unfinished member as one index of a job array.
pub(crate) fn sweep(
    spec: &SweepSpec,
    members: &[Member],
    out_dir: &Path,
    slurm: &SlurmArgs,
) -> anyhow::Result<ExitCode> {
    let options = slurm.options(out_dir.join("logs"));
    let program = std::env::current_exe().context("finding this executable for the jobs")?;
    let Some(array) = prepare_array(&spec.name, members, out_dir, &program, &[], &options)? else {
        println!("nothing to submit: no valid member is left to run");
        return Ok(ExitCode::SUCCESS);
    };
    if !array.finished.is_empty() {
        eprintln!("left out, finished earlier: {}", array.finished.join(", "));
    }
    if !array.invalid.is_empty() {
        eprintln!("left out, invalid: {}", array.invalid.join(", "));
    }
    let what = format!("a job array of {} member(s)", array.members.len());
    let code = submit(&array.script, &out_dir.join("sweep.sbatch"), &what)?;
    eprintln!(
        "when the jobs are done: `recipe report {}` (charts), `recipe sweep` again (results table)",
        out_dir.display()
    );
    Ok(code)
}

/// Submits and prints the job id on stdout (for scripts), the rest on stderr.
fn submit(script: &SbatchScript, path: &Path, what: &str) -> anyhow::Result<ExitCode> {
    match ferrotron_launch::submit(script, path) {
        Ok(job) => {
            println!("{job}");
            let log = if script.array_len.is_some() {
                format!("{}-{job}_<index>.out", script.job_name)
            } else {
                format!("{}-{job}.out", script.job_name)
            };
            eprintln!(
                "submitted job {job}: {what}; script {}; log {}",
                path.display(),
                script.log_dir.join(log).display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => {
            eprintln!("error: {err}");
            Ok(exit::code(exit::FAILED))
        }
    }
}
