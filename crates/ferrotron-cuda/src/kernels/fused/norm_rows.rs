//! The norm forward and input gradient for rows of up to 2,048 elements: one warp per row, the
//! row read once into registers with 16-byte loads, row sums by warp shuffles, no shared memory
//! or block barrier.
//!
//! The block-per-row kernels (`norm.rs`) read the row two or three times with 2-byte loads and
//! synchronise their block per sum, and a transformer's rows (hidden 768–2048) give each of
//! their 256 threads only a few elements: the forward ran at 0.7–1.1 TB/s on an H200 and the
//! input gradient at 1.6 TB/s (gpt-1.3b; tools/README.md). A warp per row keeps eight rows in flight
//! per block and, in the forward, each lane's elements in registers (eight chunks of eight at
//! most). The gradient reads its row twice instead: holding `x` and `dy` took 154 registers a
//! thread and left one block per multiprocessor, and the second read hits the L1 the first
//! one filled (a row of both is 8 KB at 2,048).

use crate::engine::dtype::DType;
use crate::engine::launch::KernelSpec;
use crate::kernels::fused::{WARP_SUM, uses_half};
use crate::kernels::template::{Hole, template};

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
        template!("norm_rows_forward.cu").fill(&[
            ("KIND", Hole::code(if self.rms { "rms" } else { "layer" })),
            ("X_NAME", Hole::Name(x)),
            ("GAMMA_NAME", Hole::Name(g)),
            (
                "STATS_ONLY_NOTE",
                Hole::code(if self.stats_only { " stats only" } else { "" }),
            ),
            ("CHUNKS", Hole::Int(self.chunks as i64)),
            ("HALF", Hole::Flag(uses_half(&[x, g]))),
            ("WARP_SUM", Hole::code(WARP_SUM)),
            ("X", Hole::Storage(x)),
            ("GAMMA", Hole::Storage(g)),
            ("RMS", Hole::Flag(self.rms)),
            ("BETA", Hole::Flag(self.beta)),
            ("STATS_ONLY", Hole::Flag(self.stats_only)),
            ("LOAD_CHUNK", Hole::code(x.load_expr("t.v[e]"))),
            ("LOAD_GAMMA", Hole::code(g.load_expr("gc.v[e]"))),
            ("LOAD_BETA", Hole::code(g.load_expr("bc.v[e]"))),
            ("STORE_R", Hole::code(x.store_expr("r"))),
        ])
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
        let term = if self.into {
            format!(
                "rstd * (g - mean_g - xh * mean_gx) + {}",
                x.load_expr("ic.v[e]")
            )
        } else {
            "rstd * (g - mean_g - xh * mean_gx)".to_string()
        };
        template!("norm_rows_input_grad.cu").fill(&[
            ("KIND", Hole::code(if self.rms { "rms" } else { "layer" })),
            ("X_NAME", Hole::Name(x)),
            ("GAMMA_NAME", Hole::Name(g)),
            ("GRAD_NAME", Hole::Name(dy)),
            (
                "INTO_NOTE",
                Hole::code(if self.into { " plus into" } else { "" }),
            ),
            ("CHUNKS", Hole::Int(self.chunks as i64)),
            ("HALF", Hole::Flag(uses_half(&[x, g, dy]))),
            ("WARP_SUM", Hole::code(WARP_SUM)),
            ("X", Hole::Storage(x)),
            ("GAMMA", Hole::Storage(g)),
            ("GRAD", Hole::Storage(dy)),
            ("RMS", Hole::Flag(self.rms)),
            ("INTO", Hole::Flag(self.into)),
            ("LOAD_X", Hole::code(x.load_expr("xc.v[e]"))),
            ("LOAD_DY", Hole::code(dy.load_expr("dc.v[e]"))),
            ("LOAD_GAMMA", Hole::code(g.load_expr("gc.v[e]"))),
            ("STORE_DX", Hole::code(x.store_expr(&term))),
        ])
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
