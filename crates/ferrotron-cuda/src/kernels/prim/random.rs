//! Random tensors from a counter-based generator (Philox4x32-10), keyed by the device seed.
//!
//! Element `i` of a call draws from counter `offset + i`, where each call reserves a fresh
//! counter range from the device: no generator state lives on the GPU, any element can be
//! computed independently (so the kernel is a plain map), and a given seed replays the same
//! sequence of tensors.

use std::sync::Arc;

use crate::engine::device::CudaDevice;
use crate::engine::dtype::DType;
use crate::engine::layout::numel;
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};
use crate::kernels::prim::elementwise::{MapScalars, run_map};

/// Philox4x32-10 and the derived uniform/normal draws, as CUDA device functions.
pub const PHILOX_HELPERS: &str = include_str!("philox.cu");

/// Distributions of the random fills.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Distribution {
    /// Uniform in `[low, high)`; integer dtypes take the floor.
    Uniform { low: f64, high: f64 },
    /// Normal with this mean and standard deviation.
    Normal { mean: f64, std: f64 },
    /// 1 with probability `p`, else 0.
    Bernoulli { p: f64 },
}

impl Distribution {
    /// C expression of one draw (double) for flat index `i`; `si0` seed, `si1` counter base.
    pub fn expr(self, dtype: DType) -> String {
        let floor_if_int = |e: String| {
            if dtype.is_int() {
                format!("floor({e})")
            } else {
                e
            }
        };
        match self {
            Distribution::Uniform { .. } => {
                floor_if_int("(sf0 + (sf1 - sf0) * philox_uniform(si0, si1 + i))".into())
            }
            Distribution::Normal { .. } => {
                floor_if_int("(sf0 + sf1 * philox_normal(si0, si1 + i))".into())
            }
            Distribution::Bernoulli { .. } => "(philox_uniform(si0, si1 + i) < sf0)".into(),
        }
    }

    fn params(self) -> (f64, f64) {
        match self {
            Distribution::Uniform { low, high } => (low, high),
            Distribution::Normal { mean, std } => (mean, std),
            Distribution::Bernoulli { p } => (p, 0.0),
        }
    }
}

/// A fresh tensor of draws from `distribution` (advances the device's counter).
pub fn random(
    device: &Arc<CudaDevice>,
    shape: &[usize],
    distribution: Distribution,
    dtype: DType,
) -> Result<CudaTensor> {
    let (x, y) = distribution.params();
    if let Distribution::Normal { std, .. } = distribution
        && std < 0.0
    {
        return Err(CudaError::invalid(
            OpContext::new("random normal").shape(shape),
            format!("negative standard deviation {std}"),
        ));
    }
    let out = CudaTensor::empty(device, shape, dtype)?;
    let (seed, offset) = device.next_rng_offset(numel(shape) as u64);
    let scalars = MapScalars {
        f: [x, y],
        i: [seed as i64, offset as i64],
    };
    run_map(
        "random",
        &out,
        &[],
        distribution.expr(dtype),
        scalars,
        PHILOX_HELPERS,
    )?;
    Ok(out)
}

/// One 32-bit word of a Philox4x32-10 draw.
pub(crate) const PHILOX_WORD: &str = include_str!("philox_word.cu");

/// The keep test of element `i` of a dropout with keep probability `k`, from (seed, counter
/// base `c`): half `i mod 2` of word `(i / 2) mod 4` of the draw at counter `c + i / 8`, sixteen
/// bits against `k · 2¹⁶` rounded (p = 0.1 keeps 58,982 of 65,536: the
/// drop probability 0.100006). Eight elements share one Philox evaluation, ten rounds of 32-bit
/// multiplies: at one evaluation per element the dropout maps ran at 1–1.6 TB/s, at one per
/// four (a 32-bit word each) `dropout_grad` still took 104 µs over gpt-1.3b's 12 × 2048 × 2048
/// bf16 activations, 2 TB/s, where a plain map of the same bytes runs near 3.5 (one H200;
/// tools/README.md). In the vectorised loop, whose eight elements start at a multiple of eight, the
/// compiler sees that they take the same counter and evaluates it once. A C expression over
/// the given names; every kernel that draws or redraws a dropout mask takes its bits here.
pub(crate) fn keep_test(seed: &str, offset: &str, index: &str, keep_prob: &str) -> String {
    format!(
        "(((philox_word({seed}, {offset} + ({index} >> 3), (int)(({index} >> 1) & 3)) >> ((int)({index} & 1) << 4)) & 0xFFFFu) < (unsigned int)({keep_prob} * 65536.0 + 0.5))"
    )
}

/// `x` (`a`) dropped and scaled, plus the residual (`b`).
fn dropout_add_expr() -> String {
    format!("(b + {})", dropout_grad_expr())
}

/// `a` dropped and scaled.
fn dropout_grad_expr() -> String {
    format!(
        "({} ? a * (float)sf1 : 0.f)",
        keep_test("si0", "si1", "i", "sf0")
    )
}

fn dropout_helpers() -> String {
    format!("{PHILOX_HELPERS}{PHILOX_WORD}")
}

fn dropout_scalars(prob: f64, rng: [u64; 2]) -> MapScalars {
    MapScalars {
        f: [1.0 - prob, 1.0 / (1.0 - prob)],
        i: [rng[0] as i64, rng[1] as i64],
    }
}

/// `residual + keep ∘ x / (1 − prob)`, the keep bits drawn from a fresh counter range (one pass,
/// no mask tensor); returns the output and the (seed, offset) that regenerate the bits.
pub fn dropout_add(
    x: &CudaTensor,
    residual: &CudaTensor,
    prob: f64,
) -> Result<(CudaTensor, [u64; 2])> {
    if x.shape() != residual.shape() || !(0.0..1.0).contains(&prob) {
        return Err(CudaError::invalid(
            OpContext::new("dropout_add")
                .shape(x.shape())
                .shape(residual.shape()),
            format!("needs equal shapes and a probability in [0, 1), got {prob}"),
        ));
    }
    let out = CudaTensor::empty(x.device(), x.shape(), x.dtype())?;
    let rng = x.device().next_rng_offset(x.numel() as u64);
    run_map(
        "dropout_add",
        &out,
        &[x, residual],
        dropout_add_expr(),
        dropout_scalars(prob, [rng.0, rng.1]),
        &dropout_helpers(),
    )?;
    Ok((out, [rng.0, rng.1]))
}

/// The gradient of `x` in [`dropout_add`]: `keep ∘ grad / (1 − prob)`, the keep bits drawn
/// again from `rng` (the output gradient must have the forward's shape).
pub fn dropout_grad(grad: &CudaTensor, prob: f64, rng: [u64; 2]) -> Result<CudaTensor> {
    let out = CudaTensor::empty(grad.device(), grad.shape(), grad.dtype())?;
    run_map(
        "dropout_grad",
        &out,
        &[grad],
        dropout_grad_expr(),
        dropout_scalars(prob, rng),
        &dropout_helpers(),
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_draws_take_the_floor_and_bernoulli_compares() {
        let u = Distribution::Uniform {
            low: -3.0,
            high: 3.0,
        };
        assert_eq!(
            u.expr(DType::I64),
            "floor((sf0 + (sf1 - sf0) * philox_uniform(si0, si1 + i)))"
        );
        assert_eq!(
            u.expr(DType::BF16),
            "(sf0 + (sf1 - sf0) * philox_uniform(si0, si1 + i))"
        );
        assert_eq!(
            Distribution::Bernoulli { p: 0.5 }.expr(DType::Bool),
            "(philox_uniform(si0, si1 + i) < sf0)"
        );
        assert_eq!(
            Distribution::Normal {
                mean: 1.0,
                std: 2.0
            }
            .params(),
            (1.0, 2.0)
        );
    }

    /// The dropout maps compile for sm_90 (NVRTC, no GPU needed), plain and vectorised, bf16;
    /// the vectorised loop evaluates Philox once for its eight elements (ten rounds of two
    /// `mul.hi` each: one evaluation there, one in the scalar tail).
    #[test]
    #[ignore = "needs NVRTC and the CUDA headers: tools/test.sh installs them and runs it"]
    fn dropout_sources_compile() {
        use crate::kernels::prim::elementwise::MapSpec;
        for (expr, inputs) in [(dropout_add_expr(), 2), (dropout_grad_expr(), 1)] {
            for vector in [false, true] {
                let spec = MapSpec {
                    name: "dropout".into(),
                    out: DType::BF16,
                    inputs: vec![DType::BF16; inputs],
                    expr: expr.clone(),
                    rank: 1,
                    contiguous: vec![true; inputs + 1],
                    helpers: dropout_helpers(),
                    vector,
                };
                let source = spec.source();
                let ptx = crate::engine::kernel_cache::compile_for_test(&source, "sm_90")
                    .unwrap_or_else(|e| panic!("{e}\n{source}"));
                let evaluations = ptx.matches("mul.hi.u32").count() / 20;
                assert_eq!(evaluations, if vector { 2 } else { 1 }, "{ptx}");
            }
        }
    }

    #[test]
    fn philox_uses_the_published_round_constants() {
        for constant in ["0xD2511F53u", "0xCD9E8D57u", "0x9E3779B9u", "0xBB67AE85u"] {
            assert!(PHILOX_HELPERS.contains(constant), "{constant}");
        }
    }
}
