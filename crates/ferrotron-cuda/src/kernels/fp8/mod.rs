//! fp8 training on Hopper (issue 17): the casts, the cuBLASLt fp8 GEMM and the scale update
//! behind `ferrotron_ops`' fp8 linear (`fp8/linear.rs` there holds the recipe and the
//! autodiff node; `fp8/scaling.rs` the arithmetic every kernel here is checked against).
//!
//! fp8 tensors are `U8` tensors of the engine (the bytes cuBLASLt reads), their format known
//! to the caller: no new element type reaches the generic kernels. Scales and amaxes stay on
//! the device: a cast reads its scale from a layer's state row (delayed scaling) or from an
//! amax pass over the tensor (current scaling), writes the inverse scale the GEMM reads, and
//! maxes the amax into the state with an atomic; nothing is read back to the host.
//!
//! A GPU below compute capability 9.0 is refused before a run starts ([`supported`]), as the
//! CPU backend is (`FusedOps::fp8_support`).

mod sources;

use ferrotron_ops::fp8::scaling::{AmaxAlgo, Fp8Format, Fp8Role, Fp8Scaling, Fp8Settings};

use crate::engine::device::CudaDevice;
use crate::engine::dtype::DType;
use crate::engine::launch::{Params, grid_for, launch};
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};
use crate::kernels::prim::elementwise::zeros;
pub use sources::CastSource;
use sources::{Amax, CastTranspose, ROW_TILES, ScaleUpdate, THREADS, TILE};

/// A tensor cast to fp8: `[rows, cols]` bytes, optionally the `[cols, rows]` transpose, the
/// `[1]` f32 inverse scale of both.
#[derive(Debug, Clone)]
pub struct Cast {
    pub data: CudaTensor,
    pub transposed: Option<CudaTensor>,
    pub scale_inv: CudaTensor,
}

/// Where a cast's scale comes from.
#[derive(Debug, Clone, Copy)]
pub enum ScaleFrom<'a> {
    /// Delayed scaling: the scale at f32 index `scale` of `state`; when recording, the amax is
    /// maxed into index `amax`.
    Delayed {
        state: &'a CudaTensor,
        scale: usize,
        amax: Option<usize>,
    },
    /// Current scaling: `scaled_max / amax(x)`, the amax measured by a pass before the cast;
    /// with `record`, the amax is also maxed into f32 index `.1` of the state `.0` (delayed
    /// scaling's first scales, `Fp8State::measures_first_scales`).
    Current {
        scaled_max: f32,
        record: Option<(&'a CudaTensor, usize)>,
    },
}

/// Whether `device` has fp8 tensor cores (compute capability 9.0, Hopper, or newer).
pub fn supported(device: &CudaDevice) -> Result<(), String> {
    let arch = device.arch();
    let capability: u32 = arch
        .trim_start_matches("sm_")
        .trim_end_matches(char::is_alphabetic)
        .parse()
        .map_err(|_| format!("unknown GPU architecture {arch}"))?;
    if capability < 90 {
        let name = device.name().unwrap_or_else(|_| "the GPU".into());
        return Err(format!(
            "GPU {} ({name}) has compute capability {}.{}; fp8 training needs 9.0 (Hopper) or \
             newer: use precision.fp8: none",
            device.ordinal(),
            capability / 10,
            capability % 10
        ));
    }
    Ok(())
}

/// `x` as a contiguous, 16-byte aligned `[rows, cols]` tensor the cast kernels can read with
/// vector loads.
fn readable(x: &CudaTensor, ctx: &dyn Fn() -> OpContext) -> Result<CudaTensor> {
    let [rows, cols] = *x.shape() else {
        return Err(CudaError::invalid(ctx(), "fp8 casts take 2-D tensors"));
    };
    if !rows.is_multiple_of(8) || !cols.is_multiple_of(8) {
        return Err(CudaError::unsupported(
            ctx(),
            format!("fp8 casts need both dimensions divisible by 8, not {rows} × {cols}"),
        ));
    }
    operand(x, ctx)
}

/// An extra operand of a cast (a norm's statistics and γ/β, RoPE's tables), of any shape:
/// float, contiguous and 16-byte aligned (a copy otherwise).
fn operand(x: &CudaTensor, ctx: &dyn Fn() -> OpContext) -> Result<CudaTensor> {
    if !x.dtype().is_float() {
        return Err(CudaError::unsupported(
            ctx(),
            "fp8 casts read float tensors",
        ));
    }
    if x.is_contiguous() && x.data_ptr().is_multiple_of(16) {
        Ok(x.clone())
    } else {
        crate::kernels::prim::elementwise::copy(x)
    }
}

/// `x [rows, cols]` cast to `format` (and transposed when `transpose`) in one pass.
pub fn cast_transpose(
    x: &CudaTensor,
    format: Fp8Format,
    transpose: bool,
    from: ScaleFrom<'_>,
) -> Result<Cast> {
    let input = CastInput {
        x,
        aux: None,
        extra: CastExtra::None,
        source: CastSource::Plain,
    };
    Ok(cast_source(input, format, transpose, from, false)?.0)
}

/// What [`cast_source`] reads: `x`, `aux` for an activation's gradient, and what a norm's
/// output, RoPE's backward or a dropout's gradient needs besides (see [`CastSource`]).
#[derive(Debug, Clone, Copy)]
pub struct CastInput<'a> {
    pub x: &'a CudaTensor,
    pub aux: Option<&'a CudaTensor>,
    pub extra: CastExtra<'a>,
    pub source: CastSource,
}

/// The operands a [`CastSource`] that computes its values from more than `x` and `aux` reads.
#[derive(Debug, Clone, Copy)]
pub enum CastExtra<'a> {
    None,
    Norm(CastNorm<'a>),
    Rope(CastRope<'a>),
    Dropout(CastDropout),
}

/// The dropout a [`CastSource::DropoutGrad`] cast regenerates: the forward's (seed, counter
/// offset) and its probability.
#[derive(Debug, Clone, Copy)]
pub struct CastDropout {
    pub rng: [u64; 2],
    pub prob: f64,
}

/// The rotary tables a [`CastSource::RopeGrad`] cast reads: `cos`, `sin` `[seq, head_dim]` in
/// x's dtype for the rows' positions (rows are `[batch, seq]`).
#[derive(Debug, Clone, Copy)]
pub struct CastRope<'a> {
    pub cos: &'a CudaTensor,
    pub sin: &'a CudaTensor,
}

/// The norm a [`CastSource::Norm`] cast applies: the row statistics (`[rows, 1]` f32, no mean
/// for RMSNorm) and γ, β (`[cols]`, x's dtype).
#[derive(Debug, Clone, Copy)]
pub struct CastNorm<'a> {
    pub mean: Option<&'a CudaTensor>,
    pub rstd: &'a CudaTensor,
    pub gamma: &'a CudaTensor,
    pub beta: Option<&'a CudaTensor>,
}

impl CastInput<'_> {
    /// The `[rows, cols]` the cast writes.
    fn output_shape(&self, ctx: &dyn Fn() -> OpContext) -> Result<[usize; 2]> {
        let [rows, cols] = *self.x.shape() else {
            return Err(CudaError::invalid(ctx(), "fp8 casts take 2-D tensors"));
        };
        let shape = match self.source {
            CastSource::Plain
            | CastSource::Gelu
            | CastSource::GeluGrad
            | CastSource::Norm { .. }
            | CastSource::RopeGrad { .. }
            | CastSource::DropoutGrad => [rows, cols],
            CastSource::Swiglu => [rows, cols / 2],
            CastSource::SwigluGrad => [rows, 2 * cols],
        };
        let needs_aux = matches!(self.source, CastSource::GeluGrad | CastSource::SwigluGrad);
        match self.aux {
            Some(aux) if needs_aux => {
                if aux.shape() != shape || aux.dtype() != self.x.dtype() {
                    return Err(CudaError::invalid(
                        ctx(),
                        format!(
                            "the pre-activation {:?} {} does not match the gradient's {shape:?} {}",
                            aux.shape(),
                            aux.dtype(),
                            self.x.dtype()
                        ),
                    ));
                }
            }
            None if !needs_aux => {}
            _ => {
                return Err(CudaError::invalid(
                    ctx(),
                    "an activation's gradient needs its pre-activation, nothing else does",
                ));
            }
        }
        self.check_extra([rows, cols], ctx)?;
        if !shape[1].is_multiple_of(8) {
            return Err(CudaError::unsupported(
                ctx(),
                format!("fp8 casts need columns divisible by 8, not {}", shape[1]),
            ));
        }
        Ok(shape)
    }

    /// That `extra` is what the source reads, and of the right shapes and dtypes.
    fn check_extra(&self, [rows, cols]: [usize; 2], ctx: &dyn Fn() -> OpContext) -> Result<()> {
        let x = self.x.dtype();
        let (fits, needs) = match (self.source, self.extra) {
            (CastSource::Norm { rms, beta }, CastExtra::Norm(norm)) => {
                let row_stat = |t: &CudaTensor| t.shape() == [rows, 1] && t.dtype() == DType::F32;
                let param = |t: &CudaTensor| t.shape() == [cols] && t.dtype() == x;
                let fits = row_stat(norm.rstd)
                    && norm.mean.is_none_or(row_stat)
                    && norm.mean.is_some() != rms
                    && param(norm.gamma)
                    && norm.beta.is_none_or(param)
                    && norm.beta.is_some() == beta;
                (
                    fits,
                    "the norm's statistics [rows, 1] f32 and γ, β [cols] in x's dtype".to_string(),
                )
            }
            (CastSource::RopeGrad { slots, head_dim }, CastExtra::Rope(rope)) => {
                let fits = match *rope.cos.shape() {
                    [seq, dim] => {
                        dim == head_dim
                            && head_dim.is_multiple_of(16)
                            && slots >= 3
                            && seq > 0
                            && rows.is_multiple_of(seq)
                            && cols.is_multiple_of(slots * head_dim)
                    }
                    _ => false,
                } && rope.sin.shape() == rope.cos.shape()
                    && rope.cos.dtype() == x
                    && rope.sin.dtype() == x;
                (
                    fits,
                    format!(
                        "rotary tables [seq, {head_dim}] in x's dtype, rows a multiple of seq, \
                         columns whole groups of {slots} heads, head_dim a multiple of 16"
                    ),
                )
            }
            (CastSource::DropoutGrad, CastExtra::Dropout(d)) => (
                (0.0..1.0).contains(&d.prob),
                "a dropout probability in [0, 1)".to_string(),
            ),
            (
                CastSource::Norm { .. } | CastSource::RopeGrad { .. } | CastSource::DropoutGrad,
                _,
            )
            | (_, CastExtra::Norm(_) | CastExtra::Rope(_) | CastExtra::Dropout(_)) => (
                false,
                format!("the operands {:?} reads, and only those", self.source),
            ),
            (_, CastExtra::None) => (true, String::new()),
        };
        if fits {
            Ok(())
        } else {
            Err(CudaError::invalid(ctx(), needs))
        }
    }

    /// The extra operands' words of the kernel's parameters, in its struct's order, and the
    /// (readable copies of the) tensors they point into, to keep alive until the launch.
    fn extra_params(
        &self,
        params: &mut Params,
        ctx: &dyn Fn() -> OpContext,
    ) -> Result<Vec<CudaTensor>> {
        let mut keep = Vec::new();
        let mut ptr = |params: &mut Params, t: Option<&CudaTensor>| -> Result<()> {
            match t {
                Some(t) => {
                    let t = operand(t, ctx)?;
                    params.ptr(t.data_ptr());
                    keep.push(t);
                }
                None => {
                    params.ptr(0);
                }
            }
            Ok(())
        };
        match self.extra {
            CastExtra::None => {}
            CastExtra::Norm(n) => {
                for t in [n.mean, Some(n.rstd), Some(n.gamma), n.beta] {
                    ptr(params, t)?;
                }
            }
            CastExtra::Rope(r) => {
                ptr(params, Some(r.cos))?;
                ptr(params, Some(r.sin))?;
                params.int(r.cos.shape()[0] as i64);
            }
            CastExtra::Dropout(d) => {
                params
                    .int(d.rng[0] as i64)
                    .int(d.rng[1] as i64)
                    .float(1.0 - d.prob)
                    .float(1.0 / (1.0 - d.prob));
            }
        }
        Ok(keep)
    }
}

/// A tensor computed from `input` (itself, an activation or an activation's gradient) cast
/// to `format` and transposed in one pass, and with `dbias` its column sums (a bias gradient,
/// in the input's dtype) from the same reads.
pub fn cast_source(
    input: CastInput<'_>,
    format: Fp8Format,
    transpose: bool,
    from: ScaleFrom<'_>,
    dbias: bool,
) -> Result<(Cast, Option<CudaTensor>)> {
    let ctx = || {
        OpContext::new(format!("fp8 cast to {}", format.name()))
            .shape(input.x.shape())
            .dtype(input.x.dtype())
    };
    let [rows, cols] = input.output_shape(&ctx)?;
    if input.source != CastSource::Plain && matches!(from, ScaleFrom::Current { .. }) {
        return Err(CudaError::unsupported(
            ctx(),
            "current scaling measures the amax of the tensor itself: cast a materialised activation",
        ));
    }
    let x = readable(input.x, &ctx)?;
    let aux = input.aux.map(|a| readable(a, &ctx)).transpose()?;
    let device = x.device().clone();
    let data = CudaTensor::empty(&device, &[rows, cols], DType::U8)?;
    let transposed = transpose
        .then(|| CudaTensor::empty(&device, &[cols, rows], DType::U8))
        .transpose()?;
    let scale_inv = CudaTensor::empty(&device, &[1], DType::F32)?;
    if rows * cols == 0 {
        return Err(CudaError::invalid(
            ctx(),
            "an empty tensor has no fp8 scale",
        ));
    }
    let f32_at = |t: &CudaTensor, index: usize| t.data_ptr() + 4 * index as u64;
    let state_f32 = |state: &CudaTensor| {
        if state.dtype() != DType::F32 || !state.is_contiguous() {
            return Err(CudaError::invalid(ctx(), "the fp8 state is contiguous f32"));
        }
        Ok(())
    };
    let (scale, amax_src, amax_dst, scaled_max, measured) = match from {
        ScaleFrom::Delayed { state, scale, amax } => {
            state_f32(state)?;
            let amax_dst = amax.map_or(0, |i| f32_at(state, i));
            (f32_at(state, scale), 0, amax_dst, 0.0, None)
        }
        ScaleFrom::Current { scaled_max, record } => {
            let amax_dst = match record {
                Some((state, i)) => {
                    state_f32(state)?;
                    f32_at(state, i)
                }
                None => 0,
            };
            let measured = zeros(&device, &[1], DType::F32)?;
            amax_into(&x, &measured)?;
            (0, measured.data_ptr(), amax_dst, scaled_max, Some(measured))
        }
    };
    let spec = CastTranspose {
        input: x.dtype(),
        format,
        transpose,
        current: measured.is_some(),
        source: input.source,
        dbias,
    };
    let bands = rows.div_ceil(TILE * ROW_TILES);
    let blocks = bands * cols.div_ceil(TILE);
    let grid =
        u32::try_from(blocks).map_err(|_| CudaError::unsupported(ctx(), "more than 2^32 tiles"))?;
    let partial = dbias
        .then(|| CudaTensor::empty(&device, &[bands, cols], DType::F32))
        .transpose()?;
    let mut params = Params::new();
    params
        .int(rows as i64)
        .int(cols as i64)
        .ptr(x.data_ptr())
        .ptr(data.data_ptr())
        .ptr(transposed.as_ref().map_or(0, CudaTensor::data_ptr))
        .ptr(scale)
        .ptr(amax_src)
        .ptr(amax_dst)
        .ptr(scale_inv.data_ptr())
        .float(f64::from(scaled_max))
        .ptr(aux.as_ref().map_or(0, CudaTensor::data_ptr))
        .ptr(partial.as_ref().map_or(0, CudaTensor::data_ptr));
    let extra = input.extra_params(&mut params, &ctx)?;
    launch(&device, &spec, grid, THREADS, &params, &ctx)?;
    // `measured` (the amax the kernel read) and the extra operands' copies are freed
    // stream-ordered, after the kernel.
    drop((measured, extra));
    let bias = partial
        .map(|partial| crate::kernels::prim::column_sum::column_sum(&partial, x.dtype(), &ctx))
        .transpose()?;
    let cast = Cast {
        data,
        transposed,
        scale_inv,
    };
    Ok((cast, bias))
}

/// `max |x|` of a readable `x` maxed into the f32 `dst` (one element).
fn amax_into(x: &CudaTensor, dst: &CudaTensor) -> Result<()> {
    let ctx = || OpContext::new("fp8 amax").shape(x.shape()).dtype(x.dtype());
    let chunks = (x.numel() / 8) as u64;
    let mut params = Params::new();
    params
        .int(chunks as i64)
        .ptr(x.data_ptr())
        .ptr(dst.data_ptr());
    let spec = Amax { input: x.dtype() };
    launch(
        x.device(),
        &spec,
        grid_for(chunks, THREADS),
        THREADS,
        &params,
        &ctx,
    )
}

/// `max |x|` of a 2-D float tensor (rows and columns multiples of 8) as a `[1]` f32 tensor.
pub fn amax(x: &CudaTensor) -> Result<CudaTensor> {
    let ctx = || OpContext::new("fp8 amax").shape(x.shape()).dtype(x.dtype());
    let x = readable(x, &ctx)?;
    let out = zeros(x.device(), &[1], DType::F32)?;
    amax_into(&x, &out)?;
    Ok(out)
}

/// The step-end update of a delayed-scaling state `[layers, row_width]` in place, one launch.
pub fn update_scaling(state: &CudaTensor, settings: &Fp8Settings) -> Result<()> {
    let Fp8Scaling::Delayed { history, algo } = settings.scaling else {
        return Ok(());
    };
    let ctx = || OpContext::new("fp8 scale update").shape(state.shape());
    let width = settings.row_width();
    if state.dtype() != DType::F32
        || !state.is_contiguous()
        || state.rank() != 2
        || state.shape()[1] != width
    {
        return Err(CudaError::invalid(
            ctx(),
            format!("the fp8 state is contiguous f32 [layers, {width}]"),
        ));
    }
    let blocks = (state.shape()[0] * Fp8Role::ALL.len()) as u64;
    let mut params = Params::new();
    params
        .int(blocks as i64)
        .int(history.max(1) as i64)
        .int(i64::from(algo == AmaxAlgo::Max))
        .ptr(state.data_ptr());
    for role in Fp8Role::ALL {
        params.float(f64::from(settings.scaled_max(role)));
    }
    let spec = ScaleUpdate;
    launch(
        state.device(),
        &spec,
        grid_for(blocks, THREADS),
        THREADS,
        &params,
        &ctx,
    )
}
