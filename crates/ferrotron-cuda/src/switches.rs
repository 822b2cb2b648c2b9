//! Every switch of the backend in one place.
//!
//! Two kinds, because they answer different questions. The [`Paths`] choose between the
//! backend's own kernels and burn's composition (fused attention, the fused norm/loss/AdamW
//! kernels, vectorised maps, the grouped GEMM, GEMM and attention tuning, the one-pass norm
//! backward, pinned uploads): several change a run's numbers, so they belong to the run and
//! come from its recipe's `runtime` section (`configure`, before the first op), which the run
//! manifest records with the recipe. The [`EnvVars`] only help debugging or say where things
//! live on this machine (op timing, the timeline, poisoned allocations, NCCL count checks, the
//! kernel cache, CUDA headers): they stay environment variables, read once, and the set ones are
//! logged and recorded too ([`set_env_vars`]).

use std::sync::OnceLock;

/// Which of the backend's own paths a run takes; every one measured on a GPU is on by default
/// (off to compare with burn's composition), a newer one is opt-in until it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Paths {
    /// cuDNN's fused flash attention (off: burn's attention, composed).
    pub fused_attention: bool,
    /// The norm, cross-entropy, AdamW, RoPE, QK-norm, SwiGLU and MoE routing kernels.
    pub fused_kernels: bool,
    /// The vectorised loop of contiguous element-wise maps.
    pub vector_maps: bool,
    /// One grouped GEMM for every expert (off: a GEMM per expert).
    pub grouped_gemm: bool,
    /// That GEMM reads the experts' row counts on the device (`kernels/fused/grouped_gemm.rs`)
    /// where the experts are too small for one cuBLASLt GEMM each (off: cuBLAS's grouped call
    /// with host counts there).
    pub grouped_gemm_device_counts: bool,
    /// The grouped GEMMs (forward and both gradients) as one cuBLASLt GEMM per expert where
    /// each expert fills the GPU (`blas/grouped.rs`; off: cuBLAS's grouped call always).
    pub grouped_gemm_per_expert: bool,
    /// Time cuBLASLt's candidate algorithms per GEMM shape and keep the fastest.
    pub gemm_tune: bool,
    /// Time cuDNN's candidate plans per attention graph and keep the fastest.
    pub attention_tune: bool,
    /// The one-pass norm backward (off: the input gradient and the γ/β reduction apart).
    pub norm_one_pass: bool,
    /// Host-to-device uploads through pinned staging buffers.
    pub pinned_uploads: bool,
    /// A GELU MLP's fc1 bias added inside GELU, the bias gradient summed in GELU's backward
    /// pass (`kernels/fused/bias_gelu.rs`; off: the linear's bias and a second read of the
    /// gradient). Off by default until measured on a GPU.
    pub bias_gelu_fusion: bool,
    /// Which device-count grouped GEMM Hopper runs (`grouped_gemm::Kernel::chosen`).
    pub grouped_gemm_kernel: GroupedKernel,
}

/// The recipe's `runtime.grouped_gemm_kernel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupedKernel {
    /// The measured best.
    #[default]
    Auto,
    /// The warpgroup kernel fed by cp.async (the best before the TMA kernel was measured).
    CpAsync,
    /// The warp-specialised persistent kernel fed by the TMA.
    Tma,
    /// The same in two-block clusters sharing the row tile.
    TmaCluster,
    /// The TMA kernel on the ping-pong schedule (two consumer warpgroups on alternate tiles).
    TmaPingpong,
}

impl Default for Paths {
    fn default() -> Self {
        Paths {
            fused_attention: true,
            fused_kernels: true,
            vector_maps: true,
            grouped_gemm: true,
            grouped_gemm_device_counts: true,
            grouped_gemm_per_expert: true,
            gemm_tune: true,
            attention_tune: true,
            norm_one_pass: true,
            pinned_uploads: true,
            bias_gelu_fusion: false,
            grouped_gemm_kernel: GroupedKernel::Auto,
        }
    }
}

static PATHS: OnceLock<Paths> = OnceLock::new();

/// Sets this process's paths, before its first op. A process holds one configuration: a second
/// call with other paths (or a call after an op already read the defaults) is refused with the
/// paths in force.
pub fn configure(paths: Paths) -> Result<(), Paths> {
    let held = *PATHS.get_or_init(|| paths);
    if held == paths { Ok(()) } else { Err(held) }
}

/// The paths in force (the defaults where nothing configured them).
pub fn paths() -> Paths {
    *PATHS.get_or_init(Paths::default)
}

/// The environment variables the backend reads (uv's `EnvVars` pattern: each name once, with
/// what it does).
pub struct EnvVars;

impl EnvVars {
    /// A path: the per-op GPU time table is written there at exit (`1`: to stderr); a training
    /// run's table starts after its first step (`FusedOps::first_step_queued`).
    pub const OP_TIMING: &'static str = "FERROTRON_OP_TIMING";
    /// A path: every op's start and end on the stream, for `tools/gpu_timeline.py`.
    pub const OP_TIMELINE: &'static str = "FERROTRON_OP_TIMELINE";
    /// Set: fresh allocations are filled with NaN, so a kernel reading what it never wrote shows.
    pub const CUDA_POISON: &'static str = "FERROTRON_CUDA_POISON";
    /// Set (not `0`): every NCCL collective first checks that all ranks pass the same count.
    pub const NCCL_CHECK_COUNTS: &'static str = "FERROTRON_NCCL_CHECK_COUNTS";
    /// Seconds: the NCCL timeout of communicators made without a recipe (`gpu_check`).
    pub const NCCL_TIMEOUT_S: &'static str = "FERROTRON_NCCL_TIMEOUT_S";
    /// A folder: where compiled kernels are cached (default: the user cache folder).
    pub const KERNEL_CACHE: &'static str = "FERROTRON_KERNEL_CACHE";
    /// Folders (`:`-separated): where NVRTC finds the CUDA headers.
    pub const CUDA_INCLUDE: &'static str = "FERROTRON_CUDA_INCLUDE";

    /// Every variable above.
    pub const ALL: [&'static str; 7] = [
        Self::OP_TIMING,
        Self::OP_TIMELINE,
        Self::CUDA_POISON,
        Self::NCCL_CHECK_COUNTS,
        Self::NCCL_TIMEOUT_S,
        Self::KERNEL_CACHE,
        Self::CUDA_INCLUDE,
    ];
}

/// The backend's environment variables that are set, with their values, read once.
pub fn set_env_vars() -> &'static [(&'static str, String)] {
    static SET: OnceLock<Vec<(&'static str, String)>> = OnceLock::new();
    SET.get_or_init(|| {
        EnvVars::ALL
            .into_iter()
            .filter_map(|name| Some((name, std::env::var(name).ok()?)))
            .collect()
    })
}

/// The value of one of [`EnvVars`], as read at the first look.
pub(crate) fn env_var(name: &str) -> Option<&'static str> {
    set_env_vars()
        .iter()
        .find(|(set, _)| *set == name)
        .map(|(_, value)| value.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_holds_one_configuration() {
        let mine = Paths {
            gemm_tune: false,
            ..Paths::default()
        };
        // the test binary's first configuration (tests share the process: take what holds)
        let held = match configure(mine) {
            Ok(()) => mine,
            Err(held) => held,
        };
        assert_eq!(paths(), held);
        let other = Paths {
            gemm_tune: !held.gemm_tune,
            ..held
        };
        assert_eq!(configure(other), Err(held));
        assert_eq!(configure(held), Ok(()));
    }

    #[test]
    fn every_variable_is_named_once_with_the_prefix() {
        let mut names = EnvVars::ALL.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), EnvVars::ALL.len());
        assert!(names.iter().all(|n| n.starts_with("FERROTRON_")));
    }
}
