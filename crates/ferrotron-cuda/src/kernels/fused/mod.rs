//! Hand-written fused kernels behind `FusedOps`: LayerNorm/RMSNorm forward and backward, and the
//! AdamW update.
//!
//! Each composed version is a chain of generic map and reduce kernels, each a full pass over
//! memory with its own output buffer. These read their inputs once per row (the norms) or once
//! per element (AdamW), accumulate in f32, and keep only what the backward needs: two f32
//! numbers per row for a norm. Sources are generated per dtype combination and cached by spec
//! like every other family.

pub mod flat;
pub mod loss;
pub mod moe;
mod norm_grad_rows;
mod norm_rows;
pub mod qk_norm;
pub mod rope;
pub mod swiglu;

use std::sync::Arc;

use ferrotron_ops::AdamWStep;

use crate::engine::dtype::DType;
use crate::engine::dtype::engine_dtype;
use crate::engine::launch::{BLOCK, KernelSpec, Params, grid_for, launch};
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};
use crate::kernels::fused::norm_grad_rows::NormRowsBackward;
use crate::kernels::fused::norm_rows::{CHUNK, NormRowsForward, NormRowsInputGrad, ROWS_PER_BLOCK};
use crate::kernels::prim::column_sum::column_sum;
use crate::kernels::prim::elementwise::zeros;
use crate::kernels::template::{Hole, template};

/// Warp-shuffle sum over a warp; every lane gets the total.
const WARP_SUM: &str = include_str!("warp_sum.cu");
/// Then shared-memory sum over a block (after [`WARP_SUM`]); every thread gets the total.
const BLOCK_SUM: &str = include_str!("block_sum.cu");

pub(super) fn uses_half(dtypes: &[DType]) -> bool {
    dtypes.iter().copied().any(DType::needs_half_headers)
}

fn norm_kind(rms: bool) -> &'static str {
    if rms { "rms" } else { "layer" }
}

/// Norm forward: one block per row. `stats_only` writes the row statistics and not the output
/// (an fp8 cast normalises the rows as it reads them, `kernels/fp8/sources.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct NormForward {
    x: DType,
    gamma: DType,
    rms: bool,
    beta: bool,
    stats_only: bool,
}

impl KernelSpec for NormForward {
    fn source(&self) -> String {
        let (x, g) = (self.x, self.gamma);
        template!("norm_forward.cu").fill(&[
            ("KIND", Hole::code(norm_kind(self.rms))),
            ("X_NAME", Hole::Name(x)),
            ("GAMMA_NAME", Hole::Name(g)),
            (
                "STATS_ONLY_NOTE",
                Hole::code(if self.stats_only { " stats only" } else { "" }),
            ),
            ("HALF", Hole::Flag(uses_half(&[x, g]))),
            ("WARP_SUM", Hole::code(WARP_SUM)),
            ("BLOCK_SUM", Hole::code(BLOCK_SUM)),
            ("X", Hole::Storage(x)),
            ("GAMMA", Hole::Storage(g)),
            ("RMS", Hole::Flag(self.rms)),
            ("BETA", Hole::Flag(self.beta)),
            ("STATS_ONLY", Hole::Flag(self.stats_only)),
            ("LOAD_X", Hole::code(x.load_expr("x[j]"))),
            ("LOAD_GAMMA", Hole::code(g.load_expr("gamma[j]"))),
            ("LOAD_BETA", Hole::code(g.load_expr("beta[j]"))),
            ("STORE_V", Hole::code(x.store_expr("v"))),
        ])
    }
}

/// Norm input gradient: one block per row; with `into`, that tensor (x's dtype) is added.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct NormInputGrad {
    x: DType,
    gamma: DType,
    grad: DType,
    rms: bool,
    into: bool,
}

impl KernelSpec for NormInputGrad {
    fn source(&self) -> String {
        let (x, g, dy) = (self.x, self.gamma, self.grad);
        let term = if self.into {
            format!(
                "rstd * (g - mean_g - xh * mean_gx) + {}",
                x.load_expr("into[j]")
            )
        } else {
            "rstd * (g - mean_g - xh * mean_gx)".to_string()
        };
        template!("norm_input_grad.cu").fill(&[
            ("KIND", Hole::code(norm_kind(self.rms))),
            ("X_NAME", Hole::Name(x)),
            ("GAMMA_NAME", Hole::Name(g)),
            ("GRAD_NAME", Hole::Name(dy)),
            (
                "INTO_NOTE",
                Hole::code(if self.into { " plus into" } else { "" }),
            ),
            ("HALF", Hole::Flag(uses_half(&[x, g, dy]))),
            ("WARP_SUM", Hole::code(WARP_SUM)),
            ("BLOCK_SUM", Hole::code(BLOCK_SUM)),
            ("X", Hole::Storage(x)),
            ("GAMMA", Hole::Storage(g)),
            ("GRAD", Hole::Storage(dy)),
            ("RMS", Hole::Flag(self.rms)),
            ("INTO", Hole::Flag(self.into)),
            ("LOAD_X", Hole::code(x.load_expr("x[j]"))),
            ("LOAD_DY", Hole::code(dy.load_expr("dy[j]"))),
            ("LOAD_GAMMA", Hole::code(g.load_expr("gamma[j]"))),
            ("STORE_DX", Hole::code(x.store_expr(&term))),
        ])
    }
}

/// Columns of one norm parameter-gradient block, and its row lanes.
const PARAM_COLS: u32 = 32;
const PARAM_LANES: u32 = 8;
/// Rows one block sums before its single atomic add per column.
const PARAM_ROWS_PER_BLOCK: usize = 256;

/// Norm γ/β gradients: column tiles × row chunks, f32 atomics into zeroed outputs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct NormParamGrad {
    x: DType,
    grad: DType,
    rms: bool,
    beta: bool,
}

impl KernelSpec for NormParamGrad {
    fn source(&self) -> String {
        let (x, dy) = (self.x, self.grad);
        let element = |dtype: DType, name: &str| {
            let storage = dtype.storage_c();
            dtype.load_expr(&format!("((const {storage}*)p.{name})[r * p.hidden + col]"))
        };
        template!("norm_param_grad.cu").fill(&[
            ("KIND", Hole::code(norm_kind(self.rms))),
            ("X_NAME", Hole::Name(x)),
            ("GRAD_NAME", Hole::Name(dy)),
            ("HALF", Hole::Flag(uses_half(&[x, dy]))),
            ("LANES", Hole::Int(PARAM_LANES.into())),
            ("COLS", Hole::Int(PARAM_COLS.into())),
            ("RMS", Hole::Flag(self.rms)),
            ("BETA", Hole::Flag(self.beta)),
            ("LOAD_X", Hole::code(element(x, "x"))),
            ("LOAD_DY", Hole::code(element(dy, "dy"))),
        ])
    }
}

/// The row statistics of a norm forward.
pub struct NormForwardOut {
    pub output: CudaTensor,
    pub mean: Option<CudaTensor>,
    pub rstd: CudaTensor,
}

fn rows_hidden(x: &CudaTensor, op: &str) -> Result<(usize, usize)> {
    match x.shape() {
        [rows, hidden] => Ok((*rows, *hidden)),
        _ => Err(CudaError::invalid(
            x.op(op),
            "a fused norm takes [rows, hidden]",
        )),
    }
}

fn check_param(p: &CudaTensor, hidden: usize, op: &str) -> Result<()> {
    if p.shape() != [hidden] {
        return Err(CudaError::invalid(
            p.op(op),
            format!("a norm parameter must be [{hidden}]"),
        ));
    }
    Ok(())
}

/// Whether a tensor starts at a whole chunk, as the warp-per-row kernels' 16-byte loads need.
fn chunk_aligned(t: &CudaTensor) -> bool {
    t.data_ptr()
        .is_multiple_of((CHUNK * t.dtype().size_in_bytes()) as u64)
}

pub(super) fn block_rows(rows: usize, op: &dyn Fn() -> OpContext) -> Result<u32> {
    u32::try_from(rows.max(1))
        .map_err(|_| CudaError::unsupported(op(), format!("{rows} rows exceed one grid")))
}

/// `x [rows, hidden]` normalised per row (LayerNorm with optional β, or RMSNorm).
pub fn norm_forward(
    x: &CudaTensor,
    gamma: &CudaTensor,
    beta: Option<&CudaTensor>,
    rms: bool,
    epsilon: f64,
) -> Result<NormForwardOut> {
    let (output, mean, rstd) = norm_pass(x, gamma, beta, rms, epsilon, true)?;
    let output = output.expect("the pass writes the output");
    Ok(NormForwardOut { output, mean, rstd })
}

/// The row statistics of a norm of `x [rows, hidden]` (LayerNorm's mean, and `1/σ`) without its
/// output, by the forward kernel's own arithmetic; `gamma` only names the parameters' dtype.
pub fn norm_stats(
    x: &CudaTensor,
    gamma: &CudaTensor,
    rms: bool,
    epsilon: f64,
) -> Result<(Option<CudaTensor>, CudaTensor)> {
    let (_, mean, rstd) = norm_pass(x, gamma, None, rms, epsilon, false)?;
    Ok((mean, rstd))
}

type NormPass = (Option<CudaTensor>, Option<CudaTensor>, CudaTensor);

fn norm_pass(
    x: &CudaTensor,
    gamma: &CudaTensor,
    beta: Option<&CudaTensor>,
    rms: bool,
    epsilon: f64,
    write: bool,
) -> Result<NormPass> {
    let (rows, hidden) = rows_hidden(x, "norm_forward")?;
    check_param(gamma, hidden, "norm_forward")?;
    let x = x.contiguous()?;
    let gamma = gamma.contiguous()?.cast(gamma.dtype())?;
    let beta = match beta {
        Some(b) => {
            check_param(b, hidden, "norm_forward")?;
            Some(b.contiguous()?.cast(gamma.dtype())?)
        }
        None => None,
    };
    let device: &Arc<_> = x.device();
    let output = write
        .then(|| CudaTensor::empty(device, &[rows, hidden], x.dtype()))
        .transpose()?;
    let mean = if rms {
        None
    } else {
        Some(CudaTensor::empty(device, &[rows, 1], DType::F32)?)
    };
    let rstd = CudaTensor::empty(device, &[rows, 1], DType::F32)?;
    let spec = NormForward {
        x: x.dtype(),
        gamma: gamma.dtype(),
        rms,
        beta: beta.is_some(),
        stats_only: !write,
    };
    let mut params = Params::new();
    params
        .int(rows as i64)
        .int(hidden as i64)
        .ptr(x.data_ptr())
        .ptr(gamma.data_ptr())
        .ptr(beta.as_ref().map_or(0, CudaTensor::data_ptr))
        .ptr(output.as_ref().map_or(0, CudaTensor::data_ptr))
        .ptr(mean.as_ref().map_or(0, CudaTensor::data_ptr))
        .ptr(rstd.data_ptr())
        .float(epsilon);
    let op = || x.op("norm_forward");
    if rows == 0 || hidden == 0 {
        return Ok((output, mean, rstd));
    }
    let warp_rows =
        NormRowsForward::for_hidden(x.dtype(), gamma.dtype(), rms, beta.is_some(), hidden)
            .map(|spec| NormRowsForward {
                stats_only: !write,
                ..spec
            })
            .filter(|_| {
                [&x, &gamma]
                    .into_iter()
                    .chain(&output)
                    .chain(beta.as_ref())
                    .all(chunk_aligned)
            });
    match warp_rows {
        Some(warp) => {
            let blocks = block_rows(rows.div_ceil(ROWS_PER_BLOCK), &op)?;
            launch(device, &warp, blocks, BLOCK, &params, &op)?;
        }
        None => launch(device, &spec, block_rows(rows, &op)?, BLOCK, &params, &op)?,
    }
    Ok((output, mean, rstd))
}

/// Whether the one-pass norm backward is on (the recipe's `runtime.norm_one_pass`; off gives
/// the warp-per-row input gradient and the separate γ/β reduction back, to compare).
fn one_pass_on() -> bool {
    crate::switches::paths().norm_one_pass
}

/// Gradients of a norm: input, γ and (with `beta`) β, γ/β in γ's dtype. Rows of up to 4,096
/// elements in whole aligned chunks take the one-pass kernel (`norm_grad_rows.rs`), others the
/// input gradient and a column reduction.
pub fn norm_backward(
    x: &CudaTensor,
    gamma: &CudaTensor,
    beta: bool,
    mean: Option<&CudaTensor>,
    rstd: &CudaTensor,
    grad: &CudaTensor,
    into: Option<&CudaTensor>,
) -> Result<(CudaTensor, CudaTensor, Option<CudaTensor>)> {
    let (rows, hidden) = rows_hidden(x, "norm_backward")?;
    check_param(gamma, hidden, "norm_backward")?;
    let x = x.contiguous()?;
    let gamma = gamma.contiguous()?;
    let grad = grad.contiguous()?;
    let into = match into {
        Some(t) if t.shape() != x.shape() => {
            return Err(CudaError::invalid(
                t.op("norm_backward"),
                format!("the gradient to add must be x's shape {:?}", x.shape()),
            ));
        }
        Some(t) if t.dtype() != x.dtype() => Some(t.cast(x.dtype())?),
        Some(t) => Some(t.contiguous()?),
        None => None,
    };
    let rms = mean.is_none();
    let device = x.device();
    let dx = CudaTensor::empty(device, &[rows, hidden], x.dtype())?;
    let mean_ptr = mean.map_or(0, CudaTensor::data_ptr);
    let op = || x.op("norm_backward");
    let aligned = [&x, &gamma, &grad, &dx]
        .into_iter()
        .chain(&into)
        .all(chunk_aligned);
    let one_pass = NormRowsBackward::for_hidden(
        x.dtype(),
        gamma.dtype(),
        grad.dtype(),
        (rms, beta, into.is_some()),
        hidden,
    )
    .filter(|_| aligned && rows > 0 && one_pass_on());
    // The input gradient's parameters, which the one-pass kernel's begin with.
    let mut params = Params::new();
    params
        .int(rows as i64)
        .int(hidden as i64)
        .ptr(x.data_ptr())
        .ptr(gamma.data_ptr())
        .ptr(grad.data_ptr())
        .ptr(mean_ptr)
        .ptr(rstd.data_ptr())
        .ptr(dx.data_ptr())
        .ptr(into.as_ref().map_or(0, CudaTensor::data_ptr));
    if let Some(spec) = one_pass {
        let blocks = spec.blocks(rows, device.multiprocessors());
        let partial = || CudaTensor::empty(device, &[blocks, hidden], DType::F32);
        let dgamma = partial()?;
        let dbeta = spec.beta.then(partial).transpose()?;
        params
            .ptr(dgamma.data_ptr())
            .ptr(dbeta.as_ref().map_or(0, CudaTensor::data_ptr));
        let grid = block_rows(blocks, &op)?;
        launch(device, &spec, grid, spec.threads as u32, &params, &op)?;
        let dgamma = column_sum(&dgamma, gamma.dtype(), &op)?;
        let dbeta = dbeta
            .map(|partial| column_sum(&partial, gamma.dtype(), &op))
            .transpose()?;
        return Ok((dx, dgamma, dbeta));
    }
    let dgamma = zeros(device, &[hidden], DType::F32)?;
    let dbeta = if beta {
        Some(zeros(device, &[hidden], DType::F32)?)
    } else {
        None
    };
    if rows > 0 && hidden > 0 {
        let spec = NormInputGrad {
            x: x.dtype(),
            gamma: gamma.dtype(),
            grad: grad.dtype(),
            rms,
            into: into.is_some(),
        };
        let warp_rows = NormRowsInputGrad::for_hidden(
            x.dtype(),
            gamma.dtype(),
            grad.dtype(),
            rms,
            into.is_some(),
            hidden,
        )
        .filter(|_| aligned);
        match warp_rows {
            Some(warp) => {
                let blocks = block_rows(rows.div_ceil(ROWS_PER_BLOCK), &op)?;
                launch(device, &warp, blocks, BLOCK, &params, &op)?;
            }
            None => launch(device, &spec, block_rows(rows, &op)?, BLOCK, &params, &op)?,
        }

        let tiles = hidden.div_ceil(PARAM_COLS as usize);
        let chunks = rows.div_ceil(PARAM_ROWS_PER_BLOCK);
        let spec = NormParamGrad {
            x: x.dtype(),
            grad: grad.dtype(),
            rms,
            beta,
        };
        let mut params = Params::new();
        params
            .int(rows as i64)
            .int(hidden as i64)
            .int(tiles as i64)
            .int(PARAM_ROWS_PER_BLOCK as i64)
            .ptr(x.data_ptr())
            .ptr(grad.data_ptr())
            .ptr(mean_ptr)
            .ptr(rstd.data_ptr())
            .ptr(dgamma.data_ptr())
            .ptr(dbeta.as_ref().map_or(0, CudaTensor::data_ptr));
        let grid = block_rows(tiles * chunks, &op)?;
        launch(device, &spec, grid, PARAM_COLS * PARAM_LANES, &params, &op)?;
    }
    let dgamma = dgamma.cast(gamma.dtype())?;
    let dbeta = dbeta.map(|b| b.cast(gamma.dtype())).transpose()?;
    Ok((dx, dgamma, dbeta))
}

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

    /// The sources the compile test builds: every dtype with the flags as the ops set them.
    fn sources() -> Vec<String> {
        let mut sources = Vec::new();
        for x in [DType::F32, DType::BF16, DType::F16] {
            for rms in [false, true] {
                for stats_only in [false, true] {
                    sources.push(
                        NormForward {
                            x,
                            gamma: x,
                            rms,
                            beta: !rms,
                            stats_only,
                        }
                        .source(),
                    );
                }
                for into in [false, true] {
                    sources.push(
                        NormInputGrad {
                            x,
                            gamma: x,
                            grad: x,
                            rms,
                            into,
                        }
                        .source(),
                    );
                }
                sources.push(
                    NormParamGrad {
                        x,
                        grad: x,
                        rms,
                        beta: !rms,
                    }
                    .source(),
                );
            }
            for first in [false, true] {
                // f32 moments, and bf16 ones (the precision-aware optimizer)
                for moments in [[DType::F32; 2], [DType::BF16; 2], [DType::BF16, DType::F32]] {
                    sources.push(
                        AdamW {
                            grad: x,
                            first,
                            decay: !first,
                            scale: first,
                            device_scale: !first,
                            rounded: first.then_some(DType::BF16),
                            moments,
                        }
                        .source(),
                    );
                }
            }
        }
        sources
    }

    /// Every flag combination of every kernel (bf16, and f32 moments and x), for the snapshot.
    fn flag_combinations() -> Vec<String> {
        let flags =
            |n: usize| (0..1u32 << n).map(move |bits| (0..n).map(move |i| bits >> i & 1 == 1));
        let mut sources = Vec::new();
        for x in [DType::BF16, DType::F32] {
            for mut f in flags(3) {
                let [rms, beta, stats_only] = [(); 3].map(|_| f.next().unwrap());
                let gamma = DType::F32;
                sources.push(
                    NormForward {
                        x,
                        gamma,
                        rms,
                        beta,
                        stats_only,
                    }
                    .source(),
                );
            }
            for mut f in flags(2) {
                let [rms, into] = [(); 2].map(|_| f.next().unwrap());
                let (gamma, grad) = (DType::F32, DType::BF16);
                sources.push(
                    NormInputGrad {
                        x,
                        gamma,
                        grad,
                        rms,
                        into,
                    }
                    .source(),
                );
            }
            for mut f in flags(2) {
                let [rms, beta] = [(); 2].map(|_| f.next().unwrap());
                sources.push(
                    NormParamGrad {
                        x,
                        grad: DType::BF16,
                        rms,
                        beta,
                    }
                    .source(),
                );
            }
            for mut f in flags(5) {
                let [first, decay, scale, device_scale, rounded] =
                    [(); 5].map(|_| f.next().unwrap());
                let rounded = rounded.then_some(DType::BF16);
                let moments = [x, DType::F32];
                let spec = AdamW {
                    grad: x,
                    first,
                    decay,
                    scale,
                    device_scale,
                    rounded,
                    moments,
                };
                sources.push(spec.source());
            }
        }
        sources
    }

    #[test]
    fn fused_sources_are_unchanged() {
        let mut sources = sources();
        sources.extend(flag_combinations());
        insta::assert_snapshot!(crate::kernels::digests(&sources));
    }

    /// Every generated source compiles for sm_90 (NVRTC, no GPU needed).
    #[test]
    #[ignore = "needs NVRTC and the CUDA headers: tools/test.sh installs them and runs it"]
    fn fused_sources_compile() {
        let sources = sources();
        for source in sources {
            crate::engine::kernel_cache::compile_for_test(&source, "sm_90")
                .unwrap_or_else(|e| panic!("{e}\n{source}"));
        }
    }
}
