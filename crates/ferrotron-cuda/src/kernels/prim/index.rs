//! Indexing: gather, scatter (add / or / assign), select, select-assign, slice-assign, cat,
//! repeat.
//!
//! Two kernels do all of it. `gather` reads `input[..., idx[...], ...]` along one dim for every
//! element of a strided index tensor; `scatter` writes values the same way into a fresh copy.
//! `select` (index_select) is a gather whose 1-D index is broadcast (stride 0) across the other
//! dims, `select_assign` the matching scatter; slice-assign, cat and repeat are strided copies.
//! Out-of-range indices cannot be reported without a host round trip, so they read as zero
//! and are skipped on writes (never an out-of-bounds access).

use crate::engine::dtype::DType;
use crate::engine::launch::{BLOCK, Params, grid_for, launch};
use crate::engine::layout::{MAX_RANK, SliceArg};
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};
use crate::kernels::prim::elementwise::copy_into;
use crate::kernels::template::{Hole, template};

/// How scattered values combine with what is already there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScatterReduce {
    /// Atomic add (sum of all values landing on an element).
    Add,
    /// Logical or (bool tensors: burn's `scatter_or` / `select_or`).
    Or,
    /// Plain store (which value wins among duplicates is unspecified).
    Assign,
}

/// Everything that determines one generated gather kernel.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GatherSpec {
    pub dtype: DType,
    pub index: DType,
    pub rank: usize,
}

/// Everything that determines one generated scatter kernel.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ScatterSpec {
    pub dtype: DType,
    pub index: DType,
    pub rank: usize,
    pub reduce: ScatterReduce,
}

/// The holes both kernels of `index.cu` fill.
fn index_holes(dtype: DType, index: DType, rank: usize) -> Vec<(&'static str, Hole<'static>)> {
    vec![
        ("DTYPE_NAME", Hole::Name(dtype)),
        ("INDEX_NAME", Hole::Name(index)),
        ("RANK", Hole::Int(rank as i64)),
        ("HALF", Hole::Flag(dtype.needs_half_headers())),
        ("T", Hole::Storage(dtype)),
        ("INDEX", Hole::Storage(index)),
        ("LOAD_INDEX", Hole::code(index.load_expr("idx[ioff]"))),
    ]
}

impl GatherSpec {
    /// `other` is the contiguous output; `data` the gathered input.
    pub fn source(&self) -> String {
        let mut holes = index_holes(self.dtype, self.index, self.rank);
        holes.push(("GATHER", Hole::Flag(true)));
        holes.push(("ZERO", Hole::code(self.dtype.store_expr("0"))));
        template!("index.cu").fill(&holes)
    }
}

impl ScatterSpec {
    /// `data` is the destination (a fresh contiguous copy); `other` the values.
    pub fn source(&self) -> String {
        let (reduce, dtype) = (self.reduce, self.dtype);
        let assign = reduce == ScatterReduce::Assign;
        let or =
            reduce == ScatterReduce::Or || (reduce == ScatterReduce::Add && dtype == DType::Bool);
        let add_i64 = reduce == ScatterReduce::Add && dtype == DType::I64;
        let add = !(assign || or || add_i64);
        let mut holes = index_holes(dtype, self.index, self.rank);
        holes.extend([
            ("GATHER", Hole::Flag(false)),
            ("REDUCE", Hole::code(format!("{reduce:?}"))),
            ("ASSIGN", Hole::Flag(assign)),
            ("OR", Hole::Flag(or)),
            ("ADD_I64", Hole::Flag(add_i64)),
            ("ADD", Hole::Flag(add)),
        ]);
        template!("index.cu").fill(&holes)
    }
}

fn check_index(op: &str, x: &CudaTensor, dim: usize, indices: &CudaTensor) -> Result<()> {
    if dim >= x.rank() {
        return Err(CudaError::invalid(
            x.op(op),
            format!("dim {dim} out of range"),
        ));
    }
    if !matches!(indices.dtype(), DType::I64 | DType::I32) {
        return Err(CudaError::invalid(
            indices.op(op),
            "indices must be an i64 or i32 tensor",
        ));
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn index_params(
    n: usize,
    dim: usize,
    dim_size: usize,
    shape: &[usize],
    data: (&[isize], usize, u64),
    idx: (&[isize], usize, u64),
    other: (&[isize], usize, u64),
) -> Params {
    let r = shape.len();
    let to_i = |s: &[isize]| s.iter().map(|&x| x as i64).collect::<Vec<_>>();
    let mut p = Params::new();
    p.int(n as i64).int(dim as i64).int(dim_size as i64);
    p.ints(shape.iter().map(|&d| d as i64));
    p.padded(&to_i(data.0), r)
        .padded(&to_i(idx.0), r)
        .padded(&to_i(other.0), r);
    p.int(data.1 as i64).int(idx.1 as i64).int(other.1 as i64);
    p.ptr(data.2).ptr(idx.2).ptr(other.2);
    p
}

/// `out[..., i, ...] = x[..., indices[..., i, ...], ...]` along `dim`; output has the
/// indices' shape (burn's `gather`).
pub fn gather(x: &CudaTensor, dim: usize, indices: &CudaTensor) -> Result<CudaTensor> {
    check_index("gather", x, dim, indices)?;
    if indices.rank() != x.rank() {
        return Err(CudaError::invalid(
            OpContext::new("gather")
                .shape(x.shape())
                .shape(indices.shape()),
            "indices must have the input's rank",
        ));
    }
    let out = CudaTensor::empty(x.device(), indices.shape(), x.dtype())?;
    let n = out.numel();
    if n == 0 {
        return Ok(out);
    }
    let rank = x.rank().max(1);
    let spec = GatherSpec {
        dtype: x.dtype(),
        index: indices.dtype(),
        rank,
    };
    let shape = if x.rank() == 0 {
        vec![1]
    } else {
        indices.shape().to_vec()
    };
    let p = index_params(
        n,
        dim,
        x.shape()[dim],
        &shape,
        (x.strides(), x.offset(), x.buffer_ptr()),
        (indices.strides(), indices.offset(), indices.buffer_ptr()),
        (out.strides(), out.offset(), out.buffer_ptr()),
    );
    launch(
        x.device(),
        &spec,
        grid_for(n as u64, BLOCK),
        BLOCK,
        &p,
        &|| x.op("gather").shape(indices.shape()),
    )?;
    Ok(out)
}

/// A copy of `x` with `values` scattered along `dim` at `indices` (same shape as `values`).
pub fn scatter(
    x: &CudaTensor,
    dim: usize,
    indices: &CudaTensor,
    values: &CudaTensor,
    reduce: ScatterReduce,
) -> Result<CudaTensor> {
    check_index("scatter", x, dim, indices)?;
    let ctx = || {
        OpContext::new("scatter")
            .shape(x.shape())
            .shape(indices.shape())
            .shape(values.shape())
            .dtype(x.dtype())
    };
    if values.dtype() != x.dtype() {
        return Err(CudaError::invalid(
            ctx(),
            "values dtype differs from the tensor's",
        ));
    }
    if indices.rank() != x.rank() {
        return Err(CudaError::invalid(
            ctx(),
            "indices must have the input's rank",
        ));
    }
    let values = values
        .expand(indices.shape())
        .map_err(|_| CudaError::invalid(ctx(), "values must have the indices' shape"))?;
    if reduce == ScatterReduce::Add && x.dtype() == DType::U8 {
        return Err(CudaError::unsupported(ctx(), "atomic add on u8"));
    }
    if reduce == ScatterReduce::Add && matches!(x.dtype(), DType::BF16 | DType::F16) {
        // 16-bit atomics are compare-and-swap loops that serialise on hot rows (an embedding
        // gradient's frequent tokens) and round after every add: sum in f32, round once.
        let wide = scatter(
            &x.cast(DType::F32)?,
            dim,
            indices,
            &values.cast(DType::F32)?,
            reduce,
        )?;
        return wide.cast(x.dtype());
    }
    let out = crate::kernels::prim::elementwise::copy(x)?;
    let n = indices.numel();
    if n == 0 {
        return Ok(out);
    }
    let spec = ScatterSpec {
        dtype: x.dtype(),
        index: indices.dtype(),
        rank: x.rank().max(1),
        reduce,
    };
    let p = index_params(
        n,
        dim,
        x.shape()[dim],
        indices.shape(),
        (out.strides(), out.offset(), out.buffer_ptr()),
        (indices.strides(), indices.offset(), indices.buffer_ptr()),
        (values.strides(), values.offset(), values.buffer_ptr()),
    );
    launch(
        x.device(),
        &spec,
        grid_for(n as u64, BLOCK),
        BLOCK,
        &p,
        &ctx,
    )?;
    Ok(out)
}

/// The 1-D `indices` laid along `dim` of `shape`, broadcast (stride 0) over the other dims.
fn broadcast_index(indices: &CudaTensor, dim: usize, shape: &[usize]) -> Result<CudaTensor> {
    let mut view_shape = vec![1; shape.len()];
    view_shape[dim] = indices.numel();
    indices.reshape(&view_shape)?.expand(shape)
}

/// `index_select`: the slices of `x` along `dim` named by the 1-D `indices`.
pub fn select(x: &CudaTensor, dim: usize, indices: &CudaTensor) -> Result<CudaTensor> {
    check_index("select", x, dim, indices)?;
    if indices.rank() != 1 {
        return Err(CudaError::invalid(
            indices.op("select"),
            "indices must be 1-D",
        ));
    }
    let mut shape = x.shape().to_vec();
    shape[dim] = indices.numel();
    gather(x, dim, &broadcast_index(indices, dim, &shape)?)
}

/// A copy of `x` with `values` (shape of `x` with `dim` resized to the index count)
/// combined into the slices named by the 1-D `indices` (burn's `select_add` / `select_or`).
pub fn select_assign(
    x: &CudaTensor,
    dim: usize,
    indices: &CudaTensor,
    values: &CudaTensor,
    reduce: ScatterReduce,
) -> Result<CudaTensor> {
    check_index("select_assign", x, dim, indices)?;
    if indices.rank() != 1 {
        return Err(CudaError::invalid(
            indices.op("select_assign"),
            "indices must be 1-D",
        ));
    }
    let mut shape = x.shape().to_vec();
    shape[dim] = indices.numel();
    let index = broadcast_index(indices, dim, &shape)?;
    scatter(x, dim, &index, values, reduce)
}

/// A copy of `x` with the (stepped) slice `ranges` overwritten by `values`.
pub fn slice_assign(
    x: &CudaTensor,
    ranges: &[SliceArg],
    values: &CudaTensor,
) -> Result<CudaTensor> {
    let out = crate::kernels::prim::elementwise::copy(x)?;
    let target = out.slice(ranges)?;
    if values.dtype() != x.dtype() {
        return Err(CudaError::invalid(
            OpContext::new("slice_assign")
                .shape(x.shape())
                .shape(values.shape()),
            "values dtype differs from the tensor's",
        ));
    }
    copy_into(&target, values)?;
    Ok(out)
}

/// Concatenates along `dim`; all tensors share dtype and the other dims.
pub fn cat(tensors: &[CudaTensor], dim: usize) -> Result<CudaTensor> {
    let first = tensors
        .first()
        .ok_or_else(|| CudaError::invalid(OpContext::new("cat"), "no tensors"))?;
    let ctx = || {
        let mut c = OpContext::new("cat").dtype(first.dtype());
        for t in tensors {
            c = c.shape(t.shape());
        }
        c
    };
    if dim >= first.rank() {
        return Err(CudaError::invalid(ctx(), format!("dim {dim} out of range")));
    }
    let mut shape = first.shape().to_vec();
    shape[dim] = 0;
    for t in tensors {
        let same_other_dims = t.rank() == first.rank()
            && t.shape()
                .iter()
                .zip(first.shape())
                .enumerate()
                .all(|(d, (a, b))| d == dim || a == b);
        if !same_other_dims || t.dtype() != first.dtype() {
            return Err(CudaError::invalid(
                ctx(),
                "shapes or dtypes differ outside dim",
            ));
        }
        shape[dim] += t.shape()[dim];
    }
    let out = CudaTensor::empty(first.device(), &shape, first.dtype())?;
    let mut start = 0;
    for t in tensors {
        let len = t.shape()[dim];
        let mut ranges: Vec<SliceArg> = shape.iter().map(|&s| SliceArg::full(s)).collect();
        ranges[dim] = SliceArg::range(start, start + len);
        copy_into(&out.slice(&ranges)?, t)?;
        start += len;
    }
    Ok(out)
}

/// Repeats the whole tensor `times` along `dim` (`[a, b]` → `[a * times, b]` for dim 0).
pub fn repeat_dim(x: &CudaTensor, dim: usize, times: usize) -> Result<CudaTensor> {
    if dim >= x.rank() {
        return Err(CudaError::invalid(
            x.op("repeat_dim"),
            format!("dim {dim} out of range"),
        ));
    }
    if x.rank() >= MAX_RANK {
        return Err(CudaError::unsupported(x.op("repeat_dim"), "rank too large"));
    }
    let mut expanded = x.shape().to_vec();
    expanded.insert(dim, times);
    let tiled = crate::kernels::prim::elementwise::copy(&x.unsqueeze(dim)?.expand(&expanded)?)?;
    let mut shape = x.shape().to_vec();
    shape[dim] *= times;
    tiled.reshape(&shape)
}

impl crate::engine::launch::KernelSpec for GatherSpec {
    fn source(&self) -> String {
        GatherSpec::source(self)
    }
}

impl crate::engine::launch::KernelSpec for ScatterSpec {
    fn source(&self) -> String {
        ScatterSpec::source(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_sources_are_unchanged() {
        let mut sources = Vec::new();
        for dtype in DType::ALL {
            for index in [DType::I64, DType::I32] {
                for rank in [1, 3] {
                    sources.push(GatherSpec { dtype, index, rank }.source());
                    for reduce in [ScatterReduce::Add, ScatterReduce::Or, ScatterReduce::Assign] {
                        sources.push(
                            ScatterSpec {
                                dtype,
                                index,
                                rank,
                                reduce,
                            }
                            .source(),
                        );
                    }
                }
            }
        }
        insta::assert_snapshot!(crate::kernels::digests(&sources));
    }

    #[test]
    fn gather_reads_zero_for_out_of_range_indices() {
        let spec = GatherSpec {
            dtype: DType::F32,
            index: DType::I64,
            rank: 2,
        };
        insta::assert_snapshot!("gather_f32_i64", spec.source());
    }

    #[test]
    fn scatter_add_picks_the_right_atomic() {
        let src = |dtype, reduce| {
            ScatterSpec {
                dtype,
                index: DType::I32,
                rank: 3,
                reduce,
            }
            .source()
        };
        assert!(src(DType::I64, ScatterReduce::Add).contains("(unsigned long long*)&data[doff]"));
        assert!(
            src(DType::BF16, ScatterReduce::Add).contains("atomicAdd(&data[doff], values[ooff])")
        );
        assert!(
            src(DType::Bool, ScatterReduce::Or).contains("if (values[ooff] != 0) data[doff] = 1;")
        );
        assert!(src(DType::F32, ScatterReduce::Assign).contains("data[doff] = values[ooff];"));
    }
}
