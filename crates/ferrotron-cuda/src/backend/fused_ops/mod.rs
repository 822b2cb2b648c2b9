//! [`FusedOps`] for [`Cuda`]: attention on cuDNN's fused flash-attention engines (bf16/f16,
//! head dims 64 and 128, or on Hopper a value head dim of its own (multi-latent attention:
//! d_qk 192 with d_v 128, any multiples of 8 up to 256; `cudnn::supports` says why), causal or
//! not, with or without a sliding window, grouped K/V unrepeated, dropout by cuDNN's Philox from
//! the device's seed and a fresh counter range, regenerated in the backward), also straight
//! from the packed QKV projection (`cudnn::packed`).
//!
//! `runtime.fused_attention: false` keeps burn's composition (today's arithmetic); f32 inputs and
//! other head dims always take it (cuDNN's fused attention has no f32 path). With cuDNN
//! missing, the first fused call stops with an error naming what to install.
//!
//! LayerNorm/RMSNorm, the AdamW update (`kernels/fused/adamw.rs`, writing the 16-bit parameter's
//! rounded copy in the same pass, in place on state nothing else holds), the gradient norm's sums
//! of squares (`kernels/prim/sum_squares.rs`, 16-byte loads of 16-bit gradients as they are), the
//! gathering of gradients into the optimizer's flat buffers (`kernels/fused/flat.rs`), the softmax
//! cross-entropy (`kernels/fused/loss.rs`) and the residual add with hidden dropout
//! (`kernels/prim/random.rs`' `dropout_add`, the keep bits drawn in the add and again in the
//! backward), SwiGLU of the packed projection (`kernels/fused/swiglu.rs`), RoPE on it
//! (`kernels/fused/rope.rs`) and its per-head QK-norm (`kernels/fused/qk_norm.rs`) run on our own
//! kernels, for every float dtype; the MoE experts' grouped matmul runs as cuBLAS grouped GEMMs
//! (`blas/grouped.rs`, also switched off alone by `runtime.grouped_gemm: false`), and their routing
//! decisions (top-k and the permutation by expert, `kernels/fused/moe.rs`), the router with its
//! combine weights (`kernels/fused/moe_router.rs`) and its balancing and z-loss terms
//! (`kernels/fused/moe_router_aux.rs`) on ours; `runtime.fused_kernels: false` switches all of
//! them back to burn's composition and the routing decisions to the host reference. The fp8 linear's primitives (casts, the fp8 GEMM, the scale update) are
//! `kernels/fp8`'s and `blas/fp8_gemm.rs`'s, glued in `fp8.rs`, refused below compute capability
//! 9.0.

mod fp8;
mod fp8_experts;

use burn::tensor::ops::{FloatTensor, IntTensor};
use ferrotron_ops::fp8::scaling::{Fp8Role, Fp8Settings};
use ferrotron_ops::kernel_or_composed;
use ferrotron_ops::{
    AdamWStep, AdamWTensors, AttentionGrads, AttentionSaved, AttentionSpec, CombineIndex,
    CombineSpec, CrossEntropySaved, DeviceScale, DropoutMask, DropoutSaved, FlatPiece, FlatSegment,
    Fp8InputNorm, Fp8Linear, Fp8Operand, Fp8Source, Fp8State, Fp8Tensor, FusedOps, GroupLimit,
    GroupRows, GroupedMatmulGrads, GroupedMatmulPartsGrads, HostPass, MoePermutation, MoeRouting,
    NormGrads, NormKind, NormSaved, NormSpec, NormStats, QkNormGrads, QkNormParams, QkNormSaved,
    ReadLater, RouterAux, RouterAuxSpec, RouterSpec, composed_adamw, composed_attention,
    composed_bias_gelu, composed_gather_flat, composed_grouped_matmul, composed_moe_router,
    composed_moe_router_aux, composed_qk_norm, composed_qkv_attention, composed_rope_qkv,
    composed_segment_sum_of_squares, composed_sum_of_squares, composed_swiglu,
    fp8_quantize_norm_composed, gather_rows_backward_reference, moe_permutation_reference,
    moe_topk_reference,
};

use crate::backend::convert::ok;
use crate::backend::{Cuda, GpuDevice};
use crate::cudnn;
use crate::engine::dtype::DType;

use crate::blas::grouped::{self, Weights, grouped_matmul, grouped_matmul_backward};
use crate::engine::layout::SliceArg;
use crate::kernels::fused::loss::{cross_entropy_backward, cross_entropy_forward};
use crate::kernels::fused::qk_norm::{self, qk_norm_backward, qk_norm_forward};
use crate::kernels::fused::rope::{rope_qkv_backward, rope_qkv_forward};
use crate::kernels::fused::swiglu::{swiglu_backward, swiglu_forward};
use crate::kernels::fused::{adamw, bias_gelu, norm_backward, norm_forward};
use crate::kernels::fused::{combine, gather_sum, moe, moe_router, moe_router_aux};
use crate::kernels::fused::{flat, grouped_gemm};
use crate::kernels::prim::random;
use crate::kernels::prim::reduce::{ReduceOp, reduce_all};
use crate::kernels::prim::sum_squares;

/// Whether fused attention is on (the recipe's `runtime.fused_attention`).
pub(crate) fn fused_attention_enabled() -> bool {
    crate::switches::paths().fused_attention
}

/// Whether the norm, cross-entropy, AdamW and the other kernels are on (the recipe's
/// `runtime.fused_kernels`).
pub(crate) fn fused_kernels_enabled() -> bool {
    crate::switches::paths().fused_kernels
}

/// Whether the experts' grouped matmul of `x` and `weights` reads the counts on the device: the
/// recipe's `runtime.grouped_gemm_device_counts`, shapes the kernel takes, and experts too
/// small for one cuBLASLt GEMM each. Where the mean expert fills the GPU those GEMMs run at
/// 1.5–1.7× the device-count kernel's rate (H100, 2026-12-07: 600–664 TFLOP/s against 383–405
/// at Mixtral's shape) and are worth the counts' read; below, the kernel beats cuBLAS's grouped
/// call (Qwen3-30B-A3B's experts: forward 1.209 ms against 1.398) and nothing is read back.
fn device_counts_gemm(x: &FloatTensor<Cuda>, weights: Weights<'_>) -> bool {
    let Some((groups, _, n)) = weights.dims() else {
        return false;
    };
    crate::switches::paths().grouped_gemm_device_counts
        && grouped_gemm::supports(x, weights)
        && !grouped::per_expert_expected(x.device(), n, x.shape()[0], groups)
}

/// The experts' grouped matmul: the device-count kernel where it is on and takes the shapes
/// (nothing read back), else the cuBLAS paths over the counts as host numbers.
fn grouped_forward(
    x: &FloatTensor<Cuda>,
    weights: Weights<'_>,
    group_rows: &GroupRows<Cuda>,
) -> FloatTensor<Cuda> {
    if device_counts_gemm(x, weights) {
        let counts = group_rows.device(&crate::backend::shared::device(x));
        let kernel = grouped_gemm::Kernel::chosen(x.device(), group_rows.groups());
        return ok(grouped_gemm::forward(kernel, x, weights, &counts));
    }
    ok(grouped_matmul(x, weights, group_rows.host()))
}

/// Both gradients of [`grouped_forward`]: `(dx, dweight [groups, k, n])`.
fn grouped_backward(
    x: &FloatTensor<Cuda>,
    weights: Weights<'_>,
    grad_output: &FloatTensor<Cuda>,
    group_rows: &GroupRows<Cuda>,
) -> (FloatTensor<Cuda>, FloatTensor<Cuda>) {
    if !device_counts_gemm(x, weights) {
        return ok(grouped_matmul_backward(
            x,
            weights,
            grad_output,
            group_rows.host(),
        ));
    }
    let counts = group_rows.device(&crate::backend::shared::device(x));
    let grad = ok(grad_output.cast(x.dtype()));
    let groups = group_rows.groups();
    let kernel = grouped_gemm::Kernel::chosen(x.device(), groups);
    (
        ok(grouped_gemm::input_grad(kernel, &grad, weights, &counts)),
        ok(grouped_gemm::weight_grad(kernel, x, &grad, &counts, groups)),
    )
}

/// What an attention node keeps, from cuDNN's forward.
fn saved_of(f: cudnn::SdpaForward) -> AttentionSaved<Cuda> {
    AttentionSaved {
        output: f.output,
        stats: f.stats,
        rng: f.rng,
    }
}

/// cuDNN's forward state, from what an attention node kept.
fn forward_of(saved: AttentionSaved<Cuda>) -> cudnn::SdpaForward {
    cudnn::SdpaForward {
        output: saved.output,
        stats: saved.stats,
        rng: saved.rng,
    }
}

/// cuDNN's mask for a spec over `keys` keys (a window reaching every key is none).
fn mask_of(spec: &AttentionSpec, keys: usize) -> cudnn::SdpaMask {
    cudnn::SdpaMask {
        causal: spec.causal,
        window: spec.effective_window(keys).map(|left| left as i64),
    }
}

fn is_float(t: &FloatTensor<Cuda>) -> bool {
    matches!(t.dtype(), DType::F32 | DType::BF16 | DType::F16)
}

impl FusedOps for Cuda {
    fn fp8_support(device: &GpuDevice, settings: &Fp8Settings) -> Result<(), String> {
        fp8::fp8_support(device, settings)
    }

    fn fp8_quantize(
        x: FloatTensor<Self>,
        fp8: &Fp8Linear,
        role: Fp8Role,
        record: bool,
    ) -> Fp8Tensor<Self> {
        fp8::fp8_quantize_op(x, fp8, role, record)
    }

    fn fp8_quantize_source(
        source: Fp8Source<Self>,
        fp8: &Fp8Linear,
        role: Fp8Role,
        record: bool,
        bias_grad: bool,
    ) -> (Fp8Tensor<Self>, Option<FloatTensor<Self>>) {
        fp8::fp8_quantize_source_op(source, fp8, role, record, bias_grad)
    }

    fn fp8_matmul(
        a: Fp8Operand<Self>,
        b: Fp8Operand<Self>,
        bias: Option<FloatTensor<Self>>,
        dtype: burn::tensor::DType,
        fast_accumulation: bool,
    ) -> FloatTensor<Self> {
        fp8::fp8_matmul_op(a, b, bias, dtype, fast_accumulation)
    }

    fn fp8_grouped_rows(
        a: Fp8Operand<Self>,
        b: &[Fp8Operand<Self>],
        group_rows: &GroupRows<Self>,
        dtype: burn::tensor::DType,
        fast_accumulation: bool,
    ) -> FloatTensor<Self> {
        fp8_experts::fp8_grouped_rows_op(a, b, group_rows, dtype, fast_accumulation)
    }

    fn fp8_grouped_inner(
        a_t: Fp8Operand<Self>,
        b_t: Fp8Operand<Self>,
        group_rows: &GroupRows<Self>,
        dtype: burn::tensor::DType,
    ) -> FloatTensor<Self> {
        fp8_experts::fp8_grouped_inner_op(a_t, b_t, group_rows, dtype)
    }

    fn fp8_quantize_norm(
        x: FloatTensor<Self>,
        norm: Fp8InputNorm<Self>,
        fp8: &Fp8Linear,
        record: bool,
    ) -> (Fp8Tensor<Self>, NormStats<Self>) {
        kernel_or_composed!(
            fused_kernels_enabled(),
            fp8::fp8_quantize_norm_op,
            fp8_quantize_norm_composed::<Self>,
            (x, norm, fp8, record)
        )
    }

    fn fp8_update_scaling(state: &Fp8State) {
        fp8::fp8_update_op(state);
    }

    /// A host read waits for every queued kernel: the step keeps its statistics on the device.
    fn device_resident_step() -> bool {
        true
    }

    fn has_norm_kernel(x: &FloatTensor<Self>, gamma: &FloatTensor<Self>, _: &NormSpec) -> bool {
        fused_kernels_enabled() && is_float(x) && is_float(gamma) && gamma.rank() == 1
    }

    fn norm_kernel_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: Option<FloatTensor<Self>>,
        spec: NormSpec,
    ) -> NormSaved<Self> {
        let rms = spec.kind == NormKind::Rms;
        let out = ok(norm_forward(&x, &gamma, beta.as_ref(), rms, spec.epsilon));
        NormSaved {
            output: out.output,
            mean: out.mean,
            rstd: out.rstd,
        }
    }

    fn norm_kernel_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        has_beta: bool,
        stats: NormStats<Self>,
        grad_output: FloatTensor<Self>,
        into: Option<FloatTensor<Self>>,
    ) -> NormGrads<Self> {
        let (input, gamma, beta) = ok(norm_backward(
            &x,
            &gamma,
            has_beta,
            stats.mean.as_ref(),
            &stats.rstd,
            &grad_output,
            into.as_ref(),
        ));
        NormGrads { input, gamma, beta }
    }

    fn has_cross_entropy_kernel(logits: &FloatTensor<Self>) -> bool {
        fused_kernels_enabled() && is_float(logits) && logits.rank() == 2
    }

    fn cross_entropy_kernel_forward(
        logits: FloatTensor<Self>,
        labels: IntTensor<Self>,
    ) -> CrossEntropySaved<Self> {
        let (losses, log_sum_exp) = ok(cross_entropy_forward(&logits, &labels));
        CrossEntropySaved {
            losses,
            log_sum_exp,
        }
    }

    fn cross_entropy_kernel_backward(
        logits: FloatTensor<Self>,
        labels: IntTensor<Self>,
        log_sum_exp: FloatTensor<Self>,
        grad_losses: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        ok(cross_entropy_backward(
            &logits,
            &labels,
            &log_sum_exp,
            &grad_losses,
        ))
    }

    fn read_later(x: FloatTensor<Self>) -> ReadLater {
        let x = ok(x.contiguous());
        let device = x.device().clone();
        let mark = ok(crate::engine::read_later::mark(&device));
        Box::new(move || ok(crate::engine::read_later::read(&device, &x, mark)))
    }

    fn first_step_queued(_device: &Self::Device) {
        if crate::timing::enabled() {
            // waits for the first step's timed ops, then forgets them
            crate::timing::reset();
            tracing::info!("op timing restarts after the first step");
        }
    }

    fn reserve_reads_later(device: &Self::Device, bytes: usize) -> usize {
        let engine = device.engine();
        // page-locked allocations belong to the context current on the calling thread
        ok(engine.bind());
        engine.read_stream().reserve(bytes)
    }

    fn host_pass(
        inputs: Vec<(FloatTensor<Self>, burn::tensor::DType)>,
        pass: &mut HostPass<'_>,
    ) -> Vec<FloatTensor<Self>> {
        let Some(device) = inputs.first().map(|(x, _)| x.device().clone()) else {
            return Vec::new();
        };
        let inputs = inputs
            .into_iter()
            .map(|(x, dtype)| {
                let dtype = ok(crate::backend::convert::engine_dtype(dtype));
                (ok(x.contiguous()), dtype)
            })
            .collect();
        ok(crate::engine::host_pass::host_pass(&device, inputs, pass))
    }

    fn adamw_step(
        value: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<(FloatTensor<Self>, FloatTensor<Self>)>,
        step: AdamWStep,
        device_scale: DeviceScale<Self>,
    ) -> AdamWTensors<Self> {
        // moments stored as the step says (f32, or 16-bit under the precision-aware optimizer)
        let stored = |m: &crate::engine::tensor::CudaTensor, dtype: burn::tensor::DType| {
            crate::backend::convert::engine_dtype(dtype).is_ok_and(|d| m.dtype() == d)
        };
        let [m_dtype, v_dtype] = step.moment_dtypes;
        let moments_stored = moments
            .as_ref()
            .is_none_or(|(m, v)| stored(m, m_dtype) && stored(v, v_dtype));
        if !(fused_kernels_enabled()
            && value.dtype() == DType::F32
            && is_float(&grad)
            && moments_stored)
        {
            return composed_adamw::<Self>(value, grad, moments, step, device_scale);
        }
        let rounded = step
            .rounded
            .map(|dtype| ok(crate::backend::convert::engine_dtype(dtype)));
        let out = ok(adamw(
            &value,
            &grad,
            moments.as_ref().map(|(m, v)| (m, v)),
            step,
            device_scale.as_ref(),
            rounded,
            true,
        ));
        AdamWTensors {
            value: out.value,
            exp_avg: out.exp_avg,
            exp_avg_sq: out.exp_avg_sq,
            rounded: out.rounded,
        }
    }

    fn gather_rows_backward(
        grad: FloatTensor<Self>,
        back: IntTensor<Self>,
        group: usize,
    ) -> FloatTensor<Self> {
        if fused_kernels_enabled() && gather_sum::supports(&grad, group) {
            ok(gather_sum::gather_sum(&grad, &back, group))
        } else {
            gather_rows_backward_reference::<Self>(grad, back, group)
        }
    }

    fn moe_topk(
        scores: FloatTensor<Self>,
        k: usize,
        group_limit: Option<GroupLimit>,
    ) -> IntTensor<Self> {
        let groups = group_limit.map(|limit| (limit.num_groups, limit.group_topk));
        if !(fused_kernels_enabled() && moe::topk_supports(&scores, k, groups)) {
            return moe_topk_reference::<Self>(scores, k, group_limit);
        }
        ok(moe::topk(&scores, k, groups))
    }

    fn fused_moe_router(
        logits: FloatTensor<Self>,
        expert_bias: Option<FloatTensor<Self>>,
        spec: RouterSpec,
    ) -> MoeRouting<Self> {
        kernel_or_composed!(
            Self::has_moe_router_kernel(&logits, &spec),
            Self::moe_router_kernel_forward,
            composed_moe_router::<Self>,
            (logits, expert_bias, spec)
        )
    }

    fn has_moe_router_kernel(logits: &FloatTensor<Self>, spec: &RouterSpec) -> bool {
        fused_kernels_enabled() && moe_router::supports(logits, spec)
    }

    fn moe_router_kernel_forward(
        logits: FloatTensor<Self>,
        expert_bias: Option<FloatTensor<Self>>,
        spec: RouterSpec,
    ) -> MoeRouting<Self> {
        let (chosen, weights) = ok(moe_router::forward(&logits, expert_bias.as_ref(), &spec));
        MoeRouting { chosen, weights }
    }

    fn moe_router_kernel_backward(
        logits: FloatTensor<Self>,
        chosen: IntTensor<Self>,
        grad_weights: FloatTensor<Self>,
        spec: RouterSpec,
    ) -> FloatTensor<Self> {
        ok(moe_router::backward(&logits, &chosen, &grad_weights, &spec))
    }

    fn fused_moe_router_aux(logits: FloatTensor<Self>, spec: RouterAuxSpec) -> RouterAux<Self> {
        kernel_or_composed!(
            Self::has_moe_router_aux_kernel(&logits, &spec),
            Self::moe_router_aux_kernel_forward,
            composed_moe_router_aux::<Self>,
            (logits, spec)
        )
    }

    fn has_moe_router_aux_kernel(logits: &FloatTensor<Self>, spec: &RouterAuxSpec) -> bool {
        fused_kernels_enabled() && moe_router_aux::supports(logits, spec)
    }

    fn moe_router_aux_kernel_forward(
        logits: FloatTensor<Self>,
        spec: RouterAuxSpec,
    ) -> RouterAux<Self> {
        let terms = ok(moe_router_aux::forward(&logits, &spec));
        RouterAux {
            probability_mass: terms.mass,
            topk_counts: terms.counts,
            log_sum_exp: terms.log_sum_exp,
        }
    }

    fn moe_router_aux_kernel_backward(
        logits: FloatTensor<Self>,
        spec: RouterAuxSpec,
        grad_mass: Option<FloatTensor<Self>>,
        grad_log_sum_exp: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        ok(moe_router_aux::backward(
            &logits,
            &spec,
            grad_mass.as_ref(),
            grad_log_sum_exp.as_ref(),
        ))
    }

    fn moe_permutation(experts: IntTensor<Self>, num_experts: usize) -> MoePermutation<Self> {
        if !(fused_kernels_enabled() && moe::permutation_supports(num_experts)) {
            return moe_permutation_reference::<Self>(experts, num_experts);
        }
        let permutation = ok(moe::permutation(&experts, num_experts));
        MoePermutation {
            order: permutation.order,
            rows: permutation.rows,
            counts: permutation.counts,
        }
    }

    fn sum_of_squares(x: FloatTensor<Self>) -> FloatTensor<Self> {
        if !(fused_kernels_enabled() && is_float(&x)) {
            return composed_sum_of_squares::<Self>(x);
        }
        match ok(sum_squares::sum_of_squares(std::slice::from_ref(&x))) {
            Some(sum) => sum,
            None => ok(reduce_all(&x, ReduceOp::SumSquares)),
        }
    }

    fn gather_flat(
        pieces: Vec<FlatPiece<Self>>,
        into: Option<FloatTensor<Self>>,
        dtype: burn::tensor::DType,
    ) -> FloatTensor<Self> {
        let floats = pieces.iter().filter_map(|p| p.grad.as_ref()).all(is_float);
        let device = pieces
            .iter()
            .find_map(|p| p.grad.as_ref())
            .or(into.as_ref())
            .map(|t| t.device().clone());
        let out = crate::backend::convert::engine_dtype(dtype)
            .ok()
            .filter(|d| d.is_float());
        let (true, Some(device), Some(out)) = (fused_kernels_enabled() && floats, device, out)
        else {
            return composed_gather_flat::<Self>(pieces, into, dtype);
        };
        let laid: Vec<_> = pieces
            .iter()
            .map(|p| flat::Piece {
                len: p.len,
                grad: p.grad.as_ref(),
            })
            .collect();
        ok(flat::gather_flat(&device, &laid, into, out))
    }

    fn segment_sum_of_squares(
        buffers: &[FloatTensor<Self>],
        segments: &[FlatSegment],
    ) -> Option<FloatTensor<Self>> {
        if !(fused_kernels_enabled() && buffers.iter().all(is_float)) {
            return composed_segment_sum_of_squares::<Self>(buffers, segments);
        }
        // No test pins a GPU's numbers, so the sum takes its own fixed order: one launch per
        // contiguous run of segments (with every parameter counted, about one per buffer; a
        // tensor-parallel rank that leaves out the parameters its group holds in common breaks
        // a buffer at each of them), all runs' partials added in f64 by one more.
        let runs: Vec<FloatTensor<Self>> = segment_runs(segments)
            .into_iter()
            .map(|(group, offset, len)| {
                let buffer = buffers[group].clone();
                if offset == 0 && len == buffer.numel() {
                    buffer
                } else {
                    ok(buffer.slice(&[SliceArg::range(offset, offset + len)]))
                }
            })
            .collect();
        match ok(sum_squares::sum_of_squares(&runs)) {
            Some(sum) => Some(sum),
            None => composed_segment_sum_of_squares::<Self>(buffers, segments),
        }
    }

    fn fused_attention(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        spec: AttentionSpec,
    ) -> FloatTensor<Self> {
        // A plain (non-autodiff) backend runs inference: dropout is off, as in burn's Dropout.
        let spec = AttentionSpec {
            dropout: 0.0,
            ..spec
        };
        kernel_or_composed!(
            Self::has_attention_kernel(&query, &key, &value, &spec),
            |query, key, value, spec| Self::attention_kernel_forward(query, key, value, spec)
                .output,
            composed_attention::<Self>,
            (query, key, value, spec)
        )
    }

    fn has_attention_kernel(
        query: &FloatTensor<Self>,
        key: &FloatTensor<Self>,
        value: &FloatTensor<Self>,
        spec: &AttentionSpec,
    ) -> bool {
        fused_attention_enabled()
            && spec.dropout < 1.0
            && cudnn::supports(query, key, value)
            && cudnn::supports_mask(mask_of(spec, key.shape()[2]), spec.dropout)
    }

    fn attention_kernel_forward(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        spec: AttentionSpec,
    ) -> AttentionSaved<Self> {
        let scale = spec.scale_for(query.shape()[3]) as f32;
        let f = ok(cudnn::sdpa_forward(
            &query,
            &key,
            &value,
            mask_of(&spec, key.shape()[2]),
            scale,
            spec.dropout as f32,
        ));
        saved_of(f)
    }

    fn attention_kernel_backward(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        saved: AttentionSaved<Self>,
        grad_output: FloatTensor<Self>,
        spec: AttentionSpec,
    ) -> AttentionGrads<Self> {
        let scale = spec.scale_for(query.shape()[3]) as f32;
        let forward = forward_of(saved);
        let (dq, dk, dv) = ok(cudnn::sdpa_backward(
            &query,
            &key,
            &value,
            &forward,
            &grad_output,
            mask_of(&spec, key.shape()[2]),
            scale,
            spec.dropout as f32,
        ));
        AttentionGrads {
            query: dq,
            key: dk,
            value: dv,
        }
    }

    fn has_dropout_add_kernel(x: &FloatTensor<Self>, prob: f64) -> bool {
        fused_kernels_enabled() && is_float(x) && (0.0..1.0).contains(&prob)
    }

    fn dropout_add_kernel_forward(
        x: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        prob: f64,
    ) -> DropoutSaved<Self> {
        let residual = if residual.dtype() == x.dtype() {
            residual
        } else {
            ok(residual.cast(x.dtype()))
        };
        let (output, rng) = ok(random::dropout_add(&x, &residual, prob));
        DropoutSaved {
            output,
            mask: DropoutMask { rng, kept: None },
        }
    }

    fn dropout_add_kernel_backward(
        grad_output: FloatTensor<Self>,
        prob: f64,
        mask: DropoutMask<Self>,
    ) -> FloatTensor<Self> {
        ok(random::dropout_grad(&grad_output, prob, mask.rng))
    }

    fn fused_rope_qkv(
        qkv: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        kernel_or_composed!(
            Self::has_rope_qkv_kernel(&qkv, &cos),
            Self::rope_qkv_kernel_forward,
            composed_rope_qkv::<Self>,
            (qkv, cos, sin)
        )
    }

    fn has_rope_qkv_kernel(qkv: &FloatTensor<Self>, cos: &FloatTensor<Self>) -> bool {
        fused_kernels_enabled() && is_float(qkv) && is_float(cos) && qkv.rank() == 5
    }

    fn rope_qkv_kernel_forward(
        qkv: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        ok(rope_qkv_forward(&qkv, &cos, &sin))
    }

    fn rope_qkv_kernel_backward(
        grad: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        ok(rope_qkv_backward(&grad, &cos, &sin))
    }

    fn fused_qk_norm(
        qkv: FloatTensor<Self>,
        params: QkNormParams<Self>,
        spec: NormSpec,
    ) -> FloatTensor<Self> {
        kernel_or_composed!(
            Self::has_qk_norm_kernel(&qkv, &params.weight[0], &spec),
            |qkv, params, spec| Self::qk_norm_kernel_forward(qkv, params, spec).output,
            composed_qk_norm::<Self>,
            (qkv, params, spec)
        )
    }

    fn has_qk_norm_kernel(
        qkv: &FloatTensor<Self>,
        weight: &FloatTensor<Self>,
        _: &NormSpec,
    ) -> bool {
        fused_kernels_enabled()
            && is_float(qkv)
            && is_float(weight)
            && qkv.rank() == 5
            && qkv.shape()[3] >= 3
            && (1..=qk_norm::MAX_HEAD_DIM).contains(&qkv.shape()[4])
    }

    fn qk_norm_kernel_forward(
        qkv: FloatTensor<Self>,
        params: QkNormParams<Self>,
        spec: NormSpec,
    ) -> QkNormSaved<Self> {
        let [q_weight, k_weight] = &params.weight;
        let bias = params.bias.as_ref().map(|[q, k]| [q, k]);
        let out = ok(qk_norm_forward(
            &qkv,
            [q_weight, k_weight],
            bias,
            spec.epsilon,
        ));
        QkNormSaved {
            output: out.output,
            stats: NormStats {
                mean: out.mean,
                rstd: out.rstd,
            },
        }
    }

    fn qk_norm_kernel_backward(
        qkv: FloatTensor<Self>,
        weight: [FloatTensor<Self>; 2],
        has_bias: bool,
        stats: NormStats<Self>,
        grad_output: FloatTensor<Self>,
    ) -> QkNormGrads<Self> {
        assert_eq!(
            has_bias,
            stats.mean.is_some(),
            "qk-norm: LayerNorm has a bias"
        );
        let [q_weight, k_weight] = &weight;
        let (qkv, weight, bias) = ok(qk_norm_backward(
            &qkv,
            [q_weight, k_weight],
            stats.mean.as_ref(),
            &stats.rstd,
            &grad_output,
        ));
        QkNormGrads { qkv, weight, bias }
    }

    fn fuses_bias_gelu() -> bool {
        fused_kernels_enabled() && crate::switches::paths().bias_gelu_fusion
    }

    fn fused_bias_gelu(x: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self> {
        kernel_or_composed!(
            Self::has_bias_gelu_kernel(&x, &bias),
            Self::bias_gelu_kernel_forward,
            composed_bias_gelu::<Self>,
            (x, bias)
        )
    }

    fn has_bias_gelu_kernel(x: &FloatTensor<Self>, bias: &FloatTensor<Self>) -> bool {
        Self::fuses_bias_gelu() && bias_gelu::supports(x, bias)
    }

    fn bias_gelu_kernel_forward(
        x: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        ok(bias_gelu::bias_gelu_forward(&x, &bias))
    }

    fn bias_gelu_kernel_backward(
        x: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        grad_output: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        ok(bias_gelu::bias_gelu_backward(&x, &bias, &grad_output))
    }

    fn fused_swiglu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        kernel_or_composed!(
            Self::has_swiglu_kernel(&x),
            Self::swiglu_kernel_forward,
            composed_swiglu::<Self>,
            (x)
        )
    }

    fn has_combine_rows_kernel(
        rows: &FloatTensor<Self>,
        weights: &FloatTensor<Self>,
        spec: &CombineSpec,
    ) -> bool {
        fused_kernels_enabled() && combine::supports(rows, weights, spec.topk)
    }

    fn combine_rows_kernel_forward(
        rows: FloatTensor<Self>,
        index: &CombineIndex<Self>,
        weights: FloatTensor<Self>,
        spec: CombineSpec,
    ) -> FloatTensor<Self> {
        ok(combine::forward(&rows, &index.index, &weights, spec.topk))
    }

    fn combine_rows_kernel_backward(
        rows: FloatTensor<Self>,
        index: &CombineIndex<Self>,
        weights: FloatTensor<Self>,
        grad_output: FloatTensor<Self>,
        spec: CombineSpec,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        ok(combine::backward(
            &rows,
            &index.index,
            &weights,
            &grad_output,
            spec.topk,
        ))
    }

    fn has_swiglu_kernel(x: &FloatTensor<Self>) -> bool {
        fused_kernels_enabled() && is_float(x) && x.rank() == 2 && x.shape()[1].is_multiple_of(2)
    }

    fn swiglu_kernel_forward(x: FloatTensor<Self>) -> FloatTensor<Self> {
        ok(swiglu_forward(&x))
    }

    fn swiglu_kernel_backward(
        x: FloatTensor<Self>,
        grad_output: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let grad = if grad_output.dtype() == x.dtype() {
            grad_output
        } else {
            ok(grad_output.cast(x.dtype()))
        };
        ok(swiglu_backward(&x, &grad))
    }

    fn fused_grouped_matmul(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        group_rows: &GroupRows<Self>,
    ) -> FloatTensor<Self> {
        kernel_or_composed!(
            Self::has_grouped_matmul_kernel(&x, &weight),
            Self::grouped_matmul_kernel_forward,
            composed_grouped_matmul::<Self>,
            (x, weight, group_rows)
        )
    }

    fn has_grouped_matmul_kernel(x: &FloatTensor<Self>, weight: &FloatTensor<Self>) -> bool {
        fused_kernels_enabled()
            && x.rank() == 2
            && weight.rank() == 3
            && grouped::supports(x.dtype(), weight.dtype())
    }

    fn grouped_matmul_kernel_forward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        group_rows: &GroupRows<Self>,
    ) -> FloatTensor<Self> {
        grouped_forward(&x, Weights::Stacked(&weight), group_rows)
    }

    fn grouped_matmul_kernel_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        grad_output: FloatTensor<Self>,
        group_rows: &GroupRows<Self>,
    ) -> GroupedMatmulGrads<Self> {
        let (x, weight) = grouped_backward(&x, Weights::Stacked(&weight), &grad_output, group_rows);
        GroupedMatmulGrads { x, weight }
    }

    fn has_grouped_matmul_parts_kernel(x: &FloatTensor<Self>, part: &FloatTensor<Self>) -> bool {
        fused_kernels_enabled()
            && x.rank() == 2
            && part.rank() == 2
            && grouped::supports(x.dtype(), part.dtype())
    }

    fn grouped_matmul_parts_kernel_forward(
        x: FloatTensor<Self>,
        parts: &[FloatTensor<Self>],
        group_rows: &GroupRows<Self>,
    ) -> FloatTensor<Self> {
        grouped_forward(&x, Weights::Parts(parts), group_rows)
    }

    fn grouped_matmul_parts_kernel_backward(
        x: FloatTensor<Self>,
        parts: &[FloatTensor<Self>],
        grad_output: FloatTensor<Self>,
        group_rows: &GroupRows<Self>,
    ) -> GroupedMatmulPartsGrads<Self> {
        let (x, weight) = grouped_backward(&x, Weights::Parts(parts), &grad_output, group_rows);
        // Each part's gradient is its view of the one buffer the GEMMs wrote.
        let parts = ok(Weights::Stacked(&weight).matrices());
        GroupedMatmulPartsGrads { x, parts }
    }

    fn fused_qkv_attention(qkv: FloatTensor<Self>, spec: AttentionSpec) -> FloatTensor<Self> {
        let spec = AttentionSpec {
            dropout: 0.0,
            ..spec
        };
        kernel_or_composed!(
            Self::has_qkv_attention_kernel(&qkv, &spec),
            |qkv, spec| Self::qkv_attention_kernel_forward(qkv, spec).output,
            composed_qkv_attention::<Self>,
            (qkv, spec)
        )
    }

    fn has_qkv_attention_kernel(qkv: &FloatTensor<Self>, spec: &AttentionSpec) -> bool {
        fused_attention_enabled()
            && spec.dropout < 1.0
            && cudnn::supports_packed(qkv)
            && cudnn::supports_mask(mask_of(spec, qkv.shape()[1]), spec.dropout)
    }

    fn qkv_attention_kernel_forward(
        qkv: FloatTensor<Self>,
        spec: AttentionSpec,
    ) -> AttentionSaved<Self> {
        let scale = spec.scale_for(qkv.shape()[4]) as f32;
        let f = ok(cudnn::packed_forward(
            &qkv,
            mask_of(&spec, qkv.shape()[1]),
            scale,
            spec.dropout as f32,
        ));
        saved_of(f)
    }

    fn qkv_attention_kernel_backward(
        qkv: FloatTensor<Self>,
        saved: AttentionSaved<Self>,
        grad_output: FloatTensor<Self>,
        spec: AttentionSpec,
    ) -> FloatTensor<Self> {
        let scale = spec.scale_for(qkv.shape()[4]) as f32;
        let forward = forward_of(saved);
        ok(cudnn::packed_backward(
            &qkv,
            &forward,
            &grad_output,
            mask_of(&spec, qkv.shape()[1]),
            scale,
            spec.dropout as f32,
        ))
    }
}

/// `segments` sorted by buffer and offset, each merged with the next where it ends where that
/// one starts.
fn segment_runs(segments: &[FlatSegment]) -> Vec<FlatSegment> {
    let mut sorted = segments.to_vec();
    sorted.sort_unstable();
    let mut runs: Vec<FlatSegment> = Vec::with_capacity(sorted.len());
    for (group, offset, len) in sorted {
        match runs.last_mut() {
            Some((g, o, l)) if *g == group && *o + *l == offset => *l += len,
            _ => runs.push((group, offset, len)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::segment_runs;

    #[test]
    fn segment_runs_merge_touching_segments_of_a_buffer_and_keep_the_gaps() {
        // model order, not buffer order; buffer 0 has a gap at 10..16
        let segments = [(1, 0, 5), (0, 16, 4), (0, 0, 10), (1, 5, 3), (0, 20, 2)];
        assert_eq!(
            segment_runs(&segments),
            vec![(0, 0, 10), (0, 16, 6), (1, 0, 8)]
        );
    }
}
