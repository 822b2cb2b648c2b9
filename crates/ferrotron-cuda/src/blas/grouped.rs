//! Grouped matmul (the MoE experts' projections) through cuBLAS's
//! `cublasGemmGroupedBatchedEx`: one call runs every expert's GEMM, each with its own row
//! count, forward and for both gradients. The per-expert row counts are host numbers the
//! routing already has, so nothing is read back; the three pointer arrays travel to the device
//! as one small upload per call.
//!
//! cuBLASLt (`gemm.rs`) has no grouped call, but it runs one expert's GEMM at the dense rate
//! once the expert's output fills the chip, where the grouped call ran the forward at 0.43 of
//! its gradients' rate and, inside a training step, the gradients at 0.4 of their isolated rate
//! (H100, 2026-12-07). So experts that large run one cuBLASLt GEMM each, planned once per bucket
//! of row counts (a new count costs two layouts, not a heuristic query), and small ones (many
//! fine-grained experts) keep the grouped call. Row-major operands are handed over as their
//! column-major transposes, as in `gemm.rs`: `C = A·B` is computed as `Cᵀ = Bᵀ·Aᵀ`.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::sys;

use crate::engine::device::CudaDevice;
use crate::engine::dtype::DType;
pub use crate::engine::experts::Weights;
use crate::engine::experts::expert_matrix;
use crate::engine::layout::SliceArg;
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};

/// One cuBLAS handle per device, bound to the device's compute stream.
struct Handle(sys::cublasHandle_t);

// SAFETY: a handle is used only under `HANDLES`' mutex, by one thread at a time.
unsafe impl Send for Handle {}

static HANDLES: OnceLock<Mutex<HashMap<usize, Handle>>> = OnceLock::new();

/// One column-major GEMM `C = op(A)·op(B)` (`m × n`, inner `k`) of a grouped call.
#[derive(Debug, Clone, Copy)]
struct Problem {
    trans_a: bool,
    trans_b: bool,
    m: usize,
    n: usize,
    k: usize,
    a: u64,
    lda: usize,
    b: u64,
    ldb: usize,
    c: u64,
    ldc: usize,
}

fn data_type(dtype: DType) -> Option<sys::cudaDataType_t> {
    match dtype {
        DType::F32 => Some(sys::cudaDataType_t::CUDA_R_32F),
        DType::F16 => Some(sys::cudaDataType_t::CUDA_R_16F),
        DType::BF16 => Some(sys::cudaDataType_t::CUDA_R_16BF),
        _ => None,
    }
}

/// Whether the grouped matmul runs for these dtypes (one float type for both operands) and
/// the recipe's `runtime.grouped_gemm` leaves it on (off gives the per-expert GEMMs back, to
/// compare).
pub fn supports(x: DType, weight: DType) -> bool {
    crate::switches::paths().grouped_gemm && x == weight && data_type(x).is_some()
}

/// Checks `x [rows, k]` and the weights (`[groups, k, n]`) against the group sizes: `(k, n)`.
fn dims(x: &CudaTensor, weights: Weights<'_>, group_rows: &[usize]) -> Result<(usize, usize)> {
    let ctx = || {
        let ctx = OpContext::new("grouped_matmul").shape(x.shape());
        match weights {
            Weights::Stacked(weight) => ctx.shape(weight.shape()),
            Weights::Parts(parts) => parts.iter().fold(ctx, |ctx, p| ctx.shape(p.shape())),
        }
        .dtype(x.dtype())
    };
    if !weights
        .dtype()
        .is_some_and(|dtype| supports(x.dtype(), dtype))
    {
        return Err(CudaError::unsupported(
            ctx(),
            "one float dtype (f32, f16, bf16) for x and weight",
        ));
    }
    let ([rows, k], Some((groups, k2, n))) = (x.shape(), weights.dims()) else {
        return Err(CudaError::invalid(
            ctx(),
            "x must be [rows, k], the weights [groups, k, n] or `groups` parts [k, n]",
        ));
    };
    if *k != k2 || groups != group_rows.len() || *rows != group_rows.iter().sum::<usize>() {
        return Err(CudaError::invalid(
            ctx(),
            format!("shapes do not match the groups {group_rows:?}"),
        ));
    }
    Ok((*k, n))
}

/// Output tiles of 128 × 128 an expert's GEMM must hold per multiprocessor to fill the GPU on
/// its own: below a wave, the grouped call's one launch keeps the GPU busier than one GEMM per
/// expert (H100, 2026-12-07: per expert 1.566 ms against 1.528 at Qwen3-30B-A3B's 128 experts
/// of ~1,024 rows × 768, 0.4 to 0.6 of the grouped call's time at 2,048 rows and more).
const TILE: usize = 128 * 128;

/// Whether the forward runs as one GEMM per expert: the recipe's switch is on and the mean
/// non-empty expert's output (`rows × n`) covers every multiprocessor with a 128 × 128 tile.
fn per_expert(device: &CudaDevice, n: usize, group_rows: &[usize]) -> bool {
    let busy = group_rows.iter().filter(|&&rows| rows > 0).count();
    busy > 0 && per_expert_at(device, n, group_rows.iter().sum::<usize>() / busy)
}

/// [`per_expert`] before the counts are known, from the mean expert's `rows / groups` rows:
/// the device-count kernel takes the experts this rule leaves to the grouped call, so the
/// choice needs no host read (`backend/fused_ops`).
pub(crate) fn per_expert_expected(
    device: &CudaDevice,
    n: usize,
    rows: usize,
    groups: usize,
) -> bool {
    groups > 0 && per_expert_at(device, n, rows / groups)
}

/// The recipe's switch is on and an expert of `rows` rows fills the GPU with `n` columns.
fn per_expert_at(device: &CudaDevice, n: usize, rows: usize) -> bool {
    crate::switches::paths().grouped_gemm_per_expert && rows * n >= device.multiprocessors() * TILE
}

/// Row block `g` of `x [rows, k]` (`group_rows[g]` rows) times expert `g`'s `[k, n]` weight →
/// `[rows, n]`; through [`matmul_per_expert`] where each expert fills the GPU (`per_expert`).
pub fn grouped_matmul(
    x: &CudaTensor,
    weights: Weights<'_>,
    group_rows: &[usize],
) -> Result<CudaTensor> {
    match weights.dims() {
        Some((_, _, n)) if per_expert(x.device(), n, group_rows) => {
            matmul_per_expert(x, weights, group_rows)
        }
        _ => matmul_grouped_call(x, weights, group_rows),
    }
}

/// A forward's operands made contiguous, its output allocated, and `(k, n)`.
struct Forward {
    x: CudaTensor,
    weights: Vec<CudaTensor>,
    out: CudaTensor,
    k: usize,
    n: usize,
}

impl Forward {
    /// The operands, or the finished output where the inner dimension is empty (zeros).
    fn new(
        x: &CudaTensor,
        weights: Weights<'_>,
        group_rows: &[usize],
    ) -> Result<std::result::Result<Self, CudaTensor>> {
        let (k, n) = dims(x, weights, group_rows)?;
        let shape = [x.shape()[0], n];
        if k == 0 {
            let zeros = crate::kernels::prim::elementwise::zeros(x.device(), &shape, x.dtype())?;
            return Ok(Err(zeros));
        }
        Ok(Ok(Forward {
            x: x.contiguous()?,
            weights: weights.matrices()?,
            out: CudaTensor::empty(x.device(), &shape, x.dtype())?,
            k,
            n,
        }))
    }
}

/// Rows `row..row + len` of a row-major `[rows, width]` tensor (a view).
fn rows_block(t: &CudaTensor, row: usize, len: usize) -> Result<CudaTensor> {
    t.slice(&[
        SliceArg::range(row, row + len),
        SliceArg::full(t.shape()[1]),
    ])
}

/// [`grouped_matmul`] as cuBLAS's one grouped call, whatever the shapes.
pub fn matmul_grouped_call(
    x: &CudaTensor,
    weights: Weights<'_>,
    group_rows: &[usize],
) -> Result<CudaTensor> {
    let Forward {
        x,
        weights,
        out,
        k,
        n,
    } = match Forward::new(x, weights, group_rows)? {
        Ok(forward) => forward,
        Err(zeros) => return Ok(zeros),
    };
    let device = x.device().clone();
    let size = x.dtype().size_in_bytes() as u64;
    let mut problems = Vec::new();
    let mut row = 0;
    for (group, &rows) in group_rows.iter().enumerate() {
        if rows > 0 && n > 0 {
            // outᵀ (n × rows) = weight[g]ᵀ (n × k, as stored) · x_gᵀ (k × rows, as stored).
            problems.push(Problem {
                trans_a: false,
                trans_b: false,
                m: n,
                n: rows,
                k,
                a: weights[group].data_ptr(),
                lda: n,
                b: x.data_ptr() + (row * k) as u64 * size,
                ldb: k,
                c: out.data_ptr() + (row * n) as u64 * size,
                ldc: n,
            });
        }
        row += rows;
    }
    run(&device, x.dtype(), &problems)?;
    Ok(out)
}

/// [`grouped_matmul`] as one cuBLASLt GEMM per expert, each writing its rows of the output
/// (`gemm::matmul_rows_into`: planned once per bucket of row counts). cuBLAS's grouped call runs
/// this product at 257–313 TFLOP/s on an H100 whatever the operand order, while one dense
/// cuBLASLt GEMM of all the rows ran at 2.3× that (tools/README.md): experts of a few thousand
/// rows each fill the GPU on their own.
pub fn matmul_per_expert(
    x: &CudaTensor,
    weights: Weights<'_>,
    group_rows: &[usize],
) -> Result<CudaTensor> {
    let f = match Forward::new(x, weights, group_rows)? {
        Ok(forward) => forward,
        Err(zeros) => return Ok(zeros),
    };
    let mut row = 0;
    for (group, &len) in group_rows.iter().enumerate() {
        if len > 0 {
            crate::blas::gemm::matmul_rows_into(
                &rows_block(&f.x, row, len)?,
                &f.weights[group],
                &rows_block(&f.out, row, len)?,
            )?;
        }
        row += len;
    }
    Ok(f.out)
}

/// The gradients `(dx [rows, k], dweight [groups, k, n])` of [`grouped_matmul`] from the output
/// gradient `[rows, n]` (cast to `x`'s dtype); an empty group's weight gradient is zero. Per
/// expert where the forward is (`per_expert`), else cuBLAS's one grouped call.
pub fn grouped_matmul_backward(
    x: &CudaTensor,
    weights: Weights<'_>,
    grad_output: &CudaTensor,
    group_rows: &[usize],
) -> Result<(CudaTensor, CudaTensor)> {
    match weights.dims() {
        Some((_, _, n)) if per_expert(x.device(), n, group_rows) => {
            backward_per_expert(x, weights, grad_output, group_rows)
        }
        _ => backward_grouped_call(x, weights, grad_output, group_rows),
    }
}

/// A backward's operands, contiguous and of `x`'s dtype, and its outputs, allocated: `dweight`
/// zeroed where a group is empty (its gradient is zero and no GEMM writes it).
struct Backward {
    x: CudaTensor,
    weights: Vec<CudaTensor>,
    grad: CudaTensor,
    dx: CudaTensor,
    dweight: CudaTensor,
    k: usize,
    n: usize,
}

impl Backward {
    fn new(
        x: &CudaTensor,
        weights: Weights<'_>,
        grad_output: &CudaTensor,
        group_rows: &[usize],
    ) -> Result<Self> {
        let (k, n) = dims(x, weights, group_rows)?;
        let rows = x.shape()[0];
        if grad_output.shape() != [rows, n] {
            return Err(CudaError::invalid(
                OpContext::new("grouped_matmul_backward").shape(grad_output.shape()),
                format!("the output gradient must be [{rows}, {n}]"),
            ));
        }
        let dtype = x.dtype();
        let grad = if grad_output.dtype() == dtype {
            grad_output.contiguous()?
        } else {
            grad_output.cast(dtype)?.contiguous()?
        };
        let device = x.device().clone();
        let zeros =
            |shape: &[usize]| crate::kernels::prim::elementwise::zeros(&device, shape, dtype);
        let groups = group_rows.len();
        let dweight = if group_rows.contains(&0) || k == 0 || n == 0 {
            zeros(&[groups, k, n])?
        } else {
            CudaTensor::empty(&device, &[groups, k, n], dtype)?
        };
        let dx = if k == 0 || n == 0 || rows == 0 {
            zeros(&[rows, k])?
        } else {
            CudaTensor::empty(&device, &[rows, k], dtype)?
        };
        Ok(Backward {
            x: x.contiguous()?,
            weights: weights.matrices()?,
            grad,
            dx,
            dweight,
            k,
            n,
        })
    }

    /// Whether no GEMM is left to run (the outputs are already their zeros).
    fn empty(&self) -> bool {
        self.k == 0 || self.n == 0 || self.x.shape()[0] == 0
    }
}

/// [`grouped_matmul_backward`] as one cuBLASLt GEMM per expert for each gradient: `dx_g = dy_g ·
/// weight[g]ᵀ` planned per bucket of row counts, `dweight[g] = x_gᵀ · dy_g` per bucket of
/// inner counts (`gemm::matmul_inner_into`).
pub fn backward_per_expert(
    x: &CudaTensor,
    weights: Weights<'_>,
    grad_output: &CudaTensor,
    group_rows: &[usize],
) -> Result<(CudaTensor, CudaTensor)> {
    let b = Backward::new(x, weights, grad_output, group_rows)?;
    if b.empty() {
        return Ok((b.dx, b.dweight));
    }
    let mut row = 0;
    for (group, &len) in group_rows.iter().enumerate() {
        if len > 0 {
            let dy = rows_block(&b.grad, row, len)?;
            let w_t = b.weights[group].permute(&[1, 0])?;
            crate::blas::gemm::matmul_rows_into(&dy, &w_t, &rows_block(&b.dx, row, len)?)?;
            let x_t = rows_block(&b.x, row, len)?.permute(&[1, 0])?;
            crate::blas::gemm::matmul_inner_into(&x_t, &dy, &expert_matrix(&b.dweight, group)?)?;
        }
        row += len;
    }
    Ok((b.dx, b.dweight))
}

/// [`grouped_matmul_backward`] as cuBLAS's one grouped call for both gradients.
pub fn backward_grouped_call(
    x: &CudaTensor,
    weights: Weights<'_>,
    grad_output: &CudaTensor,
    group_rows: &[usize],
) -> Result<(CudaTensor, CudaTensor)> {
    let b = Backward::new(x, weights, grad_output, group_rows)?;
    if b.empty() {
        return Ok((b.dx, b.dweight));
    }
    let Backward {
        x,
        weights,
        grad,
        dx,
        dweight,
        k,
        n,
    } = b;
    let (device, dtype) = (x.device().clone(), x.dtype());
    let size = dtype.size_in_bytes() as u64;
    let mut problems = Vec::new();
    let mut row = 0;
    for (group, &len) in group_rows.iter().enumerate() {
        if len > 0 {
            let w = weights[group].data_ptr();
            let g = grad.data_ptr() + (row * n) as u64 * size;
            let xg = x.data_ptr() + (row * k) as u64 * size;
            // dx_gᵀ (k × len) = weight[g] (k × n: the stored n × k transposed) · grad_gᵀ.
            problems.push(Problem {
                trans_a: true,
                trans_b: false,
                m: k,
                n: len,
                k: n,
                a: w,
                lda: n,
                b: g,
                ldb: n,
                c: dx.data_ptr() + (row * k) as u64 * size,
                ldc: k,
            });
            // dweight[g]ᵀ (n × k) = grad_gᵀ (n × len, as stored) · x_g (len × k: transposed).
            problems.push(Problem {
                trans_a: false,
                trans_b: true,
                m: n,
                n: k,
                k: len,
                a: g,
                lda: n,
                b: xg,
                ldb: k,
                c: dweight.data_ptr() + (group * k * n) as u64 * size,
                ldc: n,
            });
        }
        row += len;
    }
    run(&device, dtype, &problems)?;
    Ok((dx, dweight))
}

fn status(ctx: impl Fn() -> OpContext, status: sys::cublasStatus_t) -> Result<()> {
    if status == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Blas {
            context: ctx(),
            code: format!("{status:?}"),
        })
    }
}

fn int(value: usize, ctx: impl Fn() -> OpContext) -> Result<c_int> {
    c_int::try_from(value).map_err(|_| CudaError::unsupported(ctx(), "a dimension over 2^31"))
}

/// Queues `problems` as one `cublasGemmGroupedBatchedEx` (one problem per group) on the
/// device's stream.
fn run(device: &Arc<CudaDevice>, dtype: DType, problems: &[Problem]) -> Result<()> {
    let ctx = || OpContext::new("grouped_matmul(cublas)").dtype(dtype);
    if problems.is_empty() {
        return Ok(());
    }
    let Some(data_type) = data_type(dtype) else {
        return Err(CudaError::unsupported(ctx(), "f32, f16 or bf16"));
    };
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen cuBLAS by its usual names.
    if !*PRESENT.get_or_init(|| unsafe { sys::is_culib_present() }) {
        return Err(CudaError::LibraryMissing {
            library: "cuBLAS (libcublas)",
            hint: "add the CUDA toolkit's lib64 to LD_LIBRARY_PATH",
        });
    }
    let compute = if dtype == DType::F32 && device.tf32() {
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
    } else {
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
    };
    let op = |t: bool| {
        if t {
            sys::cublasOperation_t::CUBLAS_OP_T
        } else {
            sys::cublasOperation_t::CUBLAS_OP_N
        }
    };
    let count = problems.len();
    let trans_a: Vec<_> = problems.iter().map(|p| op(p.trans_a)).collect();
    let trans_b: Vec<_> = problems.iter().map(|p| op(p.trans_b)).collect();
    let collect = |f: fn(&Problem) -> usize| -> Result<Vec<c_int>> {
        problems.iter().map(|p| int(f(p), ctx)).collect()
    };
    let (m, n, k) = (collect(|p| p.m)?, collect(|p| p.n)?, collect(|p| p.k)?);
    let (lda, ldb, ldc) = (
        collect(|p| p.lda)?,
        collect(|p| p.ldb)?,
        collect(|p| p.ldc)?,
    );
    let alpha = vec![1.0f32; count];
    let beta = vec![0.0f32; count];
    let group_size = vec![1 as c_int; count];
    let group_count = int(count, ctx)?;
    // The pointer arrays live on the device: A's, then B's, then C's.
    let pointers: Vec<u8> = problems
        .iter()
        .map(|p| p.a)
        .chain(problems.iter().map(|p| p.b))
        .chain(problems.iter().map(|p| p.c))
        .flat_map(u64::to_le_bytes)
        .collect();
    let table = CudaTensor::from_bytes(device, &pointers, &[3 * count], DType::I64)?;
    let base = table.data_ptr();
    let array = |i: usize| base + (i * count * 8) as u64;

    device.bind()?;
    let mut handles = HANDLES
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let handle = match handles.get(&device.ordinal()) {
        Some(handle) => handle.0,
        None => {
            let mut handle: sys::cublasHandle_t = std::ptr::null_mut();
            // SAFETY: creates a handle in the device's context, bound above.
            status(ctx, unsafe { sys::cublasCreate_v2(&mut handle) })?;
            // SAFETY: the handle was just created; the stream is the device's live stream.
            status(ctx, unsafe {
                sys::cublasSetStream_v2(handle, device.cu_stream() as sys::cudaStream_t)
            })?;
            handles.insert(device.ordinal(), Handle(handle));
            handle
        }
    };
    let _timer = crate::engine::timing::scope(device, "grouped_matmul(cublas)");
    // SAFETY: every pointer addresses a live device buffer holding the `m × k`, `k × n` and
    // `m × n` column-major blocks its leading dimension describes (checked against the shapes
    // by the callers); the pointer arrays are a live device upload queued before the call on the
    // same stream (freed stream-ordered after it); the host arrays hold `count` entries and
    // alpha/beta are f32 (the compute type's scalar) in host pointer mode.
    status(ctx, unsafe {
        sys::cublasGemmGroupedBatchedEx(
            handle,
            trans_a.as_ptr(),
            trans_b.as_ptr(),
            m.as_ptr(),
            n.as_ptr(),
            k.as_ptr(),
            alpha.as_ptr().cast::<c_void>(),
            array(0) as *const *const c_void,
            data_type,
            lda.as_ptr(),
            array(1) as *const *const c_void,
            data_type,
            ldb.as_ptr(),
            beta.as_ptr().cast::<c_void>(),
            array(2) as *const *mut c_void,
            data_type,
            ldc.as_ptr(),
            group_count,
            group_size.as_ptr(),
            compute,
        )
    })?;
    drop(table);
    Ok(())
}
