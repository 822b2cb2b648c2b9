//! RoPE on the packed QKV projection `[b, s, g, slots, d]` (see
//! `ferrotron_ops::FusedOps::fused_rope_qkv`): two maps over the halves of the query and
//! key slots, read and written in place in the packed layout with the `[s, d]` tables
//! broadcast over batch, groups and slots, and a copy of the value slot. The backward is the
//! same two maps with the transposed rotation. Math in f32, stored in the projection's dtype.
//! Composed, the same rotation was six passes per rotated tensor and needed q and k split out.

use crate::engine::layout::SliceArg;
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};
use crate::kernels::prim::elementwise::{MapScalars, copy_into, run_map};

const NONE: MapScalars = MapScalars {
    f: [0.0; 2],
    i: [0; 2],
};

/// `a·c − b·d`: `x₁·cos₁ − x₂·sin₁` forward, `g₂·cos₂ − g₁·sin₁` backward.
const MINUS: &str = "(a * c - b * d)";
/// `a·c + b·d`: `x₂·cos₂ + x₁·sin₂` forward, `g₁·cos₁ + g₂·sin₂` backward.
const PLUS: &str = "(a * c + b * d)";

/// A packed tensor's first and second channel halves of its rotated (query and key) slots.
fn rotated_halves(x: &CudaTensor) -> Result<[CudaTensor; 2]> {
    let &[b, s, g, slots, d] = x.shape() else {
        unreachable!("checked by `check`")
    };
    let half = |from: usize| {
        x.slice(&[
            SliceArg::full(b),
            SliceArg::full(s),
            SliceArg::full(g),
            SliceArg::range(0, slots - 1),
            SliceArg::range(from, from + d / 2),
        ])
    };
    Ok([half(0)?, half(d / 2)?])
}

/// A packed tensor's value slot.
fn value_slot(x: &CudaTensor) -> Result<CudaTensor> {
    let &[b, s, g, slots, d] = x.shape() else {
        unreachable!("checked by `check`")
    };
    x.slice(&[
        SliceArg::full(b),
        SliceArg::full(s),
        SliceArg::full(g),
        SliceArg::range(slots - 1, slots),
        SliceArg::full(d),
    ])
}

/// A `[s, d]` table's halves as `[1, s, 1, 1, d/2]` views.
fn table_halves(table: &CudaTensor) -> Result<[CudaTensor; 2]> {
    let [s, d] = [table.shape()[0], table.shape()[1]];
    let t = table.reshape(&[1, s, 1, 1, d])?;
    let half = |from: usize| {
        t.slice(&[
            SliceArg::full(1),
            SliceArg::full(s),
            SliceArg::full(1),
            SliceArg::full(1),
            SliceArg::range(from, from + d / 2),
        ])
    };
    Ok([half(0)?, half(d / 2)?])
}

/// Shapes: `x [b, s, g, slots ≥ 3, d even]`, both tables `[s, d]`.
fn check(x: &CudaTensor, cos: &CudaTensor, sin: &CudaTensor) -> Result<()> {
    let ok = match x.shape() {
        &[_, s, _, slots, d] => {
            slots >= 3 && d.is_multiple_of(2) && cos.shape() == [s, d] && sin.shape() == [s, d]
        }
        _ => false,
    };
    if ok {
        return Ok(());
    }
    Err(CudaError::invalid(
        OpContext::new("rope_qkv")
            .shape(x.shape())
            .shape(cos.shape())
            .shape(sin.shape()),
        "expected a packed projection [b, s, g, slots >= 3, d even] and tables [s, d]",
    ))
}

/// Writes `out`'s rotated slots from `x`'s by the rotation (`transpose` false) or its
/// transpose, and copies the value slot.
fn rotate(
    out: &CudaTensor,
    x: &CudaTensor,
    cos: &CudaTensor,
    sin: &CudaTensor,
    transpose: bool,
) -> Result<()> {
    let [x1, x2] = rotated_halves(x)?;
    let [o1, o2] = rotated_halves(out)?;
    let [c1, c2] = table_halves(cos)?;
    let [s1, s2] = table_halves(sin)?;
    // Each half: (kernel name, expression, its cos and sin halves).
    let [first, second] = if transpose {
        [
            ("rope_grad_first", PLUS, [&c1, &s2]),
            ("rope_grad_second", MINUS, [&c2, &s1]),
        ]
    } else {
        [
            ("rope_first", MINUS, [&c1, &s1]),
            ("rope_second", PLUS, [&c2, &s2]),
        ]
    };
    for ((name, expr, [c, s]), out, [a, b]) in [(first, &o1, [&x1, &x2]), (second, &o2, [&x2, &x1])]
    {
        run_map(name, out, &[a, b, c, s], expr.into(), NONE, "")?;
    }
    copy_into(&value_slot(out)?, &value_slot(x)?)
}

/// The packed projection with its query and key slots rotated.
pub fn rope_qkv_forward(
    qkv: &CudaTensor,
    cos: &CudaTensor,
    sin: &CudaTensor,
) -> Result<CudaTensor> {
    check(qkv, cos, sin)?;
    let out = CudaTensor::empty(qkv.device(), qkv.shape(), qkv.dtype())?;
    rotate(&out, qkv, cos, sin, false)?;
    Ok(out)
}

/// The projection's gradient from the rotated projection's.
pub fn rope_qkv_backward(
    grad: &CudaTensor,
    cos: &CudaTensor,
    sin: &CudaTensor,
) -> Result<CudaTensor> {
    check(grad, cos, sin)?;
    let out = CudaTensor::empty(grad.device(), grad.shape(), grad.dtype())?;
    rotate(&out, grad, cos, sin, true)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::dtype::DType;
    use crate::kernels::prim::elementwise::MapSpec;

    /// Both rotations compile for sm_90 (NVRTC, no GPU needed): bf16 strided halves with bf16
    /// and f32 tables.
    #[test]
    #[ignore = "needs NVRTC and the CUDA headers: tools/test.sh installs them and runs it"]
    fn rope_sources_compile() {
        for (expr, table) in [(MINUS, DType::BF16), (PLUS, DType::F32)] {
            let spec = MapSpec {
                name: "rope".into(),
                out: DType::BF16,
                inputs: vec![DType::BF16, DType::BF16, table, table],
                expr: expr.into(),
                rank: 5,
                contiguous: vec![false; 5],
                helpers: String::new(),
                vector: false,
            };
            let source = spec.source();
            crate::engine::kernel_cache::compile_for_test(&source, "sm_90")
                .unwrap_or_else(|e| panic!("{e}\n{source}"));
        }
    }
}
