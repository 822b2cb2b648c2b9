//! Gathering per-parameter gradients into a flat buffer (`FusedOps::gather_flat`: f32, or one
//! microbatch's gradients in their own dtype), many tensors per launch.
//!
//! Autodiff leaves one gradient per parameter; the optimizer works on one buffer per group.
//! A cast and an add per parameter per microbatch is ~400 launches on a 1.3B model; this is
//! one launch per [`PIECES`] parameters. The pieces' pointers, offsets and lengths travel in
//! the by-value parameter struct (4 KiB limit), and each piece gets its own run of blocks, so
//! a block never looks anything up besides its piece.

use std::sync::Arc;

use crate::engine::device::CudaDevice;
use crate::engine::dtype::DType;
use crate::engine::launch::{BLOCK, KernelSpec, Params, launch};
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};
use crate::kernels::fused::uses_half;
use crate::kernels::template::{Hole, template};

/// Pieces per launch: four 8-byte words each (pointer, offset, length, first block) plus three
/// keep the struct near 2 KiB, within the 4 KiB a launch's by-value parameters may take.
pub const PIECES: usize = 64;
const _: () = assert!((3 + 4 * PIECES) * 8 <= 4096);

/// Blocks per piece at most: each grid-strides over its piece.
const BLOCKS_PER_PIECE: u64 = 512;

/// `out[offset_k + i] = into[offset_k + i] + piece_k[i]` in `out`'s dtype, summed in f32 (no
/// `into`: without the sum), a missing piece (null pointer) read as zeros.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct GatherFlat {
    grad: DType,
    out: DType,
    accumulate: bool,
}

impl KernelSpec for GatherFlat {
    fn source(&self) -> String {
        let (g, o) = (self.grad, self.out);
        let sum = if self.accumulate {
            format!("{} + g", o.load_expr("into[i]"))
        } else {
            "g".to_string()
        };
        template!("gather_flat.cu").fill(&[
            ("OUT_NAME", Hole::Name(o)),
            ("GRAD_NAME", Hole::Name(g)),
            (
                "ACCUMULATE_NOTE",
                Hole::code(if self.accumulate { " accumulate" } else { "" }),
            ),
            ("HALF", Hole::Flag(uses_half(&[g, o]))),
            ("PIECES", Hole::Int(PIECES as i64)),
            ("OUT", Hole::Storage(o)),
            ("GRAD", Hole::Storage(g)),
            ("ACCUMULATE", Hole::Flag(self.accumulate)),
            ("LOAD_GRAD", Hole::code(g.load_expr("src[i]"))),
            ("STORE_SUM", Hole::code(o.store_expr(&sum))),
        ])
    }
}

/// One parameter's share of the flat buffer: its length and its gradient, if it has one.
pub struct Piece<'a> {
    pub len: usize,
    pub grad: Option<&'a CudaTensor>,
}

/// `into + cat(pieces)` as a flat `dtype` buffer (`cat(pieces)` without `into`); `into` is
/// written in place when nothing else holds it, else a new buffer is returned.
pub fn gather_flat(
    device: &Arc<CudaDevice>,
    pieces: &[Piece<'_>],
    into: Option<CudaTensor>,
    dtype: DType,
) -> Result<CudaTensor> {
    let total: usize = pieces.iter().map(|p| p.len).sum();
    let op = || OpContext::new("gather_flat").shape(&[total]).dtype(dtype);
    let into = match into {
        Some(t) if t.numel() != total || t.dtype() != dtype => {
            return Err(CudaError::invalid(
                t.op("gather_flat"),
                format!("the flat buffer must hold {total} {dtype} values"),
            ));
        }
        Some(t) => Some(t.contiguous()?),
        None => None,
    };
    let out = match &into {
        Some(t) if t.is_exclusive() && t.offset() == 0 => t.clone(),
        _ => CudaTensor::empty(device, &[total], dtype)?,
    };
    // Contiguous pieces, each paired with its offset in the buffer.
    let mut offset = 0;
    let mut laid = Vec::with_capacity(pieces.len());
    for piece in pieces {
        let grad = match piece.grad {
            Some(g) if g.numel() != piece.len => {
                return Err(CudaError::invalid(
                    g.op("gather_flat"),
                    format!("a piece of {} values holds {}", piece.len, g.numel()),
                ));
            }
            Some(g) => Some(g.contiguous()?),
            None => None,
        };
        laid.push((offset, piece.len, grad));
        offset += piece.len;
    }
    // Launch runs of pieces that share a gradient dtype (a missing piece joins any run).
    let mut run: Vec<&(usize, usize, Option<CudaTensor>)> = Vec::with_capacity(PIECES);
    let mut run_dtype = None;
    for piece in &laid {
        let dtype = piece.2.as_ref().map(CudaTensor::dtype);
        let joins = dtype.is_none() || run_dtype.is_none() || dtype == run_dtype;
        if run.len() == PIECES || !joins {
            launch_run(&run, run_dtype, &out, into.as_ref(), &op)?;
            run.clear();
            run_dtype = None;
        }
        run_dtype = run_dtype.or(dtype);
        run.push(piece);
    }
    launch_run(&run, run_dtype, &out, into.as_ref(), &op)?;
    Ok(out)
}

fn launch_run(
    run: &[&(usize, usize, Option<CudaTensor>)],
    dtype: Option<DType>,
    out: &CudaTensor,
    into: Option<&CudaTensor>,
    op: &dyn Fn() -> OpContext,
) -> Result<()> {
    let run: Vec<_> = run.iter().filter(|p| p.1 > 0).collect();
    if run.is_empty() {
        return Ok(());
    }
    let spec = GatherFlat {
        grad: dtype.unwrap_or(out.dtype()),
        out: out.dtype(),
        accumulate: into.is_some(),
    };
    let mut blocks = 0u64;
    let mut first_blocks = Vec::with_capacity(run.len());
    for piece in &run {
        first_blocks.push(blocks as i64);
        blocks += (piece.1 as u64)
            .div_ceil(u64::from(BLOCK) * 4)
            .clamp(1, BLOCKS_PER_PIECE);
    }
    let mut params = Params::new();
    params
        .ptr(out.data_ptr())
        .ptr(into.map_or(0, CudaTensor::data_ptr));
    let src: Vec<i64> = run
        .iter()
        .map(|p| p.2.as_ref().map_or(0, |g| g.data_ptr() as i64))
        .collect();
    params
        .padded(&src, PIECES)
        .padded(&run.iter().map(|p| p.0 as i64).collect::<Vec<_>>(), PIECES)
        .padded(&run.iter().map(|p| p.1 as i64).collect::<Vec<_>>(), PIECES)
        .padded(&first_blocks, PIECES)
        .int(run.len() as i64);
    launch(out.device(), &spec, blocks as u32, BLOCK, &params, op)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_sources_are_unchanged() {
        let mut sources = Vec::new();
        for grad in [DType::F32, DType::BF16, DType::F16] {
            for out in [DType::F32, DType::BF16] {
                for accumulate in [false, true] {
                    sources.push(
                        GatherFlat {
                            grad,
                            out,
                            accumulate,
                        }
                        .source(),
                    );
                }
            }
        }
        insta::assert_snapshot!(crate::kernels::digests(&sources));
    }

    /// Every generated source compiles for sm_90 (NVRTC, no GPU needed).
    #[test]
    #[ignore = "needs NVRTC and the CUDA headers: tools/test.sh installs them and runs it"]
    fn flat_sources_compile() {
        for grad in [DType::F32, DType::BF16, DType::F16] {
            // f32 sums, one microbatch in its own dtype, and bf16 sums (`main_grads_dtype`)
            for (out, accumulate) in [
                (DType::F32, false),
                (DType::F32, true),
                (grad, false),
                (DType::BF16, true),
            ] {
                let source = GatherFlat {
                    grad,
                    out,
                    accumulate,
                }
                .source();
                crate::engine::kernel_cache::compile_for_test(&source, "sm_90")
                    .unwrap_or_else(|e| panic!("{e}\n{source}"));
            }
        }
    }
}
