//! How `recipe run` trains, in the order it happens: which ranks this process runs (the world),
//! on which burn backend, the cluster the planner sees, and the training call.
//!
//! The world is all ranks as threads (a CPU world in one process: tests, workstations), or one
//! rank of a process world that a launcher started (srun, torchrun), whose rank, size and
//! rendezvous address come from the launcher's environment. Both plan the same way (the world
//! size decides the cluster) and end in the runtime's per-rank loop, so a layout behaves the
//! same in threads and in processes; only the communicator differs (in-process vs. TCP). A
//! process world first checks that every rank planned the same run (the plan hash), and its
//! every group waits `parallel.distributed_timeout_minutes` for a peer before failing.
//!
//! The backend decides the GPU a process uses (the launcher's local rank, or the one GPU the
//! launcher bound to the task: `ferrotron_launch::gpu_ordinal`), the GPU kind the
//! planner sees (the chip found on the machine, so throughput and MFU are measured against its
//! peak, not the recipe's guess), the compute dtype (`precision.dtype` on GPUs, fp32 on the CPU)
//! and, on our own CUDA backend, the peak device memory reported at the end. Backends are types
//! in burn, so this is the one place that names them; everything past it is generic
//! (`ferrotron_train::train_rank::<B>`, a rank alone on one device or one rank of a world). `burn-cuda` (the stock burn-cuda 0.21 backend, the reference
//! our own is checked against) is behind the cargo feature of the same name: it pulls cubecl and
//! takes minutes to build.

use anyhow::Context;
use burn::backend::Autodiff;
use ferrotron_data::Tokenizer;
use ferrotron_launch::{GpuChoice, LaunchEnv, Launcher};
use ferrotron_parallel::ParallelContext;
use ferrotron_plan::Plan;
use ferrotron_recipe::{Backend, Cluster, GpuKind, Recipe};
use ferrotron_telemetry::MemoryProbe;
use ferrotron_train::precision::{compute_dtype, use_compute_dtype};
use ferrotron_train::{CpuTrainBackend, RunOptions, RunSummary, train_rank};

/// How GPU ranks exchange data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub(crate) enum CommArg {
    /// NCCL for a CUDA world of several processes, none for one rank.
    #[default]
    Auto,
    /// NCCL communicators even for one GPU (world 1: the rank loop over NCCL groups, to compare
    /// with the plain one-rank run).
    Nccl,
    /// TCP through the host, as CPU ranks talk: a layout of more ranks than GPUs (they share the
    /// GPUs round-robin; NCCL refuses two ranks on one GPU), to try it where only one GPU is;
    /// far slower than NCCL.
    Tcp,
}

const GIB: f64 = (1u64 << 30) as f64;

/// Which ranks this process trains.
#[derive(Debug)]
pub(crate) enum World {
    /// `size` ranks as threads of this process (1: the rank alone, on this thread).
    Threads { size: u32 },
    /// One rank of a world of processes.
    Process(Box<LaunchEnv>),
}

/// The backend of this run, with the GPU it uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compute {
    /// burn-flex on the CPU (thread ranks or one rank of a process world).
    Cpu,
    /// Ferrotron's own CUDA backend (`ferrotron_cuda::Cuda`) on device `ordinal`.
    Cuda { ordinal: usize },
    /// The stock burn-cuda 0.21 backend on device `ordinal`.
    BurnCuda { ordinal: usize },
}

/// This process's part of the run: its world and its backend.
#[derive(Debug)]
pub(crate) struct Launch {
    world: World,
    compute: Compute,
    /// GPU ranks exchange data through NCCL communicators (ours, `ferrotron_cuda::nccl`).
    nccl: bool,
}

impl World {
    /// The launcher's world when started by one, else `--world-size`, else the recipe's
    /// cluster size, else one rank.
    pub(crate) fn detect(world_size: Option<u32>, recipe: &Recipe) -> anyhow::Result<World> {
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
            return Ok(World::Process(Box::new(env)));
        }
        let size = world_size
            .or_else(|| recipe.cluster.as_ref().map(Cluster::world_size))
            .unwrap_or(1);
        Ok(World::Threads { size })
    }

    fn size(&self) -> u32 {
        match self {
            World::Threads { size } => *size,
            World::Process(env) => env.world_size,
        }
    }
}

impl Launch {
    /// `backend` for this world: a GPU backend uses the GPU numbered by the launcher's local
    /// rank (srun/torchrun, `--nproc-per-node`; GPU 0 when the launcher bound one GPU to each
    /// task, so `CUDA_VISIBLE_DEVICES` lists one), else GPU 0. A CUDA world of several processes
    /// trains over NCCL communicators; `comm` nccl uses them for one GPU too, and tcp replaces
    /// them by the host's TCP mesh (ranks beyond the GPU count then share GPUs). Fails early,
    /// before planning, when the binary lacks the backend or the world needs more than one GPU
    /// rank per process.
    pub(crate) fn select(backend: Backend, world: World, comm: CommArg) -> anyhow::Result<Launch> {
        let force_nccl = comm == CommArg::Nccl;
        let ordinal = match &world {
            // over TCP, ranks may outnumber the GPUs: they take them round-robin
            World::Process(env) if comm == CommArg::Tcp && backend == Backend::Cuda => {
                let gpus = ferrotron_cuda::device_count()
                    .context("counting the GPUs for --comm tcp")?
                    .max(1);
                env.local_rank as usize % gpus
            }
            World::Process(env) if backend != Backend::Cpu => gpu_of(env)?,
            World::Process(_) | World::Threads { .. } => 0,
        };
        let compute = match backend {
            Backend::Cpu if force_nccl => anyhow::bail!(
                "--comm nccl (FERROTRON_COMM=nccl) needs --backend cuda; CPU ranks talk over \
                 threads or TCP"
            ),
            Backend::Cpu => {
                return Ok(Launch {
                    world,
                    compute: Compute::Cpu,
                    nccl: false,
                });
            }
            Backend::Cuda => Compute::Cuda { ordinal },
            Backend::BurnCuda if comm != CommArg::Auto => anyhow::bail!(
                "--comm nccl and tcp need --backend cuda (ours): stock burn-cuda runs one rank only"
            ),
            Backend::BurnCuda if cfg!(feature = "burn-cuda") => Compute::BurnCuda { ordinal },
            Backend::BurnCuda => anyhow::bail!(
                "this `recipe` binary was built without the stock burn-cuda backend; rebuild with \
                 `cargo build --release -p ferrotron-cli --features burn-cuda`, or use \
                 --backend cuda (ours) or cpu"
            ),
        };
        let ranks = world.size();
        match (&world, compute) {
            (World::Threads { .. }, _) if ranks != 1 => anyhow::bail!(
                "GPU backends train one rank per process: start {ranks} processes \
                 (--nproc-per-node {ranks}, srun or torchrun), or --backend cpu for a \
                 {ranks}-rank layout in threads"
            ),
            (World::Process(_), Compute::BurnCuda { .. }) if ranks != 1 => anyhow::bail!(
                "stock burn-cuda runs one rank only (it has no NCCL collectives here); use \
                 --backend cuda (ours) for a {ranks}-rank GPU world"
            ),
            _ => {}
        }
        let nccl = matches!(compute, Compute::Cuda { .. })
            && comm != CommArg::Tcp
            && (ranks > 1 || force_nccl);
        Ok(Launch {
            world,
            compute,
            nccl,
        })
    }

    /// The cluster to plan on: the world's shape (CPU ranks shaped as the recipe's cluster when
    /// it has this many ranks, so rank → node placement reads the same, else one node), with the
    /// GPU kind detected from the device on a GPU backend (so the plan's peak FLOP/s and memory
    /// are this chip's).
    pub(crate) fn cluster(&self, recipe: &Recipe) -> anyhow::Result<Cluster> {
        let cluster = match &self.world {
            World::Threads { size } => match &recipe.cluster {
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
            World::Process(env) => env.cluster(GpuKind::Cpu),
        };
        let ordinal = match self.compute {
            Compute::Cpu => return Ok(cluster),
            Compute::Cuda { ordinal } | Compute::BurnCuda { ordinal } => ordinal,
        };
        let name = ferrotron_cuda::CudaDevice::get(ordinal)
            .and_then(|device| device.name())
            .with_context(|| format!("opening CUDA device {ordinal}"))?;
        let gpu = match gpu_kind(&name) {
            Some(gpu) => gpu,
            None => {
                let fallback = recipe
                    .cluster
                    .as_ref()
                    .map(|c| c.gpu)
                    .filter(|gpu| *gpu != GpuKind::Cpu)
                    .unwrap_or(GpuKind::H100);
                tracing::warn!(
                    "GPU {name:?} is not in the planner's hardware table; planning as {fallback:?}"
                );
                fallback
            }
        };
        Ok(Cluster { gpu, ..cluster })
    }

    /// The planner fills the world it was given; anything else is a bug worth stopping on.
    pub(crate) fn check_plan(&self, plan: &Plan) -> anyhow::Result<()> {
        if plan.world_size != self.world.size() {
            anyhow::bail!(
                "the plan has {} ranks but this run has {}",
                plan.world_size,
                self.world.size()
            );
        }
        Ok(())
    }

    /// This process's global rank (0 in a thread world: the process is rank 0's).
    pub(crate) fn rank(&self) -> u32 {
        match &self.world {
            World::Threads { .. } => 0,
            World::Process(env) => env.rank,
        }
    }

    /// The nodes of a Slurm step, for the run manifest; empty elsewhere (this host alone, or a
    /// torchrun world whose other hosts the environment does not name).
    pub(crate) fn hosts(&self) -> Vec<String> {
        match &self.world {
            World::Process(env) if env.launcher == Launcher::Slurm => env.hosts.clone(),
            _ => Vec::new(),
        }
    }

    /// Our CUDA backend's environment variables that are set, for the run manifest (none on the
    /// other backends, which do not read them).
    pub(crate) fn environment(&self) -> Vec<(String, String)> {
        match self.compute {
            Compute::Cuda { .. } => ferrotron_cuda::switches::set_env_vars()
                .iter()
                .map(|(name, value)| ((*name).to_owned(), value.clone()))
                .collect(),
            Compute::Cpu | Compute::BurnCuda { .. } => Vec::new(),
        }
    }

    /// Prefix for this process's own messages, so a process world's interleaved output says
    /// which rank spoke.
    pub(crate) fn log_prefix(&self) -> String {
        match &self.world {
            World::Threads { .. } => String::new(),
            World::Process(env) => format!("rank {}: ", env.rank),
        }
    }

    /// The CPU backend computes in fp32 whatever `precision.dtype` says.
    pub(crate) fn on_cpu(&self) -> bool {
        self.compute == Compute::Cpu
    }

    /// What a logged step reports as its memory: on our CUDA backend the bytes live tensors hold
    /// on the device (the allocator's count, no synchronisation), elsewhere the process's
    /// resident memory (stock burn-cuda exposes no counter).
    pub(crate) fn memory_probe(&self) -> MemoryProbe {
        match self.compute {
            Compute::Cuda { ordinal } => MemoryProbe::new("device memory allocated", move || {
                ferrotron_cuda::CudaDevice::get(ordinal)
                    .map(|device| device.memory_stats().allocated_bytes)
                    .unwrap_or(0)
            })
            .with_device(self.rank(), move || {
                let (free, total) = ferrotron_cuda::CudaDevice::get(ordinal)
                    .ok()?
                    .memory_info()
                    .ok()?;
                Some((free as u64, total as u64))
            }),
            Compute::Cpu | Compute::BurnCuda { .. } => MemoryProbe::process(),
        }
    }

    /// Trains this process's ranks; the summary is rank 0's (a process world: this rank's).
    pub(crate) fn train(
        &self,
        plan: &Plan,
        tokenizer: &Tokenizer,
        options: &RunOptions,
    ) -> anyhow::Result<RunSummary> {
        if let Compute::Cuda { .. } = self.compute {
            configure_cuda(&plan.recipe.runtime)?;
        }
        match (self.compute, &self.world) {
            (Compute::Cpu, World::Threads { size: 1 }) => {
                let device = Default::default();
                Ok(train_rank::<CpuTrainBackend>(
                    plan,
                    ParallelContext::single(),
                    tokenizer,
                    options,
                    &device,
                )?)
            }
            (Compute::Cpu, World::Threads { .. }) => {
                Ok(ferrotron_train::train_threads::<CpuTrainBackend>(
                    plan,
                    tokenizer,
                    options,
                    &Default::default(),
                )?)
            }
            (Compute::Cpu, World::Process(env)) => train_process_rank::<CpuTrainBackend>(
                plan,
                env,
                tokenizer,
                options,
                &Default::default(),
            ),
            (Compute::Cuda { ordinal }, World::Process(env)) if !self.nccl => {
                type Gpu = Autodiff<ferrotron_cuda::Cuda>;
                let device = ferrotron_cuda::GpuDevice::new(ordinal);
                use_recipe_dtype::<Gpu>(plan, &device, "over TCP")?;
                train_process_rank::<Gpu>(plan, env, tokenizer, options, &device)
            }
            (Compute::Cuda { ordinal }, world) if self.nccl => {
                let summary = train_gpu_rank_nccl(plan, world, ordinal, tokenizer, options);
                let stats = ferrotron_cuda::nccl::stats::snapshot();
                if !stats.is_empty() {
                    eprintln!(
                        "{}NCCL collectives (GPU time on the communication stream)\n{}",
                        self.log_prefix(),
                        ferrotron_cuda::nccl::stats::render(&stats)
                    );
                }
                summary
            }
            (Compute::Cuda { ordinal }, _) => {
                let device = ferrotron_cuda::GpuDevice::new(ordinal);
                let summary = train_on_gpu::<Autodiff<ferrotron_cuda::Cuda>>(
                    plan, tokenizer, options, &device,
                );
                if let Ok(engine) = ferrotron_cuda::CudaDevice::get(ordinal) {
                    let memory = engine.memory_stats();
                    eprintln!(
                        "ferrotron-cuda: peak device memory {:.2} GiB (pool reserved {:.2} GiB)",
                        memory.peak_bytes as f64 / GIB,
                        memory.reserved_bytes as f64 / GIB
                    );
                }
                summary
            }
            #[cfg(feature = "burn-cuda")]
            (Compute::BurnCuda { ordinal }, _) => {
                let device = burn::backend::cuda::CudaDevice::new(ordinal);
                train_on_gpu::<Autodiff<burn::backend::Cuda>>(plan, tokenizer, options, &device)
            }
            #[cfg(not(feature = "burn-cuda"))]
            (Compute::BurnCuda { .. }, _) => {
                anyhow::bail!("this `recipe` binary was built without the burn-cuda backend")
            }
        }
    }
}

/// The CUDA backend's paths from the recipe's `runtime` section, before its first op; the ones
/// switched off and the debugging variables set are logged.
fn configure_cuda(runtime: &ferrotron_recipe::Runtime) -> anyhow::Result<()> {
    let paths = ferrotron_cuda::switches::Paths {
        fused_attention: runtime.fused_attention,
        fused_kernels: runtime.fused_kernels,
        vector_maps: runtime.vector_maps,
        grouped_gemm: runtime.grouped_gemm,
        grouped_gemm_device_counts: runtime.grouped_gemm_device_counts,
        grouped_gemm_per_expert: runtime.grouped_gemm_per_expert,
        gemm_tune: runtime.gemm_tune,
        attention_tune: runtime.attention_tune,
        norm_one_pass: runtime.norm_one_pass,
        pinned_uploads: runtime.pinned_uploads,
        bias_gelu_fusion: runtime.bias_gelu_fusion,
        grouped_gemm_kernel: match runtime.grouped_gemm_kernel {
            ferrotron_recipe::GroupedGemmKernel::Auto => {
                ferrotron_cuda::switches::GroupedKernel::Auto
            }
            ferrotron_recipe::GroupedGemmKernel::CpAsync => {
                ferrotron_cuda::switches::GroupedKernel::CpAsync
            }
            ferrotron_recipe::GroupedGemmKernel::Tma => {
                ferrotron_cuda::switches::GroupedKernel::Tma
            }
            ferrotron_recipe::GroupedGemmKernel::TmaCluster => {
                ferrotron_cuda::switches::GroupedKernel::TmaCluster
            }
            ferrotron_recipe::GroupedGemmKernel::TmaPingpong => {
                ferrotron_cuda::switches::GroupedKernel::TmaPingpong
            }
        },
    };
    if let Err(held) = ferrotron_cuda::switches::configure(paths) {
        anyhow::bail!(
            "the CUDA backend already runs with {held:?} in this process; the recipe asks for \
             {paths:?}"
        );
    }
    if paths != ferrotron_cuda::switches::Paths::default() {
        tracing::info!("CUDA backend paths (recipe runtime): {paths:?}");
    }
    for (name, value) in ferrotron_cuda::switches::set_env_vars() {
        tracing::info!("{name}={value}");
    }
    Ok(())
}

/// One rank of a process world over TCP (a CPU rank, or a GPU rank with `--comm tcp`).
fn train_process_rank<B>(
    plan: &Plan,
    env: &LaunchEnv,
    tokenizer: &Tokenizer,
    options: &RunOptions,
    device: &B::Device,
) -> anyhow::Result<RunSummary>
where
    B: ferrotron_train::TrainBackend,
{
    let span = tracing::info_span!("rank", rank = env.rank);
    let _entered = span.enter();
    let world = join_world(env, plan)?;
    let rank = WorldRank {
        rank: env.rank,
        size: env.world_size as usize,
        abort: &|reason| world.abort(reason),
    };
    rank.train::<B, _>(plan, &world, |_| Ok(()), tokenizer, options, device)
}

/// This process's rank in a world of processes, and how to tell its peers it failed.
struct WorldRank<'a> {
    rank: u32,
    size: usize,
    /// Fails the world's waits with the reason, so the peers stop with this rank's error
    /// instead of timing out.
    abort: &'a dyn Fn(&str),
}

impl WorldRank<'_> {
    /// Build this rank's groups from the plan over `world`, `connect` them, train; the world
    /// is left on success (the peers still writing are told this is no failure) and aborted
    /// on any failure.
    fn train<B, C>(
        &self,
        plan: &Plan,
        world: &C,
        connect: impl FnOnce(&ferrotron_dist::ProcessGroups<C>) -> anyhow::Result<()>,
        tokenizer: &Tokenizer,
        options: &RunOptions,
        device: &B::Device,
    ) -> anyhow::Result<RunSummary>
    where
        B: ferrotron_train::TrainBackend,
        C: ferrotron_dist::Communicator + Sync + std::fmt::Debug + 'static,
    {
        let groups = ferrotron_train::group_members(plan, self.rank, self.size)
            .map_err(anyhow::Error::from)
            .and_then(|members| Ok(ferrotron_dist::ProcessGroups::new(&members, world)?))
            .context("building this rank's process groups")
            .and_then(|groups| connect(&groups).map(|()| groups));
        let groups = match groups {
            Ok(groups) => groups,
            Err(err) => {
                (self.abort)(&format!("{err:#}"));
                return Err(err);
            }
        };
        let ctx = ParallelContext::from_groups(groups, plan.recipe.parallel.sequence_parallel);
        match train_rank::<B>(plan, ctx, tokenizer, options, device) {
            Ok(summary) => {
                ferrotron_dist::watchdog::global().leave();
                Ok(summary)
            }
            Err(err) => {
                (self.abort)(&err.to_string());
                Err(flat(err))
            }
        }
    }
}

/// This rank's TCP world, once every rank has shown it runs the same plan (the plan hash,
/// gathered from all): ranks started with another recipe, `--set` or environment override would
/// otherwise build other groups and fail far from the cause, or train a different model.
fn join_world(env: &LaunchEnv, plan: &Plan) -> anyhow::Result<ferrotron_dist::TcpComm> {
    // Every group of the world shares its connections and so this deadline, as do the NCCL
    // groups, which take the NCCL world's.
    let config = env.tcp_config(plan.recipe.parallel.distributed_timeout());
    let world = ferrotron_dist::TcpComm::connect(&config).with_context(|| {
        format!(
            "rank {} could not join the world at {}:{}",
            env.rank, config.master_addr, config.master_port
        )
    })?;
    watch_world(env.rank, config.timeout);
    ferrotron_dist::check_agreement(&world, "plan hash", &plan.plan_hash).context(
        "the ranks planned different runs; start every rank with the same recipe, --set \
         overrides and FERROTRON_* variables",
    )?;
    // In the world, before its first collective of training (the fault tests' "before").
    fail::fail_point!("rank-joined", |what| -> anyhow::Result<
        ferrotron_dist::TcpComm,
    > { ferrotron_dist::fault::die(what) });
    Ok(world)
}

/// Arms the process watchdog (`ferrotron_dist::watchdog`): from here on no wait of this rank
/// outlives the distributed timeout, a failed peer ends it, and a wait nothing can release ends
/// the process with the reason and exit code 1.
fn watch_world(rank: u32, timeout: std::time::Duration) {
    let dog = ferrotron_dist::watchdog::global();
    dog.on_stuck(Box::new(move |reason| {
        crate::failure::sayln!("error: rank {rank}: {reason}; ending the process");
        ferrotron_dist::watchdog::end_process(i32::from(crate::exit::FAILED));
    }));
    dog.arm(rank, timeout);
}

/// One GPU rank over NCCL: the world communicator (its unique id over the TCP rendezvous of
/// the launcher's world, or a NCCL communicator of one for a lone GPU), this rank's groups from
/// the plan as NCCL sub-communicators, then the rank loop with the region collectives on the
/// device. A failing rank aborts its communicators (and tells its TCP peers) so the others stop
/// with its reason instead of hanging in NCCL.
fn train_gpu_rank_nccl(
    plan: &Plan,
    world: &World,
    ordinal: usize,
    tokenizer: &Tokenizer,
    options: &RunOptions,
) -> anyhow::Result<RunSummary> {
    use ferrotron_cuda::nccl::NcclComm;
    type B = Autodiff<ferrotron_cuda::Cuda>;
    let engine = ferrotron_cuda::CudaDevice::get(ordinal)
        .with_context(|| format!("opening CUDA device {ordinal}"))?;
    let (nccl_world, rank, size) = match world {
        World::Process(env) => {
            let span = tracing::info_span!("rank", rank = env.rank);
            let _entered = span.enter();
            let tcp = join_world(env, plan)?;
            let comm = NcclComm::world(tcp, &engine)
                .with_context(|| format!("rank {}: creating the NCCL world", env.rank))?;
            (comm, env.rank, env.world_size as usize)
        }
        World::Threads { size: 1 } => (
            NcclComm::solo(&engine, 0).context("creating a NCCL communicator for one GPU")?,
            0,
            1,
        ),
        World::Threads { size } => {
            anyhow::bail!("{size} GPU ranks in one process: start one process per GPU")
        }
    };
    nccl_world.set_timeout(plan.recipe.parallel.distributed_timeout());
    tracing::info!(
        group = ?ferrotron_dist::Communicator::label(&nccl_world),
        gpu = ordinal,
        nccl = ?ferrotron_cuda::nccl::nccl_version(),
        "NCCL world ready"
    );
    let device = ferrotron_cuda::GpuDevice::new(ordinal);
    // Connect every group now, while the device is empty, not at its first use at a step's
    // memory peak (`ferrotron_cuda::nccl::warm_up` says why); virtual stages wrap the ring.
    let wraps = plan.stages.iter().any(|stage| stage.chunks.len() > 1);
    let warm_up = |groups: &ferrotron_dist::ProcessGroups<NcclComm>| {
        ferrotron_cuda::nccl::warm_up(groups, wraps)
            .context("warming up this rank's NCCL groups")?;
        use_recipe_dtype::<B>(plan, &device, "over NCCL")
    };
    let world_rank = WorldRank {
        rank,
        size,
        abort: &|reason| nccl_world.abort(reason),
    };
    world_rank.train::<B, _>(plan, &nccl_world, warm_up, tokenizer, options, &device)
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

/// Makes the recipe's `precision.dtype` the GPU `device`'s default float dtype, before the model
/// exists (every GPU path: the device's own default is fp32; see `ferrotron_train::precision`),
/// and says so with `how` the rank trains.
fn use_recipe_dtype<B: burn::tensor::backend::Backend>(
    plan: &Plan,
    device: &B::Device,
    how: &str,
) -> anyhow::Result<()> {
    let dtype = compute_dtype(plan.recipe.precision.dtype)?;
    use_compute_dtype::<B>(device, dtype)?;
    tracing::info!(backend = %B::name(device), ?dtype, "training on the GPU {how}");
    Ok(())
}

/// The rank alone on a GPU backend, computing in the recipe's `precision.dtype`.
fn train_on_gpu<B>(
    plan: &Plan,
    tokenizer: &Tokenizer,
    options: &RunOptions,
    device: &B::Device,
) -> anyhow::Result<RunSummary>
where
    B: ferrotron_train::TrainBackend,
{
    use_recipe_dtype::<B>(plan, device, "alone")?;
    let alone = ParallelContext::single();
    Ok(train_rank::<B>(plan, alone, tokenizer, options, device)?)
}

/// The GPU of a process rank: its local rank's, or 0 when the launcher bound one GPU to the
/// task and hid the others (`ferrotron_launch::gpu_ordinal`); logged, since a wrong guess shows
/// up as two ranks on one GPU or an invalid device ordinal.
fn gpu_of(env: &LaunchEnv) -> anyhow::Result<usize> {
    let visible = std::env::var(ferrotron_launch::CUDA_VISIBLE_DEVICES).ok();
    let choice =
        ferrotron_launch::gpu_ordinal(env.local_rank, env.tasks_per_node, visible.as_deref())
            .with_context(|| format!("choosing the GPU of rank {}", env.rank))?;
    let why = match choice {
        GpuChoice::AllVisible { .. } => "CUDA_VISIBLE_DEVICES unset: the local rank's".to_owned(),
        GpuChoice::Bound => "the one GPU CUDA_VISIBLE_DEVICES shows this task".to_owned(),
        GpuChoice::Listed { visible, .. } => {
            format!("the local rank's of {visible} in CUDA_VISIBLE_DEVICES")
        }
    };
    tracing::info!(
        rank = env.rank,
        local_rank = env.local_rank,
        gpu = choice.ordinal(),
        "GPU: {why}"
    );
    Ok(choice.ordinal())
}

/// The planner's GPU kind for a CUDA device name ("NVIDIA H200", "NVIDIA H100 80GB HBM3", ...).
fn gpu_kind(device_name: &str) -> Option<GpuKind> {
    let name = device_name.to_ascii_uppercase();
    [
        ("H200", GpuKind::H200),
        ("H100", GpuKind::H100),
        ("B200", GpuKind::B200),
        ("A100", GpuKind::A100),
    ]
    .into_iter()
    .find(|(marker, _)| name.contains(marker))
    .map(|(_, kind)| kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compute(backend: Backend, size: u32) -> anyhow::Result<Compute> {
        Launch::select(backend, World::Threads { size }, CommArg::Auto).map(|launch| launch.compute)
    }

    #[test]
    fn gpu_names_map_to_the_hardware_table() {
        assert_eq!(gpu_kind("NVIDIA H200"), Some(GpuKind::H200));
        assert_eq!(gpu_kind("NVIDIA H100 80GB HBM3"), Some(GpuKind::H100));
        assert_eq!(gpu_kind("NVIDIA A100-SXM4-80GB"), Some(GpuKind::A100));
        assert_eq!(gpu_kind("NVIDIA B200"), Some(GpuKind::B200));
        assert_eq!(gpu_kind("NVIDIA GeForce RTX 4090"), None);
    }

    #[test]
    fn gpu_backends_use_the_local_rank_and_refuse_multi_rank_worlds() {
        assert_eq!(
            compute(Backend::Cuda, 1).expect("one rank"),
            Compute::Cuda { ordinal: 0 }
        );
        assert_eq!(compute(Backend::Cpu, 4).expect("cpu"), Compute::Cpu);
        let err = compute(Backend::Cuda, 2).expect_err("two GPU ranks in one process");
        assert!(err.to_string().contains("one rank per process"), "{err}");
    }

    #[test]
    fn nccl_is_forced_only_on_our_cuda_backend() {
        let one =
            Launch::select(Backend::Cuda, World::Threads { size: 1 }, CommArg::Nccl).expect("cuda");
        assert!(one.nccl);
        let plain =
            Launch::select(Backend::Cuda, World::Threads { size: 1 }, CommArg::Auto).expect("cuda");
        assert!(!plain.nccl);
        let err = Launch::select(Backend::Cpu, World::Threads { size: 1 }, CommArg::Nccl)
            .expect_err("nccl on the cpu");
        assert!(err.to_string().contains("needs --backend cuda"), "{err}");
        let cpu =
            Launch::select(Backend::Cpu, World::Threads { size: 4 }, CommArg::Auto).expect("cpu");
        assert!(!cpu.nccl);
    }

    #[test]
    fn tcp_keeps_gpu_ranks_off_nccl() {
        let one =
            Launch::select(Backend::Cuda, World::Threads { size: 1 }, CommArg::Tcp).expect("cuda");
        assert!(!one.nccl);
        let err = Launch::select(Backend::BurnCuda, World::Threads { size: 1 }, CommArg::Tcp)
            .expect_err("stock burn-cuda has no rank loop over TCP");
        assert!(err.to_string().contains("need --backend cuda"), "{err}");
        let err = Launch::select(Backend::Cuda, World::Threads { size: 2 }, CommArg::Tcp)
            .expect_err("GPU ranks are processes");
        assert!(err.to_string().contains("one rank per process"), "{err}");
    }

    #[test]
    fn burn_cuda_needs_its_feature() {
        let selected = compute(Backend::BurnCuda, 1);
        if cfg!(feature = "burn-cuda") {
            assert_eq!(
                selected.expect("built in"),
                Compute::BurnCuda { ordinal: 0 }
            );
        } else {
            let err = selected.expect_err("not built in");
            assert!(err.to_string().contains("--features burn-cuda"), "{err}");
        }
    }
}
