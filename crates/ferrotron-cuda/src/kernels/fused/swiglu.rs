//! SwiGLU of the packed `[gate; up]` projection `[rows, 2f]` (see
//! `ferrotron_ops::FusedOps::fused_swiglu`): the forward one map over the two halves read
//! in place; the backward two maps writing the two halves of one packed gradient, so nothing
//! is zero-padded, added or kept beyond the projection itself. Math in f32, stored in the
//! projection's dtype.

use crate::engine::layout::SliceArg;
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};
use crate::kernels::prim::elementwise::{FAST_MATH, MapScalars, run_map};

const NONE: MapScalars = MapScalars {
    f: [0.0; 2],
    i: [0; 2],
};

// σ(a) = rcp(1 + exp2(-a·log2(e))) with the one-instruction approximations of
// `elementwise::FAST_MATH` (a few ulp): the IEEE division and `expf` cost a dozen instructions
// each and left the fused fp8 casts of these values bound by their math rather than their bytes.
macro_rules! sigmoid {
    () => {
        "rcp_ftz(1.f + exp2_ftz(-1.4426950408889634f * a))"
    };
}

/// `silu(gate) · up` with gate `a`, up `b`.
pub(crate) const FORWARD: &str = concat!("(a * ", sigmoid!(), " * b)");
/// The gate's gradient with gate `a`, up `b`, output gradient `c`:
/// `c · b · σ(a) · (1 + a · (1 − σ(a)))`.
pub(crate) const GRAD_GATE: &str = concat!(
    "(c * b * ",
    sigmoid!(),
    " * (1.f + a * (1.f - ",
    sigmoid!(),
    ")))"
);
/// The up projection's gradient with gate `a`, output gradient `b`: `b · silu(a)`.
pub(crate) const GRAD_UP: &str = concat!("(b * a * ", sigmoid!(), ")");

/// The gate and up halves of `x [rows, 2f]`, as views.
fn halves(x: &CudaTensor) -> Result<(CudaTensor, CudaTensor)> {
    let shape = x.shape();
    if shape.len() != 2 || !shape[1].is_multiple_of(2) {
        return Err(CudaError::invalid(
            OpContext::new("swiglu").shape(shape),
            "expected a packed projection [rows, 2f]",
        ));
    }
    let [rows, width] = [shape[0], shape[1]];
    let half = |from: usize| {
        x.slice(&[
            SliceArg::full(rows),
            SliceArg::range(from, from + width / 2),
        ])
    };
    Ok((half(0)?, half(width / 2)?))
}

/// `silu(gate) · up` → `[rows, f]`.
pub fn swiglu_forward(x: &CudaTensor) -> Result<CudaTensor> {
    let (gate, up) = halves(x)?;
    let out = CudaTensor::empty(x.device(), gate.shape(), x.dtype())?;
    run_map(
        "swiglu",
        &out,
        &[&gate, &up],
        FORWARD.into(),
        NONE,
        FAST_MATH,
    )?;
    Ok(out)
}

/// The packed gradient `[rows, 2f]` from the `[rows, f]` output gradient.
pub fn swiglu_backward(x: &CudaTensor, grad: &CudaTensor) -> Result<CudaTensor> {
    let (gate, up) = halves(x)?;
    if grad.shape() != gate.shape() {
        return Err(CudaError::invalid(
            OpContext::new("swiglu backward")
                .shape(x.shape())
                .shape(grad.shape()),
            "the output gradient is not [rows, f]",
        ));
    }
    let packed = CudaTensor::empty(x.device(), x.shape(), x.dtype())?;
    let (d_gate, d_up) = halves(&packed)?;
    run_map(
        "swiglu_grad_gate",
        &d_gate,
        &[&gate, &up, grad],
        GRAD_GATE.into(),
        NONE,
        FAST_MATH,
    )?;
    run_map(
        "swiglu_grad_up",
        &d_up,
        &[&gate, grad],
        GRAD_UP.into(),
        NONE,
        FAST_MATH,
    )?;
    Ok(packed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::dtype::DType;
    use crate::kernels::prim::elementwise::MapSpec;

    /// The three maps compile for sm_90 (NVRTC, no GPU needed), bf16, strided halves.
    #[test]
    #[ignore = "needs NVRTC and the CUDA headers: tools/test.sh installs them and runs it"]
    fn swiglu_sources_compile() {
        for (expr, inputs) in [(FORWARD, 2), (GRAD_GATE, 3), (GRAD_UP, 2)] {
            let mut contiguous = vec![true];
            contiguous.extend(std::iter::repeat_n(false, inputs));
            let spec = MapSpec {
                name: "swiglu".into(),
                out: DType::BF16,
                inputs: vec![DType::BF16; inputs],
                expr: expr.into(),
                rank: 2,
                contiguous,
                helpers: FAST_MATH.into(),
                vector: false,
            };
            let source = spec.source();
            crate::engine::kernel_cache::compile_for_test(&source, "sm_90")
                .unwrap_or_else(|e| panic!("{e}\n{source}"));
        }
    }
}
