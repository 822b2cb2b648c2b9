//! Attention from the packed QKV projection `[b, s, groups, per_group + 2, d]` (see
//! `ferrotron_ops::FusedOps::fused_qkv_attention`): cuDNN reads q, k and v as strided views
//! of the projection, writes the output as `[b, s, heads, d]` and the gradients straight into the
//! slots of one packed gradient, so the model's slices never get autodiff's zero-padded
//! gradients and their sum.
//!
//! Key and value are always views. The query is a view when each group has one query head
//! (multi-head attention, the GPT presets); with several, the heads of a group are not evenly
//! strided across groups, so cuDNN gets a contiguous copy of the query and its gradient is
//! written to a fresh tensor and copied into its slots once.

use super::{
    SdpaForward, SdpaMask, in_place_strides, sdpa_backward, sdpa_backward_into, sdpa_forward,
};
use crate::engine::layout::SliceArg;
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};

/// `(batch, seq, groups, per_group, head_dim)` of a packed projection, if it is one.
fn packed_dims(qkv: &CudaTensor) -> Option<[usize; 5]> {
    let [b, s, g, slots, d] = <[usize; 5]>::try_from(qkv.shape()).ok()?;
    (slots >= 3).then_some([b, s, g, slots - 2, d])
}

/// Slots `range` of every group of a packed projection (or its gradient).
fn slots(t: &CudaTensor, range: std::ops::Range<usize>) -> Result<CudaTensor> {
    let all = |dim: usize| SliceArg::full(t.shape()[dim]);
    t.slice(&[
        all(0),
        all(1),
        all(2),
        SliceArg::range(range.start, range.end),
    ])
}

/// The `[b, h, s, d]` query and `[b, g, s, d]` key and value views of the packed `qkv`. The query
/// is `None` where it cannot be a view (several heads per group).
fn views(qkv: &CudaTensor) -> Result<(Option<CudaTensor>, CudaTensor, CudaTensor)> {
    let op = || OpContext::new("packed attention").shape(qkv.shape());
    let [b, s, g, per, d] =
        packed_dims(qkv).ok_or_else(|| CudaError::invalid(op(), "expected [b, s, g, slots, d]"))?;
    let slot = |range, heads| -> Result<CudaTensor> {
        slots(qkv, range)?
            .reshape(&[b, s, heads, d])?
            .swap_dims(1, 2)
    };
    let query = if per == 1 { Some(slot(0..1, g)?) } else { None };
    Ok((query, slot(per..per + 1, g)?, slot(per + 1..per + 2, g)?))
}

/// The query as cuDNN reads it: the view, or a contiguous `[b, h, s, d]` copy.
fn query(qkv: &CudaTensor, view: Option<CudaTensor>) -> Result<CudaTensor> {
    match view {
        Some(q) => Ok(q),
        None => {
            let [b, s, g, per, d] = packed_dims(qkv).expect("checked by views");
            slots(qkv, 0..per)?
                .contiguous()?
                .reshape(&[b, s, g * per, d])?
                .swap_dims(1, 2)
        }
    }
}

/// Whether cuDNN's fused attention takes this packed projection in place.
pub fn supports_packed(qkv: &CudaTensor) -> bool {
    let Ok((q, k, v)) = views(qkv) else {
        return false;
    };
    let q_ok = q.as_ref().is_none_or(|q| in_place_strides(q).is_some());
    q_ok && in_place_strides(&k).is_some()
        && in_place_strides(&v).is_some()
        && super::supports(q.as_ref().unwrap_or(&k), &k, &v)
}

/// Forward: the `[b, s, heads, d]` output (a contiguous tensor) with cuDNN's saved state (whose
/// output is the same data as `[b, h, s, d]`).
pub fn packed_forward(
    qkv: &CudaTensor,
    mask: SdpaMask,
    scale: f32,
    dropout: f32,
) -> Result<SdpaForward> {
    let (q, k, v) = views(qkv)?;
    let q = query(qkv, q)?;
    let mut forward = sdpa_forward(&q, &k, &v, mask, scale, dropout)?;
    forward.output = forward.output.swap_dims(1, 2)?;
    Ok(forward)
}

/// Backward: the packed gradient of `qkv` from the `[b, s, heads, d]` output gradient, every
/// slot written by cuDNN (or, for a copied query, copied in once).
pub fn packed_backward(
    qkv: &CudaTensor,
    saved: &SdpaForward,
    grad: &CudaTensor,
    mask: SdpaMask,
    scale: f32,
    dropout: f32,
) -> Result<CudaTensor> {
    let (q_view, k, v) = views(qkv)?;
    let q = query(qkv, q_view)?;
    let saved = SdpaForward {
        output: saved.output.swap_dims(1, 2)?,
        ..saved.clone()
    };
    let grad = grad.swap_dims(1, 2)?;
    let packed = CudaTensor::empty(qkv.device(), qkv.shape(), qkv.dtype())?;
    // The packed gradient has the projection's shape: its query slot is a view exactly when
    // the projection's is.
    let (dq, dk, dv) = views(&packed)?;
    match dq {
        Some(dq) => {
            sdpa_backward_into(
                &q,
                &k,
                &v,
                &saved,
                &grad,
                mask,
                scale,
                dropout,
                &[dq, dk, dv],
            )?;
        }
        None => {
            let (dq, dk_fresh, dv_fresh) =
                sdpa_backward(&q, &k, &v, &saved, &grad, mask, scale, dropout)?;
            let [b, s, g, per, d] = packed_dims(qkv).expect("checked by views");
            let into = |range, from: &CudaTensor, heads: usize| -> Result<()> {
                let slot = slots(&packed, range)?;
                let from = from.swap_dims(1, 2)?.reshape(&[b, s, g, heads / g, d])?;
                crate::kernels::prim::elementwise::copy_into(&slot, &from)
            };
            into(0..per, &dq, g * per)?;
            into(per..per + 1, &dk_fresh, g)?;
            into(per + 1..per + 2, &dv_fresh, g)?;
        }
    }
    Ok(packed)
}
