//! `Σ x²` of a contiguous buffer with 16-byte loads: the gradient norm's sums over the
//! optimizer's flat buffers.
//!
//! The generic reduction loads one element a thread per iteration from at most 1,024 blocks:
//! over gpt-1.3b's bf16 gradient buffers that was 1.07 ms a buffer, 2.1 ms a step, 1.25 TB/s
//! (one H200, 2026-12-05). Here every thread adds whole chunks of 16 bytes (eight 16-bit or
//! four f32 elements) in f32, a few blocks per multiprocessor walk the buffer, each writes one
//! partial sum, and the generic reduction adds the partials in block order: the same number on
//! every run.

use crate::dtype::DType;
use crate::error::Result;
use crate::kernels::reduce::{ReduceOp, reduce_all};
use crate::kernels::{KernelSpec, Params, includes, launch};
use crate::tensor::CudaTensor;

/// Threads of a block.
const THREADS: u32 = 256;
/// Blocks per multiprocessor.
const BLOCKS_PER_SM: usize = 8;

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
        let t = self.input.storage_c();
        let per = self.per_chunk();
        let mut s = format!("// sum squares vector {}\n", self.input);
        s += includes(self.input.needs_half_headers());
        s += "struct Params { long long n; unsigned long long in, out; };\n";
        s += &format!(
            "struct alignas(16) Chunk {{ {t} v[{per}]; }};\n\
             extern \"C\" __global__ void __launch_bounds__({THREADS}) ferrotron_kernel(const Params p) {{\n"
        );
        s += &format!("  const {t}* in = (const {t}*)p.in;\n");
        s += &format!("  const long long chunks = p.n / {per};\n");
        s += "  const long long step = (long long)gridDim.x * blockDim.x;\n";
        s += "  float acc = 0.f;\n";
        s += "  for (long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += step) {\n";
        s += "    const Chunk k = ((const Chunk*)in)[c];\n";
        s += &format!(
            "#pragma unroll\n    for (int e = 0; e < {per}; ++e) {{ const float v = {}; acc += v * v; }}\n  }}\n",
            self.input.load_expr("k.v[e]")
        );
        // The elements after the last whole chunk: the first block's first threads.
        s += &format!(
            "  if (blockIdx.x == 0 && threadIdx.x < p.n - chunks * {per}) {{ const float v = {}; acc += v * v; }}\n",
            self.input
                .load_expr(&format!("in[chunks * {per} + threadIdx.x]"))
        );
        s += "#pragma unroll\n  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);\n";
        s += &format!("  __shared__ float warps[{}];\n", THREADS / 32);
        s += "  if ((threadIdx.x & 31) == 0) warps[threadIdx.x >> 5] = acc;\n  __syncthreads();\n";
        s += &format!(
            "  if (threadIdx.x == 0) {{\n    float total = 0.f;\n#pragma unroll\n    for (int w = 0; w < {}; ++w) total += warps[w];\n    ((float*)p.out)[blockIdx.x] = total;\n  }}\n}}\n",
            THREADS / 32
        );
        s
    }
}

/// `Σ x²` as `[1]` f32 where this kernel takes `x` (contiguous, 16-byte aligned, a float
/// dtype, and large enough to fill the device); `None` otherwise.
pub(crate) fn sum_of_squares(x: &CudaTensor) -> Result<Option<CudaTensor>> {
    let spec = SumSquares { input: x.dtype() };
    let device = x.device();
    let blocks = device.multiprocessors().max(1) * BLOCKS_PER_SM;
    let n = x.numel();
    let takes = matches!(x.dtype(), DType::F32 | DType::BF16 | DType::F16)
        && x.is_contiguous()
        && x.data_ptr().is_multiple_of(16)
        && n >= blocks * THREADS as usize * spec.per_chunk();
    if !takes {
        return Ok(None);
    }
    let partials = CudaTensor::empty(device, &[blocks], DType::F32)?;
    let mut params = Params::new();
    params
        .int(n as i64)
        .ptr(x.data_ptr())
        .ptr(partials.data_ptr());
    launch(device, &spec, blocks as u32, THREADS, &params, &|| {
        x.op("sum_of_squares")
    })?;
    reduce_all(&partials, ReduceOp::Sum).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_is_sixteen_bytes() {
        assert_eq!(SumSquares { input: DType::BF16 }.per_chunk(), 8);
        assert_eq!(SumSquares { input: DType::F32 }.per_chunk(), 4);
    }

    /// The sources compile for sm_90 (NVRTC, no GPU needed) for every float dtype.
    #[test]
    #[ignore = "needs NVRTC and the CUDA headers: tools/test.sh installs them and runs it"]
    fn sum_squares_sources_compile() {
        for input in [DType::F32, DType::BF16, DType::F16] {
            let source = SumSquares { input }.source();
            crate::kernels::cache::compile_for_test(&source, "sm_90")
                .unwrap_or_else(|e| panic!("{e}\n{source}"));
        }
    }
}
