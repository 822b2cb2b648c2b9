//! cuDNN's fused attention through its backend (graph) API, loaded at run time.
//!
//! `graph` describes operation graphs as data, `sdpa` builds the attention forward and backward
//! graphs the way NVIDIA's cudnn-frontend does (the fused flash-attention engines only match
//! that exact pattern), and this module materialises a graph into backend descriptors, asks the
//! heuristics for engine configs, keeps the first execution plan that finalises (cached per
//! [`sdpa::SdpaKey`]) and executes it on the device's stream with a variant pack.
//!
//! `libcudnn.so.9` is opened on first use; a machine without it gets a `LibraryMissing` error
//! naming what to install.
#![allow(unsafe_code)]

pub mod graph;
mod packed;
pub mod sdpa;
mod tune;

pub use packed::{packed_backward, packed_forward, supports_packed};

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cudnn::sys as cs;

use crate::engine::alloc::DeviceBuffer;
use crate::engine::device::CudaDevice;
use crate::engine::dtype::{DType, Scalar};
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, DriverResultExt, OpContext, Result};
use crate::kernels::prim::elementwise::full;
use graph::{Dt, Graph, Op, Pw, Red};
use sdpa::SdpaKey;
pub use sdpa::SdpaMask;

/// Whether `libcudnn` can be opened here.
pub fn available() -> bool {
    // SAFETY: only tries to dlopen cuDNN by its usual names.
    unsafe { cs::is_culib_present() }
}

fn missing() -> CudaError {
    CudaError::LibraryMissing {
        library: "cuDNN 9 (libcudnn.so.9)",
        hint: "install it (`pip install nvidia-cudnn-cu13`, or the cuDNN 9 package for CUDA 13) and add its lib folder to LD_LIBRARY_PATH, e.g. $(python3 -c 'import nvidia.cudnn, os; print(os.path.dirname(nvidia.cudnn.__file__))')/lib; or set the recipe's runtime.fused_attention: false",
    }
}

/// cuDNN's version number (e.g. 91900), or `None` without cuDNN.
pub fn version() -> Option<usize> {
    // SAFETY: cudnnGetVersion takes no arguments and only reads a constant.
    available().then(|| unsafe { cs::cudnnGetVersion() })
}

fn check(status: cs::cudnnStatus_t, what: &str, op: &dyn Fn() -> OpContext) -> Result<()> {
    if status == cs::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        return Ok(());
    }
    Err(CudaError::Unsupported {
        context: op(),
        reason: format!("cuDNN {what}: {status:?}"),
    })
}

/// An owned backend descriptor.
struct Desc(cs::cudnnBackendDescriptor_t);

impl Desc {
    fn new(kind: cs::cudnnBackendDescriptorType_t, op: &dyn Fn() -> OpContext) -> Result<Self> {
        let mut d: cs::cudnnBackendDescriptor_t = std::ptr::null_mut();
        check(
            // SAFETY: `d` receives a fresh descriptor.
            unsafe { cs::cudnnBackendCreateDescriptor(kind, &mut d) },
            &format!("create {kind:?}"),
            op,
        )?;
        Ok(Self(d))
    }

    fn set<T>(
        &self,
        name: cs::cudnnBackendAttributeName_t,
        ty: cs::cudnnBackendAttributeType_t,
        values: &[T],
        op: &dyn Fn() -> OpContext,
    ) -> Result<()> {
        // SAFETY: `values` holds `len` elements of the C type `ty` names (callers pair them).
        let status = unsafe {
            cs::cudnnBackendSetAttribute(
                self.0,
                name,
                ty,
                values.len() as i64,
                values.as_ptr().cast(),
            )
        };
        check(status, &format!("set {name:?}"), op)
    }

    fn set_desc(
        &self,
        name: cs::cudnnBackendAttributeName_t,
        d: &Desc,
        op: &dyn Fn() -> OpContext,
    ) -> Result<()> {
        self.set(
            name,
            cs::cudnnBackendAttributeType_t::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            &[d.0],
            op,
        )
    }

    fn finalize(&self, what: &str, op: &dyn Fn() -> OpContext) -> Result<()> {
        check(
            // SAFETY: a live descriptor whose attributes were set above.
            unsafe { cs::cudnnBackendFinalize(self.0) },
            &format!("finalize {what}"),
            op,
        )
    }
}

impl Drop for Desc {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: created by cudnnBackendCreateDescriptor, destroyed once.
            unsafe { cs::cudnnBackendDestroyDescriptor(self.0) };
        }
    }
}

// SAFETY: backend descriptors are plain heap objects; cuDNN allows using them from any thread
// as long as calls on one descriptor do not overlap, which the plan cache's mutex ensures.
unsafe impl Send for Desc {}
// SAFETY: a finalised execution plan is only read by cudnnBackendExecute, which cuDNN allows
// concurrently; every mutation (building) happens under the plan cache's mutex.
unsafe impl Sync for Desc {}

fn data_type(dt: Dt) -> cs::cudnnDataType_t {
    use cs::cudnnDataType_t::*;
    match dt {
        Dt::F32 => CUDNN_DATA_FLOAT,
        Dt::F16 => CUDNN_DATA_HALF,
        Dt::Bf16 => CUDNN_DATA_BFLOAT16,
        Dt::I32 => CUDNN_DATA_INT32,
        Dt::I64 => CUDNN_DATA_INT64,
        Dt::Bool => CUDNN_DATA_BOOLEAN,
    }
}

fn pointwise_mode(mode: Pw) -> cs::cudnnPointwiseMode_t {
    use cs::cudnnPointwiseMode_t::*;
    match mode {
        Pw::Add => CUDNN_POINTWISE_ADD,
        Pw::Sub => CUDNN_POINTWISE_SUB,
        Pw::Mul => CUDNN_POINTWISE_MUL,
        Pw::Div => CUDNN_POINTWISE_DIV,
        Pw::Exp => CUDNN_POINTWISE_EXP,
        Pw::Log => CUDNN_POINTWISE_LOG,
        Pw::Identity => CUDNN_POINTWISE_IDENTITY,
        Pw::CmpGe => CUDNN_POINTWISE_CMP_GE,
        Pw::CmpGt => CUDNN_POINTWISE_CMP_GT,
        Pw::BinarySelect => CUDNN_POINTWISE_BINARY_SELECT,
        Pw::GenIndex { .. } => CUDNN_POINTWISE_GEN_INDEX,
    }
}

/// One finalised execution plan and its workspace size.
struct Candidate {
    plan: Desc,
    workspace: usize,
    /// Its engine config, kept alive with it.
    _config: Desc,
}

/// The execution plans of one graph that finalised, in the heuristics' order (the first alone
/// unless attention plans are timed, `tune.rs`), the plan chosen among them on first use, and
/// the UIDs a variant pack must supply.
struct Plan {
    candidates: Vec<Candidate>,
    chosen: OnceLock<usize>,
    uids: Vec<i64>,
    /// Kept alive for the plans' lifetime (cuDNN may refer to them).
    _graph: Vec<Desc>,
}

struct Handle(cs::cudnnHandle_t);
// SAFETY: a cuDNN handle may be used from any thread, one call at a time (mutex below).
unsafe impl Send for Handle {}

struct DeviceState {
    handle: Handle,
    plans: HashMap<SdpaKey, Arc<Plan>>,
}

fn states() -> &'static Mutex<HashMap<usize, DeviceState>> {
    static S: OnceLock<Mutex<HashMap<usize, DeviceState>>> = OnceLock::new();
    S.get_or_init(|| Mutex::new(HashMap::new()))
}

const BOOL_TRUE: [bool; 1] = [true];
const BOOL_FALSE: [bool; 1] = [false];

fn build_plan(handle: cs::cudnnHandle_t, g: &Graph, op: &dyn Fn() -> OpContext) -> Result<Plan> {
    use cs::cudnnBackendAttributeName_t::*;
    use cs::cudnnBackendAttributeType_t::*;
    use cs::cudnnBackendDescriptorType_t::*;
    let mut keep = Vec::new();
    let mut tensors: HashMap<i64, Desc> = HashMap::new();
    for t in &g.tensors {
        let d = Desc::new(CUDNN_BACKEND_TENSOR_DESCRIPTOR, op)?;
        d.set(
            CUDNN_ATTR_TENSOR_DATA_TYPE,
            CUDNN_TYPE_DATA_TYPE,
            &[data_type(t.dtype)],
            op,
        )?;
        d.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, &t.dims, op)?;
        d.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, &t.strides, op)?;
        d.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &[t.uid], op)?;
        d.set(
            CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
            CUDNN_TYPE_INT64,
            &[16i64],
            op,
        )?;
        let virt = if t.is_virtual { BOOL_TRUE } else { BOOL_FALSE };
        d.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &virt, op)?;
        if t.by_value {
            d.set(
                CUDNN_ATTR_TENSOR_IS_BY_VALUE,
                CUDNN_TYPE_BOOLEAN,
                &BOOL_TRUE,
                op,
            )?;
        }
        d.finalize(&format!("tensor {} ({})", t.uid, t.name), op)?;
        tensors.insert(t.uid, d);
    }
    let tensor = |uid: i64| -> &Desc { &tensors[&uid] };
    let mut ops = Vec::new();
    for (i, o) in g.ops.iter().enumerate() {
        let what = format!("op {i} {o:?}");
        match *o {
            Op::Matmul { a, b, c } => {
                let desc = Desc::new(CUDNN_BACKEND_MATMUL_DESCRIPTOR, op)?;
                let f32t = [data_type(Dt::F32)];
                desc.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &f32t, op)?;
                desc.finalize("matmul descriptor", op)?;
                let d = Desc::new(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, op)?;
                d.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, tensor(a), op)?;
                d.set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, tensor(b), op)?;
                d.set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, tensor(c), op)?;
                d.set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, &desc, op)?;
                d.finalize(&what, op)?;
                keep.push(desc);
                ops.push(d);
            }
            Op::Pointwise {
                mode,
                prec,
                x,
                b,
                t,
                y,
            } => {
                let desc = Desc::new(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, op)?;
                desc.set(
                    CUDNN_ATTR_POINTWISE_MODE,
                    CUDNN_TYPE_POINTWISE_MODE,
                    &[pointwise_mode(mode)],
                    op,
                )?;
                desc.set(
                    CUDNN_ATTR_POINTWISE_MATH_PREC,
                    CUDNN_TYPE_DATA_TYPE,
                    &[data_type(prec)],
                    op,
                )?;
                if let Pw::GenIndex { axis } = mode {
                    desc.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &[axis], op)?;
                }
                desc.finalize("pointwise descriptor", op)?;
                let d = Desc::new(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, op)?;
                d.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &desc, op)?;
                d.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, tensor(x), op)?;
                if let Some(b) = b {
                    d.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, tensor(b), op)?;
                }
                if let Some(t) = t {
                    d.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, tensor(t), op)?;
                }
                d.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, tensor(y), op)?;
                d.set(
                    CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1,
                    CUDNN_TYPE_FLOAT,
                    &[1f32],
                    op,
                )?;
                d.set(
                    CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2,
                    CUDNN_TYPE_FLOAT,
                    &[1f32],
                    op,
                )?;
                d.finalize(&what, op)?;
                keep.push(desc);
                ops.push(d);
            }
            Op::Reduction { mode, x, y } => {
                let desc = Desc::new(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, op)?;
                let f32t = [data_type(Dt::F32)];
                desc.set(
                    CUDNN_ATTR_REDUCTION_COMP_TYPE,
                    CUDNN_TYPE_DATA_TYPE,
                    &f32t,
                    op,
                )?;
                let operator = match mode {
                    Red::Add => cs::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_ADD,
                    Red::Max => cs::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_MAX,
                };
                desc.set(
                    CUDNN_ATTR_REDUCTION_OPERATOR,
                    CUDNN_TYPE_REDUCTION_OPERATOR_TYPE,
                    &[operator],
                    op,
                )?;
                desc.finalize("reduction descriptor", op)?;
                let d = Desc::new(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, op)?;
                d.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, tensor(x), op)?;
                d.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, tensor(y), op)?;
                d.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, &desc, op)?;
                d.finalize(&what, op)?;
                keep.push(desc);
                ops.push(d);
            }
            Op::Rng {
                keep: p,
                y,
                seed,
                offset,
            } => {
                let desc = Desc::new(CUDNN_BACKEND_RNG_DESCRIPTOR, op)?;
                desc.set(
                    CUDNN_ATTR_RNG_DISTRIBUTION,
                    CUDNN_TYPE_RNG_DISTRIBUTION,
                    &[cs::cudnnRngDistribution_t::CUDNN_RNG_DISTRIBUTION_BERNOULLI],
                    op,
                )?;
                desc.set(
                    CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY,
                    CUDNN_TYPE_DOUBLE,
                    &[p],
                    op,
                )?;
                desc.finalize("rng descriptor", op)?;
                let d = Desc::new(CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR, op)?;
                d.set_desc(CUDNN_ATTR_OPERATION_RNG_YDESC, tensor(y), op)?;
                d.set_desc(CUDNN_ATTR_OPERATION_RNG_DESC, &desc, op)?;
                d.set_desc(CUDNN_ATTR_OPERATION_RNG_SEED, tensor(seed), op)?;
                d.set_desc(CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC, tensor(offset), op)?;
                d.finalize(&what, op)?;
                keep.push(desc);
                ops.push(d);
            }
            Op::Reshape { x, y } => {
                let d = Desc::new(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, op)?;
                d.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, tensor(x), op)?;
                d.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, tensor(y), op)?;
                d.finalize(&what, op)?;
                ops.push(d);
            }
        }
    }
    let graph = Desc::new(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, op)?;
    graph.set(
        CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
        CUDNN_TYPE_HANDLE,
        &[handle],
        op,
    )?;
    let raw: Vec<cs::cudnnBackendDescriptor_t> = ops.iter().map(|d| d.0).collect();
    graph.set(
        CUDNN_ATTR_OPERATIONGRAPH_OPS,
        CUDNN_TYPE_BACKEND_DESCRIPTOR,
        &raw,
        op,
    )?;
    graph.finalize("operation graph", op)?;

    let heur = Desc::new(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, op)?;
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &graph, op)?;
    heur.set(
        CUDNN_ATTR_ENGINEHEUR_MODE,
        CUDNN_TYPE_HEUR_MODE,
        &[cs::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A],
        op,
    )?;
    heur.finalize("engine heuristics", op)?;
    let mut count: i64 = 0;
    check(
        // SAFETY: a count query (no elements requested).
        unsafe {
            cs::cudnnBackendGetAttribute(
                heur.0,
                CUDNN_ATTR_ENGINEHEUR_RESULTS,
                CUDNN_TYPE_BACKEND_DESCRIPTOR,
                0,
                &mut count,
                std::ptr::null_mut(),
            )
        },
        "count heuristic results",
        op,
    )?;
    if count == 0 {
        return Err(CudaError::Unsupported {
            context: op(),
            reason: "cuDNN heuristics found no engine for the attention graph".into(),
        });
    }
    let configs: Vec<Desc> = (0..count)
        .map(|_| Desc::new(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, op))
        .collect::<Result<_>>()?;
    let mut raw: Vec<cs::cudnnBackendDescriptor_t> = configs.iter().map(|d| d.0).collect();
    let mut got: i64 = 0;
    check(
        // SAFETY: `raw` holds `count` created engine-config descriptors for cuDNN to fill.
        unsafe {
            cs::cudnnBackendGetAttribute(
                heur.0,
                CUDNN_ATTR_ENGINEHEUR_RESULTS,
                CUDNN_TYPE_BACKEND_DESCRIPTOR,
                count,
                &mut got,
                raw.as_mut_ptr().cast(),
            )
        },
        "read heuristic results",
        op,
    )?;
    let mut last_err = None;
    let mut candidates = Vec::new();
    let wanted = tune::candidates();
    for (index, config) in configs.into_iter().take(got as usize).enumerate() {
        if candidates.len() == wanted {
            break;
        }
        let plan = Desc::new(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, op)?;
        plan.set(
            CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
            CUDNN_TYPE_HANDLE,
            &[handle],
            op,
        )?;
        plan.set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &config, op)?;
        match plan.finalize("execution plan", op) {
            Ok(()) => {
                let mut ws: i64 = 0;
                let mut n: i64 = 0;
                check(
                    // SAFETY: reads one int64 into `ws`.
                    unsafe {
                        cs::cudnnBackendGetAttribute(
                            plan.0,
                            CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                            CUDNN_TYPE_INT64,
                            1,
                            &mut n,
                            (&mut ws as *mut i64).cast(),
                        )
                    },
                    "workspace size",
                    op,
                )?;
                tracing::debug!(candidates = got, index, "cuDNN engine config finalised");
                candidates.push(Candidate {
                    plan,
                    workspace: ws.max(0) as usize,
                    _config: config,
                });
            }
            Err(e) => last_err = Some(e),
        }
    }
    if candidates.is_empty() {
        return Err(last_err.unwrap_or_else(|| CudaError::Unsupported {
            context: op(),
            reason: "no cuDNN engine config finalised".into(),
        }));
    }
    keep.push(heur);
    keep.push(graph);
    keep.extend(ops);
    keep.extend(tensors.into_values());
    Ok(Plan {
        candidates,
        chosen: OnceLock::new(),
        uids: g.variant_uids(),
        _graph: keep,
    })
}

/// The cached plan for `key` on `device` (built on first use), with the device's handle.
fn plan_for(
    device: &CudaDevice,
    key: &SdpaKey,
    op: &dyn Fn() -> OpContext,
) -> Result<(cs::cudnnHandle_t, Arc<Plan>)> {
    if !available() {
        return Err(missing());
    }
    let mut all = states().lock().unwrap_or_else(|p| p.into_inner());
    let state = match all.entry(device.ordinal()) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => {
            device.bind()?;
            let mut h: cs::cudnnHandle_t = std::ptr::null_mut();
            // SAFETY: `h` receives a new handle for the current context.
            check(unsafe { cs::cudnnCreate(&mut h) }, "cudnnCreate", op)?;
            check(
                // SAFETY: the device's stream lives as long as the device (the process).
                unsafe { cs::cudnnSetStream(h, device.cu_stream().cast()) },
                "cudnnSetStream",
                op,
            )?;
            e.insert(DeviceState {
                handle: Handle(h),
                plans: HashMap::new(),
            })
        }
    };
    if let Some(plan) = state.plans.get(key) {
        return Ok((state.handle.0, plan.clone()));
    }
    let graph = if key.backward {
        sdpa::backward_graph(key)
    } else {
        sdpa::forward_graph(key)
    };
    let started = std::time::Instant::now();
    let plan = Arc::new(build_plan(state.handle.0, &graph, op)?);
    tracing::debug!(
        ?key,
        ms = started.elapsed().as_millis() as u64,
        candidates = plan.candidates.len(),
        "cuDNN attention plan built"
    );
    state.plans.insert(key.clone(), plan.clone());
    Ok((state.handle.0, plan))
}

/// Executes `plan` for `key` with `pointers` (device addresses or, for by-value scalars, host
/// pointers) for its UIDs: the candidate chosen on its first execution (`tune.rs`).
///
/// `zeroed` are scratch tensors cudnn-frontend zeroes before every execution (the backward's
/// dQ accumulator): the heuristics' first plan writes them whole (`gpu_check` runs it on
/// poisoned memory, and no memset is spent on it), any other plan gets them zeroed first.
fn execute(
    device: &Arc<CudaDevice>,
    handle: cs::cudnnHandle_t,
    (key, plan): (&SdpaKey, &Plan),
    pointers: &HashMap<i64, *mut c_void>,
    zeroed: &[&CudaTensor],
    op: &dyn Fn() -> OpContext,
) -> Result<()> {
    let run = |index: usize| {
        if index > 0 {
            device.bind()?;
            for t in zeroed {
                let bytes = t.numel() * t.dtype().size_in_bytes();
                // SAFETY: a live contiguous scratch tensor of `bytes` bytes on this device,
                // written on its stream before the plan that reads it.
                unsafe {
                    cudarc::driver::result::memset_d8_async(
                        t.data_ptr(),
                        0,
                        bytes,
                        device.cu_stream(),
                    )
                }
                .ctx(op)?;
            }
        }
        execute_candidate(
            device,
            handle,
            &plan.candidates[index],
            &plan.uids,
            pointers,
            op,
        )
    };
    let index = match plan.chosen.get() {
        Some(&index) => index,
        None => {
            let index = tune::pick(device, &key.problem(), plan.candidates.len(), run);
            *plan.chosen.get_or_init(|| index)
        }
    };
    run(index)
}

/// Executes one candidate plan with a variant pack of `pointers` for `uids`.
fn execute_candidate(
    device: &Arc<CudaDevice>,
    handle: cs::cudnnHandle_t,
    plan: &Candidate,
    uids: &[i64],
    pointers: &HashMap<i64, *mut c_void>,
    op: &dyn Fn() -> OpContext,
) -> Result<()> {
    use cs::cudnnBackendAttributeName_t::*;
    use cs::cudnnBackendAttributeType_t::*;
    let workspace = if plan.workspace > 0 {
        Some(DeviceBuffer::alloc(device, plan.workspace)?)
    } else {
        None
    };
    let ws_ptr: *mut c_void = workspace
        .as_ref()
        .map_or(std::ptr::null_mut(), |b| b.ptr() as *mut c_void);
    let mut ptrs = Vec::with_capacity(uids.len());
    for uid in uids {
        ptrs.push(*pointers.get(uid).ok_or_else(|| {
            CudaError::invalid(op(), format!("cuDNN variant pack lacks UID {uid}"))
        })?);
    }
    let pack = Desc::new(
        cs::cudnnBackendDescriptorType_t::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR,
        op,
    )?;
    pack.set(
        CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
        CUDNN_TYPE_INT64,
        uids,
        op,
    )?;
    pack.set(
        CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
        CUDNN_TYPE_VOID_PTR,
        &ptrs,
        op,
    )?;
    pack.set(
        CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
        CUDNN_TYPE_VOID_PTR,
        &[ws_ptr],
        op,
    )?;
    pack.finalize("variant pack", op)?;
    device.bind()?;
    // SAFETY: every pointer refers to a live buffer of the size its tensor descriptor implies
    // (checked by the callers) or to a host scalar that outlives this call; the workspace lives
    // until after the queued work (stream-ordered free).
    let status = unsafe { cs::cudnnBackendExecute(handle, plan.plan.0, pack.0) };
    check(status, "execute", op)?;
    drop(workspace);
    Ok(())
}

/// Engine dtype → graph dtype (half types only: cuDNN's fused attention has no f32 path).
pub fn graph_dtype(dtype: DType) -> Option<Dt> {
    match dtype {
        DType::BF16 => Some(Dt::Bf16),
        DType::F16 => Some(Dt::F16),
        _ => None,
    }
}

/// `[b, h, s, d]` element strides of a tensor cuDNN can read in place: rank 4, unit stride
/// over the head dim, 16-byte aligned start and strides, no broadcast (stride 0) dims.
pub fn in_place_strides(t: &CudaTensor) -> Option<[i64; 4]> {
    if t.rank() != 4 {
        return None;
    }
    let s = t.strides();
    let elem = t.dtype().size_in_bytes() as i64;
    let ok_stride = |x: isize, dim: usize| x > 0 || t.shape()[dim] == 1;
    if s[3] != 1 || !(0..3).all(|i| ok_stride(s[i], i)) {
        return None;
    }
    let aligned = t.data_ptr().is_multiple_of(16) && (0..3).all(|i| (s[i] as i64 * elem) % 16 == 0);
    aligned.then(|| {
        let mut out = [0i64; 4];
        for i in 0..4 {
            // A size-1 dim's stride is arbitrary; give cuDNN a positive one.
            out[i] = if s[i] > 0 { s[i] as i64 } else { 1 };
        }
        out
    })
}

/// `t` itself when cuDNN can read it in place, else a contiguous copy.
fn readable(t: &CudaTensor) -> Result<(CudaTensor, [i64; 4])> {
    if let Some(s) = in_place_strides(t) {
        return Ok((t.clone(), s));
    }
    let c = t.contiguous()?;
    let s = in_place_strides(&c).ok_or_else(|| {
        CudaError::invalid(
            t.op("cuDNN attention"),
            "a contiguous copy is still not 16-byte aligned (head dim must be a multiple of 8)",
        )
    })?;
    Ok((c, s))
}

/// A fresh `[b, h, s, d]` tensor stored as `[b, s, h, d]` (what the model's head merge
/// reads as a view).
fn bshd(
    device: &Arc<CudaDevice>,
    b: usize,
    h: usize,
    s: usize,
    d: usize,
    dtype: DType,
) -> Result<CudaTensor> {
    CudaTensor::empty(device, &[b, s, h, d], dtype)?.swap_dims(1, 2)
}

fn ptr(t: &CudaTensor) -> *mut c_void {
    t.data_ptr() as *mut c_void
}

/// Attention problem sizes `[b, h, g, s_q, s_kv, d_qk, d_v]` read from q `[b, h, s_q, d_qk]`,
/// k `[b, g, s_kv, d_qk]` and v `[b, g, s_kv, d_v]`.
fn sizes(
    q: &CudaTensor,
    k: &CudaTensor,
    v: &CudaTensor,
    op: &dyn Fn() -> OpContext,
) -> Result<[usize; 7]> {
    let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
    let shapes_ok = qs.len() == 4
        && ks.len() == 4
        && vs.len() == 4
        && ks[..3] == vs[..3]
        && qs[0] == ks[0]
        && qs[3] == ks[3];
    if !shapes_ok {
        return Err(CudaError::invalid(
            op(),
            "expected q [b, h, s, d_qk], k [b, g, s_kv, d_qk], v [b, g, s_kv, d_v]",
        ));
    }
    if ks[1] == 0 || qs[1] % ks[1] != 0 {
        return Err(CudaError::invalid(
            op(),
            "query heads must be a multiple of key/value groups",
        ));
    }
    Ok([qs[0], qs[1], ks[1], qs[2], ks[2], qs[3], vs[3]])
}

/// Whether cuDNN's fused attention takes these inputs (dtype, head dims, cuDNN ≥ 9; with a
/// value head dim of its own, see [`head_dims_supported`]).
pub fn supports(q: &CudaTensor, k: &CudaTensor, v: &CudaTensor) -> bool {
    let dims_ok = q.rank() == 4
        && k.rank() == 4
        && v.rank() == 4
        && v.shape()[..3] == k.shape()[..3]
        && q.shape()[3] == k.shape()[3];
    dims_ok
        && graph_dtype(q.dtype()).is_some()
        && k.dtype() == q.dtype()
        && v.dtype() == q.dtype()
        && head_dims_supported(version(), q.device().arch(), q.shape()[3], v.shape()[3])
        && q.shape()[1].is_multiple_of(k.shape()[1].max(1))
}

/// The head dims cuDNN's fused attention serves here, forward and backward.
///
/// Equal query/key and value head dims: 64 and 128, the GPU-tested set since the first fused
/// attention (unchanged). A value head dim of its own (multi-latent attention: DeepSeek-V3's
/// d_qk 192, d_v 128) as cudnn-frontend's SDPA support checks admit it for bf16/f16
/// (`sdpa_support_surface.h`, `CompositeSDPABackwardNode::pre_validate_node`): both multiples
/// of 8 up to 256 on Hopper (sm_90), any mask or dropout; the backward of unequal head dims from
/// cuDNN 9.13 (on 9.11–9.12 the frontend refuses some pairs of d_qk in (128, 192] and d_v in
/// (64, 128]; its release 1.14.1 names a Hopper backward bug of such pairs introduced in 9.11
/// and fixed in 9.13). Everything else takes the composed path: other
/// architectures (Ampere's backward stops at 128, Blackwell's unequal head dims are 192/128
/// only), older cuDNN, dims that are no multiple of 8 (cuDNN's 16-byte alignment of 16-bit
/// rows). Without cuDNN the first call names what to install, as for equal head dims.
fn head_dims_supported(version: Option<usize>, arch: &str, d_qk: usize, d_v: usize) -> bool {
    if d_qk == d_v {
        return matches!(d_qk, 64 | 128);
    }
    let dim_ok = |d: usize| d > 0 && d <= 256 && d.is_multiple_of(8);
    dim_ok(d_qk) && dim_ok(d_v) && arch == "sm_90" && version.is_none_or(|v| v >= 91300)
}

/// Whether this cuDNN's fused attention takes `mask` with `dropout`: a sliding window from 9.2,
/// with dropout from 9.10.2 (cudnn-frontend's SDPA support checks). Without cuDNN, yes: the first
/// call then names what to install.
pub fn supports_mask(mask: SdpaMask, dropout: f64) -> bool {
    mask_supported_by(version(), mask, dropout)
}

fn mask_supported_by(version: Option<usize>, mask: SdpaMask, dropout: f64) -> bool {
    match version {
        Some(v) if mask.window.is_some() => v >= 90200 && (dropout == 0.0 || v >= 91002),
        _ => true,
    }
}

/// What the forward produced and the backward needs.
#[derive(Debug, Clone)]
pub struct SdpaForward {
    /// `[b, h, s, d_v]` stored as `[b, s, h, d_v]`.
    pub output: CudaTensor,
    /// `[b, h, s, 1]` f32.
    pub stats: CudaTensor,
    /// (seed, offset) of the dropout generator.
    pub rng: [u64; 2],
}

/// The dropout seed and offset as device int64 scalars, written by a fill kernel (the value
/// travels in the launch parameters): an upload from pageable host memory would synchronise the
/// stream, twice per layer and step.
fn seed_offset(device: &Arc<CudaDevice>, rng: [u64; 2]) -> Result<(CudaTensor, CudaTensor)> {
    let fill = |v: u64| full(device, &[1, 1, 1, 1], Scalar::Int(v as i64), DType::I64);
    Ok((fill(rng[0])?, fill(rng[1])?))
}

/// Fused attention forward: `softmax(scale·q·kᵀ (+ causal mask, sliding window)) (dropout) · v`.
pub fn sdpa_forward(
    q: &CudaTensor,
    k: &CudaTensor,
    v: &CudaTensor,
    mask: SdpaMask,
    scale: f32,
    dropout: f32,
) -> Result<SdpaForward> {
    let op = || {
        OpContext::new("cuDNN attention forward")
            .shape(q.shape())
            .shape(k.shape())
            .dtype(q.dtype())
    };
    let [b, h, g, sq, skv, d, dv] = sizes(q, k, v, &op)?;
    let dt = graph_dtype(q.dtype())
        .ok_or_else(|| CudaError::unsupported(op(), "cuDNN attention needs bf16 or f16"))?;
    let device = q.device();
    let (q, q_s) = readable(q)?;
    let (k, k_s) = readable(k)?;
    let (v, v_s) = readable(v)?;
    let out = bshd(device, b, h, sq, dv, q.dtype())?;
    let o_s = in_place_strides(&out).expect("fresh output is aligned");
    let stats = CudaTensor::empty(device, &[b, h, sq, 1], DType::F32)?;
    let key = SdpaKey {
        backward: false,
        batch: b as i64,
        heads: h as i64,
        groups: g as i64,
        seq_q: sq as i64,
        seq_kv: skv as i64,
        head_dim: d as i64,
        value_dim: dv as i64,
        dtype: dt,
        mask,
        dropout_bits: if dropout > 0.0 { dropout.to_bits() } else { 0 },
        strides: vec![q_s, k_s, v_s, o_s],
    };
    let (handle, plan) = plan_for(device, &key, &op)?;
    let rng = if dropout > 0.0 {
        let (seed, offset) = device.next_rng_offset((b * h * sq * skv) as u64);
        [seed, offset]
    } else {
        [0, 0]
    };
    let mut scalars = [
        scale,
        f32::NEG_INFINITY,
        1.0 / (1.0 - dropout),
        1.0 - dropout,
        1.0,
        mask.left_bound().unwrap_or(0.0),
    ];
    let mut pointers: HashMap<i64, *mut c_void> = HashMap::new();
    pointers.insert(sdpa::Q, ptr(&q));
    pointers.insert(sdpa::K, ptr(&k));
    pointers.insert(sdpa::V, ptr(&v));
    pointers.insert(sdpa::O, ptr(&out));
    pointers.insert(sdpa::STATS, ptr(&stats));
    pointers.insert(sdpa::SCALE, (&mut scalars[0] as *mut f32).cast());
    pointers.insert(sdpa::NEG_INF, (&mut scalars[1] as *mut f32).cast());
    pointers.insert(sdpa::DROPOUT_SCALE, (&mut scalars[2] as *mut f32).cast());
    pointers.insert(sdpa::LEFT_BOUND, (&mut scalars[5] as *mut f32).cast());
    let rng_tensors = if dropout > 0.0 {
        Some(seed_offset(device, rng)?)
    } else {
        None
    };
    if let Some((seed, offset)) = &rng_tensors {
        pointers.insert(sdpa::SEED, ptr(seed));
        pointers.insert(sdpa::OFFSET, ptr(offset));
    }
    let _timer = crate::engine::timing::scope(device, "attention_fwd(cudnn)");
    execute(device, handle, (&key, &plan), &pointers, &[], &op)?;
    Ok(SdpaForward {
        output: out,
        stats,
        rng,
    })
}

/// Fused attention backward: (dq, dk, dv) from the forward's saved state and dO.
#[allow(clippy::too_many_arguments)]
pub fn sdpa_backward(
    q: &CudaTensor,
    k: &CudaTensor,
    v: &CudaTensor,
    saved: &SdpaForward,
    grad: &CudaTensor,
    mask: SdpaMask,
    scale: f32,
    dropout: f32,
) -> Result<(CudaTensor, CudaTensor, CudaTensor)> {
    let op = || OpContext::new("cuDNN attention backward").shape(q.shape());
    let [b, h, g, sq, skv, d, d_v] = sizes(q, k, v, &op)?;
    let device = q.device();
    let dq = bshd(device, b, h, sq, d, q.dtype())?;
    let dk = bshd(device, b, g, skv, d, q.dtype())?;
    let dv = bshd(device, b, g, skv, d_v, q.dtype())?;
    let grads = [dq, dk, dv];
    sdpa_backward_into(q, k, v, saved, grad, mask, scale, dropout, &grads)?;
    let [dq, dk, dv] = grads;
    Ok((dq, dk, dv))
}

/// [`sdpa_backward`] writing dq, dk and dv into the given `[b, h, s, d_qk]` /
/// `[b, g, s_kv, d_qk]` / `[b, g, s_kv, d_v]` views (any strides cuDNN can write in place: unit
/// head-dim stride, 16-byte aligned), e.g. the slots of one packed gradient.
#[allow(clippy::too_many_arguments)]
pub fn sdpa_backward_into(
    q: &CudaTensor,
    k: &CudaTensor,
    v: &CudaTensor,
    saved: &SdpaForward,
    grad: &CudaTensor,
    mask: SdpaMask,
    scale: f32,
    dropout: f32,
    grads: &[CudaTensor; 3],
) -> Result<()> {
    let op = || {
        OpContext::new("cuDNN attention backward")
            .shape(q.shape())
            .shape(k.shape())
            .dtype(q.dtype())
    };
    let [b, h, g, sq, skv, d, d_v] = sizes(q, k, v, &op)?;
    let dt = graph_dtype(q.dtype())
        .ok_or_else(|| CudaError::unsupported(op(), "cuDNN attention needs bf16 or f16"))?;
    let device = q.device();
    let (q, q_s) = readable(q)?;
    let (k, k_s) = readable(k)?;
    let (v, v_s) = readable(v)?;
    let (o, o_s) = readable(&saved.output)?;
    let grad = if grad.dtype() == q.dtype() {
        grad.clone()
    } else {
        grad.cast(q.dtype())?
    };
    let (d_o, do_s) = readable(&grad)?;
    let [dq, dk, dv] = grads;
    let expected = [[b, h, sq, d], [b, g, skv, d], [b, g, skv, d_v]];
    let mut strides = [[0i64; 4]; 3];
    for ((t, shape), stride) in [dq, dk, dv].iter().zip(expected).zip(&mut strides) {
        *stride = match in_place_strides(t) {
            Some(s) if t.shape() == shape && t.dtype() == q.dtype() => s,
            _ => {
                return Err(CudaError::invalid(
                    op().shape(t.shape()),
                    "a gradient output is not a writable view of the expected shape and dtype",
                ));
            }
        };
    }
    let softmax_sum = CudaTensor::empty(device, &[b, h, sq, 1], DType::F32)?;
    let accum = CudaTensor::empty(device, &[b, h, sq, d], DType::F32)?;
    let key = SdpaKey {
        backward: true,
        batch: b as i64,
        heads: h as i64,
        groups: g as i64,
        seq_q: sq as i64,
        seq_kv: skv as i64,
        head_dim: d as i64,
        value_dim: d_v as i64,
        dtype: dt,
        mask,
        dropout_bits: if dropout > 0.0 { dropout.to_bits() } else { 0 },
        strides: vec![q_s, k_s, v_s, o_s, do_s, strides[0], strides[1], strides[2]],
    };
    let (handle, plan) = plan_for(device, &key, &op)?;
    let mut scalars = [
        scale,
        f32::NEG_INFINITY,
        1.0 / (1.0 - dropout),
        1.0 - dropout,
        1.0,
        mask.left_bound().unwrap_or(0.0),
    ];
    let mut pointers: HashMap<i64, *mut c_void> = HashMap::new();
    for (uid, t) in [
        (sdpa::Q, &q),
        (sdpa::K, &k),
        (sdpa::V, &v),
        (sdpa::O, &o),
        (sdpa::D_O, &d_o),
        (sdpa::D_Q, dq),
        (sdpa::D_K, dk),
        (sdpa::D_V, dv),
        (sdpa::STATS, &saved.stats),
        (sdpa::SOFTMAX_SUM, &softmax_sum),
        (sdpa::DQ_ACCUM, &accum),
    ] {
        pointers.insert(uid, ptr(t));
    }
    pointers.insert(sdpa::SCALE, (&mut scalars[0] as *mut f32).cast());
    pointers.insert(sdpa::NEG_INF, (&mut scalars[1] as *mut f32).cast());
    pointers.insert(sdpa::DROPOUT_SCALE, (&mut scalars[2] as *mut f32).cast());
    pointers.insert(sdpa::DROPOUT_KEEP, (&mut scalars[3] as *mut f32).cast());
    pointers.insert(sdpa::ONE, (&mut scalars[4] as *mut f32).cast());
    pointers.insert(sdpa::LEFT_BOUND, (&mut scalars[5] as *mut f32).cast());
    let rng_tensors = if dropout > 0.0 {
        Some(seed_offset(device, saved.rng)?)
    } else {
        None
    };
    if let Some((seed, offset)) = &rng_tensors {
        pointers.insert(sdpa::SEED, ptr(seed));
        pointers.insert(sdpa::OFFSET, ptr(offset));
    }
    let _timer = crate::engine::timing::scope(device, "attention_bwd(cudnn)");
    execute(device, handle, (&key, &plan), &pointers, &[&accum], &op)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sliding_window_needs_cudnn_9_2_and_with_dropout_9_10_2() {
        let window = SdpaMask {
            causal: true,
            window: Some(4095),
        };
        let causal = SdpaMask {
            window: None,
            ..window
        };
        assert!(mask_supported_by(Some(90100), causal, 0.1));
        assert!(!mask_supported_by(Some(90100), window, 0.0));
        assert!(mask_supported_by(Some(90200), window, 0.0));
        assert!(!mask_supported_by(Some(91001), window, 0.1));
        // The GPU machine's cuDNN.
        assert!(mask_supported_by(Some(91900), window, 0.1));
        assert!(mask_supported_by(None, window, 0.1));
    }

    #[test]
    fn equal_head_dims_keep_64_and_128_everywhere() {
        for arch in ["sm_80", "sm_90"] {
            assert!(head_dims_supported(Some(90100), arch, 64, 64));
            assert!(head_dims_supported(Some(91900), arch, 128, 128));
            assert!(!head_dims_supported(Some(91900), arch, 96, 96));
            assert!(!head_dims_supported(Some(91900), arch, 192, 192));
        }
    }

    #[test]
    fn a_value_head_dim_of_its_own_needs_hopper_and_cudnn_9_13() {
        // DeepSeek-V3's MLA on the GPU machine's cuDNN.
        assert!(head_dims_supported(Some(91900), "sm_90", 192, 128));
        assert!(head_dims_supported(Some(91900), "sm_90", 96, 64));
        assert!(head_dims_supported(Some(91900), "sm_90", 48, 32));
        assert!(head_dims_supported(Some(91900), "sm_90", 256, 8));
        assert!(head_dims_supported(None, "sm_90", 192, 128));
        // The backward of unequal head dims before 9.13, other architectures.
        assert!(!head_dims_supported(Some(91200), "sm_90", 192, 128));
        assert!(!head_dims_supported(Some(91900), "sm_80", 192, 128));
        assert!(!head_dims_supported(Some(91900), "sm_100", 96, 64));
        // Past 256, or no multiple of 8 (16-byte rows).
        assert!(!head_dims_supported(Some(91900), "sm_90", 264, 128));
        assert!(!head_dims_supported(Some(91900), "sm_90", 192, 100));
        assert!(!head_dims_supported(Some(91900), "sm_90", 36, 24));
    }
}
