//! 2-D convolution and transposed convolution as im2col + one batched cuBLASLt matmul.
//!
//! The im2col matrix is first a *view*: over the padded input with strides
//! `[n, c, dilation·h, dilation·w, stride·h, stride·w]` it has shape `[N, C, kh, kw, OH, OW]`,
//! and the reshape to `[N, groups, C/groups·kh·kw, OH·OW]` makes the one copy. A transposed
//! convolution is the convolution of the stride-dilated, re-padded input with the flipped,
//! group-transposed kernel. burn's defaults then give conv1d, conv_transpose1d and every
//! backward pass (they are built from these two). Language models never call these; they are
//! here so the backend runs any burn model, at matmul speed rather than a tuned kernel's.

use burn::tensor::ops::{ConvOptions, ConvTransposeOptions};

use crate::engine::layout::{Layout, SliceArg};
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};
use crate::kernels::prim::elementwise::{self as ew, BinaryOp};
use crate::kernels::prim::index;

fn invalid(op: &str, x: &CudaTensor, w: &CudaTensor, reason: String) -> CudaError {
    CudaError::invalid(
        OpContext::new(op)
            .shape(x.shape())
            .shape(w.shape())
            .dtype(x.dtype()),
        reason,
    )
}

/// Output size of one spatial dim, or `None` when the kernel does not fit.
pub(crate) fn conv_out_size(
    size: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
) -> Option<usize> {
    let span = dilation * (kernel.checked_sub(1)?) + 1;
    let padded = size + 2 * padding;
    (stride > 0 && padded >= span).then(|| (padded - span) / stride + 1)
}

/// Pads (positive) or crops (negative) the two spatial dims of `[N, C, H, W]` with zeros:
/// `pads = [top, bottom, left, right]`.
fn pad_or_crop(x: &CudaTensor, pads: [isize; 4]) -> Result<CudaTensor> {
    let shape = x.shape().to_vec();
    let crop = |size: usize, before: isize, after: isize| {
        let start = (-before).max(0) as usize;
        let end = (size as isize - (-after).max(0)).max(start as isize) as usize;
        SliceArg::range(start, end)
    };
    let cropped = x.slice(&[
        SliceArg::full(shape[0]),
        SliceArg::full(shape[1]),
        crop(shape[2], pads[0], pads[1]),
        crop(shape[3], pads[2], pads[3]),
    ])?;
    let grow = |p: isize| p.max(0) as usize;
    if pads.iter().all(|&p| p <= 0) {
        return Ok(cropped);
    }
    let c = cropped.shape().to_vec();
    let padded_shape = [
        c[0],
        c[1],
        c[2] + grow(pads[0]) + grow(pads[1]),
        c[3] + grow(pads[2]) + grow(pads[3]),
    ];
    let zeros = ew::zeros(x.device(), &padded_shape, x.dtype())?;
    index::slice_assign(
        &zeros,
        &[
            SliceArg::full(c[0]),
            SliceArg::full(c[1]),
            SliceArg::range(grow(pads[0]), grow(pads[0]) + c[2]),
            SliceArg::range(grow(pads[2]), grow(pads[2]) + c[3]),
        ],
        &cropped,
    )
}

/// `conv2d(x [N, C, H, W], weight [O, C/g, kh, kw]) + bias [O]` → `[N, O, OH, OW]`.
pub(super) fn conv2d(
    x: &CudaTensor,
    weight: &CudaTensor,
    bias: Option<&CudaTensor>,
    options: &ConvOptions<2>,
) -> Result<CudaTensor> {
    let op = "conv2d";
    if x.rank() != 4 || weight.rank() != 4 {
        return Err(invalid(
            op,
            x,
            weight,
            "expected 4-D input and weight".into(),
        ));
    }
    let [n, c, h, w] = [x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]];
    let [o, cg, kh, kw] = [
        weight.shape()[0],
        weight.shape()[1],
        weight.shape()[2],
        weight.shape()[3],
    ];
    let g = options.groups;
    if g == 0 || c % g != 0 || o % g != 0 || cg != c / g {
        return Err(invalid(
            op,
            x,
            weight,
            format!("channels do not split into {g} groups"),
        ));
    }
    let [sh, sw] = options.stride;
    let [ph, pw] = options.padding;
    let [dh, dw] = options.dilation;
    let (Some(oh), Some(ow)) = (
        conv_out_size(h, kh, sh, ph, dh),
        conv_out_size(w, kw, sw, pw, dw),
    ) else {
        return Err(invalid(
            op,
            x,
            weight,
            "kernel larger than the padded input".into(),
        ));
    };
    let padded = pad_or_crop(x, [ph as isize, ph as isize, pw as isize, pw as isize])?;
    let l = padded.layout();
    let st = &l.strides;
    let im2col = padded.with_layout(Layout {
        shape: vec![n, c, kh, kw, oh, ow],
        strides: vec![
            st[0],
            st[1],
            st[2] * dh as isize,
            st[3] * dw as isize,
            st[2] * sh as isize,
            st[3] * sw as isize,
        ],
        offset: l.offset,
    });
    let cols = im2col.reshape(&[n, g, cg * kh * kw, oh * ow])?;
    let kernel = weight.reshape(&[1, g, o / g, cg * kh * kw])?;
    let out = crate::blas::gemm::matmul(&kernel, &cols)?; // [N, g, O/g, OH·OW]
    let out = out.reshape(&[n, o, oh, ow])?;
    match bias {
        Some(b) => ew::binary(&out, &b.reshape(&[1, o, 1, 1])?, BinaryOp::Add),
        None => Ok(out),
    }
}

/// `conv_transpose2d(x [N, C, H, W], weight [C, O/g, kh, kw]) + bias [O]`.
pub(super) fn conv_transpose2d(
    x: &CudaTensor,
    weight: &CudaTensor,
    bias: Option<&CudaTensor>,
    options: &ConvTransposeOptions<2>,
) -> Result<CudaTensor> {
    let op = "conv_transpose2d";
    if x.rank() != 4 || weight.rank() != 4 {
        return Err(invalid(
            op,
            x,
            weight,
            "expected 4-D input and weight".into(),
        ));
    }
    let [n, c, h, w] = [x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]];
    let [wc, og, kh, kw] = [
        weight.shape()[0],
        weight.shape()[1],
        weight.shape()[2],
        weight.shape()[3],
    ];
    let g = options.groups;
    if g == 0 || wc != c || c % g != 0 || options.stride.contains(&0) {
        return Err(invalid(
            op,
            x,
            weight,
            format!("channels do not split into {g} groups"),
        ));
    }
    let [sh, sw] = options.stride;
    // Spread the input `stride` apart with zeros in between.
    let spread_shape = [n, c, (h - 1) * sh + 1, (w - 1) * sw + 1];
    let spread = if sh == 1 && sw == 1 {
        x.clone()
    } else {
        index::slice_assign(
            &ew::zeros(x.device(), &spread_shape, x.dtype())?,
            &[
                SliceArg::full(n),
                SliceArg::full(c),
                SliceArg {
                    start: 0,
                    end: spread_shape[2],
                    step: sh as isize,
                },
                SliceArg {
                    start: 0,
                    end: spread_shape[3],
                    step: sw as isize,
                },
            ],
            x,
        )?
    };
    let reach = |k: usize, d: usize| (d * (k - 1)) as isize;
    let [ph, pw] = options.padding.map(|p| p as isize);
    let [oph, opw] = options.padding_out.map(|p| p as isize);
    let [dh, dw] = options.dilation;
    let padded = pad_or_crop(
        &spread,
        [
            reach(kh, dh) - ph,
            reach(kh, dh) - ph + oph,
            reach(kw, dw) - pw,
            reach(kw, dw) - pw + opw,
        ],
    )?;
    // [C, O/g, kh, kw] -> [g, C/g, O/g, ..] -> [g, O/g, C/g, ..], flipped in space -> [O, C/g, ..].
    let kernel = weight
        .reshape(&[g, c / g, og, kh, kw])?
        .swap_dims(1, 2)?
        .flip(&[3, 4])?
        .reshape(&[g * og, c / g, kh, kw])?;
    let as_conv = ConvOptions::new([1, 1], [0, 0], options.dilation, g);
    conv2d(&padded, &kernel, bias, &as_conv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_sizes_follow_the_usual_formula() {
        assert_eq!(conv_out_size(32, 3, 1, 1, 1), Some(32));
        assert_eq!(conv_out_size(32, 3, 2, 1, 1), Some(16));
        assert_eq!(conv_out_size(10, 3, 1, 0, 2), Some(6));
        assert_eq!(conv_out_size(2, 5, 1, 0, 1), None);
        assert_eq!(conv_out_size(8, 0, 1, 0, 1), None);
    }
}
