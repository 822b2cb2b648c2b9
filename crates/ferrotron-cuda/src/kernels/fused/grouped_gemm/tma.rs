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

use super::{GroupedGemm, Kernel, Product, TILE};
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
        Self::new(t.data_ptr(), t.dtype(), t.shape(), t.strides(), box_rows)
    }

    fn new(
        address: u64,
        dtype: DType,
        shape: &[usize],
        strides: &[isize],
        box_rows: usize,
    ) -> Self {
        let (rows, cols, stride) = match (shape, strides) {
            (&[rows, cols], &[stride, _]) => (rows, cols, stride.max(0) as usize),
            _ => (0, 0, 0),
        };
        MapKey {
            address,
            dtype,
            inner: cols as u64,
            outer: rows as u64,
            stride: stride as u64,
            box_outer: box_rows as u32,
        }
    }

    /// The box in elements (128 bytes wide) and the rows' stride in bytes, as the driver takes
    /// them.
    fn box_and_stride(&self) -> ([u32; 2], u64) {
        let size = self.dtype.size_in_bytes();
        (
            [(BOX_BYTES / size) as u32, self.box_outer],
            self.stride * size as u64,
        )
    }

    /// The encoded map: 128-byte swizzle, zeros out of bounds, L2 promotion of 256 bytes.
    fn encode(&self, op: &OpContext) -> Result<[u64; 16]> {
        let dtype = match self.dtype {
            DType::BF16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            DType::U8 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            _ => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        };
        let dims = [self.inner, self.outer];
        let (boxes, stride) = self.box_and_stride();
        let strides = [stride];
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

/// fp8 operands' inverse scales (device addresses): A's `[1]`, B's `[groups]` (`b_step` 1) or
/// `[1]` (0).
#[derive(Debug, Clone, Copy)]
pub(super) struct Scales {
    pub(super) a: u64,
    pub(super) b: u64,
    pub(super) b_step: i64,
}

/// The 16 scalar words the kernel's parameters start with (`out` and `counts` device
/// addresses), in the order of the C `Params`.
fn scalars(
    out: u64,
    counts: u64,
    [n_tiles, k_tiles, k, ldc]: [usize; 4],
    scales: Option<Scales>,
) -> Params {
    let mut params = Params::new();
    params
        .ptr(out)
        .ptr(counts)
        .ints([n_tiles, k_tiles, k, ldc].map(|v| v as i64));
    match scales {
        Some(scales) => params.ptr(scales.a).ptr(scales.b).int(scales.b_step),
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
    scales: Option<Scales>,
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
    let mut params = scalars(
        out.data_ptr(),
        counts.data_ptr(),
        [n_tiles, inner / step, 0, out_cols],
        scales,
    );
    push_map(&mut params, MapKey::of(a, a_box).encode(op)?);
    for weight in weights {
        push_map(&mut params, MapKey::of(weight, weight_box).cached(op)?);
    }
    let upper = (rows.div_ceil(TILE) + spec.groups) * n_tiles;
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
    scales: Option<Scales>,
    op: &OpContext,
) -> Result<()> {
    let (k, n) = match (spec.fp8, x.shape(), grad_output.shape()) {
        (Some(_), &[k, _], &[n, _]) | (None, &[_, k], &[_, n]) => (k, n),
        _ => return Err(crate::error::CudaError::invalid(op.clone(), "2-D operands")),
    };
    let n_tiles = n / spec.tile_cols;
    let spec = &paired(spec, n_tiles);
    let mut params = scalars(
        out.data_ptr(),
        counts.data_ptr(),
        [n_tiles, 0, k, n],
        scales,
    );
    let (a_box, b_box) = match spec.fp8 {
        // K-major: a tile's rows (a cluster's blocks half of them each) of 128 bytes
        Some(_) if spec.kernel == Kernel::HopperTmaCluster => (64, spec.tile_cols),
        Some(_) => (128, spec.tile_cols),
        // MN-major: 64 reduction rows of 64 columns
        None => (64, 64),
    };
    push_map(&mut params, MapKey::of(x, a_box).encode(op)?);
    push_map(&mut params, MapKey::of(grad_output, b_box).encode(op)?);
    let upper = spec.groups * (k / TILE) * n_tiles;
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
fn grid(kernel: Kernel, tiles: usize, sms: usize) -> u32 {
    let blocks = if kernel == Kernel::HopperTmaCluster {
        (tiles.min(sms) & !1).max(2)
    } else {
        tiles.clamp(1, sms)
    };
    blocks as u32
}

fn launch_persistent(
    on: &CudaTensor,
    spec: &GroupedGemm,
    tiles: usize,
    params: &Params,
    op: &OpContext,
) -> Result<()> {
    let grid = grid(spec.kernel, tiles, on.device().multiprocessors());
    launch(on.device(), spec, grid, THREADS, params, &|| op.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The C `Params` of `grouped_gemm_sm90_tma.cu`: its 8-byte scalars before the first map,
    /// counted from the declarations (`a, b;` two, `x[7];` seven).
    fn template_scalars() -> usize {
        let source = include_str!("../grouped_gemm_sm90_tma.cu");
        let body = source
            .split("struct __align__(128) Params {")
            .nth(1)
            .and_then(|rest| rest.split("TensorMap a;").next())
            .expect("the template declares Params with the map a");
        body.lines()
            .map(|line| line.split("//").next().unwrap_or("").trim())
            .filter(|code| !code.is_empty())
            .map(|declaration| match declaration.split_once('[') {
                Some((_, count)) => count
                    .trim_end_matches("];")
                    .parse::<usize>()
                    .expect("an array length"),
                None => declaration.matches(',').count() + 1,
            })
            .sum()
    }

    #[test]
    fn the_scalars_fill_the_c_params_before_its_maps() {
        assert_eq!(template_scalars(), SCALARS);
        let plain = scalars(1, 2, [3, 4, 5, 6], None);
        assert_eq!(
            plain.words(),
            &[1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        let scales = Scales {
            a: 7,
            b: 8,
            b_step: 1,
        };
        let fp8 = scalars(1, 2, [3, 4, 5, 6], Some(scales));
        assert_eq!(fp8.words()[6..10], [7, 8, 1, 0]);
        assert_eq!(fp8.words().len() * 8, MAP_BYTES);
    }

    #[test]
    fn boxes_are_128_bytes_wide_and_strides_in_bytes() {
        let bf16 = MapKey::new(0x1000, DType::BF16, &[1000, 256], &[256, 1], 128);
        assert_eq!(bf16.box_and_stride(), ([64, 128], 512));
        // an fp8 transposed operand: a view of rows padded to 16 bytes
        let fp8 = MapKey::new(0x1000, DType::U8, &[256, 1475], &[1488, 1], 64);
        assert_eq!((fp8.inner, fp8.outer), (1475, 256));
        assert_eq!(fp8.box_and_stride(), ([128, 64], 1488));
    }

    #[test]
    fn clusters_take_whole_pairs_and_odd_column_tiles_one_block() {
        assert_eq!(grid(Kernel::HopperTmaCluster, 1000, 132), 132);
        assert_eq!(grid(Kernel::HopperTmaCluster, 7, 132), 6);
        assert_eq!(grid(Kernel::HopperTmaCluster, 1, 132), 2);
        assert_eq!(grid(Kernel::HopperTma, 7, 132), 7);
        assert_eq!(grid(Kernel::HopperTma, 0, 132), 1);
        let spec = |kernel| GroupedGemm {
            dtype: DType::BF16,
            groups: 8,
            product: Product::Forward,
            kernel,
            tile_cols: 256,
            fp8: None,
        };
        assert_eq!(
            paired(&spec(Kernel::HopperTmaCluster), 6).kernel,
            Kernel::HopperTmaCluster
        );
        assert_eq!(
            paired(&spec(Kernel::HopperTmaCluster), 3).kernel,
            Kernel::HopperTma
        );
        assert_eq!(
            paired(&spec(Kernel::HopperTma), 6).kernel,
            Kernel::HopperTma
        );
    }
}
