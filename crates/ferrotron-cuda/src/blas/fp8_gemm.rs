//! fp8 GEMMs through cuBLASLt on Hopper: `D [m, n] = (a · bᵀ) · a_scale_inv · b_scale_inv
//! (+ bias)` for fp8 `a [m, k]` and `b [n, k]`, `k` contiguous in both, D in bf16/f16/f32.
//!
//! Hopper's fp8 kernels take only the "TN" form: in cuBLASLt's column-major terms op(A) = T and
//! op(B) = N, both operands stored with the contraction dimension contiguous. Our row-major
//! `D [m, n]` is cuBLASLt's column-major `n × m` result `op(A) · op(B)` with A our `b` (stored
//! as a `k × n` column-major matrix, transposed) and B our `a` (`k × m`, not transposed). The inverse scales are device pointers (A_SCALE is `b`'s, B_SCALE
//! `a`'s), set per call like the bias; e5m2 × e5m2 does not exist on Hopper (the hybrid recipe
//! never asks for it: gradients meet e4m3 activations or weights).
//!
//! This module keeps its own cuBLASLt handle and workspace per device (the bf16 path's live in
//! `gemm.rs`); plans (descriptors, layouts, an algorithm) are cached per problem, the algorithm
//! chosen as the bf16 path chooses it: the heuristic's candidates timed on the first call's
//! operands and the choice remembered on disk (`tune.rs`, `runtime.gemm_tune`).
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublaslt::{result, sys};
use ferrotron_ops::fp8::scaling::Fp8Format;

use crate::engine::alloc::DeviceBuffer;
use crate::engine::device::CudaDevice;
use crate::engine::dtype::DType;
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};

/// cuBLASLt workspace, as the bf16 path's.
const WORKSPACE_BYTES: usize = 32 << 20;

pub use crate::engine::fp8_operand::Operand;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    m: u64,
    n: u64,
    k: u64,
    a: Fp8Format,
    b: Fp8Format,
    out: DType,
    bias: bool,
    fast_accumulation: bool,
}

struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    layouts: [sys::cublasLtMatrixLayout_t; 3],
    algo: sys::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: created by `make_plan`, destroyed once.
        unsafe {
            let _ = result::destroy_matmul_desc(self.desc);
            for layout in self.layouts {
                let _ = result::destroy_matrix_layout(layout);
            }
        }
    }
}

struct Handle {
    handle: sys::cublasLtHandle_t,
    workspace: Arc<DeviceBuffer>,
    plans: HashMap<Key, Plan>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.plans.clear();
        // SAFETY: created by `create_handle`, destroyed once, after its plans.
        let _ = unsafe { result::destroy_handle(self.handle) };
    }
}

// SAFETY: a handle is used only under its mutex, by one thread at a time.
unsafe impl Send for Handle {}

/// The handles, by device ordinal.
fn handles() -> &'static Mutex<HashMap<usize, Handle>> {
    static HANDLES: OnceLock<Mutex<HashMap<usize, Handle>>> = OnceLock::new();
    HANDLES.get_or_init(Default::default)
}

fn cuda_type(format: Fp8Format) -> sys::cudaDataType {
    match format {
        Fp8Format::E4m3 => sys::cudaDataType::CUDA_R_8F_E4M3,
        Fp8Format::E5m2 => sys::cudaDataType::CUDA_R_8F_E5M2,
    }
}

fn out_type(dtype: DType) -> Option<sys::cudaDataType> {
    match dtype {
        DType::BF16 => Some(sys::cudaDataType::CUDA_R_16BF),
        DType::F16 => Some(sys::cudaDataType::CUDA_R_16F),
        DType::F32 => Some(sys::cudaDataType::CUDA_R_32F),
        _ => None,
    }
}

/// Checks an operand: contiguous `[rows, k]` bytes, `k` and the rows multiples of 16, a `[1]`
/// f32 inverse scale.
fn rows_of(op: &Operand<'_>, k: usize, ctx: &dyn Fn() -> OpContext) -> Result<usize> {
    let [rows, cols] = *op.data.shape() else {
        return Err(CudaError::invalid(ctx(), "fp8 operands are 2-D"));
    };
    if op.data.dtype() != DType::U8 || !op.data.is_contiguous() || cols != k {
        return Err(CudaError::invalid(
            ctx(),
            "fp8 operands are contiguous bytes [rows, k] with the same k",
        ));
    }
    if !rows.is_multiple_of(16) || !k.is_multiple_of(16) {
        return Err(CudaError::unsupported(
            ctx(),
            format!("fp8 GEMMs need dimensions divisible by 16, not {rows} × {k}"),
        ));
    }
    if op.scale_inv.dtype() != DType::F32 || op.scale_inv.numel() != 1 {
        return Err(CudaError::invalid(ctx(), "an inverse scale is one f32"));
    }
    Ok(rows)
}

/// `(a · bᵀ) · a.scale_inv · b.scale_inv + bias` → `[m, n]` in `out`; `fast_accumulation`
/// trades the fp8 tensor cores' periodic promotion to f32 for speed (the forward only).
pub fn fp8_matmul(
    a: Operand<'_>,
    b: Operand<'_>,
    bias: Option<&CudaTensor>,
    out: DType,
    fast_accumulation: bool,
) -> Result<CudaTensor> {
    let ctx = || {
        OpContext::new(format!(
            "fp8 matmul {}·{}ᵀ",
            a.format.name(),
            b.format.name()
        ))
        .shape(a.data.shape())
        .shape(b.data.shape())
    };
    let k = a.data.shape().get(1).copied().unwrap_or(0);
    let m = rows_of(&a, k, &ctx)?;
    let n = rows_of(&b, k, &ctx)?;
    let Some(d_type) = out_type(out) else {
        return Err(CudaError::unsupported(
            ctx(),
            "fp8 GEMMs write bf16, f16 or f32",
        ));
    };
    if a.format == Fp8Format::E5m2 && b.format == Fp8Format::E5m2 {
        return Err(CudaError::unsupported(
            ctx(),
            "e5m2 × e5m2 has no Hopper kernel",
        ));
    }
    let bias = match bias {
        Some(v) if v.shape() != [n] => {
            return Err(CudaError::invalid(ctx(), format!("bias is not [{n}]")));
        }
        Some(v) if v.dtype() == out && v.is_contiguous() => Some(v.clone()),
        Some(v) => Some(v.cast(out)?.contiguous()?),
        None => None,
    };
    let device = a.data.device().clone();
    let output = CudaTensor::empty(&device, &[m, n], out)?;
    crate::blas::gemm::cublaslt_present()?;
    let key = Key {
        m: m as u64,
        n: n as u64,
        k: k as u64,
        a: a.format,
        b: b.format,
        out,
        bias: bias.is_some(),
        fast_accumulation,
    };
    device.bind()?;
    let mut all = handles().lock().unwrap_or_else(|p| p.into_inner());
    let handle = match all.entry(device.ordinal()) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => e.insert(Handle {
            handle: result::create_handle().map_err(|e| CudaError::blas(ctx(), e))?,
            workspace: DeviceBuffer::alloc(&device, WORKSPACE_BYTES)?,
            plans: HashMap::new(),
        }),
    };
    if !handle.plans.contains_key(&key) {
        let (mut plan, candidates) =
            make_plan(handle, &key, d_type).map_err(|e| CudaError::blas(ctx(), e))?;
        if candidates.len() > 1 {
            let problem = format!("fp8 {key:?}");
            let pick = crate::blas::tune::pick(&device, &problem, &candidates, |algo| {
                run(handle, &plan, algo, &a, &b, bias.as_ref(), &output, &device)
            });
            plan.algo = candidates[pick];
        }
        handle.plans.insert(key, plan);
    }
    let plan = &handle.plans[&key];
    let _timer = crate::engine::timing::scope(&device, "fp8_matmul(cublaslt)");
    run(
        handle,
        plan,
        &plan.algo,
        &a,
        &b,
        bias.as_ref(),
        &output,
        &device,
    )
    .map_err(|e| CudaError::blas(ctx(), e))?;
    Ok(output)
}

fn set<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    value: &T,
) -> Result<(), result::CublasError> {
    // SAFETY: `value` is the attribute's documented type and lives across the call.
    unsafe {
        result::set_matmul_desc_attribute(
            desc,
            attr,
            (value as *const T).cast(),
            std::mem::size_of::<T>(),
        )
    }
}

/// The problem's plan with the heuristic's best guess, and the candidates to time (the
/// guess first; one unless GEMM tuning is on, `tune.rs`).
fn make_plan(
    handle: &Handle,
    key: &Key,
    d_type: sys::cudaDataType,
) -> Result<(Plan, Vec<sys::cublasLtMatmulAlgo_t>), result::CublasError> {
    use sys::cublasLtMatmulDescAttributes_t as A;
    let desc = result::create_matmul_desc(
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        sys::cudaDataType::CUDA_R_32F,
    )?;
    // Owned from here on, so an early return frees what was made.
    let mut plan = Plan {
        desc,
        layouts: [std::ptr::null_mut(); 3],
        // SAFETY: an all-zero algorithm is a valid (unset) value of this plain C struct.
        algo: unsafe { std::mem::zeroed() },
    };
    // CUBLAS_OP_T and CUBLAS_OP_N
    let (transposed, plain): (i32, i32) = (1, 0);
    set(desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &transposed)?;
    set(desc, A::CUBLASLT_MATMUL_DESC_TRANSB, &plain)?;
    set(
        desc,
        A::CUBLASLT_MATMUL_DESC_FAST_ACCUM,
        &i8::from(key.fast_accumulation),
    )?;
    if key.bias {
        set(
            desc,
            A::CUBLASLT_MATMUL_DESC_EPILOGUE,
            &sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
        )?;
    }
    let (m, n, k) = (key.m, key.n, key.k);
    plan.layouts[0] = result::create_matrix_layout(cuda_type(key.b), k, n, k as i64)?;
    plan.layouts[1] = result::create_matrix_layout(cuda_type(key.a), k, m, k as i64)?;
    plan.layouts[2] = result::create_matrix_layout(d_type, n, m, n as i64)?;
    let pref = result::create_matmul_pref()?;
    let ws = handle.workspace.len() as u64;
    // SAFETY: MAX_WORKSPACE_BYTES takes a u64; the preference lives across the call.
    let found = unsafe {
        result::set_matmul_pref_attribute(
            pref,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            (&ws as *const u64).cast(),
            8,
        )
        .and_then(|()| heuristic(handle, &plan, pref))
    };
    // SAFETY: created above, destroyed once.
    let _ = unsafe { result::destroy_matmul_pref(pref) };
    let candidates = found?;
    plan.algo = candidates[0];
    Ok((plan, candidates))
}

/// The heuristic's algorithms for the plan's problem, best guess first (at least one).
///
/// # Safety
/// `pref` must be a live preference.
unsafe fn heuristic(
    handle: &Handle,
    plan: &Plan,
    pref: sys::cublasLtMatmulPreference_t,
) -> Result<Vec<sys::cublasLtMatmulAlgo_t>, result::CublasError> {
    let asked = crate::blas::tune::asked();
    // SAFETY: an all-zero heuristic result is a valid (unfilled) value of this plain C struct.
    let mut found =
        vec![unsafe { std::mem::zeroed::<sys::cublasLtMatmulHeuristicResult_t>() }; asked];
    let mut count = 0;
    // SAFETY: descriptors and layouts are live; `found` has room for `asked` results.
    unsafe {
        sys::cublasLtMatmulAlgoGetHeuristic(
            handle.handle,
            plan.desc,
            plan.layouts[0],
            plan.layouts[1],
            plan.layouts[2],
            plan.layouts[2],
            pref,
            asked as i32,
            found.as_mut_ptr(),
            &mut count,
        )
        .result()?;
    }
    crate::blas::tune::usable(&found, count)
}

/// Queues `out = a · bᵀ` scaled (plus the bias) with `algo`.
#[allow(clippy::too_many_arguments)]
fn run(
    handle: &Handle,
    plan: &Plan,
    algo: &sys::cublasLtMatmulAlgo_t,
    a: &Operand<'_>,
    b: &Operand<'_>,
    bias: Option<&CudaTensor>,
    out: &CudaTensor,
    device: &CudaDevice,
) -> Result<(), result::CublasError> {
    use sys::cublasLtMatmulDescAttributes_t as A;
    // cuBLASLt's A is our `b`, its B our `a`.
    let a_scale = b.scale_inv.data_ptr() as *const c_void;
    let b_scale = a.scale_inv.data_ptr() as *const c_void;
    set(plan.desc, A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale)?;
    set(plan.desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale)?;
    if let Some(bias) = bias {
        let ptr = bias.data_ptr() as *const c_void;
        set(plan.desc, A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ptr)?;
    }
    let alpha: f32 = 1.0;
    let beta: f32 = 0.0;
    // SAFETY: every pointer addresses a live device buffer of the size its layout describes
    // (checked by `rows_of`), the scale pointers one f32 each, the bias (when the epilogue is
    // on) a live `[n]` vector of the output type; alpha and beta are host f32 (the default
    // pointer mode); the workspace is ours while the handles' mutex is held; the call is queued
    // on the device's stream like every kernel.
    unsafe {
        result::matmul(
            handle.handle,
            plan.desc,
            (&alpha as *const f32).cast(),
            (&beta as *const f32).cast(),
            b.data.data_ptr() as *const c_void,
            plan.layouts[0],
            a.data.data_ptr() as *const c_void,
            plan.layouts[1],
            out.data_ptr() as *const c_void,
            plan.layouts[2],
            out.data_ptr() as *mut c_void,
            plan.layouts[2],
            algo,
            handle.workspace.ptr() as *mut c_void,
            handle.workspace.len(),
            device.cu_stream() as sys::cudaStream_t,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_formats_map_to_cuda_types() {
        assert_eq!(
            cuda_type(Fp8Format::E4m3),
            sys::cudaDataType::CUDA_R_8F_E4M3
        );
        assert_eq!(
            cuda_type(Fp8Format::E5m2),
            sys::cudaDataType::CUDA_R_8F_E5M2
        );
        assert_eq!(out_type(DType::BF16), Some(sys::cudaDataType::CUDA_R_16BF));
        assert_eq!(out_type(DType::U8), None);
    }
}
