//! `Σ x²` of contiguous buffers with 16-byte loads: the gradient norm's sums over the
//! optimizer's flat buffers.
//!
//! The generic reduction loads one element a thread per iteration from at most 1,024 blocks:
//! over gpt-1.3b's bf16 gradient buffers that was 1.07 ms a buffer, 2.1 ms a step, 1.25 TB/s
//! (one H200; tools/README.md). Here every thread adds whole chunks of 16 bytes (eight 16-bit or
//! four f32 elements), a few blocks per multiprocessor walk each buffer, each writes one
//! partial sum, and one block adds every buffer's partials in buffer and block order: the same
//! number on every run, and one sum however many runs of segments a rank counts.
//!
//! The norm decides clipping, so the sums are f64 and the total is rounded to f32 once. In
//! f32, a thread of a 650 M-element buffer (gpt-1.3b's) added 2,400 squares one after another
//! and lost the small ones under its large partial sum: simulated on the CPU in the kernel's
//! order (bf16), the total came out 2e-6 to 1e-5 low (log-uniform magnitudes, uniform values,
//! embedding-like rows of two magnitudes); with a chunk's squares added pairwise in f32 and
//! the chunks in f64, at most 4e-8 off. One conversion a chunk keeps the loop at the memory's
//! pace: conversions to f64 run at 16 a cycle a multiprocessor, so one an element would cost
//! about 40 % of a bf16 buffer's read time on an H100.

use crate::engine::dtype::DType;
use crate::engine::launch::{KernelSpec, Params, launch};
use crate::engine::tensor::CudaTensor;
use crate::error::Result;
use crate::kernels::template::{Hole, template};

/// Threads of a block.
const THREADS: u32 = 256;
/// Blocks per multiprocessor.
const BLOCKS_PER_SM: usize = 8;

/// The partial sums of one buffer, one f64 a block.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SumSquares {
    input: DType,
}

impl SumSquares {
    /// Elements in one 16-byte chunk.
    fn per_chunk(&self) -> usize {
        16 / self.input.size_in_bytes()
    }
}

impl KernelSpec for SumSquares {
    fn source(&self) -> String {
        let per = self.per_chunk() as i64;
        template!("sum_squares.cu").fill(&[
            ("INPUT_NAME", Hole::Name(self.input)),
            ("HALF", Hole::Flag(self.input.needs_half_headers())),
            ("T", Hole::Storage(self.input)),
            ("PER_CHUNK", Hole::Int(per)),
            ("HALF_CHUNK", Hole::Int(per / 2)),
            ("THREADS", Hole::Int(THREADS.into())),
            ("LOAD_CHUNK", Hole::code(self.input.load_expr("k.v[e]"))),
            ("LOAD_ELEMENT", Hole::code(self.input.load_expr("in[i]"))),
            ("BLOCK_TOTAL", Hole::code(block_total())),
        ])
    }
}

/// Every buffer's partials added into one f32 `[1]` by one block, in order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Finish;

impl KernelSpec for Finish {
    fn source(&self) -> String {
        template!("sum_squares_finish.cu").fill(&[
            ("THREADS", Hole::Int(THREADS.into())),
            ("BLOCK_TOTAL", Hole::code(block_total())),
        ])
    }
}

/// A block's `acc`s summed into thread 0's `total` (`block_total.cu`).
fn block_total() -> String {
    template!("block_total.cu").fill_piece(&[("WARPS", Hole::Int((THREADS / 32).into()))])
}

/// `Σ x²` over all of `parts` as `[1]` f32 (one launch a part and one to finish) where the
/// kernels take every part (contiguous, a float dtype); `None` otherwise.
pub(crate) fn sum_of_squares(parts: &[CudaTensor]) -> Result<Option<CudaTensor>> {
    let Some(first) = parts.first() else {
        return Ok(None);
    };
    let takes = |x: &CudaTensor| {
        matches!(x.dtype(), DType::F32 | DType::BF16 | DType::F16) && x.is_contiguous()
    };
    if !parts.iter().all(takes) {
        return Ok(None);
    }
    let device = first.device();
    let most = device.multiprocessors().max(1) * BLOCKS_PER_SM;
    let grids: Vec<usize> = parts
        .iter()
        .map(|x| {
            let per = SumSquares { input: x.dtype() }.per_chunk();
            (x.numel() / per).div_ceil(THREADS as usize).clamp(1, most)
        })
        .collect();
    // f64 partials, in a buffer of 8-byte elements (the engine has no f64 dtype).
    let partials = CudaTensor::empty(device, &[grids.iter().sum()], DType::I64)?;
    let mut at = partials.data_ptr();
    for (x, &grid) in parts.iter().zip(&grids) {
        let spec = SumSquares { input: x.dtype() };
        let size = x.dtype().size_in_bytes() as u64;
        let head = ((16 - x.data_ptr() % 16) % 16 / size).min(x.numel() as u64);
        let mut params = Params::new();
        params
            .int(x.numel() as i64)
            .int(head as i64)
            .ptr(x.data_ptr())
            .ptr(at);
        launch(device, &spec, grid as u32, THREADS, &params, &|| {
            x.op("sum_of_squares")
        })?;
        at += 8 * grid as u64;
    }
    let out = CudaTensor::empty(device, &[1], DType::F32)?;
    let mut params = Params::new();
    params
        .int(partials.numel() as i64)
        .ptr(partials.data_ptr())
        .ptr(out.data_ptr());
    launch(device, &Finish, 1, THREADS, &params, &|| {
        first.op("sum_of_squares")
    })?;
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_is_sixteen_bytes() {
        assert_eq!(SumSquares { input: DType::BF16 }.per_chunk(), 8);
        assert_eq!(SumSquares { input: DType::F32 }.per_chunk(), 4);
    }

    /// Partials and total in f64, the chunk's squares pairwise, the total rounded once.
    #[test]
    fn sums_are_f64() {
        let source = SumSquares { input: DType::BF16 }.source();
        assert!(source.contains("double acc = 0.0;"), "{source}");
        assert!(source.contains("acc += (double)q[0];"), "{source}");
        assert!(
            source.contains("for (int w = 4; w > 0; w >>= 1)"),
            "{source}"
        );
        assert!(
            source.contains("((double*)p.out)[blockIdx.x] = total;"),
            "{source}"
        );
        let finish = Finish.source();
        assert!(
            finish.contains("*(float*)p.out = (float)total;"),
            "{finish}"
        );
    }

    #[test]
    fn sum_squares_sources_are_unchanged() {
        let mut sources: Vec<String> = [DType::F32, DType::BF16, DType::F16]
            .map(|input| SumSquares { input }.source())
            .into();
        sources.push(Finish.source());
        insta::assert_snapshot!(crate::kernels::digests(&sources));
    }

    /// The sources compile for sm_90 (NVRTC, no GPU needed) for every float dtype.
    #[test]
    #[ignore = "needs NVRTC and the CUDA headers: tools/test.sh installs them and runs it"]
    fn sum_squares_sources_compile() {
        let sources = [DType::F32, DType::BF16, DType::F16]
            .map(|input| SumSquares { input }.source())
            .into_iter()
            .chain([Finish.source()]);
        for source in sources {
            crate::engine::kernel_cache::compile_for_test(&source, "sm_90")
                .unwrap_or_else(|e| panic!("{e}\n{source}"));
        }
    }
}
