//! MoE routing (`ferrotron_ops::FusedOps::fused_moe_router`) in one kernel each way, a warp per
//! token with expert `e` in lane `e % 32`: the forward loads the token's logits into registers,
//! makes the scores and the selection scores (plus the bias), picks `k` times the warp's best
//! untaken allowed score (first each group's best sums under a group limit) and weights the
//! picks; the backward recomputes the weights from the logits and the decisions and writes the
//! token's whole gradient row. Composed, the same was about a dozen passes over `[tokens,
//! experts]` each way (`op/router.rs` in the ops crate says which).
//!
//! A pick compares `f32::total_cmp` keys and keeps the lower expert on a tie, and a group's sum
//! adds its best scores best first from `-0.0`, so the decisions are `select_topk`'s (and the
//! top-k kernel's, `moe.rs`) on the same scores.

use ferrotron_ops::{RouterScore, RouterSpec};

use crate::engine::dtype::DType;
use crate::engine::launch::{BLOCK, KernelSpec, Params, launch};
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};
use crate::kernels::template::{Hole, template};

use super::WARP_SUM;
use super::moe::{MAX_GROUPS, MAX_TOPK, topk_supports};

/// Experts at most: a lane keeps 32 slots of a row in registers.
pub const MAX_EXPERTS: usize = 1024;
/// The warp helpers both routing families use: `total_cmp` keys, the warp's maximum and its best
/// candidate.
pub(super) const ROUTER_WARP: &str = include_str!("moe_router_warp.cu");

/// What the weights are made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Weighting {
    /// Softmax over the chosen logits.
    SoftmaxAfter,
    /// The chosen probabilities of a softmax over every expert.
    PreSoftmax,
    /// The chosen sigmoids, normalised to sum to 1 when `k > 1`.
    Sigmoid,
}

impl Weighting {
    fn of(spec: &RouterSpec) -> Self {
        match spec.score {
            RouterScore::Softmax if spec.pre_softmax => Weighting::PreSoftmax,
            RouterScore::Softmax => Weighting::SoftmaxAfter,
            RouterScore::Sigmoid => Weighting::Sigmoid,
        }
    }

    fn note(self) -> &'static str {
        match self {
            Weighting::SoftmaxAfter => "softmax",
            Weighting::PreSoftmax => "pre softmax",
            Weighting::Sigmoid => "sigmoid",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum RouterKernel {
    /// Decisions and weights; `groups = (num, topk)`.
    Forward {
        dtype: DType,
        experts: usize,
        k: usize,
        weighting: Weighting,
        bias: bool,
        groups: Option<(usize, usize)>,
    },
    /// The logits' gradient from the weights'.
    Backward {
        dtype: DType,
        experts: usize,
        k: usize,
        weighting: Weighting,
    },
}

impl KernelSpec for RouterKernel {
    fn source(&self) -> String {
        let (RouterKernel::Forward {
            dtype,
            experts,
            k,
            weighting,
            ..
        }
        | RouterKernel::Backward {
            dtype,
            experts,
            k,
            weighting,
        }) = *self;
        let mut holes = vec![
            ("DTYPE_NAME", Hole::Name(dtype)),
            ("EXPERTS", Hole::Int(experts as i64)),
            ("K", Hole::Int(k as i64)),
            ("SCORE_NOTE", Hole::code(weighting.note())),
            ("HALF", Hole::Flag(dtype.needs_half_headers())),
            ("T", Hole::Storage(dtype)),
            ("WARP_SUM", Hole::code(WARP_SUM)),
            ("ROUTER_WARP", Hole::code(ROUTER_WARP)),
            ("PER_LANE", Hole::Int(experts.div_ceil(32) as i64)),
            (
                "PRE_SOFTMAX",
                Hole::Flag(weighting == Weighting::PreSoftmax),
            ),
            ("SIGMOID", Hole::Flag(weighting == Weighting::Sigmoid)),
            (
                "SOFTMAX_AFTER",
                Hole::Flag(weighting == Weighting::SoftmaxAfter),
            ),
            (
                "NORMALISE",
                Hole::Flag(weighting == Weighting::Sigmoid && k > 1),
            ),
        ];
        match *self {
            RouterKernel::Forward { bias, groups, .. } => {
                holes.extend([
                    ("BIAS_NOTE", Hole::code(if bias { " bias" } else { "" })),
                    ("BIAS", Hole::Flag(bias)),
                    ("GROUPS", Hole::Flag(groups.is_some())),
                    ("LOAD_LOGIT", Hole::code(dtype.load_expr("logits[e]"))),
                    (
                        "AS_IS",
                        Hole::Flag(
                            weighting == Weighting::PreSoftmax
                                || (weighting == Weighting::Sigmoid && k == 1),
                        ),
                    ),
                    ("STORE_WEIGHT", Hole::code(dtype.store_expr("w"))),
                ]);
                holes.extend(super::moe::group_holes(k, groups));
                template!("moe_router_forward.cu").fill(&holes)
            }
            RouterKernel::Backward { .. } => {
                holes.extend([
                    ("LOAD_GRAD", Hole::code(dtype.load_expr("grad[lane]"))),
                    ("LOAD_CHOSEN", Hole::code(dtype.load_expr("logits[e]"))),
                    ("LOAD_LOGIT", Hole::code(dtype.load_expr("logits[x_e]"))),
                    (
                        "STORE_PRE",
                        Hole::code(dtype.store_expr("p_e * (d[j] - dot)")),
                    ),
                    ("STORE_D", Hole::code(dtype.store_expr("d[j]"))),
                ]);
                template!("moe_router_backward.cu").fill(&holes)
            }
        }
    }
}

/// Whether the kernels route these logits: float `[tokens, experts]` with at most
/// [`MAX_EXPERTS`] experts, and `k` and the group limit the top-k kernel takes.
pub fn supports(logits: &CudaTensor, spec: &RouterSpec) -> bool {
    let groups = spec
        .group_limit
        .map(|limit| (limit.num_groups, limit.group_topk));
    logits.rank() == 2
        && logits.shape()[1] <= MAX_EXPERTS
        && topk_supports(logits, spec.topk, groups)
}

/// Warps (tokens) per block.
const WARPS: usize = BLOCK as usize / 32;

fn check(logits: &CudaTensor, spec: &RouterSpec, op: &dyn Fn() -> OpContext) -> Result<()> {
    if supports(logits, spec) {
        return Ok(());
    }
    Err(CudaError::unsupported(
        op(),
        format!(
            "float [tokens, experts] logits, at most {MAX_EXPERTS} experts, 1 ≤ k ≤ {MAX_TOPK}, \
             at most {MAX_GROUPS} even groups"
        ),
    ))
}

/// `logits [tokens, experts]` (and an `expert_bias [experts]` for the selection) → each
/// token's experts `[tokens, k]` i64, best first, and their weights `[tokens · k]` in the
/// logits' dtype.
pub fn forward(
    logits: &CudaTensor,
    expert_bias: Option<&CudaTensor>,
    spec: &RouterSpec,
) -> Result<(CudaTensor, CudaTensor)> {
    let op = || {
        OpContext::new("moe_router")
            .shape(logits.shape())
            .dtype(logits.dtype())
    };
    check(logits, spec, &op)?;
    let logits = logits.contiguous()?;
    let [tokens, experts] = [logits.shape()[0], logits.shape()[1]];
    let bias = match expert_bias {
        Some(bias) if bias.numel() != experts => {
            return Err(CudaError::invalid(
                op(),
                format!("the expert bias must hold {experts} values"),
            ));
        }
        Some(bias) => Some(bias.cast(DType::F32)?.contiguous()?),
        None => None,
    };
    let k = spec.topk;
    let device = logits.device();
    let chosen = CudaTensor::empty(device, &[tokens, k], DType::I64)?;
    let weights = CudaTensor::empty(device, &[tokens * k], logits.dtype())?;
    if tokens == 0 {
        return Ok((chosen, weights));
    }
    let mut params = Params::new();
    params
        .ptr(logits.data_ptr())
        .ptr(bias.as_ref().map_or(0, CudaTensor::data_ptr))
        .ptr(chosen.data_ptr())
        .ptr(weights.data_ptr())
        .int(tokens as i64)
        .float(spec.scaling_factor);
    let kernel = RouterKernel::Forward {
        dtype: logits.dtype(),
        experts,
        k,
        weighting: Weighting::of(spec),
        bias: bias.is_some(),
        groups: spec
            .group_limit
            .map(|limit| (limit.num_groups, limit.group_topk)),
    };
    launch(device, &kernel, blocks(tokens, &op)?, BLOCK, &params, &op)?;
    Ok((chosen, weights))
}

/// The logits' gradient `[tokens, experts]` from the weights' `[tokens · k]`, given the
/// forward's decisions `chosen [tokens, k]`.
pub fn backward(
    logits: &CudaTensor,
    chosen: &CudaTensor,
    grad_weights: &CudaTensor,
    spec: &RouterSpec,
) -> Result<CudaTensor> {
    let op = || {
        OpContext::new("moe_router backward")
            .shape(logits.shape())
            .dtype(logits.dtype())
    };
    check(logits, spec, &op)?;
    let [tokens, experts] = [logits.shape()[0], logits.shape()[1]];
    let k = spec.topk;
    if chosen.shape() != [tokens, k] || grad_weights.numel() != tokens * k {
        return Err(CudaError::invalid(
            op(),
            format!(
                "the decisions must be [{tokens}, {k}] and the weights' gradient {tokens} · {k}"
            ),
        ));
    }
    let logits = logits.contiguous()?;
    let chosen = chosen.cast(DType::I64)?.contiguous()?;
    let grad = grad_weights.cast(logits.dtype())?.contiguous()?;
    let d_logits = CudaTensor::empty(logits.device(), &[tokens, experts], logits.dtype())?;
    if tokens == 0 {
        return Ok(d_logits);
    }
    let mut params = Params::new();
    params
        .ptr(logits.data_ptr())
        .ptr(chosen.data_ptr())
        .ptr(grad.data_ptr())
        .ptr(d_logits.data_ptr())
        .int(tokens as i64)
        .float(spec.scaling_factor);
    let kernel = RouterKernel::Backward {
        dtype: logits.dtype(),
        experts,
        k,
        weighting: Weighting::of(spec),
    };
    let device = logits.device();
    launch(device, &kernel, blocks(tokens, &op)?, BLOCK, &params, &op)?;
    Ok(d_logits)
}

/// Blocks of [`WARPS`] rows, a warp each.
pub(super) fn blocks(rows: usize, op: &dyn Fn() -> OpContext) -> Result<u32> {
    u32::try_from(rows.div_ceil(WARPS))
        .map_err(|_| CudaError::unsupported(op(), format!("{rows} rows exceed one grid")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources() -> Vec<String> {
        let mut sources = Vec::new();
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for weighting in [
                Weighting::SoftmaxAfter,
                Weighting::PreSoftmax,
                Weighting::Sigmoid,
            ] {
                for (experts, k, bias, groups) in [
                    (128, 1, false, None),
                    (128, 8, true, None),
                    (256, 8, true, Some((8, 4))),
                    (60, 6, false, Some((4, 3))),
                    (1024, 32, false, None),
                ] {
                    sources.push(
                        RouterKernel::Forward {
                            dtype,
                            experts,
                            k,
                            weighting,
                            bias,
                            groups,
                        }
                        .source(),
                    );
                    sources.push(
                        RouterKernel::Backward {
                            dtype,
                            experts,
                            k,
                            weighting,
                        }
                        .source(),
                    );
                }
            }
        }
        sources
    }

    #[test]
    fn moe_router_sources_are_unchanged() {
        insta::assert_snapshot!(crate::kernels::digests(&sources()));
    }

    #[test]
    fn kernels_are_named_after_their_pass_and_shape() {
        let names: Vec<String> = [
            RouterKernel::Forward {
                dtype: DType::BF16,
                experts: 256,
                k: 8,
                weighting: Weighting::Sigmoid,
                bias: true,
                groups: Some((8, 4)),
            },
            RouterKernel::Backward {
                dtype: DType::F32,
                experts: 128,
                k: 2,
                weighting: Weighting::PreSoftmax,
            },
        ]
        .iter()
        .map(|spec| crate::engine::kernel_cache::kernel_name(&spec.source()))
        .collect();
        assert_eq!(
            names,
            [
                "moe_router_forward_bf16_experts_256_k_8_sigmoid_bias_groups_8_top_4",
                "moe_router_backward_f32_experts_128_k_2_pre_softmax"
            ]
        );
    }

    /// Every generated source compiles for sm_90 (NVRTC, no GPU needed).
    #[test]
    #[ignore = "needs NVRTC and the CUDA headers: tools/test.sh installs them and runs it"]
    fn moe_router_sources_compile() {
        for source in sources() {
            crate::engine::kernel_cache::compile_for_test(&source, "sm_90")
                .unwrap_or_else(|e| panic!("{e}\n{source}"));
        }
    }
}
