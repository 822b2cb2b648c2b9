//! Matmul through cuBLASLt: batched, strided, broadcast batch dims, transposes read through
//! the layout instead of copied; f32 (TF32 only when the device flag allows), bf16 and f16
//! with f32 accumulation.
//!
//! cuBLASLt is column-major; a row-major `C = A·B` is computed as the column-major
//! `Cᵀ = Bᵀ·Aᵀ`, where a row-major operand *is* its column-major transpose and a transposed
//! view (unit row stride) is an `OP_T` operand. Only views that are neither (or whose batch
//! dims do not flatten to one stride) are copied first. The algorithm is chosen once per
//! problem (`tune.rs`: the heuristic's candidates timed, the choice remembered on disk)
//! and cached with the problem's descriptors, so steady-state calls do no search.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublaslt::{result, sys};

use crate::engine::alloc::DeviceBuffer;
use crate::engine::device::CudaDevice;
use crate::engine::dtype::DType;
use crate::engine::layout::broadcast_shapes;
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};

/// cuBLASLt workspace (NVIDIA recommends 32 MiB on Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;

/// How a matrix operand lies in memory, seen by cuBLASLt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MatrixOrder {
    /// Row-major in our terms (unit column stride).
    pub row_major: bool,
    /// Leading dimension in elements.
    pub ld: i64,
}

/// Whether a `rows × cols` matrix with these strides can be handed to cuBLASLt as is.
pub fn matrix_order(
    rows: usize,
    cols: usize,
    row_stride: isize,
    col_stride: isize,
) -> Option<MatrixOrder> {
    let (r, c) = (rows as isize, cols as isize);
    let row_ok = (col_stride == 1 || cols == 1) && (rows == 1 || row_stride >= c.max(1));
    if row_ok {
        let ld = if rows == 1 { c.max(1) } else { row_stride };
        return Some(MatrixOrder {
            row_major: true,
            ld: ld as i64,
        });
    }
    let col_ok = (row_stride == 1 || rows == 1) && (cols == 1 || col_stride >= r.max(1));
    if col_ok {
        let ld = if cols == 1 { r.max(1) } else { col_stride };
        return Some(MatrixOrder {
            row_major: false,
            ld: ld as i64,
        });
    }
    None
}

/// One stride that walks all batch dims in order, if there is one (0 for a pure broadcast).
pub fn batch_stride(shape: &[usize], strides: &[isize]) -> Option<i64> {
    let dims: Vec<(usize, isize)> = shape
        .iter()
        .copied()
        .zip(strides.iter().copied())
        .filter(|(s, _)| *s != 1)
        .collect();
    let Some(&(_, last)) = dims.last() else {
        return Some(0);
    };
    if dims.iter().all(|(_, st)| *st == 0) {
        return Some(0);
    }
    let mut expected = last;
    for &(size, stride) in dims.iter().rev() {
        if stride != expected || stride < 0 {
            return None;
        }
        expected = stride * size as isize;
    }
    Some(last as i64)
}

/// Largest power of two (≤ 256) dividing the address: what the heuristic may assume.
pub fn pointer_alignment(ptr: u64) -> u32 {
    if ptr == 0 {
        return 256;
    }
    (1u64 << ptr.trailing_zeros().min(8)) as u32
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ProblemKey {
    dtype: DType,
    tf32: bool,
    m: u64,
    n: u64,
    k: u64,
    batch: i32,
    a: (MatrixOrder, i64, u32),
    b: (MatrixOrder, i64, u32),
    d_align: u32,
    /// cuBLASLt bias epilogue (a vector over the output columns added in the GEMM).
    bias: bool,
    /// Planned for a bucket of counts of one dimension (the bucket's top in `m` or `k`,
    /// [`matmul_rows_into`], [`matmul_inner_into`]).
    bucketed: Option<Bucketed>,
}

impl ProblemKey {
    /// The op table's row: one per problem shape, so a slow GEMM shows up on its own
    /// (`matmul_bias(cublaslt) 24576x6144x2048 NN`: m × n × k, each operand row-major `N` or
    /// transposed `T`, a batch count where there is one).
    fn timing_name(&self) -> String {
        let op = if self.bias { "matmul_bias" } else { "matmul" };
        let order = |o: &MatrixOrder| if o.row_major { 'N' } else { 'T' };
        let batch = if self.batch > 1 {
            format!(" x{}", self.batch)
        } else {
            String::new()
        };
        let up_to = |dim| {
            if self.bucketed == Some(dim) {
                " (rows ≤)"
            } else {
                ""
            }
        };
        format!(
            "{op}(cublaslt) {}{}x{}x{}{} {}{}{batch}",
            self.m,
            up_to(Bucketed::Rows),
            self.n,
            self.k,
            up_to(Bucketed::Inner),
            order(&self.a.0),
            order(&self.b.0)
        )
    }
}

/// Descriptors, layouts and the heuristic's algorithm for one problem, made once and reused
/// (only the bias pointer is set per call).
struct GemmPlan {
    desc: Desc,
    first: Layout,
    second: Layout,
    d: Layout,
    algo: sys::cublasLtMatmulAlgo_t,
}

/// A cuBLASLt handle with its workspace and algorithm cache (one per device).
struct BlasHandle {
    handle: sys::cublasLtHandle_t,
    workspace: Arc<DeviceBuffer>,
    plans: HashMap<ProblemKey, GemmPlan>,
}

// SAFETY: the handle is used only under its device's mutex, by one thread at a time.
unsafe impl Send for BlasHandle {}

/// A device's cuBLASLt handle, created on its first GEMM.
type HandleSlot = Arc<Mutex<Option<BlasHandle>>>;

/// The handle slot of `device`: one per device, each under its own mutex so ranks on different
/// devices do not wait for each other's GEMM calls.
fn handle_slot(device: &CudaDevice) -> HandleSlot {
    static SLOTS: OnceLock<Mutex<HashMap<usize, HandleSlot>>> = OnceLock::new();
    SLOTS
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .entry(device.ordinal())
        .or_default()
        .clone()
}

impl Drop for BlasHandle {
    fn drop(&mut self) {
        // SAFETY: created by `create_handle`, destroyed once.
        if let Err(err) = unsafe { result::destroy_handle(self.handle) } {
            tracing::warn!(?err, "cublasLtDestroy failed");
        }
    }
}

fn cuda_type(dtype: DType) -> Option<sys::cudaDataType> {
    match dtype {
        DType::F32 => Some(sys::cudaDataType::CUDA_R_32F),
        DType::F16 => Some(sys::cudaDataType::CUDA_R_16F),
        DType::BF16 => Some(sys::cudaDataType::CUDA_R_16BF),
        _ => None,
    }
}

/// RAII for the per-call descriptors.
struct Layout(sys::cublasLtMatrixLayout_t);
impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: created by `create_matrix_layout`, destroyed once.
        let _ = unsafe { result::destroy_matrix_layout(self.0) };
    }
}
struct Desc(sys::cublasLtMatmulDesc_t);
impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by `create_matmul_desc`, destroyed once.
        let _ = unsafe { result::destroy_matmul_desc(self.0) };
    }
}
struct Pref(sys::cublasLtMatmulPreference_t);
impl Drop for Pref {
    fn drop(&mut self) {
        // SAFETY: created by `create_matmul_pref`, destroyed once.
        let _ = unsafe { result::destroy_matmul_pref(self.0) };
    }
}

/// An operand ready for cuBLASLt: a view with a usable matrix order and one batch stride.
struct Operand {
    tensor: CudaTensor,
    order: MatrixOrder,
    batch_stride: i64,
}

fn prepare(t: &CudaTensor, batch: &[usize], rows: usize, cols: usize) -> Result<Operand> {
    let mut full = batch.to_vec();
    full.extend([rows, cols]);
    let view = t.expand(&full)?;
    let r = full.len();
    let try_view = |v: &CudaTensor| -> Option<Operand> {
        let order = matrix_order(rows, cols, v.strides()[r - 2], v.strides()[r - 1])?;
        let bs = batch_stride(&v.shape()[..r - 2], &v.strides()[..r - 2])?;
        Some(Operand {
            tensor: v.clone(),
            order,
            batch_stride: bs,
        })
    };
    if let Some(op) = try_view(&view) {
        return Ok(op);
    }
    let copy = view.contiguous()?;
    try_view(&copy)
        .ok_or_else(|| CudaError::invalid(t.op("matmul"), "cannot lay out operand for cuBLASLt"))
}

/// `a · b` over the last two dims, batch dims broadcast: `[.., m, k] · [.., k, n] → [.., m, n]`.
pub fn matmul(a: &CudaTensor, b: &CudaTensor) -> Result<CudaTensor> {
    matmul_bias(a, b, None)
}

/// `a · b + bias` with `bias` `[n]` (of the output dtype) added by cuBLASLt's bias epilogue.
pub fn matmul_bias(
    a: &CudaTensor,
    b: &CudaTensor,
    bias: Option<&CudaTensor>,
) -> Result<CudaTensor> {
    let ctx = || {
        OpContext::new("matmul")
            .shape(a.shape())
            .shape(b.shape())
            .dtype(a.dtype())
    };
    if a.dtype() != b.dtype() {
        return Err(CudaError::invalid(ctx(), "dtypes differ"));
    }
    let Some(data_type) = cuda_type(a.dtype()) else {
        return Err(CudaError::unsupported(
            ctx(),
            "cuBLASLt matmul takes f32, f16 or bf16",
        ));
    };
    if a.rank() < 2 || b.rank() < 2 {
        return Err(CudaError::invalid(ctx(), "operands need rank >= 2"));
    }
    let (m, k) = (a.shape()[a.rank() - 2], a.shape()[a.rank() - 1]);
    let (k2, n) = (b.shape()[b.rank() - 2], b.shape()[b.rank() - 1]);
    if k != k2 {
        return Err(CudaError::invalid(
            ctx(),
            format!("inner dims differ: {k} vs {k2}"),
        ));
    }
    let batch = broadcast_shapes(&a.shape()[..a.rank() - 2], &b.shape()[..b.rank() - 2])
        .ok_or_else(|| CudaError::invalid(ctx(), "batch dims do not broadcast"))?;
    let mut out_shape = batch.clone();
    out_shape.extend([m, n]);
    let device = a.device().clone();
    let out = CudaTensor::empty(&device, &out_shape, a.dtype())?;
    let batch_count: usize = batch.iter().product();
    if out.numel() == 0 {
        return Ok(out);
    }
    if k == 0 {
        return crate::kernels::prim::elementwise::zeros(&device, &out_shape, a.dtype());
    }
    let a_op = prepare(a, &batch, m, k)?;
    let b_op = prepare(b, &batch, k, n)?;
    let batch_count = i32::try_from(batch_count)
        .map_err(|_| CudaError::unsupported(ctx(), "more than 2^31 batches"))?;
    cublaslt_present()?;
    let key = ProblemKey {
        dtype: a.dtype(),
        tf32: device.tf32(),
        m: m as u64,
        n: n as u64,
        k: k as u64,
        batch: batch_count,
        a: (
            a_op.order,
            a_op.batch_stride,
            pointer_alignment(a_op.tensor.data_ptr()),
        ),
        b: (
            b_op.order,
            b_op.batch_stride,
            pointer_alignment(b_op.tensor.data_ptr()),
        ),
        d_align: pointer_alignment(out.data_ptr()),
        bias: bias.is_some(),
        bucketed: None,
    };
    let bias = match bias {
        Some(v) => {
            if v.shape() != [n] {
                return Err(CudaError::invalid(
                    ctx(),
                    format!("bias shape {:?} is not [{n}]", v.shape()),
                ));
            }
            Some(if v.dtype() == a.dtype() && v.is_contiguous() {
                v.clone()
            } else {
                v.cast(a.dtype())?.contiguous()?
            })
        }
        None => None,
    };
    with_blas(&device, &ctx, |blas| {
        run_gemm(
            blas,
            &device,
            &key,
            data_type,
            &a_op,
            &b_op,
            bias.as_ref(),
            &out,
        )
    })?;
    Ok(out)
}

/// Runs `f` with `device`'s cuBLASLt handle (created on first use), under its mutex.
fn with_blas(
    device: &Arc<CudaDevice>,
    ctx: &dyn Fn() -> OpContext,
    f: impl FnOnce(&mut BlasHandle) -> Result<(), result::CublasError>,
) -> Result<()> {
    device.bind()?;
    let handle = handle_slot(device);
    let mut guard = handle
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if guard.is_none() {
        let handle = result::create_handle().map_err(|e| CudaError::blas(ctx(), e))?;
        let workspace = DeviceBuffer::alloc(device, WORKSPACE_BYTES)?;
        *guard = Some(BlasHandle {
            handle,
            workspace,
            plans: HashMap::new(),
        });
    }
    let blas = guard
        .as_mut()
        .ok_or_else(|| CudaError::invalid(ctx(), "cuBLASLt handle missing"))?;
    f(blas).map_err(|e| CudaError::blas(ctx(), e))
}

/// Counts per plan of [`matmul_rows_into`] and [`matmul_inner_into`]: a count is planned as the
/// next multiple.
const ROW_BUCKET: usize = 1024;

/// Which dimension of a [`matmul_bucketed`] call changes from call to call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Bucketed {
    /// `m`, the output's rows (an expert's rows in the forward and the input gradient).
    Rows,
    /// `k`, the inner dimension (an expert's rows in the weight gradient).
    Inner,
}

/// `out = x · w` into `out` for a block of rows whose count changes from call to call (an MoE
/// expert's): `x [m, k]` and `out [m, n]` row-major (row slices of larger tensors will do),
/// `w [k, n]`. The algorithm is asked for once per bucket of [`ROW_BUCKET`] counts, `m` rounded
/// up, and run at `m` itself, so a new count costs two layouts rather than a heuristic query;
/// the bucket is not tuned (a trial run would write its rows past `m`).
pub fn matmul_rows_into(x: &CudaTensor, w: &CudaTensor, out: &CudaTensor) -> Result<()> {
    matmul_bucketed(x, w, out, Bucketed::Rows)
}

/// `out = a · b` into `out [m, n]` (row-major) where the inner dimension `k` is a count that
/// changes from call to call (an expert's weight gradient, `x_gᵀ · dy_g`, whose sum runs over
/// the expert's rows): planned once per bucket of [`ROW_BUCKET`] counts, as
/// [`matmul_rows_into`].
pub fn matmul_inner_into(a: &CudaTensor, b: &CudaTensor, out: &CudaTensor) -> Result<()> {
    matmul_bucketed(a, b, out, Bucketed::Inner)
}

fn matmul_bucketed(x: &CudaTensor, w: &CudaTensor, out: &CudaTensor, vary: Bucketed) -> Result<()> {
    let ctx = || {
        OpContext::new("matmul_bucketed")
            .shape(x.shape())
            .shape(w.shape())
            .dtype(x.dtype())
    };
    let ([m, k], [k2, n], [m2, n2]) = (x.shape(), w.shape(), out.shape()) else {
        return Err(CudaError::invalid(ctx(), "x [m, k], w [k, n], out [m, n]"));
    };
    let (m, k, n) = (*m, *k, *n);
    if k != *k2 || m != *m2 || n != *n2 || x.dtype() != w.dtype() || out.dtype() != x.dtype() {
        return Err(CudaError::invalid(ctx(), "shapes or dtypes do not match"));
    }
    let Some(data_type) = cuda_type(x.dtype()) else {
        return Err(CudaError::unsupported(ctx(), "f32, f16 or bf16"));
    };
    let out_order = matrix_order(m, n, out.strides()[0], out.strides()[1])
        .filter(|order| order.row_major)
        .ok_or_else(|| CudaError::invalid(ctx(), "out must be row-major"))?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        return Err(CudaError::unsupported(ctx(), "an empty inner dimension"));
    }
    let bucket = |count: usize| count.next_multiple_of(ROW_BUCKET);
    let (m_plan, k_plan) = match vary {
        Bucketed::Rows => (bucket(m), k),
        Bucketed::Inner => (m, bucket(k)),
    };
    let a_op = at_plan_shape(prepare(x, &[], m, k)?, m_plan, k_plan);
    let b_op = at_plan_shape(prepare(w, &[], k, n)?, k_plan, n);
    cublaslt_present()?;
    let device = x.device().clone();
    let key = ProblemKey {
        dtype: x.dtype(),
        tf32: device.tf32(),
        m: m_plan as u64,
        n: n as u64,
        k: k_plan as u64,
        batch: 1,
        a: (a_op.order, 0, pointer_alignment(a_op.tensor.data_ptr())),
        b: (b_op.order, 0, pointer_alignment(b_op.tensor.data_ptr())),
        d_align: pointer_alignment(out.data_ptr()),
        bias: false,
        bucketed: Some(vary),
    };
    with_blas(&device, &ctx, |blas| {
        if !blas.plans.contains_key(&key) {
            let (plan, _) = make_plan(blas, &key, data_type, &a_op, &b_op)?;
            blas.plans.insert(key.clone(), plan);
        }
        let plan = &blas.plans[&key];
        let _timer = if crate::engine::timing::enabled() {
            crate::engine::timing::scope(&device, &key.timing_name())
        } else {
            None
        };
        // The plan's layouts are the bucket's; these are this call's counts.
        let (m, k, n) = (m as u64, k as u64, n as u64);
        let first = match vary {
            Bucketed::Rows => None,
            Bucketed::Inner if b_op.order.row_major => {
                Some(matrix_layout(data_type, n, k, b_op.order.ld, 1, 0)?)
            }
            Bucketed::Inner => Some(matrix_layout(data_type, k, n, b_op.order.ld, 1, 0)?),
        };
        let ld = a_op.order.ld;
        let second = if a_op.order.row_major {
            matrix_layout(data_type, k, m, ld, 1, 0)?
        } else {
            matrix_layout(data_type, m, k, ld, 1, 0)?
        };
        let d = matrix_layout(data_type, n, m, out_order.ld, 1, 0)?;
        let layouts = [first.as_ref().unwrap_or(&plan.first), &second, &d];
        let stream = device.cu_stream();
        launch_with(
            blas,
            &plan.desc,
            layouts,
            &plan.algo,
            [&a_op, &b_op],
            out,
            stream,
        )
    })
}

/// `op` with its order read at the plan's shape: a count of one makes any matrix look
/// row-major (one column takes any stride), which a plan for a bucket of counts cannot use
/// (an x_gᵀ of one row read as row-major with a leading dimension of 1).
fn at_plan_shape(op: Operand, rows: usize, cols: usize) -> Operand {
    let strides = op.tensor.strides();
    match matrix_order(rows, cols, strides[0], strides[1]) {
        Some(order) => Operand { order, ..op },
        None => op,
    }
}

fn set_desc<T>(
    desc: &Desc,
    attr: sys::cublasLtMatmulDescAttributes_t,
    value: &T,
) -> Result<(), result::CublasError> {
    // SAFETY: `value` is the attribute's documented type and lives across the call.
    unsafe {
        result::set_matmul_desc_attribute(
            desc.0,
            attr,
            (value as *const T).cast(),
            std::mem::size_of::<T>(),
        )
    }
}

fn matrix_layout(
    data_type: sys::cudaDataType,
    rows: u64,
    cols: u64,
    ld: i64,
    batch: i32,
    stride: i64,
) -> Result<Layout, result::CublasError> {
    let layout = Layout(result::create_matrix_layout(data_type, rows, cols, ld)?);
    // SAFETY: BATCH_COUNT takes an int32, STRIDED_BATCH_OFFSET an int64.
    unsafe {
        result::set_matrix_layout_attribute(
            layout.0,
            sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
            (&batch as *const i32).cast(),
            4,
        )?;
        result::set_matrix_layout_attribute(
            layout.0,
            sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
            (&stride as *const i64).cast(),
            8,
        )?;
    }
    Ok(layout)
}

#[allow(clippy::too_many_arguments)]
fn run_gemm(
    blas: &mut BlasHandle,
    device: &CudaDevice,
    key: &ProblemKey,
    data_type: sys::cudaDataType,
    a: &Operand,
    b: &Operand,
    bias: Option<&CudaTensor>,
    out: &CudaTensor,
) -> Result<(), result::CublasError> {
    let stream = device.cu_stream();
    if !blas.plans.contains_key(key) {
        let (plan, candidates) = make_plan(blas, key, data_type, a, b)?;
        set_bias(&plan, bias)?;
        let plan = if candidates.len() > 1 && crate::blas::tune::enabled() {
            let pick = crate::blas::tune::pick(device, &format!("{key:?}"), &candidates, |algo| {
                launch(blas, &plan, algo, a, b, out, stream)
            });
            GemmPlan {
                algo: candidates[pick],
                ..plan
            }
        } else {
            plan
        };
        blas.plans.insert(key.clone(), plan);
    }
    let plan = &blas.plans[key];
    // Timed after the (first-call) heuristic query, which is host work.
    let _timer = if crate::engine::timing::enabled() {
        crate::engine::timing::scope(device, &key.timing_name())
    } else {
        None
    };
    set_bias(plan, bias)?;
    launch(blas, plan, &plan.algo, a, b, out, stream)
}

/// Points the plan's bias epilogue at `bias` (set per call: the vector moves between calls).
fn set_bias(plan: &GemmPlan, bias: Option<&CudaTensor>) -> Result<(), result::CublasError> {
    let Some(bias) = bias else { return Ok(()) };
    let ptr = bias.data_ptr() as *const c_void;
    set_desc(
        &plan.desc,
        sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
        &ptr,
    )
}

/// Queues `out = a · b` (plus the bias the plan's descriptor points at) with `algo`.
fn launch(
    blas: &BlasHandle,
    plan: &GemmPlan,
    algo: &sys::cublasLtMatmulAlgo_t,
    a: &Operand,
    b: &Operand,
    out: &CudaTensor,
    stream: cudarc::driver::sys::CUstream,
) -> Result<(), result::CublasError> {
    let layouts = [&plan.first, &plan.second, &plan.d];
    launch_with(blas, &plan.desc, layouts, algo, [a, b], out, stream)
}

/// [`launch`] with the layouts given: cuBLASLt's A (our `b`), B (our `a`) and D.
fn launch_with(
    blas: &BlasHandle,
    desc: &Desc,
    [first, second, d]: [&Layout; 3],
    algo: &sys::cublasLtMatmulAlgo_t,
    [a, b]: [&Operand; 2],
    out: &CudaTensor,
    stream: cudarc::driver::sys::CUstream,
) -> Result<(), result::CublasError> {
    let alpha: f32 = 1.0;
    let beta: f32 = 0.0;
    // SAFETY: pointers address live device buffers of the sizes the layouts describe (checked
    // by `prepare`), alpha/beta are host f32 (the default pointer mode and the f32 scale type),
    // the bias (when the epilogue is on) is a live `[n]` vector of the output type, and the
    // workspace is exclusively ours while the device's blas mutex is held; the call is queued on
    // the device's stream like every kernel.
    unsafe {
        result::matmul(
            blas.handle,
            desc.0,
            (&alpha as *const f32).cast::<c_void>(),
            (&beta as *const f32).cast::<c_void>(),
            b.tensor.data_ptr() as *const c_void,
            first.0,
            a.tensor.data_ptr() as *const c_void,
            second.0,
            out.data_ptr() as *const c_void,
            d.0,
            out.data_ptr() as *mut c_void,
            d.0,
            algo,
            blas.workspace.ptr() as *mut c_void,
            blas.workspace.len(),
            stream as sys::cudaStream_t,
        )
    }
}

fn make_plan(
    blas: &BlasHandle,
    key: &ProblemKey,
    data_type: sys::cudaDataType,
    a: &Operand,
    b: &Operand,
) -> Result<(GemmPlan, Vec<sys::cublasLtMatmulAlgo_t>), result::CublasError> {
    let (m, n, k) = (key.m, key.n, key.k);
    let compute = if key.dtype == DType::F32 && key.tf32 {
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
    } else {
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
    };
    let desc = Desc(result::create_matmul_desc(
        compute,
        sys::cudaDataType::CUDA_R_32F,
    )?);
    // cuBLASLt's A is our B (n × k column-major), its B is our A (k × m column-major).
    let trans_first: i32 = i32::from(!b.order.row_major);
    let trans_second: i32 = i32::from(!a.order.row_major);
    set_desc(
        &desc,
        sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
        &trans_first,
    )?;
    set_desc(
        &desc,
        sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
        &trans_second,
    )?;
    if key.bias {
        // D is n × m column-major: the bias runs over its rows, our output columns.
        set_desc(
            &desc,
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
            &sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
        )?;
    }
    let first = if b.order.row_major {
        matrix_layout(data_type, n, k, b.order.ld, key.batch, b.batch_stride)?
    } else {
        matrix_layout(data_type, k, n, b.order.ld, key.batch, b.batch_stride)?
    };
    let second = if a.order.row_major {
        matrix_layout(data_type, k, m, a.order.ld, key.batch, a.batch_stride)?
    } else {
        matrix_layout(data_type, m, k, a.order.ld, key.batch, a.batch_stride)?
    };
    let d = matrix_layout(data_type, n, m, n as i64, key.batch, (m * n) as i64)?;
    let pref = Pref(result::create_matmul_pref()?);
    let ws = blas.workspace.len();
    let set_pref = |attr, v: &[u8]| {
        // SAFETY: each attribute gets its documented type (u64 / u32) by size.
        unsafe { result::set_matmul_pref_attribute(pref.0, attr, v.as_ptr().cast(), v.len()) }
    };
    use sys::cublasLtMatmulPreferenceAttributes_t as P;
    set_pref(
        P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
        &(ws as u64).to_ne_bytes(),
    )?;
    set_pref(
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
        &key.b.2.to_ne_bytes(),
    )?;
    set_pref(
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        &key.a.2.to_ne_bytes(),
    )?;
    set_pref(
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
        &key.d_align.to_ne_bytes(),
    )?;
    set_pref(
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
        &key.d_align.to_ne_bytes(),
    )?;
    let candidates = heuristic_candidates(blas, &desc, &first, &second, &d, &pref)?;
    let plan = GemmPlan {
        desc,
        first,
        second,
        d,
        algo: candidates[0],
    };
    Ok((plan, candidates))
}

/// The heuristic's candidates for a problem, best guess first (at least one, or an error).
fn heuristic_candidates(
    blas: &BlasHandle,
    desc: &Desc,
    first: &Layout,
    second: &Layout,
    d: &Layout,
    pref: &Pref,
) -> Result<Vec<sys::cublasLtMatmulAlgo_t>, result::CublasError> {
    let asked = crate::blas::tune::asked();
    // SAFETY: an all-zero heuristic result is a valid (unfilled) value of this plain C struct.
    let mut found =
        vec![unsafe { std::mem::zeroed::<sys::cublasLtMatmulHeuristicResult_t>() }; asked];
    let mut count = 0;
    // SAFETY: all descriptors are live for the call; `found` has room for `asked` results.
    unsafe {
        sys::cublasLtMatmulAlgoGetHeuristic(
            blas.handle,
            desc.0,
            first.0,
            second.0,
            d.0,
            d.0,
            pref.0,
            asked as i32,
            found.as_mut_ptr(),
            &mut count,
        )
        .result()?;
    }
    crate::blas::tune::usable(&found, count)
}

/// Whether cuBLASLt can be loaded, asked once: cudarc's check dlopens every candidate name, too
/// much for every GEMM of a step.
pub(crate) fn cublaslt_present() -> Result<()> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen cuBLASLt by its usual names.
    if *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() }) {
        Ok(())
    } else {
        Err(CudaError::LibraryMissing {
            library: "cuBLASLt (libcublasLt)",
            hint: "add the CUDA toolkit's lib64 to LD_LIBRARY_PATH",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_major_and_transposed_views_need_no_copy() {
        // [m=4, k=3] row-major.
        assert_eq!(
            matrix_order(4, 3, 3, 1),
            Some(MatrixOrder {
                row_major: true,
                ld: 3
            })
        );
        // Transpose of a [3, 4] row-major matrix: strides (1, 4).
        assert_eq!(
            matrix_order(4, 3, 1, 4),
            Some(MatrixOrder {
                row_major: false,
                ld: 4
            })
        );
        // A column slice of a wider matrix keeps its leading dimension.
        assert_eq!(
            matrix_order(4, 3, 10, 1),
            Some(MatrixOrder {
                row_major: true,
                ld: 10
            })
        );
        // Stepped columns are not expressible.
        assert_eq!(matrix_order(4, 3, 6, 2), None);
        // A single row may have any row stride.
        assert_eq!(
            matrix_order(1, 5, 0, 1),
            Some(MatrixOrder {
                row_major: true,
                ld: 5
            })
        );
    }

    #[test]
    fn batch_dims_flatten_to_one_stride_or_broadcast() {
        assert_eq!(batch_stride(&[2, 3], &[36, 12]), Some(12));
        assert_eq!(batch_stride(&[2, 3], &[0, 0]), Some(0));
        assert_eq!(batch_stride(&[], &[]), Some(0));
        assert_eq!(batch_stride(&[2, 1, 3], &[36, 99, 12]), Some(12));
        // A broadcast dim mixed with a real one cannot be one stride.
        assert_eq!(batch_stride(&[2, 3], &[0, 12]), None);
    }

    #[test]
    fn alignment_is_capped_at_256() {
        assert_eq!(pointer_alignment(0x7f00_0000_0000), 256);
        assert_eq!(pointer_alignment(0x1002), 2);
        assert_eq!(pointer_alignment(0x1010), 16);
    }
}
