//! The AdamW update behind `FusedOps` in one pass over the flat buffers: the composed version
//! is a chain of map kernels, each a full pass over memory with its own output buffer; this one
//! reads the value, gradient and moments once per element, computes in f32, and writes the
//! 16-bit parameter's rounded copy in the same pass.

use ferrotron_ops::AdamWStep;

use crate::engine::dtype::{DType, engine_dtype};
use crate::engine::launch::{BLOCK, KernelSpec, Params, grid_for, launch};
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, Result};
use crate::kernels::template::{Hole, template};

use super::uses_half;

/// AdamW over one flat parameter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct AdamW {
    grad: DType,
    first: bool,
    decay: bool,
    /// A host scalar factor on the gradient.
    scale: bool,
    /// A factor read from device memory (`[1]` f32: a clipping coefficient the host never saw).
    device_scale: bool,
    /// The parameter's 16-bit dtype, whose rounded copy of the new value is also written.
    rounded: Option<DType>,
    /// How the two moments are stored (read widened to f32, written back rounded).
    moments: [DType; 2],
}

impl KernelSpec for AdamW {
    fn source(&self) -> String {
        let g = self.grad;
        let [m, v] = self.moments;
        // f32 moments keep the source (and so the kernel cache's key) they always had
        let moments_note = if self.moments == [DType::F32; 2] {
            String::new()
        } else {
            format!(" moments {m} {v}")
        };
        let mut dtypes = vec![g, m, v];
        dtypes.extend(self.rounded);
        let store = |dtype: DType, x: &str| {
            if dtype == DType::F32 {
                x.to_owned()
            } else {
                dtype.store_expr(x)
            }
        };
        let mut holes = vec![
            ("GRAD_NAME", Hole::Name(g)),
            ("MOMENTS_NOTE", Hole::code(moments_note)),
            ("HALF", Hole::Flag(uses_half(&dtypes))),
            ("GRAD", Hole::Storage(g)),
            ("M", Hole::Storage(m)),
            ("V", Hole::Storage(v)),
            ("SCALE", Hole::Flag(self.scale)),
            ("DEVICE_SCALE", Hole::Flag(self.device_scale)),
            ("FIRST", Hole::Flag(self.first)),
            ("DECAY", Hole::Flag(self.decay)),
            ("ROUNDED", Hole::Flag(self.rounded.is_some())),
            ("LOAD_GRAD", Hole::code(g.load_expr("grad[i]"))),
            ("LOAD_M", Hole::code(m.load_expr("m_in[i]"))),
            ("LOAD_V", Hole::code(v.load_expr("v_in[i]"))),
            ("STORE_M", Hole::code(store(m, "m"))),
            ("STORE_V", Hole::code(store(v, "v"))),
        ];
        if let Some(r) = self.rounded {
            holes.push(("ROUNDED_TYPE", Hole::Storage(r)));
            holes.push(("STORE_ROUNDED", Hole::code(r.store_expr("w"))));
        }
        template!("adamw.cu").fill(&holes)
    }
}

/// What one AdamW update writes: the new fp32 value, both moments, and the value rounded to
/// the parameter's dtype where `AdamWStep::rounded` asks for it.
pub struct AdamWOutput {
    pub value: CudaTensor,
    pub exp_avg: CudaTensor,
    pub exp_avg_sq: CudaTensor,
    pub rounded: Option<CudaTensor>,
}

/// One AdamW update of a flat fp32 `value` from `grad` and the moments.
/// `device_scale` (`[1]`, f32) multiplies the gradient after `s.grad_scale`; `rounded` asks
/// for the new value in that dtype too (the 16-bit parameter's own copy). With `give_up`, the
/// caller will not read `value` and the moments again: each that nothing else holds (a flat
/// optimizer buffer, a moment) is written in place instead of into a new buffer.
pub fn adamw(
    value: &CudaTensor,
    grad: &CudaTensor,
    moments: Option<(&CudaTensor, &CudaTensor)>,
    s: AdamWStep,
    device_scale: Option<&CudaTensor>,
    rounded: Option<DType>,
    give_up: bool,
) -> Result<AdamWOutput> {
    let op = || value.op("adamw");
    let n = value.numel();
    let [m_dtype, v_dtype] = s.moment_dtypes;
    let (m_dtype, v_dtype) = (engine_dtype(m_dtype)?, engine_dtype(v_dtype)?);
    let reusable = |t: &CudaTensor, dtype: DType| {
        give_up
            && t.is_exclusive()
            && t.is_contiguous()
            && t.offset() == 0
            && t.dtype() == dtype
            && t.numel() == n
    };
    let reuse = [
        Some(value).filter(|t| reusable(t, DType::F32)).cloned(),
        moments.and_then(|(m, _)| Some(m).filter(|t| reusable(t, m_dtype)).cloned()),
        moments.and_then(|(_, v)| Some(v).filter(|t| reusable(t, v_dtype)).cloned()),
    ];
    let flat = |t: &CudaTensor, dtype: Option<DType>| -> Result<CudaTensor> {
        if t.numel() != n || dtype.is_some_and(|d| t.dtype() != d) {
            return Err(CudaError::invalid(
                t.op("adamw"),
                format!(
                    "AdamW operands must hold {n} elements (moments in {m_dtype} and {v_dtype})"
                ),
            ));
        }
        t.contiguous()?.reshape(&[n])
    };
    let value = flat(value, Some(DType::F32))?;
    let grad = flat(grad, None)?;
    let moments = match moments {
        Some((m, v)) => Some((flat(m, Some(m_dtype))?, flat(v, Some(v_dtype))?)),
        None => None,
    };
    let device_scale = match device_scale {
        Some(t) if t.numel() == 1 => Some(t.cast(DType::F32)?.contiguous()?),
        Some(t) => {
            return Err(CudaError::invalid(
                t.op("adamw"),
                "the device gradient scale must hold one value",
            ));
        }
        None => None,
    };
    let device = value.device();
    let [out_value, out_m, out_v] = [DType::F32, m_dtype, v_dtype]
        .into_iter()
        .zip(reuse)
        .map(|(dtype, t)| match t {
            Some(t) => Ok(t),
            None => CudaTensor::empty(device, &[n], dtype),
        })
        .collect::<Vec<_>>()
        .try_into()
        .unwrap_or_else(|_| unreachable!("three outputs"));
    let (out_value, out_m, out_v) = (out_value?, out_m?, out_v?);
    let rounded = rounded
        .map(|dtype| CudaTensor::empty(device, &[n], dtype))
        .transpose()?;
    let spec = AdamW {
        grad: grad.dtype(),
        first: moments.is_none(),
        decay: s.decay.is_some(),
        scale: s.grad_scale != 1.0,
        device_scale: device_scale.is_some(),
        rounded: rounded.as_ref().map(CudaTensor::dtype),
        moments: [m_dtype, v_dtype],
    };
    let mut params = Params::new();
    params
        .int(n as i64)
        .ptr(value.data_ptr())
        .ptr(grad.data_ptr())
        .ptr(moments.as_ref().map_or(0, |(m, _)| m.data_ptr()))
        .ptr(moments.as_ref().map_or(0, |(_, v)| v.data_ptr()))
        .ptr(out_value.data_ptr())
        .ptr(out_m.data_ptr())
        .ptr(out_v.data_ptr())
        .ptr(device_scale.as_ref().map_or(0, CudaTensor::data_ptr))
        .ptr(rounded.as_ref().map_or(0, CudaTensor::data_ptr))
        .float(s.lr)
        .float(s.beta1)
        .float(1.0 - s.beta1)
        .float(s.beta2)
        .float(1.0 - s.beta2)
        .float(s.eps)
        .float(s.decay.unwrap_or(1.0))
        .float(s.bias_correction1)
        .float(s.bias_correction2)
        .float(s.grad_scale);
    if n > 0 {
        launch(
            device,
            &spec,
            grid_for(n as u64, BLOCK),
            BLOCK,
            &params,
            &op,
        )?;
    }
    Ok(AdamWOutput {
        value: out_value,
        exp_avg: out_m,
        exp_avg_sq: out_v,
        rounded,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sources the compile test builds: every gradient dtype, f32 moments and bf16 ones
    /// (the precision-aware optimizer), with the flags as the ops set them.
    fn sources() -> Vec<String> {
        let mut sources = Vec::new();
        for grad in [DType::F32, DType::BF16, DType::F16] {
            for first in [false, true] {
                for moments in [[DType::F32; 2], [DType::BF16; 2], [DType::BF16, DType::F32]] {
                    let spec = AdamW {
                        grad,
                        first,
                        decay: !first,
                        scale: first,
                        device_scale: !first,
                        rounded: first.then_some(DType::BF16),
                        moments,
                    };
                    sources.push(spec.source());
                }
            }
        }
        sources
    }

    /// Every flag combination (bf16 and f32 gradients, moments in the gradient's dtype and
    /// f32), for the snapshot.
    fn flag_combinations() -> Vec<String> {
        let mut sources = Vec::new();
        for grad in [DType::BF16, DType::F32] {
            for bits in 0..1u32 << 5 {
                let flag = |i: u32| bits >> i & 1 == 1;
                let spec = AdamW {
                    grad,
                    first: flag(0),
                    decay: flag(1),
                    scale: flag(2),
                    device_scale: flag(3),
                    rounded: flag(4).then_some(DType::BF16),
                    moments: [grad, DType::F32],
                };
                sources.push(spec.source());
            }
        }
        sources
    }

    #[test]
    fn adamw_sources_are_unchanged() {
        let mut sources = sources();
        sources.extend(flag_combinations());
        insta::assert_snapshot!(crate::kernels::digests(&sources));
    }

    /// Every generated source compiles for sm_90 (NVRTC, no GPU needed).
    #[test]
    #[ignore = "needs NVRTC and the CUDA headers: tools/test.sh installs them and runs it"]
    fn adamw_sources_compile() {
        for source in sources() {
            crate::engine::kernel_cache::compile_for_test(&source, "sm_90")
                .unwrap_or_else(|e| panic!("{e}\n{source}"));
        }
    }
}
