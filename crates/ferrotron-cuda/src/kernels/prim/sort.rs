//! Sort and argsort along a dim: one block per row runs a bitonic network over the row padded
//! to a power of two, in global scratch memory.
//!
//! Keys compare with their original index as a tie-break, so the order is a strict total order:
//! the result is deterministic and stable (equal keys keep their input order), which makes it
//! comparable element for element with burn's CPU sort. Padding sorts after every real key.

use crate::engine::dtype::DType;
use crate::engine::launch::{Params, launch};
use crate::engine::layout::coalesce;
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, Result};
use crate::kernels::template::{Hole, template};

const SORT_BLOCK: u32 = 1024;

/// Everything that determines one generated sort kernel.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SortSpec {
    pub dtype: DType,
    pub descending: bool,
    pub rank: usize,
}

impl SortSpec {
    pub fn source(&self) -> String {
        let d = self.dtype;
        let (pad, cmp, direction) = if self.descending {
            (d.min_value_c(), ">", "descending")
        } else {
            (d.max_value_c(), "<", "ascending")
        };
        template!("sort.cu").fill(&[
            ("DTYPE_NAME", Hole::Name(d)),
            ("DIRECTION", Hole::code(direction)),
            ("RANK", Hole::Int(self.rank as i64)),
            ("HALF", Hole::Flag(d.needs_half_headers())),
            ("T", Hole::Storage(d)),
            ("KEY", Hole::code(d.compute_c())),
            ("CMP", Hole::code(cmp)),
            ("PAD", Hole::code(pad)),
            (
                "LOAD",
                Hole::code(d.load_expr("in[ib + t * p.in_red_stride]")),
            ),
            ("STORE", Hole::code(d.store_expr("keys[t]"))),
        ])
    }
}

/// Sorts along `dim`: (values, i64 indices into the original dim). Stable.
pub fn sort_with_indices(
    x: &CudaTensor,
    dim: usize,
    descending: bool,
) -> Result<(CudaTensor, CudaTensor)> {
    let values = CudaTensor::empty(x.device(), x.shape(), x.dtype())?;
    let indices = run_sort(x, dim, descending, Some(&values))?;
    Ok((values, indices))
}

/// Sorted values along `dim`.
pub fn sort(x: &CudaTensor, dim: usize, descending: bool) -> Result<CudaTensor> {
    sort_with_indices(x, dim, descending).map(|(v, _)| v)
}

/// Indices that sort `x` along `dim` (i64). Stable.
pub fn argsort(x: &CudaTensor, dim: usize, descending: bool) -> Result<CudaTensor> {
    run_sort(x, dim, descending, None)
}

fn run_sort(
    x: &CudaTensor,
    dim: usize,
    descending: bool,
    values: Option<&CudaTensor>,
) -> Result<CudaTensor> {
    if dim >= x.rank() {
        return Err(CudaError::invalid(
            x.op("sort"),
            format!("dim {dim} out of range"),
        ));
    }
    let device = x.device();
    let indices = CudaTensor::empty(device, x.shape(), DType::I64)?;
    let mut shape = x.shape().to_vec();
    let mut in_strides = x.strides().to_vec();
    let mut out_strides = indices.strides().to_vec();
    let len = shape.remove(dim);
    let in_red = in_strides.remove(dim);
    let out_red = out_strides.remove(dim);
    let rows: usize = shape.iter().product();
    if rows == 0 || len == 0 {
        return Ok(indices);
    }
    let pow2 = len.next_power_of_two();
    // 8 bytes per key fits every compute type.
    let keys = CudaTensor::empty(device, &[rows * pow2], DType::I64)?;
    let ids = CudaTensor::empty(device, &[rows * pow2], DType::I64)?;
    let merged = coalesce(&shape, &[&in_strides, &out_strides]);
    let spec = SortSpec {
        dtype: x.dtype(),
        descending,
        rank: merged.shape.len(),
    };
    let mut p = Params::new();
    p.int(rows as i64).int(len as i64).int(pow2 as i64);
    p.ints(merged.shape.iter().map(|&d| d as i64));
    p.ints(merged.strides[0].iter().map(|&d| d as i64));
    p.ints(merged.strides[1].iter().map(|&d| d as i64));
    p.int(in_red as i64)
        .int(out_red as i64)
        .int(x.offset() as i64);
    p.ptr(x.buffer_ptr());
    p.ptr(values.map_or(0, |v| v.buffer_ptr()));
    p.ptr(indices.buffer_ptr())
        .ptr(keys.buffer_ptr())
        .ptr(ids.buffer_ptr());
    launch(
        device,
        &spec,
        rows.min(crate::engine::launch::MAX_GRID as usize) as u32,
        SORT_BLOCK,
        &p,
        &|| x.op("sort"),
    )?;
    Ok(indices)
}

impl crate::engine::launch::KernelSpec for SortSpec {
    fn source(&self) -> String {
        SortSpec::source(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sort_sources_are_unchanged() {
        let mut sources = Vec::new();
        for dtype in DType::ALL {
            for descending in [false, true] {
                for rank in [1, 3] {
                    sources.push(
                        SortSpec {
                            dtype,
                            descending,
                            rank,
                        }
                        .source(),
                    );
                }
            }
        }
        insta::assert_snapshot!(crate::kernels::digests(&sources));
    }

    #[test]
    fn sort_source_is_a_bitonic_network_with_index_tie_break() {
        let spec = SortSpec {
            dtype: DType::F32,
            descending: true,
            rank: 1,
        };
        insta::assert_snapshot!("sort_f32_descending", spec.source());
    }
}
