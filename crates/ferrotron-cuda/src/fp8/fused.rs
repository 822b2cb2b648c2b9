//! The fp8 primitives of `ferrotron_parallel::FusedOps` for [`Cuda`], on this module's kernels
//! and GEMM (the trait's methods in `fused_ops.rs` call these).

use burn::tensor::DType as BurnDType;
use ferrotron_parallel::fp8_scaling::{AMAX, Fp8Role, Fp8Scaling, Fp8Settings, SCALE};
use ferrotron_parallel::{Fp8Linear, Fp8Operand, Fp8State, Fp8Tensor};

use super::{Cast, Operand, ScaleFrom, cast_transpose, fp8_matmul, supported, update_scaling};
use crate::backend::convert::{engine_dtype, ok};
use crate::backend::{Cuda, GpuDevice};
use crate::device::CudaDevice;
use crate::tensor::CudaTensor;

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
    let settings = *fp8.settings();
    let format = settings.format(role);
    let Cast {
        data,
        transposed,
        scale_inv,
    } = match settings.scaling {
        Fp8Scaling::Current => ok(cast_transpose(
            &x,
            format,
            true,
            ScaleFrom::Current {
                scaled_max: settings.scaled_max(role),
                record: None,
            },
        )),
        Fp8Scaling::Delayed { .. } => {
            let device = GpuDevice::new(x.device().ordinal());
            let at = fp8.block_offset(role);
            let first = fp8.measures_first_scales();
            fp8.state().with_tensor::<Cuda, _>(&device, |state| {
                let from = if first {
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
                ok(cast_transpose(&x, format, true, from))
            })
        }
    };
    Fp8Tensor {
        data,
        transposed: transposed.expect("a transposing cast writes the transpose"),
        scale_inv,
        format,
    }
}

/// `FusedOps::fp8_matmul`: the cuBLASLt fp8 GEMM.
pub(crate) fn fp8_matmul_op(
    a: Fp8Operand<Cuda>,
    b: Fp8Operand<Cuda>,
    bias: Option<CudaTensor>,
    dtype: BurnDType,
    fast_accumulation: bool,
) -> CudaTensor {
    fn operand(o: &Fp8Operand<Cuda>) -> Operand<'_> {
        Operand {
            data: &o.data,
            format: o.format,
            scale_inv: &o.scale_inv,
        }
    }
    let out = ok(engine_dtype(dtype));
    ok(fp8_matmul(
        operand(&a),
        operand(&b),
        bias.as_ref(),
        out,
        fast_accumulation,
    ))
}

/// `FusedOps::fp8_update_scaling`: the update kernel on the state, in place.
pub(crate) fn fp8_update_op(state: &Fp8State) {
    let settings = *state.settings();
    state.update_tensor::<Cuda>(|tensor| ok(update_scaling(tensor, &settings)));
}
