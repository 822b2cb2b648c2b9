//! Which ranks this `recipe run` process trains: all of them as threads (a CPU world in one
//! process: tests, workstations), or one of a process world that a launcher started (srun,
//! torchrun), whose rank, size and rendezvous address come from the launcher's environment.
//!
//! Both paths plan the same way (the world size decides the cluster the planner sees) and end in
//! the runtime's per-rank loop, so a layout behaves the same in threads and in processes; only
//! the communicator differs (in-process vs. TCP).

use std::time::Duration;

use anyhow::Context;
use ferrotron_plan::Plan;
use ferrotron_recipe::{Cluster, GpuKind, Recipe};
use ferrotron_slurm::{LaunchEnv, Launcher};
use ferrotron_train::{CpuTrainBackend, RunOptions, RunSummary};

/// How long a collective may wait for a peer before the run fails naming the missing ranks.
const COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug)]
pub enum RunWorld {
    /// `size` ranks as threads of this process (1: the plain one-rank loop).
    Threads { size: u32 },
    /// One rank of a world of processes.
    Process(Box<LaunchEnv>),
}

impl RunWorld {
    /// The launcher's world when started by one, else `--world-size`, else the recipe's
    /// cluster size, else one rank.
    pub fn detect(world_size: Option<u32>, recipe: &Recipe) -> anyhow::Result<RunWorld> {
        if let Some(env) = LaunchEnv::detect().context("reading the launcher's environment")? {
            if let Some(asked) = world_size
                && asked != env.world_size
            {
                anyhow::bail!(
                    "--world-size {asked} disagrees with the launcher's world of {} processes; \
                     leave it out under srun/torchrun",
                    env.world_size
                );
            }
            return Ok(RunWorld::Process(Box::new(env)));
        }
        let size = world_size
            .or_else(|| recipe.cluster.as_ref().map(Cluster::world_size))
            .unwrap_or(1);
        Ok(RunWorld::Threads { size })
    }

    /// The cluster to plan on: CPU ranks, shaped as the recipe's cluster when it has this many
    /// ranks (so rank → node placement reads the same), else one node.
    pub fn cluster(&self, recipe: &Recipe) -> Cluster {
        match self {
            RunWorld::Threads { size } => match &recipe.cluster {
                Some(cluster) if cluster.world_size() == *size => Cluster {
                    gpu: GpuKind::Cpu,
                    ..cluster.clone()
                },
                _ => Cluster {
                    nodes: 1,
                    gpus_per_node: *size,
                    gpu: GpuKind::Cpu,
                },
            },
            RunWorld::Process(env) => env.cluster(GpuKind::Cpu),
        }
    }

    /// This process's global rank (0 in a thread world: the process is rank 0's).
    /// The nodes of a Slurm step, for the run manifest; empty elsewhere (this host alone, or a
    /// torchrun world whose other hosts the environment does not name).
    pub fn hosts(&self) -> Vec<String> {
        match self {
            RunWorld::Process(env) if env.launcher == Launcher::Slurm => env.hosts.clone(),
            _ => Vec::new(),
        }
    }

    pub fn rank(&self) -> u32 {
        match self {
            RunWorld::Threads { .. } => 0,
            RunWorld::Process(env) => env.rank,
        }
    }

    /// Prefix for this process's own messages, so a process world's interleaved output says
    /// which rank spoke.
    pub fn log_prefix(&self) -> String {
        match self {
            RunWorld::Threads { .. } => String::new(),
            RunWorld::Process(env) => format!("rank {}: ", env.rank),
        }
    }

    fn size(&self) -> u32 {
        match self {
            RunWorld::Threads { size } => *size,
            RunWorld::Process(env) => env.world_size,
        }
    }

    /// The planner fills the world it was given; anything else is a bug worth stopping on.
    pub fn check_plan(&self, plan: &Plan) -> anyhow::Result<()> {
        if plan.world_size != self.size() {
            anyhow::bail!(
                "the plan has {} ranks but this run has {}",
                plan.world_size,
                self.size()
            );
        }
        Ok(())
    }

    /// Train this process's ranks on the CPU backend; the summary is rank 0's (a process
    /// world: this rank's).
    pub fn train(&self, plan: &Plan, options: &RunOptions) -> anyhow::Result<RunSummary> {
        let device = Default::default();
        match self {
            RunWorld::Threads { size: 1 } => Ok(ferrotron_train::train::<CpuTrainBackend>(
                plan, options, &device,
            )?),
            RunWorld::Threads { .. } => Ok(ferrotron_train::train_threads::<CpuTrainBackend>(
                plan, options, &device,
            )?),
            RunWorld::Process(env) => train_process_rank(plan, env, options),
        }
    }
}

/// Rendezvous over TCP, build this rank's groups from the plan, train. A failing rank tells its
/// peers before it exits, so they stop with its reason instead of timing out.
fn train_process_rank(
    plan: &Plan,
    env: &LaunchEnv,
    options: &RunOptions,
) -> anyhow::Result<RunSummary> {
    let span = tracing::info_span!("rank", rank = env.rank);
    let _entered = span.enter();
    let config = env.tcp_config(COLLECTIVE_TIMEOUT);
    let world = ferrotron_dist::TcpComm::connect(&config).with_context(|| {
        format!(
            "rank {} could not join the world at {}:{}",
            env.rank, config.master_addr, config.master_port
        )
    })?;
    let groups = ferrotron_train::group_members(plan, env.rank, env.world_size as usize)
        .map_err(anyhow::Error::from)
        .and_then(|members| Ok(ferrotron_dist::ProcessGroups::new(&members, &world)?));
    let groups = match groups {
        Ok(groups) => groups,
        Err(err) => {
            world.abort(&err.to_string());
            return Err(err).context("building this rank's process groups");
        }
    };
    let ctx = ferrotron_parallel::ParallelContext::from_groups(
        groups,
        plan.recipe.parallel.sequence_parallel,
    );
    let device = Default::default();
    match ferrotron_train::train_rank::<CpuTrainBackend>(plan, ctx, options, &device) {
        Ok(summary) => Ok(summary),
        Err(err) => {
            world.abort(&err.to_string());
            Err(flat(err))
        }
    }
}

/// A training error as one message: its display already names its cause, so the caller's
/// `{:#}` (which appends causes for the rendezvous' context chain) must not repeat it. A
/// non-finite loss has no cause and keeps its type: the exit code depends on it.
fn flat(err: ferrotron_train::TrainError) -> anyhow::Error {
    match err {
        ferrotron_train::TrainError::NonFinite { .. } => anyhow::Error::new(err),
        other => anyhow::Error::msg(other.to_string()),
    }
}
