//! Which burn backend `recipe run` trains on, and what that changes around the run: the GPU a
//! process uses (the launcher's local rank), the cluster the planner sees (the GPU found on the
//! machine, so throughput and MFU are measured against that chip's peak, not the recipe's
//! guess), the compute dtype (`precision.dtype` on GPUs, fp32 on the CPU) and, on our own CUDA
//! backend, the peak device memory reported at the end.
//!
//! Backends are types in burn, so this is the one place that names them; everything past it is
//! generic (`ferrotron_train::train::<B>`). `burn-cuda` (the stock burn-cuda 0.21 backend, the
//! reference our own is checked against) is behind the cargo feature of the same name: it pulls
//! cubecl and takes minutes to build.

use anyhow::Context;
use burn::backend::Autodiff;
use burn::tensor::backend::AutodiffBackend;
use ferrotron_parallel::ParallelOps;
use ferrotron_plan::Plan;
use ferrotron_recipe::{Backend, Cluster, GpuKind, Recipe};
use ferrotron_telemetry::MemoryProbe;
use ferrotron_train::precision::{compute_dtype, use_compute_dtype};
use ferrotron_train::{RunOptions, RunSummary};

use super::world::RunWorld;

/// The backend of this run, with the GPU it uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeBackend {
    /// burn-flex on the CPU (thread ranks or one rank of a process world).
    Cpu,
    /// Ferrotron's own CUDA backend (`ferrotron_cuda::Cuda`) on device `ordinal`.
    Cuda { ordinal: usize },
    /// The stock burn-cuda 0.21 backend on device `ordinal`.
    BurnCuda { ordinal: usize },
}

impl ComputeBackend {
    /// `backend` for this process: a GPU backend uses the GPU numbered by the launcher's local
    /// rank (srun/torchrun), else GPU 0. Fails early, before planning, when the binary lacks the
    /// backend or the world needs more than one GPU rank per process.
    pub fn select(backend: Backend, world: &RunWorld) -> anyhow::Result<ComputeBackend> {
        let ordinal = match world {
            RunWorld::Process(env) => env.local_rank as usize,
            RunWorld::Threads { .. } => 0,
        };
        let selected = match backend {
            Backend::Cpu => return Ok(ComputeBackend::Cpu),
            Backend::Cuda => ComputeBackend::Cuda { ordinal },
            Backend::BurnCuda if cfg!(feature = "burn-cuda") => {
                ComputeBackend::BurnCuda { ordinal }
            }
            Backend::BurnCuda => anyhow::bail!(
                "this `recipe` binary was built without the stock burn-cuda backend; rebuild with \
                 `cargo build --release -p ferrotron-cli --features burn-cuda`, or use \
                 --backend cuda (ours) or cpu"
            ),
        };
        let ranks = match world {
            RunWorld::Threads { size } => *size,
            RunWorld::Process(env) => env.world_size,
        };
        if ranks != 1 {
            anyhow::bail!(
                "GPU backends train one rank per process, and a multi-GPU world needs NCCL \
                 communicators, which are not wired in yet: run one rank (--world-size 1 and \
                 parallel degrees of 1), or --backend cpu for a {ranks}-rank layout"
            );
        }
        Ok(selected)
    }

    /// What a logged step reports as its memory: on our CUDA backend the bytes live tensors hold on
    /// the device (the allocator's count, no synchronisation), elsewhere the process's resident
    /// memory (stock burn-cuda exposes no counter).
    pub fn memory_probe(&self) -> MemoryProbe {
        match *self {
            ComputeBackend::Cuda { ordinal } => {
                MemoryProbe::new("device memory allocated", move || {
                    ferrotron_cuda::CudaDevice::get(ordinal)
                        .map(|device| device.memory_stats().allocated_bytes)
                        .unwrap_or(0)
                })
            }
            ComputeBackend::Cpu | ComputeBackend::BurnCuda { .. } => MemoryProbe::process(),
        }
    }

    /// The cluster to plan on: the world's shape, with the GPU kind detected from the device
    /// (so the plan's peak FLOP/s and memory are this chip's).
    pub fn cluster(&self, world: &RunWorld, recipe: &Recipe) -> anyhow::Result<Cluster> {
        let cluster = world.cluster(recipe);
        let ordinal = match *self {
            ComputeBackend::Cpu => return Ok(cluster),
            ComputeBackend::Cuda { ordinal } | ComputeBackend::BurnCuda { ordinal } => ordinal,
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

    /// Train this process's ranks on the backend.
    pub fn train(
        &self,
        world: &RunWorld,
        plan: &Plan,
        options: &RunOptions,
    ) -> anyhow::Result<RunSummary> {
        match *self {
            ComputeBackend::Cpu => world.train(plan, options),
            ComputeBackend::Cuda { ordinal } => {
                let device = ferrotron_cuda::GpuDevice::new(ordinal);
                let summary =
                    train_on_gpu::<Autodiff<ferrotron_cuda::Cuda>>(plan, options, &device);
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
            ComputeBackend::BurnCuda { ordinal } => {
                let device = burn::backend::cuda::CudaDevice::new(ordinal);
                train_on_gpu::<Autodiff<burn::backend::Cuda>>(plan, options, &device)
            }
            #[cfg(not(feature = "burn-cuda"))]
            ComputeBackend::BurnCuda { .. } => {
                anyhow::bail!("this `recipe` binary was built without the burn-cuda backend")
            }
        }
    }
}

const GIB: f64 = (1u64 << 30) as f64;

/// One rank on a GPU backend, computing in the recipe's `precision.dtype` (set as the device's
/// default float dtype before the model exists; see `ferrotron_train::precision`).
fn train_on_gpu<B>(
    plan: &Plan,
    options: &RunOptions,
    device: &B::Device,
) -> anyhow::Result<RunSummary>
where
    B: AutodiffBackend + ParallelOps,
    B::InnerBackend: ParallelOps,
{
    let dtype = compute_dtype(plan.recipe.precision.dtype)?;
    use_compute_dtype::<B>(device, dtype)?;
    tracing::info!(backend = %B::name(device), ?dtype, "training on the GPU");
    Ok(ferrotron_train::train::<B>(plan, options, device)?)
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
        let one = RunWorld::Threads { size: 1 };
        assert_eq!(
            ComputeBackend::select(Backend::Cuda, &one).expect("one rank"),
            ComputeBackend::Cuda { ordinal: 0 }
        );
        assert_eq!(
            ComputeBackend::select(Backend::Cpu, &RunWorld::Threads { size: 4 }).expect("cpu"),
            ComputeBackend::Cpu
        );
        let err = ComputeBackend::select(Backend::Cuda, &RunWorld::Threads { size: 2 })
            .expect_err("two GPU ranks in one process");
        assert!(err.to_string().contains("one rank per process"), "{err}");
    }

    #[test]
    fn burn_cuda_needs_its_feature() {
        let selected = ComputeBackend::select(Backend::BurnCuda, &RunWorld::Threads { size: 1 });
        if cfg!(feature = "burn-cuda") {
            assert_eq!(
                selected.expect("built in"),
                ComputeBackend::BurnCuda { ordinal: 0 }
            );
        } else {
            let err = selected.expect_err("not built in");
            assert!(err.to_string().contains("--features burn-cuda"), "{err}");
        }
    }
}
