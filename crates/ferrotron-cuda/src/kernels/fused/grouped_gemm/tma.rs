//! The launches of Hopper's warp-specialised grouped GEMM (`grouped_gemm_sm90_tma.cu`): the
//! tensor maps its Tensor Memory Accelerator loads through, and a persistent grid of one block
//! an SM.
//!
//! Why the maps travel by value: since CUDA 12.1 a kernel takes up to 32,764 bytes of
//! parameters, which hold the routed rows' map and one 128-byte map per expert's weight (up to
//! [`MAX_GROUPS`]), so no upload precedes a launch and the experts' own tensors need no stack.
//! A map is a pure function of its address, shape and box, so the weights' maps (the same
//! addresses every step) are encoded once and kept; the activations' (new buffers each call)
//! are encoded per launch, two at most.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, PoisonError};

use cudarc::driver::sys;

use super::{GroupedGemm, Kernel, Product};
use crate::engine::dtype::DType;
use crate::engine::launch::{Params, launch};
use crate::engine::tensor::CudaTensor;
use crate::error::{DriverResultExt, OpContext, Result};

/// Groups the TMA kernel takes: its maps and 16 scalar words within the parameters' 32,764 bytes.
pub(super) const MAX_GROUPS: usize = 252;
const _: () = assert!((2 + MAX_GROUPS) * MAP_BYTES <= 32_764);

const MAP_BYTES: usize = 128;
/// Threads a block: the producer warpgroup and two consumers.
const THREADS: u32 = 384;
/// The kernel's scalar words before its maps (128 bytes, so the maps are aligned).
const SCALARS: usize = 16;
/// Encoded maps kept at most (a model's experts' weights in each box shape, with room).
const CACHED_MAPS: usize = 1 << 16;

/// A row-major `[outer, inner]` matrix of 16-bit or 8-bit elements, `stride` elements a row,
/// cut into boxes of 128 bytes (the swizzle's span) by `box_outer` rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct MapKey {
    address: u64,
    dtype: DType,
    inner: u64,
    outer: u64,
    stride: u64,
    box_outer: u32,
}

/// The swizzle's span, a box's width in bytes.
const BOX_BYTES: usize = 128;

static MAPS: LazyLock<Mutex<HashMap<MapKey, [u64; 16]>>> = LazyLock::new(Mutex::default);

impl MapKey {
    /// `[rows, cols]` `t` (its columns contiguous, its rows `strides[0]` apart) in boxes of
    /// 128 bytes × `box_rows` rows.
    fn of(t: &CudaTensor, box_rows: usize) -> Self {
        let (rows, cols, stride) = match (t.shape(), t.strides()) {
            (&[rows, cols], &[stride, _]) => (rows, cols, stride.max(0) as usize),
            _ => (0, 0, 0),
        };
        MapKey {
            address: t.data_ptr(),
            dtype: t.dtype(),
            inner: cols as u64,
            outer: rows as u64,
            stride: stride as u64,
            box_outer: box_rows as u32,
        }
    }

    /// The encoded map: 128-byte swizzle, zeros out of bounds, L2 promotion of 256 bytes.
    fn encode(&self, op: &OpContext) -> Result<[u64; 16]> {
        let dtype = match self.dtype {
            DType::BF16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            DType::U8 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            _ => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        };
        let size = self.dtype.size_in_bytes();
        let dims = [self.inner, self.outer];
        let strides = [self.stride * size as u64];
        let boxes = [(BOX_BYTES / size) as u32, self.box_outer];
        let element_strides = [1u32, 1];
        let mut map = sys::CUtensorMap { opaque: [0; 16] };
        // SAFETY: every pointer is to a live local array of the length a rank-2 map reads
        // (dims 2, strides 1, boxes 2, element strides 2); the driver only writes `map`.
        unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                dtype,
                2,
                self.address as *mut std::ffi::c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                boxes.as_ptr(),
                element_strides.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        }
        .result()
        .ctx(|| op.clone())?;
        Ok(map.opaque)
    }

    /// [`Self::encode`], kept for the next launch over the same matrix.
    fn cached(&self, op: &OpContext) -> Result<[u64; 16]> {
        let mut maps = MAPS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(map) = maps.get(self) {
            return Ok(*map);
        }
        let map = self.encode(op)?;
        if maps.len() >= CACHED_MAPS {
            maps.clear();
        }
        maps.insert(*self, map);
        Ok(map)
    }
}

/// fp8 operands' inverse scales: A's `[1]`, B's `[groups]` (`b_step` 1) or `[1]` (0).
#[derive(Debug, Clone, Copy)]
pub(super) struct Scales<'a> {
    pub(super) a: &'a CudaTensor,
    pub(super) b: &'a CudaTensor,
    pub(super) b_step: i64,
}

/// The 16 scalar words the kernel's parameters start with.
fn scalars(
    out: &CudaTensor,
    counts: &CudaTensor,
    [n_tiles, k_tiles, k, ldc]: [usize; 4],
    scales: Option<Scales<'_>>,
) -> Params {
    let mut params = Params::new();
    params
        .ptr(out.data_ptr())
        .ptr(counts.data_ptr())
        .ints([n_tiles, k_tiles, k, ldc].map(|v| v as i64));
    match scales {
        Some(scales) => params
            .ptr(scales.a.data_ptr())
            .ptr(scales.b.data_ptr())
            .int(scales.b_step),
        None => params.padded(&[], 3),
    };
    params.padded(&[], SCALARS - 9);
    params
}

fn push_map(params: &mut Params, map: [u64; 16]) {
    for word in map {
        params.ptr(word);
    }
}

/// The forward or input gradient: `a [rows, inner]` against each group's weight (`[k, n]`;
/// fp8: `[out_cols, inner]`) into `out [rows, out_cols]`, the tiles walked by one block an SM.
pub(super) fn rows_product(
    spec: &GroupedGemm,
    a: &CudaTensor,
    weights: &[CudaTensor],
    counts: &CudaTensor,
    out: &CudaTensor,
    scales: Option<Scales<'_>>,
    op: &OpContext,
) -> Result<()> {
    let (&[rows, inner], &[_, out_cols]) = (a.shape(), out.shape()) else {
        return Err(crate::error::CudaError::invalid(op.clone(), "2-D operands"));
    };
    let n_tiles = out_cols / spec.tile_cols;
    let spec = &paired(spec, n_tiles);
    // a K-major weight (fp8, the input gradient): a tile's columns' rows of the reduction; the
    // forward's MN-major one: 64 reduction rows
    let weight_box = if spec.fp8.is_some() || spec.product == Product::InputGrad {
        spec.tile_cols
    } else {
        64
    };
    // a cluster's blocks load half the row tile each
    let a_box = if spec.kernel == Kernel::HopperTmaCluster {
        64
    } else {
        128
    };
    let step = BOX_BYTES / a.dtype().size_in_bytes();
    let mut params = scalars(out, counts, [n_tiles, inner / step, 0, out_cols], scales);
    push_map(&mut params, MapKey::of(a, a_box).encode(op)?);
    for weight in weights {
        push_map(&mut params, MapKey::of(weight, weight_box).cached(op)?);
    }
    let upper = (rows.div_ceil(128) + spec.groups) * n_tiles;
    launch_persistent(a, spec, upper, &params, op)
}

/// The weight gradient: `x [rows, k]ᵀ · dy [rows, n]` over each group's rows into
/// `out [groups, k, n]`; fp8: from `xᵀ [k, rows]` and `dyᵀ [n, rows]`.
pub(super) fn weight_grad(
    spec: &GroupedGemm,
    x: &CudaTensor,
    grad_output: &CudaTensor,
    counts: &CudaTensor,
    out: &CudaTensor,
    scales: Option<Scales<'_>>,
    op: &OpContext,
) -> Result<()> {
    let (k, n) = match (spec.fp8, x.shape(), grad_output.shape()) {
        (Some(_), &[k, _], &[n, _]) | (None, &[_, k], &[_, n]) => (k, n),
        _ => return Err(crate::error::CudaError::invalid(op.clone(), "2-D operands")),
    };
    let n_tiles = n / spec.tile_cols;
    let spec = &paired(spec, n_tiles);
    let mut params = scalars(out, counts, [n_tiles, 0, k, n], scales);
    let (a_box, b_box) = match spec.fp8 {
        // K-major: a tile's rows (a cluster's blocks half of them each) of 128 bytes
        Some(_) if spec.kernel == Kernel::HopperTmaCluster => (64, spec.tile_cols),
        Some(_) => (128, spec.tile_cols),
        // MN-major: 64 reduction rows of 64 columns
        None => (64, 64),
    };
    push_map(&mut params, MapKey::of(x, a_box).encode(op)?);
    push_map(&mut params, MapKey::of(grad_output, b_box).encode(op)?);
    let upper = spec.groups * (k / 128) * n_tiles;
    launch_persistent(x, spec, upper, &params, op)
}

/// The cluster kernel where the output's `n_tiles` column tiles pair up, else the single-block
/// one.
fn paired(spec: &GroupedGemm, n_tiles: usize) -> GroupedGemm {
    let mut spec = spec.clone();
    if spec.kernel == Kernel::HopperTmaCluster && !n_tiles.is_multiple_of(2) {
        spec.kernel = Kernel::HopperTma;
    }
    spec
}

/// One block an SM, at most one a tile; whole clusters of two for the cluster kernel.
fn launch_persistent(
    on: &CudaTensor,
    spec: &GroupedGemm,
    tiles: usize,
    params: &Params,
    op: &OpContext,
) -> Result<()> {
    let sms = on.device().multiprocessors();
    let grid = if spec.kernel == Kernel::HopperTmaCluster {
        (tiles.min(sms) & !1).max(2)
    } else {
        tiles.clamp(1, sms)
    };
    launch(on.device(), spec, grid as u32, THREADS, params, &|| {
        op.clone()
    })
}
