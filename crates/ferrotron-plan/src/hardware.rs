//! What the planner assumes about each GPU kind and its links.
//!
//! Every figure carries its provenance: the datasheet, a measurement on this project's machines
//! (see `/work/shared/design.md`), or an assumption. The planner's predictions are only as good
//! as this table, so it is kept in one place and printed by `recipe plan --explain`.

use ferrotron_recipe::{Dtype, Fp8, GpuKind};
use serde::{Deserialize, Serialize};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
const MIB: f64 = 1024.0 * 1024.0;

/// Hopper's rates, fitted by least squares to the dense bench rows on one H200 and one H100
/// with the GEMMs at the rate gpt-1.3b's per-op timing measured (`tools/README.md`, "Where the
/// planner's fitted numbers come from"): GEMMs at this fraction of peak,
const HOPPER_GEMM_EFFICIENCY: f64 = 0.76;
/// fused attention without dropout at this fraction of peak by the planner's FLOP count,
const HOPPER_ATTENTION_EFFICIENCY: f64 = 0.405;
/// dropout at this many seconds a causal score (the forward alone, timed: 946 µs a layer of
/// gpt-1.3b 12 × 2048 with it and 390 without, 1.38 ps a score),
const HOPPER_DROPOUT_SECONDS_PER_SCORE: f64 = 1.8e-12;
/// The MoE experts' grouped GEMMs (cuBLAS's `cublasGemmGroupedBatchedEx`) at this fraction of
/// peak, where the runtime keeps them on that call (experts too small to fill the chip alone):
/// fitted to `qwen3-30b-a3b-4l` on one H100 (128 experts of 768, ~500 rows each; 0.126 s a step
/// on 2026-12-07, `tools/README.md`). In isolation the call runs 0.27–0.28 of peak at that
/// shape; in the step, with new row counts every call, its op time was 4.6 ms a call against
/// 1.5–3 ms. Other chips take the same ratio to their dense GEMM rate ([`GROUPED_TO_DENSE`]),
/// assumed.
const HOPPER_GROUPED_GEMM_EFFICIENCY: f64 = 0.14;
/// The grouped GEMMs' rate over the dense GEMMs' on Hopper.
const GROUPED_TO_DENSE: f64 = HOPPER_GROUPED_GEMM_EFFICIENCY / HOPPER_GEMM_EFFICIENCY;
/// The experts' GEMMs one per expert (cuBLASLt, each expert's output filling the chip) at this
/// fraction of peak: fitted to `moe-8x-mb16`, `mixtral-8x7b-2l` and `deepseek-v3-3l` on one
/// H100 (2026-12-07 09:53–09:56 UTC; predicted 1.01, 1.07 and 0.88 of their steps). In
/// isolation they ran 0.51–0.67 of peak (`gpu_check --filter device_grouped`).
const HOPPER_PER_EXPERT_GEMM_EFFICIENCY: f64 = 0.5;
/// The per-expert GEMMs' rate over the dense GEMMs' on Hopper.
const PER_EXPERT_TO_DENSE: f64 = HOPPER_PER_EXPERT_GEMM_EFFICIENCY / HOPPER_GEMM_EFFICIENCY;
/// The experts' GEMMs through Ferrotron's device-count kernel (warpgroup MMA fed by the TMA; the
/// counts never read back) at this fraction of peak, where the runtime takes it (experts too
/// small to fill the chip alone): fitted to `qwen3-30b-a3b-4l` and its 8-microbatch twin on one
/// H100 (2026-12-07 22:48 and 23:20 UTC, the TMA kernel: predicted 1.01 and 0.99 of their steps;
/// 0.16 fitted the cp.async kernel before). In isolation it ran 0.34–0.48 of peak at that shape
/// (`gpu_check --filter device_grouped`), cuBLAS's grouped call 0.27–0.29.
const HOPPER_DEVICE_COUNTS_GEMM_EFFICIENCY: f64 = 0.19;
/// The device-count kernel's rate over the dense GEMMs' on Hopper.
const DEVICE_COUNTS_TO_DENSE: f64 = HOPPER_DEVICE_COUNTS_GEMM_EFFICIENCY / HOPPER_GEMM_EFFICIENCY;
/// Hopper's dense fp32 peak, which the dropout cost of other chips is scaled by.
const HOPPER_PEAK_FP32: f64 = 67e12;
/// and the element-wise passes at this many of the bytes `time.rs` counts a second: the same
/// on both cards, whose steps took the same time, so not the HBM's bandwidth.
const HOPPER_ELEMENTWISE_BYTES_PER_SECOND: f64 = 0.432 * 4.8e12;

/// Performance figures of one accelerator kind.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GpuSpec {
    pub kind: GpuKind,
    /// Dense bf16/fp16 tensor-core peak, FLOP/s.
    pub peak_bf16: f64,
    /// Dense fp8 tensor-core peak, FLOP/s (0 where the chip has no fp8).
    pub peak_fp8: f64,
    /// Dense fp32 (non-tensor-core) peak, FLOP/s.
    pub peak_fp32: f64,
    /// Usable device memory, bytes.
    pub memory_bytes: f64,
    /// HBM bandwidth, bytes/s.
    pub memory_bandwidth: f64,
    /// Fraction of peak reached by large GEMMs.
    pub gemm_efficiency: f64,
    /// Fraction of peak reached by the MoE experts' grouped GEMMs (one call for every expert).
    pub grouped_gemm_efficiency: f64,
    /// Fraction of peak reached by the experts' GEMMs run one per expert, where each expert's
    /// output fills the chip (`runtime.grouped_gemm_per_expert`, `routed.rs`).
    pub per_expert_gemm_efficiency: f64,
    /// Fraction of peak reached by the experts' GEMMs through the device-count kernel, where
    /// they do not (`runtime.grouped_gemm_device_counts`, `routed.rs`).
    pub device_counts_gemm_efficiency: f64,
    /// Streaming multiprocessors: how many 128 × 128 output tiles fill the chip.
    pub multiprocessors: u32,
    /// Fraction of peak reached by fused (flash) attention without dropout, forward and
    /// backward together, by the planner's count of its FLOPs (`flops.rs`).
    pub attention_efficiency: f64,
    /// Fraction of HBM bandwidth the element-wise passes reach, as `time.rs` counts their bytes
    /// (it counts the main passes; the fit folds in the ones it leaves out and small kernels).
    pub memory_bound_efficiency: f64,
    /// All-reduce bus bandwidth inside a node, bytes/s.
    pub intra_node_bus_bandwidth: f64,
    /// Per-GPU network bandwidth across nodes, bytes/s (after protocol efficiency).
    pub inter_node_bandwidth: f64,
    /// Fixed cost of one collective call, seconds.
    pub collective_latency: f64,
    /// Memory the framework takes before the model: CUDA context, NCCL buffers, workspaces.
    pub framework_overhead_bytes: f64,
    /// Where these numbers come from.
    pub source: &'static str,
}

impl GpuSpec {
    pub fn of(kind: GpuKind) -> GpuSpec {
        match kind {
            GpuKind::A100 => GpuSpec {
                kind,
                peak_bf16: 312e12,
                peak_fp8: 0.0,
                peak_fp32: 19.5e12,
                memory_bytes: 80.0 * GIB,
                memory_bandwidth: 2.0e12,
                gemm_efficiency: 0.80,
                grouped_gemm_efficiency: 0.80 * GROUPED_TO_DENSE,
                per_expert_gemm_efficiency: 0.80 * PER_EXPERT_TO_DENSE,
                device_counts_gemm_efficiency: 0.80 * DEVICE_COUNTS_TO_DENSE,
                multiprocessors: 108,
                attention_efficiency: 0.55,
                memory_bound_efficiency: 1.0,
                intra_node_bus_bandwidth: 230e9,
                inter_node_bandwidth: 0.8 * 25e9,
                collective_latency: 20e-6,
                framework_overhead_bytes: 3.0 * GIB,
                source: "A100 SXM 80GB datasheet; efficiencies and NVLink3 bus bandwidth assumed; \
                         200 Gb/s InfiniBand per GPU at 80%",
            },
            // The same chip as the H200 with less and slower memory: its GEMMs, attention and
            // element-wise passes ran the bench rows in the same time (gpt-1.3b 12 × 2048:
            // 0.388 s a step on both), so it takes the H200's fitted rates, the element-wise
            // one scaled to the same bytes a second.
            GpuKind::H100 => GpuSpec {
                kind,
                peak_bf16: 989e12,
                peak_fp8: 1979e12,
                peak_fp32: HOPPER_PEAK_FP32,
                memory_bytes: 80.0 * GIB,
                memory_bandwidth: 3.35e12,
                gemm_efficiency: HOPPER_GEMM_EFFICIENCY,
                grouped_gemm_efficiency: HOPPER_GROUPED_GEMM_EFFICIENCY,
                per_expert_gemm_efficiency: HOPPER_PER_EXPERT_GEMM_EFFICIENCY,
                device_counts_gemm_efficiency: HOPPER_DEVICE_COUNTS_GEMM_EFFICIENCY,
                multiprocessors: 132,
                attention_efficiency: HOPPER_ATTENTION_EFFICIENCY,
                memory_bound_efficiency: HOPPER_ELEMENTWISE_BYTES_PER_SECOND / 3.35e12,
                intra_node_bus_bandwidth: 356e9,
                inter_node_bandwidth: 0.8 * 50e9,
                collective_latency: 20e-6,
                framework_overhead_bytes: 3.0 * GIB,
                source: "H100 SXM datasheet; GEMM, attention and element-wise rates the H200's \
                         (the same chip: the bench rows ran in the same time on both); NVLink \
                         all-reduce bus bandwidth as measured on H200 (356 GB/s); 400 Gb/s \
                         InfiniBand per GPU at 80%",
            },
            GpuKind::H200 => GpuSpec {
                kind,
                peak_bf16: 989e12,
                peak_fp8: 1979e12,
                peak_fp32: HOPPER_PEAK_FP32,
                memory_bytes: 140.0 * GIB,
                memory_bandwidth: 4.8e12,
                // Fitted to `tools/gpu-bench.sh` rows on one H200 and one H100 (`tools/README.md`,
                // "Where the planner's fitted numbers come from"); the overhead is the device's
                // peak less the allocator's (the CUDA context, cuBLAS/cuDNN workspaces, module
                // images); `tests/bench_rows.rs` holds every dense row's prediction within 10 %.
                gemm_efficiency: HOPPER_GEMM_EFFICIENCY,
                grouped_gemm_efficiency: HOPPER_GROUPED_GEMM_EFFICIENCY,
                per_expert_gemm_efficiency: HOPPER_PER_EXPERT_GEMM_EFFICIENCY,
                device_counts_gemm_efficiency: HOPPER_DEVICE_COUNTS_GEMM_EFFICIENCY,
                multiprocessors: 132,
                attention_efficiency: HOPPER_ATTENTION_EFFICIENCY,
                memory_bound_efficiency: HOPPER_ELEMENTWISE_BYTES_PER_SECOND / 4.8e12,
                intra_node_bus_bandwidth: 356e9,
                inter_node_bandwidth: 0.8 * 50e9,
                collective_latency: 20e-6,
                framework_overhead_bytes: 0.6 * GIB,
                source: "H200 SXM datasheet; fitted here \
                         (tools/gpu-bench.sh, one H200 and one H100): training GEMMs 0.76 of \
                         peak, fused attention 0.405 without dropout and 1.8 ps a causal score \
                         with it, element-wise passes at 2.07 TB/s, 0.6 GiB outside the \
                         tensors; NCCL all-reduce bus bandwidth 356 GB/s on 4 GPUs; 400 Gb/s \
                         InfiniBand per GPU at 80%",
            },
            GpuKind::B200 => GpuSpec {
                kind,
                peak_bf16: 2250e12,
                peak_fp8: 4500e12,
                peak_fp32: 80e12,
                memory_bytes: 180.0 * GIB,
                memory_bandwidth: 8.0e12,
                gemm_efficiency: 0.75,
                grouped_gemm_efficiency: 0.75 * GROUPED_TO_DENSE,
                per_expert_gemm_efficiency: 0.75 * PER_EXPERT_TO_DENSE,
                device_counts_gemm_efficiency: 0.75 * DEVICE_COUNTS_TO_DENSE,
                multiprocessors: 148,
                attention_efficiency: 0.50,
                memory_bound_efficiency: 1.0,
                intra_node_bus_bandwidth: 700e9,
                inter_node_bandwidth: 0.8 * 100e9,
                collective_latency: 20e-6,
                framework_overhead_bytes: 3.0 * GIB,
                source: "B200 datasheet; efficiencies and NVLink5 bus bandwidth assumed; \
                         800 Gb/s InfiniBand per GPU at 80%",
            },
            GpuKind::Cpu => GpuSpec {
                kind,
                peak_bf16: 100e9,
                peak_fp8: 0.0,
                peak_fp32: 100e9,
                memory_bytes: 16.0 * GIB,
                memory_bandwidth: 20e9,
                gemm_efficiency: 0.5,
                grouped_gemm_efficiency: 0.5 * GROUPED_TO_DENSE,
                per_expert_gemm_efficiency: 0.5 * GROUPED_TO_DENSE,
                device_counts_gemm_efficiency: 0.5 * GROUPED_TO_DENSE,
                multiprocessors: 1,
                attention_efficiency: 0.3,
                memory_bound_efficiency: 1.0,
                intra_node_bus_bandwidth: 5e9,
                inter_node_bandwidth: 1e9,
                collective_latency: 50e-6,
                framework_overhead_bytes: 0.25 * GIB,
                source: "NOMINAL cpu rank (one thread group): 100 GFLOP/s, 16 GiB, in-process \
                         collectives; a placeholder so CPU plans have numbers, not a measurement",
            },
        }
    }

    /// The tensor-core peak for the precision the GEMMs run in.
    pub fn peak(&self, dtype: Dtype, fp8: Fp8) -> f64 {
        if fp8 != Fp8::None && self.peak_fp8 > 0.0 {
            return self.peak_fp8;
        }
        match dtype {
            Dtype::Bf16 | Dtype::Fp16 => self.peak_bf16,
            Dtype::Fp32 => self.peak_fp32,
        }
    }

    /// The MFU denominator: the dense peak of the recipe's 16- or 32-bit dtype, for fp8 recipes
    /// too. Megatron and torchtitan count MFU against the bf16 peak (989 TFLOP/s on an H100 or
    /// H200), so an fp8 run's MFU is comparable with the same model's bf16 run and its gain
    /// shows as a higher MFU, not as a lower one against the fp8 peak.
    pub fn mfu_peak(&self, dtype: Dtype) -> f64 {
        self.peak(dtype, Fp8::None)
    }

    /// Seconds attention dropout adds per causal score (`b·heads·s²/2` a layer), forward and
    /// backward: the kernel draws a random number for every score, which costs the same at any
    /// head dim. Fitted on Hopper; another chip's scales with its fp32 rate, the units that
    /// draw the numbers (an assumption until measured there).
    pub fn attention_dropout_seconds_per_score(&self) -> f64 {
        HOPPER_DROPOUT_SECONDS_PER_SCORE * HOPPER_PEAK_FP32 / self.peak_fp32
    }

    /// Whether the chip has fp8 tensor cores.
    pub fn supports_fp8(&self) -> bool {
        self.peak_fp8 > 0.0
    }
}

/// What the planner assumes about the host side of a GPU node: the memory and CPU cores that
/// hold and update the optimizer state `training.optimizer.optimizer_cpu_offload` moves off the
/// device, and the PCIe links the gradients and weights cross every step.
///
/// Initial, not measured: the rates are starting values to be calibrated by `tools/gpu-bench`
/// (a D2H/H2D copy and a host AdamW pass on the GPU machine) and replaced here with their
/// measurement and date.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct HostSpec {
    /// Host memory per GPU of a node, bytes; a node of g GPUs has g times this. 128 GiB is the
    /// project's one-, two- and four-GPU H100/H200 machines exactly (128, 256 and 512 GiB); its
    /// eight-GPU machine has 560 GiB (70 GiB per GPU), a DGX H100 2 TiB (256).
    pub memory_per_gpu_bytes: f64,
    /// Host memory of a node the offloaded state cannot have: the OS, the training processes'
    /// own heaps, the data loader's pages. Assumed.
    pub reserved_per_node_bytes: f64,
    /// Host memory per rank for the copies in flight: the runtime streams the offloaded
    /// update through four page-locked pieces of 32 MiB (ferrotron-cuda `host_pass.rs`).
    pub transfer_buffer_bytes: f64,
    /// Device-to-host copy rate of one GPU into page-locked memory, bytes/s: 54 GB/s measured
    /// on one H100 80 GB (PCIe 5, `torch` copies of 256 MiB; `tools/host_probe.py`).
    pub device_to_host_bandwidth: f64,
    /// Host-to-device copy rate of one GPU from page-locked memory, bytes/s: 54 GB/s, as above.
    pub host_to_device_bandwidth: f64,
    /// Memory traffic a node's CPU cores sustain running AdamW (what it reads and writes per
    /// parameter), bytes/s, shared by the node's ranks: 150 GB/s, the streamed host pass's own
    /// rate on the 16 cores of the one-H100 machine (`tools/gpu-bench.sh` offload rows, the
    /// `ferrotron::offload` log: the 8B shape's 8.03 B parameters at 30 bytes each in 1.52 s,
    /// gpt-1.3b's 1.32 B in 0.27 s; `tools/README.md`, issue 49).
    pub cpu_optimizer_bandwidth: f64,
}

/// The host of every GPU kind's node until measurements tell them apart; `cpu` ranks have no
/// separate host (their state already lives in host memory).
pub(crate) const GPU_HOST: HostSpec = HostSpec {
    memory_per_gpu_bytes: 128.0 * GIB,
    reserved_per_node_bytes: 16.0 * GIB,
    transfer_buffer_bytes: 128.0 * MIB,
    device_to_host_bandwidth: 54e9,
    host_to_device_bandwidth: 54e9,
    cpu_optimizer_bandwidth: 150e9,
};

/// The name users write and read (`h100`, `cpu`), upper-cased for GPUs as datasheets do.
pub fn gpu_name(gpu: GpuKind) -> &'static str {
    match gpu {
        GpuKind::A100 => "A100",
        GpuKind::H100 => "H100",
        GpuKind::H200 => "H200",
        GpuKind::B200 => "B200",
        GpuKind::Cpu => "cpu",
    }
}

/// The recipe spelling of a dtype.
pub(crate) fn dtype_name(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::Bf16 => "bf16",
        Dtype::Fp16 => "fp16",
        Dtype::Fp32 => "fp32",
    }
}

/// Peak dense FLOP/s of one `gpu` for GEMMs in `dtype` (or fp8 when enabled and supported).
/// The denominator of MFU.
pub fn peak_flops(gpu: GpuKind, dtype: Dtype, fp8: Fp8) -> f64 {
    GpuSpec::of(gpu).peak(dtype, fp8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datasheet_peaks() {
        assert_eq!(peak_flops(GpuKind::H100, Dtype::Bf16, Fp8::None), 989e12);
        assert_eq!(peak_flops(GpuKind::H200, Dtype::Bf16, Fp8::Hybrid), 1979e12);
        assert_eq!(peak_flops(GpuKind::A100, Dtype::Fp16, Fp8::None), 312e12);
        assert_eq!(peak_flops(GpuKind::B200, Dtype::Bf16, Fp8::None), 2250e12);
    }

    #[test]
    fn fp8_on_a_chip_without_it_falls_back_to_bf16() {
        assert_eq!(peak_flops(GpuKind::A100, Dtype::Bf16, Fp8::E4m3), 312e12);
        assert!(!GpuSpec::of(GpuKind::A100).supports_fp8());
    }

    #[test]
    fn fitted_h200_gemm_rate_is_what_training_gemms_reach() {
        // gpt-1.3b's GEMMs over a step, in the per-op timing: 750 TFLOP/s; cuBLASLt alone on
        // one large square product reaches 760-830 (`tools/README.md`).
        let spec = GpuSpec::of(GpuKind::H200);
        let rate = spec.peak_bf16 * spec.gemm_efficiency;
        assert!((740e12..=760e12).contains(&rate), "{rate}");
    }
}
