//! The router's balancing and z-loss terms (`ferrotron_ops::FusedOps::fused_moe_router_aux`):
//! forward in two launches, backward in one, a warp per token row with expert `e` in lane
//! `e % 32`.
//!
//! The forward's first launch is a block per band of at most [`BAND`] rows of one group: each
//! row's log-sum-exp written as it goes, its probabilities (and plain top-k slots) summed per
//! lane over the warp's rows, the warps' sums added in warp order into the band's partial; the
//! second adds each group's band partials in band order. Sums over tokens thus run in one fixed
//! order, never by float atomics, so the terms (and the training run) repeat bit for bit. The
//! backward recomputes each row's probabilities from its logits.

use ferrotron_ops::{RouterAuxSpec, RouterScore};

use crate::engine::dtype::DType;
use crate::engine::launch::{BLOCK, KernelSpec, Params, launch};
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};
use crate::kernels::template::{Hole, template};

use super::WARP_SUM;
use super::moe::MAX_TOPK;
use super::moe_router::{MAX_EXPERTS, ROUTER_WARP, blocks};

/// Rows per block of the forward's first launch.
pub const BAND: usize = 64;
/// Warps per block of the forward's first launch.
const WARPS: usize = BLOCK as usize / 32;

/// The terms a kernel computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Terms {
    /// The balancing probabilities' mass, with sigmoid scores (else softmax).
    mass: Option<bool>,
    /// The plain top-k counts' `k`.
    count: Option<usize>,
    log_sum_exp: bool,
}

impl Terms {
    fn of(spec: &RouterAuxSpec) -> Self {
        Terms {
            mass: spec
                .balancing
                .map(|balancing| balancing.score == RouterScore::Sigmoid),
            count: spec.balancing.and_then(|balancing| balancing.count_topk),
            log_sum_exp: spec.log_sum_exp,
        }
    }

    fn note(&self) -> String {
        let mut note = String::new();
        match self.mass {
            Some(true) => note.push_str(" sigmoid mass"),
            Some(false) => note.push_str(" softmax mass"),
            None => {}
        }
        if let Some(k) = self.count {
            note.push_str(&format!(" top {k} counts"));
        }
        if self.log_sum_exp {
            note.push_str(" lse");
        }
        note
    }

    /// The holes of the two passes over rows (the forward's first launch and the backward).
    fn row_holes(&self, dtype: DType, experts: usize) -> Vec<(&'static str, Hole<'static>)> {
        vec![
            ("DTYPE_NAME", Hole::Name(dtype)),
            ("TERMS_NOTE", Hole::code(self.note())),
            ("HALF", Hole::Flag(dtype.needs_half_headers())),
            ("T", Hole::Storage(dtype)),
            ("EXPERTS", Hole::Int(experts as i64)),
            ("PER_LANE", Hole::Int(experts.div_ceil(32) as i64)),
            ("WARP_SUM", Hole::code(WARP_SUM)),
            ("ROUTER_WARP", Hole::code(ROUTER_WARP)),
            ("LOAD_LOGIT", Hole::code(dtype.load_expr("logits[e]"))),
            ("BALANCING", Hole::Flag(self.mass.is_some())),
            ("SIGMOID", Hole::Flag(self.mass == Some(true))),
            ("LSE", Hole::Flag(self.log_sum_exp)),
            (
                "EXPS",
                Hole::Flag(self.log_sum_exp || self.mass == Some(false)),
            ),
        ]
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum AuxKernel {
    /// Band partials of the mass and counts; the log-sum-exps.
    Forward {
        dtype: DType,
        experts: usize,
        terms: Terms,
    },
    /// Each group's band partials of the mass (and the counts) added.
    Reduce { dtype: DType, counts: bool },
    /// The logits' gradient.
    Backward {
        dtype: DType,
        experts: usize,
        terms: Terms,
    },
}

impl KernelSpec for AuxKernel {
    fn source(&self) -> String {
        match *self {
            AuxKernel::Forward {
                dtype,
                experts,
                terms,
            } => {
                let mut holes = terms.row_holes(dtype, experts);
                holes.extend([
                    ("WARPS", Hole::Int(WARPS as i64)),
                    ("BAND", Hole::Int(BAND as i64)),
                    ("COUNT", Hole::Flag(terms.count.is_some())),
                    ("K", Hole::Int(terms.count.unwrap_or(0) as i64)),
                    ("STORE_LSE", Hole::code(dtype.store_expr("logf(sum) + m"))),
                ]);
                template!("moe_router_aux_forward.cu").fill(&holes)
            }
            AuxKernel::Reduce { dtype, counts } => {
                let note = if counts { " mass counts" } else { " mass" };
                template!("moe_router_aux_reduce.cu").fill(&[
                    ("DTYPE_NAME", Hole::Name(dtype)),
                    ("TERMS_NOTE", Hole::code(note)),
                    ("HALF", Hole::Flag(dtype.needs_half_headers())),
                    ("T", Hole::Storage(dtype)),
                    ("COUNT", Hole::Flag(counts)),
                    ("STORE_MASS", Hole::code(dtype.store_expr("mass"))),
                    ("STORE_COUNT", Hole::code(dtype.store_expr("count"))),
                ])
            }
            AuxKernel::Backward {
                dtype,
                experts,
                terms,
            } => {
                let mut holes = terms.row_holes(dtype, experts);
                holes.extend([
                    (
                        "LOAD_GRAD_MASS",
                        Hole::code(dtype.load_expr("grad_mass[e]")),
                    ),
                    (
                        "LOAD_GRAD_LSE",
                        Hole::code(dtype.load_expr("grad_lse[row]")),
                    ),
                    ("STORE_D", Hole::code(dtype.store_expr("d[j]"))),
                ]);
                template!("moe_router_aux_backward.cu").fill(&holes)
            }
        }
    }
}

/// Whether the kernels take these logits and terms: float `[tokens, experts]` with at most
/// [`MAX_EXPERTS`] experts, groups dividing the tokens, a top-k within the top-k kernel's.
pub fn supports(logits: &CudaTensor, spec: &RouterAuxSpec) -> bool {
    let [tokens, experts] = logits.shape() else {
        return false;
    };
    logits.dtype().is_float()
        && (1..=MAX_EXPERTS).contains(experts)
        && (spec.balancing.is_some() || spec.log_sum_exp)
        && spec.balancing.is_none_or(|balancing| {
            let per_group = balancing.tokens_per_group;
            per_group > 0
                && tokens.is_multiple_of(per_group)
                && balancing
                    .count_topk
                    .is_none_or(|k| (1..=MAX_TOPK.min(*experts)).contains(&k))
        })
}

fn check(logits: &CudaTensor, spec: &RouterAuxSpec, op: &dyn Fn() -> OpContext) -> Result<()> {
    if supports(logits, spec) {
        return Ok(());
    }
    Err(CudaError::unsupported(
        op(),
        format!(
            "float [tokens, experts] logits, at most {MAX_EXPERTS} experts, groups dividing the \
             tokens, 1 ≤ k ≤ {MAX_TOPK}, at least one term"
        ),
    ))
}

/// The terms [`forward`] computes, each in the logits' dtype.
pub struct AuxTerms {
    /// `[groups, experts]`.
    pub mass: Option<CudaTensor>,
    /// `[groups, experts]`.
    pub counts: Option<CudaTensor>,
    /// `[tokens]`.
    pub log_sum_exp: Option<CudaTensor>,
}

/// `logits [tokens, experts]` → the terms `spec` asks for.
pub fn forward(logits: &CudaTensor, spec: &RouterAuxSpec) -> Result<AuxTerms> {
    let op = || {
        OpContext::new("moe_router_aux")
            .shape(logits.shape())
            .dtype(logits.dtype())
    };
    check(logits, spec, &op)?;
    let logits = logits.contiguous()?;
    let (device, dtype) = (logits.device(), logits.dtype());
    let [tokens, experts] = [logits.shape()[0], logits.shape()[1]];
    let terms = Terms::of(spec);
    let per_group = spec
        .balancing
        .map_or(tokens, |balancing| balancing.tokens_per_group)
        .max(1);
    let groups = tokens / per_group;
    let bands_per_group = per_group.div_ceil(BAND);
    let bands = groups * bands_per_group;
    let partial = |wanted: bool| {
        wanted
            .then(|| CudaTensor::empty(device, &[bands.max(1), experts], DType::F32))
            .transpose()
    };
    let (mass_partial, count_partial) = (
        partial(terms.mass.is_some())?,
        partial(terms.count.is_some())?,
    );
    let log_sum_exp = spec
        .log_sum_exp
        .then(|| CudaTensor::empty(device, &[tokens], dtype))
        .transpose()?;
    let out = |wanted: bool| {
        wanted
            .then(|| CudaTensor::empty(device, &[groups, experts], dtype))
            .transpose()
    };
    let (mass, counts) = (out(terms.mass.is_some())?, out(terms.count.is_some())?);
    if tokens == 0 {
        return Ok(AuxTerms {
            mass,
            counts,
            log_sum_exp,
        });
    }
    let ptr = |t: &Option<CudaTensor>| t.as_ref().map_or(0, CudaTensor::data_ptr);
    let mut params = Params::new();
    params
        .ptr(logits.data_ptr())
        .ptr(ptr(&mass_partial))
        .ptr(ptr(&count_partial))
        .ptr(ptr(&log_sum_exp))
        .int(per_group as i64)
        .int(bands_per_group as i64);
    let kernel = AuxKernel::Forward {
        dtype,
        experts,
        terms,
    };
    let grid = u32::try_from(bands)
        .map_err(|_| CudaError::unsupported(op(), format!("{bands} bands exceed one grid")))?;
    launch(device, &kernel, grid, BLOCK, &params, &op)?;
    if terms.mass.is_some() {
        let mut params = Params::new();
        params
            .ptr(ptr(&mass_partial))
            .ptr(ptr(&count_partial))
            .ptr(ptr(&mass))
            .ptr(ptr(&counts))
            .int(groups as i64)
            .int(experts as i64)
            .int(bands_per_group as i64);
        let kernel = AuxKernel::Reduce {
            dtype,
            counts: terms.count.is_some(),
        };
        let sums = groups * experts;
        let grid = u32::try_from(sums.div_ceil(BLOCK as usize)).map_err(|_| {
            CudaError::unsupported(op(), format!("{sums} group sums exceed one grid"))
        })?;
        launch(device, &kernel, grid, BLOCK, &params, &op)?;
    }
    Ok(AuxTerms {
        mass,
        counts,
        log_sum_exp,
    })
}

/// The logits' gradient `[tokens, experts]` from the mass's `[groups, experts]` and the
/// log-sum-exps' `[tokens]` (each given where `spec` asked for the term).
pub fn backward(
    logits: &CudaTensor,
    spec: &RouterAuxSpec,
    grad_mass: Option<&CudaTensor>,
    grad_log_sum_exp: Option<&CudaTensor>,
) -> Result<CudaTensor> {
    let op = || {
        OpContext::new("moe_router_aux backward")
            .shape(logits.shape())
            .dtype(logits.dtype())
    };
    check(logits, spec, &op)?;
    let [tokens, experts] = [logits.shape()[0], logits.shape()[1]];
    let per_group = spec
        .balancing
        .map_or(tokens, |balancing| balancing.tokens_per_group)
        .max(1);
    let groups = tokens / per_group;
    let matches = |grad: Option<&CudaTensor>, wanted: bool, len: usize| match grad {
        Some(grad) => wanted && grad.numel() == len,
        None => !wanted,
    };
    if !matches(grad_mass, spec.balancing.is_some(), groups * experts)
        || !matches(grad_log_sum_exp, spec.log_sum_exp, tokens)
    {
        return Err(CudaError::invalid(
            op(),
            format!(
                "the gradients of the terms asked for: the mass's [{groups}, {experts}], the \
                 log-sum-exps' [{tokens}]"
            ),
        ));
    }
    let logits = logits.contiguous()?;
    let dtype = logits.dtype();
    let as_logits = |g: Option<&CudaTensor>| {
        g.map(|g| g.cast(dtype).and_then(|g| g.contiguous()))
            .transpose()
    };
    let (grad_mass, grad_log_sum_exp) = (as_logits(grad_mass)?, as_logits(grad_log_sum_exp)?);
    let terms = Terms {
        count: None,
        ..Terms::of(spec)
    };
    let d_logits = CudaTensor::empty(logits.device(), &[tokens, experts], dtype)?;
    if tokens == 0 {
        return Ok(d_logits);
    }
    let ptr = |t: &Option<CudaTensor>| t.as_ref().map_or(0, CudaTensor::data_ptr);
    let mut params = Params::new();
    params
        .ptr(logits.data_ptr())
        .ptr(ptr(&grad_mass))
        .ptr(ptr(&grad_log_sum_exp))
        .ptr(d_logits.data_ptr())
        .int(tokens as i64)
        .int(per_group as i64);
    let kernel = AuxKernel::Backward {
        dtype,
        experts,
        terms,
    };
    let device = logits.device();
    launch(device, &kernel, blocks(tokens, &op)?, BLOCK, &params, &op)?;
    Ok(d_logits)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_terms() -> Vec<Terms> {
        let mut all = Vec::new();
        for mass in [None, Some(false), Some(true)] {
            for count in [None, Some(1), Some(8)] {
                for log_sum_exp in [false, true] {
                    if mass.is_none() && (count.is_some() || !log_sum_exp) {
                        continue;
                    }
                    all.push(Terms {
                        mass,
                        count,
                        log_sum_exp,
                    });
                }
            }
        }
        all
    }

    fn sources() -> Vec<String> {
        let mut sources = Vec::new();
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for terms in all_terms() {
                for experts in [128, 60, 1024] {
                    sources.push(
                        AuxKernel::Forward {
                            dtype,
                            experts,
                            terms,
                        }
                        .source(),
                    );
                    let backward = Terms {
                        count: None,
                        ..terms
                    };
                    sources.push(
                        AuxKernel::Backward {
                            dtype,
                            experts,
                            terms: backward,
                        }
                        .source(),
                    );
                }
            }
            for counts in [false, true] {
                sources.push(AuxKernel::Reduce { dtype, counts }.source());
            }
        }
        sources
    }

    #[test]
    fn moe_router_aux_sources_are_unchanged() {
        insta::assert_snapshot!(crate::kernels::digests(&sources()));
    }

    #[test]
    fn kernels_are_named_after_their_pass_and_terms() {
        let terms = Terms {
            mass: Some(false),
            count: Some(8),
            log_sum_exp: true,
        };
        let names: Vec<String> = [
            AuxKernel::Forward {
                dtype: DType::BF16,
                experts: 128,
                terms,
            },
            AuxKernel::Reduce {
                dtype: DType::BF16,
                counts: true,
            },
        ]
        .iter()
        .map(|spec| crate::engine::kernel_cache::kernel_name(&spec.source()))
        .collect();
        assert_eq!(
            names,
            [
                "moe_router_aux_forward_bf16_experts_128_softmax_mass_top_8_counts_lse",
                "moe_router_aux_reduce_bf16_mass_counts"
            ]
        );
    }

    /// Every generated source compiles for sm_90 (NVRTC, no GPU needed).
    #[test]
    #[ignore = "needs NVRTC and the CUDA headers: tools/test.sh installs them and runs it"]
    fn moe_router_aux_sources_compile() {
        for source in sources() {
            crate::engine::kernel_cache::compile_for_test(&source, "sm_90")
                .unwrap_or_else(|e| panic!("{e}\n{source}"));
        }
    }
}
