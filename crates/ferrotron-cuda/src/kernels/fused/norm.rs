//! LayerNorm/RMSNorm forward and backward behind `FusedOps`, and the choice between these
//! block-per-row kernels and the warp-per-row (`norm_rows.rs`) and one-pass (`norm_grad_rows.rs`)
//! ones.
//!
//! The composed version is a chain of generic map and reduce kernels, each a full pass over
//! memory with its own output buffer. These read their inputs once per row, accumulate in f32,
//! and keep only what the backward needs: two f32 numbers per row.

use std::sync::Arc;

use crate::engine::dtype::DType;
use crate::engine::launch::{BLOCK, KernelSpec, Params, launch};
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, Result};
use crate::kernels::fused::norm_grad_rows::NormRowsBackward;
use crate::kernels::fused::norm_rows::{CHUNK, NormRowsForward, NormRowsInputGrad, ROWS_PER_BLOCK};
use crate::kernels::prim::column_sum::column_sum;
use crate::kernels::prim::elementwise::zeros;
use crate::kernels::template::{Hole, template};

use super::{BLOCK_SUM, WARP_SUM, block_rows, uses_half};

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The sources the compile test builds: every dtype with the flags as the ops set them.
    fn sources() -> Vec<String> {
        let mut sources = Vec::new();
        for x in [DType::F32, DType::BF16, DType::F16] {
            for rms in [false, true] {
                for stats_only in [false, true] {
                    let beta = !rms;
                    let spec = NormForward {
                        x,
                        gamma: x,
                        rms,
                        beta,
                        stats_only,
                    };
                    sources.push(spec.source());
                }
                for into in [false, true] {
                    let spec = NormInputGrad {
                        x,
                        gamma: x,
                        grad: x,
                        rms,
                        into,
                    };
                    sources.push(spec.source());
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
        }
        sources
    }

    /// Every flag combination of every kernel (bf16 and f32 x), for the snapshot.
    fn flag_combinations() -> Vec<String> {
        let flags =
            |n: usize| (0..1u32 << n).map(move |bits| (0..n).map(move |i| bits >> i & 1 == 1));
        let mut sources = Vec::new();
        for x in [DType::BF16, DType::F32] {
            for mut f in flags(3) {
                let [rms, beta, stats_only] = [(); 3].map(|_| f.next().unwrap());
                let spec = NormForward {
                    x,
                    gamma: DType::F32,
                    rms,
                    beta,
                    stats_only,
                };
                sources.push(spec.source());
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
        }
        sources
    }

    #[test]
    fn norm_sources_are_unchanged() {
        let mut sources = sources();
        sources.extend(flag_combinations());
        insta::assert_snapshot!(crate::kernels::digests(&sources));
    }

    /// Every generated source compiles for sm_90 (NVRTC, no GPU needed).
    #[test]
    #[ignore = "needs NVRTC and the CUDA headers: tools/test.sh installs them and runs it"]
    fn norm_sources_compile() {
        for source in sources() {
            crate::engine::kernel_cache::compile_for_test(&source, "sm_90")
                .unwrap_or_else(|e| panic!("{e}\n{source}"));
        }
    }
}
