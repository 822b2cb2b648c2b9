//! sbatch scripts rendered from the plan.
//!
//! The plan already knows the cluster (nodes × GPUs per node, GPU kind), so the script asks
//! Slurm for exactly that: one task per GPU, `srun` starting every rank, each rank finding its
//! place in Slurm's environment ([`crate::LaunchEnv`]). What a long run needs around it is
//! written in every script rather than left to the user to remember:
//!
//! - `--signal=TERM@120`: Slurm sends SIGTERM to every task two minutes before the time limit;
//!   `recipe run` saves a checkpoint and exits 0 on SIGTERM. The signal goes to the job steps
//!   (the training processes) and not `B:` to the batch shell, because a shell waiting on `srun`
//!   would only pass it on after `srun` returned — too late.
//! - `--requeue`: a preempted job (or one on a failed node) goes back into the queue instead of
//!   failing; the requeued job runs the same script and `checkpoint.resume: auto` continues.
//! - `--open-mode=append` and `--output=<logs>/%x-%j.out`: one log per job, and a requeued job
//!   appends to it rather than wiping its first life's output.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use ferrotron_plan::Plan;
use ferrotron_recipe::GpuKind;

/// Scheduling choices that are not in the recipe (they belong to the site, not the model).
#[derive(Debug, Clone, PartialEq)]
pub struct SlurmOptions {
    /// `--job-name` (default: the recipe's name, or the sweep's).
    pub job_name: Option<String>,
    pub partition: Option<String>,
    /// Wall-clock limit in any form sbatch accepts (`4:00:00`, `2-00:00:00`).
    pub time: Option<String>,
    pub account: Option<String>,
    pub qos: Option<String>,
    /// CPU cores per task (default: the recipe's `runtime.threads`, if set).
    pub cpus_per_task: Option<u32>,
    /// Memory per node (`--mem`), e.g. `200G`.
    pub mem: Option<String>,
    /// Seconds before the time limit when tasks get SIGTERM to save and stop.
    pub signal_seconds: u32,
    /// Where job logs go (created before submitting: Slurm does not create it).
    pub log_dir: PathBuf,
    /// More sbatch options, as written on the command line (`--constraint=h100`).
    pub extra: Vec<String>,
    /// Job arrays: at most this many members at once (`--array=0-N%P`).
    pub array_parallel: Option<u32>,
}

impl Default for SlurmOptions {
    fn default() -> Self {
        SlurmOptions {
            job_name: None,
            partition: None,
            time: None,
            account: None,
            qos: None,
            cpus_per_task: None,
            mem: None,
            signal_seconds: 120,
            log_dir: PathBuf::from("logs"),
            extra: Vec::new(),
            array_parallel: None,
        }
    }
}

/// The command every task of a step runs: the `recipe` program and its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
}

/// What a job asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobShape {
    pub nodes: u32,
    /// One task (rank) per GPU, or per CPU rank on the CPU backend.
    pub tasks_per_node: u32,
    /// 0 when the plan is for CPU ranks (no `--gpus-per-node`).
    pub gpus_per_node: u32,
    pub cpus_per_task: Option<u32>,
}

impl JobShape {
    /// The plan's cluster, one task per device.
    pub fn of_plan(plan: &Plan, options: &SlurmOptions) -> JobShape {
        let cluster = &plan.cluster;
        JobShape {
            nodes: cluster.nodes,
            tasks_per_node: cluster.gpus_per_node,
            gpus_per_node: if cluster.gpu == GpuKind::Cpu {
                0
            } else {
                cluster.gpus_per_node
            },
            cpus_per_task: options.cpus_per_task.or(plan.recipe.runtime.threads),
        }
    }

    /// The smallest shape that fits every one of `shapes` (a job array's members share one).
    pub fn covering(shapes: impl IntoIterator<Item = JobShape>) -> Option<JobShape> {
        shapes.into_iter().reduce(|a, b| JobShape {
            nodes: a.nodes.max(b.nodes),
            tasks_per_node: a.tasks_per_node.max(b.tasks_per_node),
            gpus_per_node: a.gpus_per_node.max(b.gpus_per_node),
            cpus_per_task: a.cpus_per_task.max(b.cpus_per_task),
        })
    }

    pub fn tasks(&self) -> u32 {
        self.nodes * self.tasks_per_node
    }
}

/// One member of a job array.
#[derive(Debug, Clone, PartialEq)]
pub struct ArrayTask {
    /// Shown in a comment and the log.
    pub name: String,
    /// Ranks this member runs on (at most the array's shape).
    pub tasks: u32,
    pub command: TaskCommand,
}

/// A rendered batch script.
#[derive(Debug, Clone, PartialEq)]
pub struct SbatchScript {
    pub job_name: String,
    /// The directory the script's `--output` points into.
    pub log_dir: PathBuf,
    /// How many array members (None: a plain job).
    pub array_len: Option<usize>,
    text: String,
}

/// Quotes `word` for bash when it needs it.
pub fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_./:=@%+-,".contains(&b));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

fn command_line(command: &TaskCommand) -> String {
    std::iter::once(command.program.display().to_string())
        .chain(command.args.iter().cloned())
        .map(|w| shell_quote(&w))
        .collect::<Vec<_>>()
        .join(" ")
}

fn log_pattern(log_dir: &Path, array: bool) -> String {
    let file = if array { "%x-%A_%a.out" } else { "%x-%j.out" };
    log_dir.join(file).display().to_string()
}

fn header(
    name: &str,
    shape: JobShape,
    options: &SlurmOptions,
    array: Option<usize>,
    why: &str,
) -> String {
    let mut out = String::from("#!/bin/bash\n");
    for line in why.lines() {
        let _ = writeln!(out, "# {line}");
    }
    let mut directive = |text: String| {
        let _ = writeln!(out, "#SBATCH {text}");
    };
    directive(format!("--job-name={}", shell_quote(name)));
    directive(format!("--nodes={}", shape.nodes));
    directive(format!("--ntasks-per-node={}", shape.tasks_per_node));
    if shape.gpus_per_node > 0 {
        directive(format!("--gpus-per-node={}", shape.gpus_per_node));
    }
    if let Some(cpus) = shape.cpus_per_task {
        directive(format!("--cpus-per-task={cpus}"));
    }
    for (flag, value) in [
        ("partition", &options.partition),
        ("time", &options.time),
        ("account", &options.account),
        ("qos", &options.qos),
        ("mem", &options.mem),
    ] {
        if let Some(value) = value {
            directive(format!("--{flag}={}", shell_quote(value)));
        }
    }
    if let Some(len) = array {
        let limit = options
            .array_parallel
            .map(|p| format!("%{p}"))
            .unwrap_or_default();
        directive(format!("--array=0-{}{limit}", len.saturating_sub(1)));
    }
    directive(format!("--signal=TERM@{}", options.signal_seconds));
    directive("--requeue".to_owned());
    directive("--open-mode=append".to_owned());
    directive(format!(
        "--output={}",
        shell_quote(&log_pattern(&options.log_dir, array.is_some()))
    ));
    for extra in &options.extra {
        directive(extra.clone());
    }
    out
}

const TASK_NOTE: &str = "\
# Every task reads its rank, the world size and the rendezvous (first node of the step, port
# derived from the job id) from Slurm's environment. SIGTERM (the --signal above, or
# `scancel --signal=TERM`) makes every rank save a checkpoint and exit 0; a requeued job
# (`scontrol requeue`, or preemption) runs this script again and `checkpoint.resume: auto`
# continues from that checkpoint.
set -euo pipefail
echo \"job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST\"
";

impl SbatchScript {
    /// The script for one run of `plan`: every task runs `command`.
    pub fn for_run(plan: &Plan, command: &TaskCommand, options: &SlurmOptions) -> SbatchScript {
        let shape = JobShape::of_plan(plan, options);
        let name = options
            .job_name
            .clone()
            .unwrap_or_else(|| plan.recipe.name.clone());
        let d = &plan.degrees;
        let why = format!(
            "Written by `recipe submit` for {} (plan {}).\n\
             {} ranks = {} node(s) × {} task(s); tp {} pp {} cp {} ep {} dp {}.",
            plan.recipe.name,
            &plan.plan_hash[..plan.plan_hash.len().min(12)],
            plan.world_size,
            shape.nodes,
            shape.tasks_per_node,
            d.tp,
            d.pp,
            d.cp,
            d.ep,
            d.dp,
        );
        let mut text = header(&name, shape, options, None, &why);
        text.push('\n');
        text.push_str(TASK_NOTE);
        let _ = writeln!(
            text,
            "srun --kill-on-bad-exit=1 --ntasks={} {}",
            shape.tasks(),
            command_line(command)
        );
        SbatchScript {
            job_name: name,
            log_dir: options.log_dir.clone(),
            array_len: None,
            text,
        }
    }

    /// One job array over `tasks`: array index `i` runs `tasks[i]` inside `shape`.
    pub fn for_array(
        name: &str,
        tasks: &[ArrayTask],
        shape: JobShape,
        options: &SlurmOptions,
    ) -> SbatchScript {
        let name = options.job_name.clone().unwrap_or_else(|| name.to_owned());
        let why = format!(
            "Written by `recipe sweep --submit`: {} member(s) of sweep {name}, one per array index.",
            tasks.len()
        );
        let mut text = header(&name, shape, options, Some(tasks.len()), &why);
        text.push('\n');
        text.push_str(TASK_NOTE);
        text.push_str("case \"$SLURM_ARRAY_TASK_ID\" in\n");
        for (index, task) in tasks.iter().enumerate() {
            let _ = writeln!(
                text,
                "  {index}) # {}\n     ntasks={}; set -- {} ;;",
                task.name,
                task.tasks,
                command_line(&task.command)
            );
        }
        text.push_str(
            "  *) echo \"no sweep member for array index $SLURM_ARRAY_TASK_ID\" >&2; exit 2 ;;\nesac\n",
        );
        text.push_str("srun --kill-on-bad-exit=1 --ntasks=\"$ntasks\" \"$@\"\n");
        SbatchScript {
            job_name: name,
            log_dir: options.log_dir.clone(),
            array_len: Some(tasks.len()),
            text,
        }
    }

    pub fn text(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_leaves_plain_words_and_protects_the_rest() {
        assert_eq!(shell_quote("runs/a-1/member.yaml"), "runs/a-1/member.yaml");
        assert_eq!(shell_quote("my run"), "'my run'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("$HOME"), "'$HOME'");
    }

    #[test]
    fn covering_takes_the_largest_of_each() {
        let small = JobShape {
            nodes: 1,
            tasks_per_node: 2,
            gpus_per_node: 0,
            cpus_per_task: None,
        };
        let big = JobShape {
            nodes: 2,
            tasks_per_node: 1,
            gpus_per_node: 0,
            cpus_per_task: Some(4),
        };
        assert_eq!(
            JobShape::covering([small, big]),
            Some(JobShape {
                nodes: 2,
                tasks_per_node: 2,
                gpus_per_node: 0,
                cpus_per_task: Some(4)
            })
        );
        assert_eq!(JobShape::covering([]), None);
    }
}
