//! Cumulative ops along a dim: cumsum, cumprod, cummax, cummin.
//!
//! One thread scans one row sequentially, rows in parallel. Training uses these on small
//! tensors (masks, positions), where this simple form is exact and bandwidth is irrelevant; a
//! decoupled look-back scan would be the upgrade if a long single-row scan ever matters.

use crate::engine::dtype::DType;
use crate::engine::launch::{BLOCK, Params, grid_for, launch};
use crate::engine::layout::coalesce;
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, Result};
use crate::kernels::template::{Hole, template};

/// Cumulative ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScanOp {
    Sum,
    Prod,
    Max,
    Min,
}

/// Everything that determines one generated scan kernel.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ScanSpec {
    pub op: ScanOp,
    pub dtype: DType,
    /// Rank of the (merged) outer shape.
    pub rank: usize,
}

impl ScanSpec {
    pub fn source(&self) -> String {
        let d = self.dtype;
        let (acc, init, step) = match self.op {
            ScanOp::Sum => (d.accumulate_c(), "0", "acc + v"),
            ScanOp::Prod => (d.accumulate_c(), "1", "acc * v"),
            ScanOp::Max => (d.compute_c(), d.min_value_c(), "(v > acc ? v : acc)"),
            ScanOp::Min => (d.compute_c(), d.max_value_c(), "(v < acc ? v : acc)"),
        };
        template!("scan.cu").fill(&[
            ("OP", Hole::code(format!("{:?}", self.op))),
            ("DTYPE_NAME", Hole::Name(d)),
            ("RANK", Hole::Int(self.rank as i64)),
            ("HALF", Hole::Flag(d.needs_half_headers())),
            ("T", Hole::Storage(d)),
            ("ACC", Hole::code(acc)),
            ("INIT", Hole::code(init)),
            ("STEP", Hole::code(step)),
            (
                "LOAD",
                Hole::code(d.load_expr("in[ib + j * p.in_red_stride]")),
            ),
            ("STORE", Hole::code(d.store_expr("acc"))),
        ])
    }
}

/// Cumulative `op` along `dim`; same shape and dtype as `x`.
pub fn cumulative(x: &CudaTensor, dim: usize, op: ScanOp) -> Result<CudaTensor> {
    let name = format!("cum{op:?}").to_lowercase();
    if dim >= x.rank() {
        return Err(CudaError::invalid(
            x.op(&name),
            format!("dim {dim} out of range"),
        ));
    }
    if x.dtype().is_bool() {
        return Err(CudaError::unsupported(x.op(&name), "bool tensors"));
    }
    let out = CudaTensor::empty(x.device(), x.shape(), x.dtype())?;
    let mut shape = x.shape().to_vec();
    let mut in_strides = x.strides().to_vec();
    let mut out_strides = out.strides().to_vec();
    let len = shape.remove(dim);
    let in_red = in_strides.remove(dim);
    let out_red = out_strides.remove(dim);
    let rows: usize = shape.iter().product();
    if rows == 0 || len == 0 {
        return Ok(out);
    }
    let merged = coalesce(&shape, &[&in_strides, &out_strides]);
    let spec = ScanSpec {
        op,
        dtype: x.dtype(),
        rank: merged.shape.len(),
    };
    let mut p = Params::new();
    p.int(rows as i64).int(len as i64);
    p.ints(merged.shape.iter().map(|&d| d as i64));
    p.ints(merged.strides[0].iter().map(|&d| d as i64));
    p.ints(merged.strides[1].iter().map(|&d| d as i64));
    p.int(in_red as i64).int(out_red as i64);
    p.int(x.offset() as i64).int(out.offset() as i64);
    p.ptr(x.buffer_ptr()).ptr(out.buffer_ptr());
    launch(
        x.device(),
        &spec,
        grid_for(rows as u64, BLOCK),
        BLOCK,
        &p,
        &|| x.op(&name),
    )?;
    Ok(out)
}

impl crate::engine::launch::KernelSpec for ScanSpec {
    fn source(&self) -> String {
        ScanSpec::source(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_sources_are_unchanged() {
        let mut sources = Vec::new();
        for op in [ScanOp::Sum, ScanOp::Prod, ScanOp::Max, ScanOp::Min] {
            for dtype in DType::ALL.into_iter().filter(|d| !d.is_bool()) {
                for rank in [1, 3] {
                    sources.push(ScanSpec { op, dtype, rank }.source());
                }
            }
        }
        insta::assert_snapshot!(crate::kernels::digests(&sources));
    }

    #[test]
    fn cumsum_f16_accumulates_in_float() {
        let spec = ScanSpec {
            op: ScanOp::Sum,
            dtype: DType::F16,
            rank: 1,
        };
        insta::assert_snapshot!("scan_cumsum_f16", spec.source());
    }

    #[test]
    fn cummax_starts_from_the_lowest_value() {
        let spec = ScanSpec {
            op: ScanOp::Max,
            dtype: DType::I32,
            rank: 1,
        };
        assert!(spec.source().contains("int acc = (-2147483647 - 1);"));
    }
}
