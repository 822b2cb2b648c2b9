//! The norm forward and input gradient for rows of up to 2,048 elements: one warp per row, the
//! row read once into registers with 16-byte loads, row sums by warp shuffles, no shared memory
//! or block barrier.
//!
//! The block-per-row kernels (`mod.rs`) read the row two or three times with 2-byte loads and
//! synchronise their block per sum, and a transformer's rows (hidden 768–2048) give each of
//! their 256 threads only a few elements: the forward ran at 0.7–1.1 TB/s on an H200 and the
//! input gradient at 1.6 TB/s (gpt-1.3b; tools/README.md). A warp per row keeps eight rows in flight
//! per block and, in the forward, each lane's elements in registers (eight chunks of eight at
//! most). The gradient reads its row twice instead: holding `x` and `dy` took 154 registers a
//! thread and left one block per multiprocessor, and the second read hits the L1 the first
//! one filled (a row of both is 8 KB at 2,048).

use crate::engine::dtype::DType;
use crate::engine::launch::KernelSpec;
use crate::engine::launch::includes;
use crate::kernels::fused::uses_half;

/// Elements per 16-byte-or-wider chunk a lane loads at once.
pub(super) const CHUNK: usize = 8;
/// Chunks a lane may hold: rows up to 32 · 8 · 8 = 2,048 elements.
const MAX_CHUNKS_PER_LANE: usize = 8;
/// Rows per 256-thread block.
pub(super) const ROWS_PER_BLOCK: usize = 8;

/// A warp-per-row norm forward, `chunks` chunks of eight per lane; `stats_only` writes the row
/// statistics and not the output.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct NormRowsForward {
    pub x: DType,
    pub gamma: DType,
    pub rms: bool,
    pub beta: bool,
    pub chunks: usize,
    pub stats_only: bool,
}

impl NormRowsForward {
    /// The spec for rows of `hidden` elements, if this kernel takes them: a multiple of eight,
    /// at most 2,048, and every pointer aligned to a whole chunk (checked by the caller).
    pub(super) fn for_hidden(
        x: DType,
        gamma: DType,
        rms: bool,
        beta: bool,
        hidden: usize,
    ) -> Option<Self> {
        let chunks = hidden / CHUNK;
        let per_lane = chunks.div_ceil(32);
        (hidden.is_multiple_of(CHUNK) && (1..=MAX_CHUNKS_PER_LANE).contains(&per_lane)).then_some(
            Self {
                x,
                gamma,
                rms,
                beta,
                chunks: per_lane,
                stats_only: false,
            },
        )
    }
}

impl KernelSpec for NormRowsForward {
    fn source(&self) -> String {
        let (x, g) = (self.x, self.gamma);
        let (xs, gs) = (x.storage_c(), g.storage_c());
        let kind = if self.rms { "rms" } else { "layer" };
        let only = if self.stats_only { " stats only" } else { "" };
        let mut s = format!(
            "// norm forward {kind} warp per row {x} gamma {g}{only}, {} chunks per lane\n",
            self.chunks
        );
        s += includes(uses_half(&[x, g]));
        s += "struct Params { long long rows, hidden; unsigned long long x, gamma, beta, y, mean, rstd; double eps; };\n";
        s += "template <typename T> struct alignas(sizeof(T) * 8) Chunk { T v[8]; };\n";
        s += "__device__ __forceinline__ float warp_sum(float v) {\n#pragma unroll\n  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n  return v;\n}\n";
        s += "extern \"C\" __global__ void ferrotron_kernel(const Params p) {\n";
        s += &format!("  constexpr int C = {};\n", self.chunks);
        s += "  const int lane = threadIdx.x & 31;\n";
        s += "  const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);\n";
        s += "  if (row >= p.rows) return;\n";
        s += "  const long long chunks = p.hidden >> 3;\n";
        s += &format!(
            "  const Chunk<{xs}>* x = (const Chunk<{xs}>*)((const {xs}*)p.x + row * p.hidden);\n"
        );
        s += "  float v[C][8];\n  float sum = 0.f;\n";
        s += "#pragma unroll\n  for (int k = 0; k < C; ++k) {\n    const long long c = lane + k * 32;\n";
        s += &format!(
            "    if (c < chunks) {{\n      const Chunk<{xs}> t = x[c];\n#pragma unroll\n      for (int e = 0; e < 8; ++e) {{ v[k][e] = {}; sum += v[k][e]; }}\n    }} else {{\n#pragma unroll\n      for (int e = 0; e < 8; ++e) v[k][e] = 0.f;\n    }}\n  }}\n",
            x.load_expr("t.v[e]")
        );
        s += "  const float inv_n = 1.f / (float)p.hidden;\n";
        if self.rms {
            s += "  (void)sum;\n  const float mean = 0.f;\n";
        } else {
            s += "  const float mean = warp_sum(sum) * inv_n;\n";
        }
        s += "  float sq = 0.f;\n#pragma unroll\n  for (int k = 0; k < C; ++k) {\n    if (lane + k * 32 < chunks) {\n#pragma unroll\n      for (int e = 0; e < 8; ++e) { const float d = v[k][e] - mean; sq += d * d; }\n    }\n  }\n";
        s += "  const float rstd = rsqrtf(warp_sum(sq) * inv_n + (float)p.eps);\n";
        if self.stats_only {
            s += "  if (lane == 0) {\n";
            if !self.rms {
                s += "    ((float*)p.mean)[row] = mean;\n";
            }
            s += "    ((float*)p.rstd)[row] = rstd;\n  }\n}\n";
            return s;
        }
        s += &format!("  const Chunk<{gs}>* gamma = (const Chunk<{gs}>*)p.gamma;\n");
        s += &format!("  const Chunk<{gs}>* beta = (const Chunk<{gs}>*)p.beta;\n");
        s += &format!("  Chunk<{xs}>* y = (Chunk<{xs}>*)(({xs}*)p.y + row * p.hidden);\n");
        s += "#pragma unroll\n  for (int k = 0; k < C; ++k) {\n    const long long c = lane + k * 32;\n    if (c < chunks) {\n";
        s += &format!("      const Chunk<{gs}> gc = gamma[c];\n");
        if self.beta {
            s += &format!("      const Chunk<{gs}> bc = beta[c];\n");
        } else {
            s += "      (void)beta;\n";
        }
        s += &format!(
            "      Chunk<{xs}> o;\n#pragma unroll\n      for (int e = 0; e < 8; ++e) {{\n"
        );
        s += &format!(
            "        float r = (v[k][e] - mean) * rstd * {};\n",
            g.load_expr("gc.v[e]")
        );
        if self.beta {
            s += &format!("        r += {};\n", g.load_expr("bc.v[e]"));
        }
        s += &format!(
            "        o.v[e] = {};\n      }}\n      y[c] = o;\n    }}\n  }}\n",
            x.store_expr("r")
        );
        s += "  if (lane == 0) {\n";
        if !self.rms {
            s += "    ((float*)p.mean)[row] = mean;\n";
        }
        s += "    ((float*)p.rstd)[row] = rstd;\n  }\n}\n";
        s
    }
}

/// A warp-per-row norm input gradient, `chunks` chunks of eight per lane, the row read twice:
/// the same row sums as the block kernel (`Σ g`, `Σ g·x̂` with `g = dy·γ`), then `dx = rstd·(g − mean g − x̂·mean gx̂)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct NormRowsInputGrad {
    pub x: DType,
    pub gamma: DType,
    pub grad: DType,
    pub rms: bool,
    /// Adds the gradient `into` (x's dtype) to `dx`.
    pub into: bool,
    pub chunks: usize,
}

impl NormRowsInputGrad {
    /// The spec for rows of `hidden` elements, on the forward's conditions.
    pub(super) fn for_hidden(
        x: DType,
        gamma: DType,
        grad: DType,
        rms: bool,
        into: bool,
        hidden: usize,
    ) -> Option<Self> {
        NormRowsForward::for_hidden(x, gamma, rms, false, hidden).map(|f| Self {
            x,
            gamma,
            grad,
            rms,
            into,
            chunks: f.chunks,
        })
    }
}

impl KernelSpec for NormRowsInputGrad {
    fn source(&self) -> String {
        let (x, g, dy) = (self.x, self.gamma, self.grad);
        let (xs, gs, ds) = (x.storage_c(), g.storage_c(), dy.storage_c());
        let kind = if self.rms { "rms" } else { "layer" };
        let plus = if self.into { " plus into" } else { "" };
        let mut s = format!(
            "// norm backward input {kind} warp per row {x} gamma {g} grad {dy}{plus}, {} chunks per lane\n",
            self.chunks
        );
        s += includes(uses_half(&[x, g, dy]));
        s += "struct Params { long long rows, hidden; unsigned long long x, gamma, dy, mean, rstd, dx, into; };\n";
        s += "template <typename T> struct alignas(sizeof(T) * 8) Chunk { T v[8]; };\n";
        s += "__device__ __forceinline__ float warp_sum(float v) {\n#pragma unroll\n  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n  return v;\n}\n";
        s += "extern \"C\" __global__ void ferrotron_kernel(const Params p) {\n";
        s += &format!("  constexpr int C = {};\n", self.chunks);
        s += "  const int lane = threadIdx.x & 31;\n";
        s += "  const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);\n";
        s += "  if (row >= p.rows) return;\n";
        s += "  const long long chunks = p.hidden >> 3;\n";
        s += &format!(
            "  const Chunk<{xs}>* x = (const Chunk<{xs}>*)((const {xs}*)p.x + row * p.hidden);\n"
        );
        s += &format!(
            "  const Chunk<{ds}>* dy = (const Chunk<{ds}>*)((const {ds}*)p.dy + row * p.hidden);\n"
        );
        s += &format!("  const Chunk<{gs}>* gamma = (const Chunk<{gs}>*)p.gamma;\n");
        if self.rms {
            s += "  const float mean = 0.f;\n";
        } else {
            s += "  const float mean = ((const float*)p.mean)[row];\n";
        }
        s += "  const float rstd = ((const float*)p.rstd)[row];\n";
        s += "  float sum_g = 0.f, sum_gx = 0.f;\n";
        let body = |tail: &str| {
            format!(
                "#pragma unroll\n      for (int e = 0; e < 8; ++e) {{\n        const float g = {} * {};\n        const float xh = ({} - mean) * rstd;\n{tail}      }}\n",
                dy.load_expr("dc.v[e]"),
                g.load_expr("gc.v[e]"),
                x.load_expr("xc.v[e]"),
            )
        };
        s += "#pragma unroll\n  for (int k = 0; k < C; ++k) {\n    const long long c = lane + k * 32;\n    if (c < chunks) {\n";
        let loads = format!(
            "      const Chunk<{xs}> xc = x[c];\n      const Chunk<{ds}> dc = dy[c];\n      const Chunk<{gs}> gc = gamma[c];\n"
        );
        s += &loads;
        s += &body("        sum_g += g; sum_gx += g * xh;\n");
        s += "    }\n  }\n";
        s += "  const float inv_n = 1.f / (float)p.hidden;\n";
        if self.rms {
            s += "  (void)sum_g;\n  const float mean_g = 0.f;\n";
        } else {
            s += "  const float mean_g = warp_sum(sum_g) * inv_n;\n";
        }
        s += "  const float mean_gx = warp_sum(sum_gx) * inv_n;\n";
        s += &format!("  Chunk<{xs}>* dx = (Chunk<{xs}>*)(({xs}*)p.dx + row * p.hidden);\n");
        if self.into {
            s += &format!(
                "  const Chunk<{xs}>* into = (const Chunk<{xs}>*)((const {xs}*)p.into + row * p.hidden);\n"
            );
        }
        s += "#pragma unroll\n  for (int k = 0; k < C; ++k) {\n    const long long c = lane + k * 32;\n    if (c < chunks) {\n";
        s += &loads;
        let term = if self.into {
            s += &format!("      const Chunk<{xs}> ic = into[c];\n");
            format!(
                "rstd * (g - mean_g - xh * mean_gx) + {}",
                x.load_expr("ic.v[e]")
            )
        } else {
            "rstd * (g - mean_g - xh * mean_gx)".to_string()
        };
        s += &format!("      Chunk<{xs}> o;\n");
        s += &body(&format!("        o.v[e] = {};\n", x.store_expr(&term)));
        s += "      dx[c] = o;\n    }\n  }\n}\n";
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_up_to_2048_elements_in_chunks_of_eight_take_the_warp_kernel() {
        let spec =
            |hidden| NormRowsForward::for_hidden(DType::BF16, DType::BF16, false, true, hidden);
        assert_eq!(spec(2048).map(|s| s.chunks), Some(8));
        assert_eq!(spec(1024).map(|s| s.chunks), Some(4));
        assert_eq!(spec(768).map(|s| s.chunks), Some(3));
        assert_eq!(spec(64).map(|s| s.chunks), Some(1));
        assert!(spec(4096).is_none(), "too many registers per lane");
        assert!(spec(1004).is_none(), "not whole chunks");
    }

    /// Every dtype, LayerNorm and RMSNorm, forward (and its statistics alone) and input
    /// gradient (with and without a gradient to add), at the widest rows.
    fn sources() -> Vec<String> {
        let mut sources = Vec::new();
        for x in [DType::F32, DType::BF16, DType::F16] {
            for (rms, gamma) in [(false, x), (true, x), (false, DType::F32)] {
                let spec =
                    NormRowsForward::for_hidden(x, gamma, rms, !rms, 2048).expect("takes 2048");
                let grad = |into| {
                    NormRowsInputGrad::for_hidden(x, gamma, x, rms, into, 2048)
                        .expect("2048")
                        .source()
                };
                let stats = NormRowsForward {
                    stats_only: true,
                    ..spec.clone()
                };
                sources.extend([spec.source(), stats.source(), grad(false), grad(true)]);
            }
        }
        sources
    }

    #[test]
    fn norm_rows_sources_are_unchanged() {
        let mut sources = sources();
        // and the flags the list above leaves together: RMSNorm with β, LayerNorm without
        for (rms, beta) in [(true, true), (false, false)] {
            let spec = NormRowsForward::for_hidden(DType::BF16, DType::F32, rms, beta, 768);
            sources.push(spec.expect("takes 768").source());
        }
        insta::assert_snapshot!(crate::kernels::digests(&sources));
    }

    /// The sources compile for sm_90 (NVRTC, no GPU needed), the row in registers.
    #[test]
    #[ignore = "needs NVRTC and the CUDA headers: tools/test.sh installs them and runs it"]
    fn norm_rows_sources_compile() {
        for source in sources() {
            let ptx = crate::engine::kernel_cache::compile_for_test(&source, "sm_90")
                .unwrap_or_else(|e| panic!("{e}\n{source}"));
            // The row lives in registers: nothing spills to local memory.
            assert!(!ptx.contains(".local"), "{source}\n{ptx}");
        }
    }
}
