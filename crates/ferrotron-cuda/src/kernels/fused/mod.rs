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
use crate::engine::launch::{BLOCK, KernelSpec, Params, grid_for, includes, launch};
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};
use crate::kernels::fused::norm_grad_rows::NormRowsBackward;
use crate::kernels::fused::norm_rows::{CHUNK, NormRowsForward, NormRowsInputGrad, ROWS_PER_BLOCK};
use crate::kernels::prim::column_sum::column_sum;
use crate::kernels::prim::elementwise::zeros;

/// Warp-shuffle then shared-memory sum over a block; every thread gets the total.
const BLOCK_SUM: &str = r#"
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? red[lane] : 0.f;
  return warp_sum(v);
}
"#;

pub(super) fn uses_half(dtypes: &[DType]) -> bool {
    dtypes.iter().copied().any(DType::needs_half_headers)
}

/// The start of a row-per-block norm kernel: header, includes, the block sum, the parameter
/// struct, and in scope `red`, `row`, `x` (the row, read-only), `gamma` and `inv_n`; `out` names
/// the row pointer the kernel writes (`y`, `dx`), declared in `x`'s dtype.
fn row_kernel_prelude(
    header: &str,
    dtypes: &[DType],
    params: &str,
    x: DType,
    gamma: DType,
    out: &str,
) -> String {
    let mut s = format!("{header}\n");
    s += includes(uses_half(dtypes));
    s += BLOCK_SUM;
    s += &format!("struct Params {{ {params} }};\n");
    s += "extern \"C\" __global__ void ferrotron_kernel(const Params p) {\n";
    s += "  __shared__ float red[32];\n";
    s += "  const long long row = blockIdx.x;\n";
    s += &format!(
        "  const {xs}* x = (const {xs}*)p.x + row * p.hidden;\n  {xs}* {out} = ({xs}*)p.{out} + row * p.hidden;\n",
        xs = x.storage_c()
    );
    s += &format!(
        "  const {gs}* gamma = (const {gs}*)p.gamma;\n",
        gs = gamma.storage_c()
    );
    s += "  const float inv_n = 1.f / (float)p.hidden;\n";
    s
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
        let kind = if self.rms { "rms" } else { "layer" };
        let (x, g) = (self.x, self.gamma);
        let only = if self.stats_only { " stats only" } else { "" };
        let mut s = row_kernel_prelude(
            &format!("// norm forward {kind} {x} gamma {g}{only}"),
            &[x, g],
            "long long rows, hidden; unsigned long long x, gamma, beta, y, mean, rstd; double eps;",
            x,
            g,
            "y",
        );
        s += &format!(
            "  const {gs}* beta = (const {gs}*)p.beta;\n",
            gs = g.storage_c()
        );
        if self.rms {
            s += "  const float mean = 0.f;\n";
        } else {
            s += "  float sum = 0.f;\n";
            s += &format!(
                "  for (long long j = threadIdx.x; j < p.hidden; j += blockDim.x) sum += {};\n",
                x.load_expr("x[j]")
            );
            s += "  const float mean = block_sum(sum, red) * inv_n;\n";
        }
        s += "  float sq = 0.f;\n";
        s += &format!(
            "  for (long long j = threadIdx.x; j < p.hidden; j += blockDim.x) {{ const float d = {} - mean; sq += d * d; }}\n",
            x.load_expr("x[j]")
        );
        s += "  const float rstd = rsqrtf(block_sum(sq, red) * inv_n + (float)p.eps);\n";
        if self.stats_only {
            s += "  (void)y; (void)gamma; (void)beta;\n";
        } else {
            s += "  for (long long j = threadIdx.x; j < p.hidden; j += blockDim.x) {\n";
            s += &format!(
                "    float v = ({} - mean) * rstd * {};\n",
                x.load_expr("x[j]"),
                g.load_expr("gamma[j]")
            );
            if self.beta {
                s += &format!("    v += {};\n", g.load_expr("beta[j]"));
            }
            s += &format!("    y[j] = {};\n  }}\n", x.store_expr("v"));
        }
        s += "  if (threadIdx.x == 0) {\n";
        if !self.rms {
            s += "    ((float*)p.mean)[row] = mean;\n";
        }
        s += "    ((float*)p.rstd)[row] = rstd;\n  }\n}\n";
        s
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
        let kind = if self.rms { "rms" } else { "layer" };
        let (x, g, dy) = (self.x, self.gamma, self.grad);
        let plus = if self.into { " plus into" } else { "" };
        let mut s = row_kernel_prelude(
            &format!("// norm backward input {kind} {x} gamma {g} grad {dy}{plus}"),
            &[x, g, dy],
            "long long rows, hidden; unsigned long long x, gamma, dy, mean, rstd, dx, into;",
            x,
            g,
            "dx",
        );
        if self.into {
            s += &format!(
                "  const {xs}* into = (const {xs}*)p.into + row * p.hidden;\n",
                xs = x.storage_c()
            );
        }
        s += &format!(
            "  const {ds}* dy = (const {ds}*)p.dy + row * p.hidden;\n",
            ds = dy.storage_c()
        );
        if self.rms {
            s += "  const float mean = 0.f;\n";
        } else {
            s += "  const float mean = ((const float*)p.mean)[row];\n";
        }
        s += "  const float rstd = ((const float*)p.rstd)[row];\n";
        s += "  float sum_g = 0.f, sum_gx = 0.f;\n";
        let g_expr = format!("{} * {}", dy.load_expr("dy[j]"), g.load_expr("gamma[j]"));
        let xhat = format!("({} - mean) * rstd", x.load_expr("x[j]"));
        s += "  for (long long j = threadIdx.x; j < p.hidden; j += blockDim.x) {\n";
        s += &format!("    const float g = {g_expr};\n    const float xh = {xhat};\n");
        s += "    sum_g += g; sum_gx += g * xh;\n  }\n";
        if self.rms {
            s += "  const float mean_g = 0.f;\n";
        } else {
            s += "  const float mean_g = block_sum(sum_g, red) * inv_n;\n";
        }
        s += "  const float mean_gx = block_sum(sum_gx, red) * inv_n;\n";
        s += "  for (long long j = threadIdx.x; j < p.hidden; j += blockDim.x) {\n";
        s += &format!("    const float g = {g_expr};\n    const float xh = {xhat};\n");
        let term = if self.into {
            format!(
                "rstd * (g - mean_g - xh * mean_gx) + {}",
                x.load_expr("into[j]")
            )
        } else {
            "rstd * (g - mean_g - xh * mean_gx)".to_string()
        };
        s += &format!("    dx[j] = {};\n  }}\n}}\n", x.store_expr(&term));
        s
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
        let kind = if self.rms { "rms" } else { "layer" };
        let (x, dy) = (self.x, self.grad);
        let mut s = format!("// norm backward params {kind} {x} grad {dy}\n");
        s += includes(uses_half(&[x, dy]));
        s += "struct Params { long long rows, hidden, tiles, rows_per_block; unsigned long long x, dy, mean, rstd, dgamma, dbeta; };\n";
        s += "extern \"C\" __global__ void ferrotron_kernel(const Params p) {\n";
        s += &format!("  __shared__ float acc_g[{PARAM_LANES}][{PARAM_COLS}];\n");
        s += &format!("  __shared__ float acc_b[{PARAM_LANES}][{PARAM_COLS}];\n");
        s += "  const long long tile = blockIdx.x % p.tiles, chunk = blockIdx.x / p.tiles;\n";
        s += &format!(
            "  const int c = threadIdx.x % {PARAM_COLS}, lane = threadIdx.x / {PARAM_COLS};\n"
        );
        s += &format!("  const long long col = tile * {PARAM_COLS} + c;\n");
        s += "  const long long first = chunk * p.rows_per_block;\n";
        s += "  const long long last = first + p.rows_per_block < p.rows ? first + p.rows_per_block : p.rows;\n";
        s += "  float g = 0.f, b = 0.f;\n";
        s += "  if (col < p.hidden) {\n";
        s += &format!("    for (long long r = first + lane; r < last; r += {PARAM_LANES}) {{\n");
        s += &format!(
            "      const float d = {};\n",
            dy.load_expr(&format!(
                "((const {}*)p.dy)[r * p.hidden + col]",
                dy.storage_c()
            ))
        );
        let mean = if self.rms {
            "0.f"
        } else {
            "((const float*)p.mean)[r]"
        };
        s += &format!(
            "      const float xh = ({} - {mean}) * ((const float*)p.rstd)[r];\n",
            x.load_expr(&format!(
                "((const {}*)p.x)[r * p.hidden + col]",
                x.storage_c()
            ))
        );
        s += "      g += d * xh; b += d;\n    }\n  }\n";
        s += "  acc_g[lane][c] = g; acc_b[lane][c] = b;\n  __syncthreads();\n";
        s += "  if (lane == 0 && col < p.hidden) {\n";
        s += &format!(
            "    for (int l = 1; l < {PARAM_LANES}; ++l) {{ g += acc_g[l][c]; b += acc_b[l][c]; }}\n"
        );
        s += "    atomicAdd((float*)p.dgamma + col, g);\n";
        if self.beta {
            s += "    atomicAdd((float*)p.dbeta + col, b);\n";
        }
        s += "  }\n}\n";
        s
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
        let mut s = if self.moments == [DType::F32; 2] {
            format!("// adamw f32 grad {g}\n")
        } else {
            format!("// adamw f32 grad {g} moments {m} {v}\n")
        };
        let mut dtypes = vec![g, m, v];
        dtypes.extend(self.rounded);
        s += includes(uses_half(&dtypes));
        s += "struct Params { long long n; unsigned long long value, grad, m, v, out_value, out_m, out_v, device_scale, out_rounded; double lr, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, bc1, bc2, scale; };\n";
        s += "extern \"C\" __global__ void ferrotron_kernel(const Params p) {\n";
        s += &format!(
            "  const {gs}* grad = (const {gs}*)p.grad;\n",
            gs = g.storage_c()
        );
        s += "  const float* value = (const float*)p.value;\n";
        s += &format!(
            "  const {ms}* m_in = (const {ms}*)p.m;\n  const {vs}* v_in = (const {vs}*)p.v;\n",
            ms = m.storage_c(),
            vs = v.storage_c()
        );
        s += &format!(
            "  float* out_value = (float*)p.out_value;\n  {ms}* out_m = ({ms}*)p.out_m;\n  {vs}* out_v = ({vs}*)p.out_v;\n",
            ms = m.storage_c(),
            vs = v.storage_c()
        );
        s += "  const long long step = (long long)blockDim.x * gridDim.x;\n";
        s += "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += step) {\n";
        s += &format!("    float g = {};\n", g.load_expr("grad[i]"));
        if self.scale {
            s += "    g = g * (float)p.scale;\n";
        }
        if self.device_scale {
            s += "    g = g * ((const float*)p.device_scale)[0];\n";
        }
        if self.first {
            s += "    const float m = g * (float)p.one_minus_beta1;\n";
            s += "    const float v = (g * g) * (float)p.one_minus_beta2;\n";
        } else {
            s += &format!(
                "    const float m = {} * (float)p.beta1 + g * (float)p.one_minus_beta1;\n",
                m.load_expr("m_in[i]")
            );
            s += &format!(
                "    const float v = {} * (float)p.beta2 + (g * g) * (float)p.one_minus_beta2;\n",
                v.load_expr("v_in[i]")
            );
        }
        s += "    float w = value[i];\n";
        if self.decay {
            s += "    w = w * (float)p.decay;\n";
        }
        s += "    const float m_hat = m / (float)p.bc1, v_hat = v / (float)p.bc2;\n";
        s += "    w = w - (m_hat / (sqrtf(v_hat) + (float)p.eps)) * (float)p.lr;\n";
        let store = |dtype: DType, x: &str| {
            if dtype == DType::F32 {
                x.to_owned()
            } else {
                dtype.store_expr(x)
            }
        };
        s += &format!(
            "    out_value[i] = w; out_m[i] = {}; out_v[i] = {};\n",
            store(m, "m"),
            store(v, "v")
        );
        if let Some(r) = self.rounded {
            s += &format!(
                "    (({t}*)p.out_rounded)[i] = {};\n",
                r.store_expr("w"),
                t = r.storage_c()
            );
        }
        s += "  }\n}\n";
        s
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
