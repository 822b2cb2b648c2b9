//! The fp8 primitives of `ferrotron_ops::FusedOps` for [`Cuda`], on the fp8 kernels
//! (`kernels/fp8`) and GEMM (`blas/fp8_gemm.rs`); the trait's methods in `mod.rs` call these.

use burn::tensor::DType as BurnDType;
use ferrotron_ops::fp8::scaling::{AMAX, Fp8Role, Fp8Scaling, Fp8Settings, SCALE};
use ferrotron_ops::{
    Fp8Activation, Fp8InputNorm, Fp8Linear, Fp8Operand, Fp8Source, Fp8State, Fp8Tensor, NormKind,
    NormStats, fp8_quantize_norm_composed, fp8_quantize_source_composed,
};

use crate::backend::convert::{engine_dtype, ok};
use crate::backend::{Cuda, GpuDevice};
use crate::blas::fp8_gemm::{Operand, fp8_matmul};
use crate::engine::device::CudaDevice;
use crate::engine::tensor::CudaTensor;
use crate::kernels::fp8::{
    Cast, CastDropout, CastExtra, CastInput, CastNorm, CastRope, CastSource, ScaleFrom,
    cast_source, supported, update_scaling,
};
use crate::kernels::fused::norm_stats;

/// `FusedOps::fp8_support`: a GPU of compute capability 9.0 or newer, a recipe with
/// per-tensor scales.
pub(crate) fn fp8_support(device: &GpuDevice, settings: &Fp8Settings) -> Result<(), String> {
    let _ = settings;
    let device = CudaDevice::get(device.ordinal).map_err(|e| e.to_string())?;
    supported(&device)
}

/// `FusedOps::fp8_quantize`: one cast-transpose pass, the scale from the layer's state row
/// (delayed) or from an amax pass (current).
pub(crate) fn fp8_quantize_op(
    x: CudaTensor,
    fp8: &Fp8Linear,
    role: Fp8Role,
    record: bool,
) -> Fp8Tensor<Cuda> {
    fp8_quantize_source_op(Fp8Source::Plain(x), fp8, role, record, false).0
}

/// `FusedOps::fp8_quantize_source`: the activation (or its gradient) computed, cast and
/// transposed, and the bias gradient summed, in one pass. A scale measured from this very
/// tensor (current scaling, a first step) needs its amax before the cast: the activation is
/// materialised for that (`fp8_quantize_source_composed`), as the kernel reads only its inputs.
pub(crate) fn fp8_quantize_source_op(
    source: Fp8Source<Cuda>,
    fp8: &Fp8Linear,
    role: Fp8Role,
    record: bool,
    bias_grad: bool,
) -> (Fp8Tensor<Cuda>, Option<CudaTensor>) {
    let settings = *fp8.settings();
    let measured = match settings.scaling {
        Fp8Scaling::Current => true,
        Fp8Scaling::Delayed { .. } => fp8.measures_first_scales(),
    };
    let mut tables = None;
    let mut dropout = None;
    let (x, aux, kind) = match source {
        Fp8Source::Plain(x) => (x, None, CastSource::Plain),
        source if measured => {
            return fp8_quantize_source_composed::<Cuda>(source, fp8, role, record, bias_grad);
        }
        Fp8Source::DropoutGrad { grad, mask, prob } => {
            // The reference kernels keep the mask itself: nothing to regenerate.
            if mask.kept.is_some() {
                let source = Fp8Source::DropoutGrad { grad, mask, prob };
                return fp8_quantize_source_composed::<Cuda>(source, fp8, role, record, bias_grad);
            }
            dropout = Some(CastDropout {
                rng: mask.rng,
                prob,
            });
            (grad, None, CastSource::DropoutGrad)
        }
        Fp8Source::RopeGrad { grad, rope } => {
            let fits = [&rope.cos, &rope.sin]
                .iter()
                .all(|t| t.dtype() == grad.dtype())
                && rope.head_dim.is_multiple_of(16);
            if !fits {
                let source = Fp8Source::RopeGrad { grad, rope };
                return fp8_quantize_source_composed::<Cuda>(source, fp8, role, record, bias_grad);
            }
            let kind = CastSource::RopeGrad {
                slots: rope.slots,
                head_dim: rope.head_dim,
            };
            tables = Some((rope.cos, rope.sin));
            (grad, None, kind)
        }
        Fp8Source::Activation { pre, act } => {
            let kind = match act {
                Fp8Activation::Gelu => CastSource::Gelu,
                Fp8Activation::Swiglu => CastSource::Swiglu,
            };
            (pre, None, kind)
        }
        Fp8Source::ActivationGrad { grad, pre, act } => {
            let kind = match act {
                Fp8Activation::Gelu => CastSource::GeluGrad,
                Fp8Activation::Swiglu => CastSource::SwigluGrad,
            };
            (grad, Some(pre), kind)
        }
    };
    let extra = match (&tables, dropout) {
        (Some((cos, sin)), _) => CastExtra::Rope(CastRope { cos, sin }),
        (None, Some(dropout)) => CastExtra::Dropout(dropout),
        (None, None) => CastExtra::None,
    };
    let input = CastInput {
        x: &x,
        aux: aux.as_ref(),
        extra,
        source: kind,
    };
    let (tensor, bias) = cast_with(input, fp8, role, record, bias_grad, measured);
    (tensor, bias)
}

/// `FusedOps::fp8_quantize_norm`: the row statistics by the norm kernel's arithmetic without
/// its output, then one cast pass that normalises each row as it reads it. Where the scale is
/// measured from this very tensor (current scaling, a first step), or the kernels cannot take
/// the operands, the norm's output is materialised and cast (`fp8_quantize_norm_composed`).
pub(crate) fn fp8_quantize_norm_op(
    x: CudaTensor,
    norm: Fp8InputNorm<Cuda>,
    fp8: &Fp8Linear,
    record: bool,
) -> (Fp8Tensor<Cuda>, NormStats<Cuda>) {
    let measured = match fp8.settings().scaling {
        Fp8Scaling::Current => true,
        Fp8Scaling::Delayed { .. } => fp8.measures_first_scales(),
    };
    let same_dtype = |t: &CudaTensor| t.dtype() == x.dtype();
    let fits = !measured
        && x.rank() == 2
        && same_dtype(&norm.gamma)
        && norm.beta.as_ref().is_none_or(same_dtype)
        && x.shape()[1].is_multiple_of(8);
    if !fits {
        return fp8_quantize_norm_composed::<Cuda>(x, norm, fp8, record);
    }
    let rms = norm.spec.kind == NormKind::Rms;
    let (mean, rstd) = ok(norm_stats(&x, &norm.gamma, rms, norm.spec.epsilon));
    let input = CastInput {
        x: &x,
        aux: None,
        extra: CastExtra::Norm(CastNorm {
            mean: mean.as_ref(),
            rstd: &rstd,
            gamma: &norm.gamma,
            beta: norm.beta.as_ref(),
        }),
        source: CastSource::Norm {
            rms,
            beta: norm.beta.is_some(),
        },
    };
    let (tensor, _) = cast_with(input, fp8, Fp8Role::Input, record, false, false);
    (tensor, NormStats { mean, rstd })
}

/// One cast pass of `input` for `role` with the layer's scaling (see [`fp8_quantize_source_op`]).
fn cast_with(
    input: CastInput<'_>,
    fp8: &Fp8Linear,
    role: Fp8Role,
    record: bool,
    bias_grad: bool,
    measured: bool,
) -> (Fp8Tensor<Cuda>, Option<CudaTensor>) {
    let settings = *fp8.settings();
    let format = settings.format(role);
    let (cast, bias) = match settings.scaling {
        Fp8Scaling::Current => ok(cast_source(
            input,
            format,
            true,
            ScaleFrom::Current {
                scaled_max: settings.scaled_max(role),
                record: None,
            },
            bias_grad,
        )),
        Fp8Scaling::Delayed { .. } => {
            let device = GpuDevice::new(input.x.device().ordinal());
            let at = fp8.block_offset(role);
            fp8.state().with_tensor::<Cuda, _>(&device, |state| {
                let from = if measured {
                    ScaleFrom::Current {
                        scaled_max: settings.scaled_max(role),
                        record: record.then_some((&*state, at + AMAX)),
                    }
                } else {
                    ScaleFrom::Delayed {
                        state,
                        scale: at + SCALE,
                        amax: record.then_some(at + AMAX),
                    }
                };
                ok(cast_source(input, format, true, from, bias_grad))
            })
        }
    };
    let Cast {
        data,
        transposed,
        scale_inv,
    } = cast;
    let tensor = Fp8Tensor {
        data,
        transposed: transposed.expect("a transposing cast writes the transpose"),
        scale_inv,
        format,
    };
    (tensor, bias)
}

/// `FusedOps::fp8_matmul`: the cuBLASLt fp8 GEMM.
pub(crate) fn fp8_matmul_op(
    a: Fp8Operand<Cuda>,
    b: Fp8Operand<Cuda>,
    bias: Option<CudaTensor>,
    dtype: BurnDType,
    fast_accumulation: bool,
) -> CudaTensor {
    let out = ok(engine_dtype(dtype));
    ok(fp8_matmul(
        operand(&a),
        operand(&b),
        bias.as_ref(),
        out,
        fast_accumulation,
    ))
}

/// An fp8 operand as the engine's GEMMs take it.
pub(super) fn operand(o: &Fp8Operand<Cuda>) -> Operand<'_> {
    Operand {
        data: &o.data,
        format: o.format,
        scale_inv: &o.scale_inv,
    }
}

/// `FusedOps::fp8_update_scaling`: the update kernel on the state, in place.
pub(crate) fn fp8_update_op(state: &Fp8State) {
    let settings = *state.settings();
    state.update_tensor::<Cuda>(|tensor| ok(update_scaling(tensor, &settings)));
}
