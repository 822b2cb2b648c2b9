//! The norm backward in one pass over the rows: the input gradient and the γ (and β) gradients
//! from a single read of `x` and `dy`.
//!
//! The warp-per-row input gradient (`norm_rows.rs`) and the column reduction for γ/β
//! (`norm.rs`) each read `x` and `dy`: at gpt-1.3b's `[24576, 2048]` bf16 rows the second read
//! was 82 µs of the pair's 202 (one H200's op table in tools/README.md), about 1 % of a bf16 step and
//! 1.3 % of an fp8 one, and its f32 atomics summed in whatever order the blocks ran. Here a
//! block of `T` threads takes one row at a time, every thread the same one or two chunks of
//! eight columns of each row, so its share of γ stays in registers and so do its running
//! `Σ dy·x̂` and `Σ dy`; a row's two sums go through shared memory (one barrier a row, two
//! slots alternating by row). A few blocks per multiprocessor walk all the rows, each writes its
//! partial sums once, and `kernels/prim/column_sum.rs` adds those in block order: the same
//! numbers every run.
//! TransformerEngine's LayerNorm backward is built the same way.
//!
//! With one row's loads in flight at a time and the gradient to add read only after the
//! barrier, the kernel moved 2.35 TB/s (170 µs a call at gpt-1.3b's rows, one H200,
//! tools/README.md): so a block now requests the next row's `x` and `dy` before a row's barrier and
//! this row's gradient to add together with its `x` and `dy`.

use crate::engine::dtype::DType;
use crate::engine::launch::KernelSpec;
use crate::kernels::fused::norm_rows::CHUNK;
use crate::kernels::fused::{WARP_SUM, uses_half};
use crate::kernels::template::{Hole, template};

/// Chunks of eight a thread holds: the row's elements live in registers between its two loops.
const CHUNKS_PER_THREAD: usize = 2;
/// The widest block: rows up to 256 · 2 · 8 = 4,096 elements.
const MAX_THREADS: usize = 256;
/// Warps of resident blocks a multiprocessor is given (the grid: this many warps' worth of
/// blocks per multiprocessor, each looping over rows).
const WARPS_PER_SM: usize = 16;

/// The one-pass norm backward for one dtype combination and row width.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct NormRowsBackward {
    pub x: DType,
    pub gamma: DType,
    pub grad: DType,
    pub rms: bool,
    /// Also the β gradient (LayerNorm with a bias).
    pub beta: bool,
    /// Adds the gradient `into` (x's dtype) to `dx`.
    pub into: bool,
    /// Threads of a block (a power of two, 32–256).
    pub threads: usize,
    /// Chunks of eight each thread takes (1 or 2).
    pub chunks: usize,
}

impl NormRowsBackward {
    /// The spec for rows of `hidden` elements, if this kernel takes them: a multiple of eight,
    /// at most 4,096 (every pointer aligned to a whole chunk is the caller's check).
    pub(crate) fn for_hidden(
        x: DType,
        gamma: DType,
        grad: DType,
        (rms, beta, into): (bool, bool, bool),
        hidden: usize,
    ) -> Option<Self> {
        let chunks = hidden / CHUNK;
        if hidden == 0 || !hidden.is_multiple_of(CHUNK) || chunks > MAX_THREADS * CHUNKS_PER_THREAD
        {
            return None;
        }
        let threads = chunks
            .div_ceil(CHUNKS_PER_THREAD)
            .next_power_of_two()
            .clamp(32, MAX_THREADS);
        Some(Self {
            x,
            gamma,
            grad,
            rms,
            beta: beta && !rms,
            into,
            threads,
            chunks: chunks.div_ceil(threads),
        })
    }

    /// Blocks for `rows` rows on a device of `multiprocessors`: a few per multiprocessor, never
    /// more than there are rows.
    pub(crate) fn blocks(&self, rows: usize, multiprocessors: usize) -> usize {
        let per_sm = (WARPS_PER_SM * 32 / self.threads).max(1);
        (multiprocessors.max(1) * per_sm).min(rows).max(1)
    }
}

impl KernelSpec for NormRowsBackward {
    fn source(&self) -> String {
        let (x, g, dy) = (self.x, self.gamma, self.grad);
        let mut term = "rstd * (d * gam[k][e] - mean_g - xh * mean_gx)".to_string();
        if self.into {
            term = format!("{term} + {}", x.load_expr("ic[k].v[e]"));
        }
        template!("norm_grad_rows.cu").fill(&[
            ("KIND", Hole::code(if self.rms { "rms" } else { "layer" })),
            ("X_NAME", Hole::Name(x)),
            ("GAMMA_NAME", Hole::Name(g)),
            ("GRAD_NAME", Hole::Name(dy)),
            (
                "BETA_NOTE",
                Hole::code(if self.beta { " beta" } else { "" }),
            ),
            (
                "INTO_NOTE",
                Hole::code(if self.into { " plus into" } else { "" }),
            ),
            ("THREADS", Hole::Int(self.threads as i64)),
            ("CHUNKS", Hole::Int(self.chunks as i64)),
            ("HALF", Hole::Flag(uses_half(&[x, g, dy]))),
            ("WARP_SUM", Hole::code(WARP_SUM)),
            ("X", Hole::Storage(x)),
            ("GAMMA", Hole::Storage(g)),
            ("GRAD", Hole::Storage(dy)),
            ("RMS", Hole::Flag(self.rms)),
            ("BETA", Hole::Flag(self.beta)),
            ("INTO", Hole::Flag(self.into)),
            ("LOAD_GAMMA", Hole::code(g.load_expr("gc.v[e]"))),
            ("LOAD_DY", Hole::code(dy.load_expr("dc[k].v[e]"))),
            ("LOAD_X", Hole::code(x.load_expr("xc[k].v[e]"))),
            ("STORE_DX", Hole::code(x.store_expr(&term))),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(hidden: usize) -> Option<NormRowsBackward> {
        NormRowsBackward::for_hidden(
            DType::BF16,
            DType::BF16,
            DType::BF16,
            (false, true, false),
            hidden,
        )
    }

    #[test]
    fn a_block_gives_each_thread_one_or_two_chunks_of_its_row() {
        let shape = |hidden| spec(hidden).map(|s| (s.threads, s.chunks));
        assert_eq!(shape(2048), Some((128, 2)));
        assert_eq!(shape(1024), Some((64, 2)));
        assert_eq!(shape(768), Some((64, 2)));
        assert_eq!(shape(4096), Some((256, 2)));
        assert_eq!(shape(64), Some((32, 1)));
        assert_eq!(shape(8), Some((32, 1)));
        assert!(shape(8192).is_none(), "more than two chunks a thread");
        assert!(shape(1004).is_none(), "not whole chunks");
        assert!(shape(0).is_none());
    }

    #[test]
    fn every_chunk_of_a_row_has_a_thread() {
        for hidden in (8..=4096).step_by(8) {
            let s = spec(hidden).expect("takes it");
            assert!(s.threads * s.chunks * CHUNK >= hidden, "{hidden}");
            assert!(s.chunks <= CHUNKS_PER_THREAD, "{hidden}");
        }
    }

    #[test]
    fn the_grid_is_a_few_blocks_a_multiprocessor_and_no_more_than_the_rows() {
        let s = spec(2048).expect("2048");
        assert_eq!(s.blocks(24576, 132), 132 * 4);
        assert_eq!(s.blocks(100, 132), 100);
        assert_eq!(s.blocks(0, 132), 1);
        let narrow = spec(64).expect("64");
        assert_eq!(narrow.blocks(1 << 20, 132), 132 * 16);
    }

    #[test]
    fn rmsnorm_has_no_beta_gradient() {
        let s = NormRowsBackward::for_hidden(
            DType::BF16,
            DType::BF16,
            DType::BF16,
            (true, true, false),
            2048,
        )
        .expect("2048");
        assert!(!s.beta);
    }

    /// Every dtype, LayerNorm with and without β, RMSNorm, with and without a gradient to add,
    /// at narrow, middle and the widest rows.
    fn sources() -> Vec<String> {
        let mut sources = Vec::new();
        for x in [DType::F32, DType::BF16, DType::F16] {
            for gamma in [x, DType::F32] {
                for (rms, beta) in [(false, true), (false, false), (true, false)] {
                    for into in [false, true] {
                        for hidden in [64, 2048, 4096] {
                            let spec = NormRowsBackward::for_hidden(
                                x,
                                gamma,
                                x,
                                (rms, beta, into),
                                hidden,
                            )
                            .expect("takes it");
                            sources.push(spec.source());
                        }
                    }
                }
            }
        }
        sources
    }

    #[test]
    fn norm_grad_rows_sources_are_unchanged() {
        insta::assert_snapshot!(crate::kernels::digests(&sources()));
    }

    /// The sources compile for sm_90 (NVRTC, no GPU needed) without spilling.
    #[test]
    #[ignore = "needs NVRTC and the CUDA headers: tools/test.sh installs them and runs it"]
    fn norm_grad_rows_sources_compile() {
        for source in sources() {
            let ptx = crate::engine::kernel_cache::compile_for_test(&source, "sm_90")
                .unwrap_or_else(|e| panic!("{e}\n{source}"));
            assert!(!ptx.contains(".local"), "{source}\n{ptx}");
        }
    }
}
