//! MoE routing's decisions on the device (`FusedOps::moe_topk`, `FusedOps::moe_permutation`),
//! so a layer's host reads only its experts' row counts.
//!
//! - Top-k: one thread per token. The experts are few (8 to a few hundred) and `k` small, so
//!   `k` scans of the row, each taking the best expert not yet taken, beat a sort; the group
//!   limit first sums each group's best `k / group_topk` scores the same way. Scores compare as
//!   Rust's `f32::total_cmp` does (the float's bits made a signed integer key) and a scan keeps
//!   the first of equal keys, so the decisions are the host reference's exactly, NaN and signed
//!   zeros included; a group's sum starts from `-0.0` as Rust's `Sum` does.
//! - Permutation: a counting sort in three small launches. Blocks of [`CHUNK`] positions count
//!   their experts; one block turns the counts into each block's first row per expert (and the
//!   totals); then one warp per block walks its chunk in order, 32 positions at a time, each
//!   lane's rank among the lanes holding the same expert (`__match_any_sync`) giving its row.
//!   Rows follow the positions' order within every expert (stable), as the reference's do.

use crate::engine::dtype::DType;
use crate::engine::launch::{BLOCK, KernelSpec, Params, launch};
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};
use crate::kernels::template::{Hole, Template, template};

/// Positions per block of the permutation's count and scatter launches.
pub const CHUNK: usize = 1024;
/// Experts at most: the permutation keeps one 8-byte counter per expert in shared memory.
pub const MAX_EXPERTS: usize = 4096;
/// `k` at most (a token's experts are kept in registers).
pub const MAX_TOPK: usize = 32;
/// Groups at most under a group limit (the chosen groups are a 64-bit mask).
pub const MAX_GROUPS: usize = 64;

/// The generated kernels.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum MoeKernel {
    /// Each row's `k` best of `[rows, experts]` scores, within `groups = (num, topk)`.
    Topk {
        dtype: DType,
        k: usize,
        groups: Option<(usize, usize)>,
    },
    /// Per block of [`CHUNK`] positions, each expert's count.
    Count { experts: usize },
    /// Block counts → each block's first row per expert; the experts' totals.
    Offsets { experts: usize },
    /// Each position's row, written into the order.
    Scatter { experts: usize },
}

impl KernelSpec for MoeKernel {
    fn source(&self) -> String {
        let histogram = |experts: usize, template: Template| {
            template.fill(&[
                ("EXPERTS", Hole::Int(experts as i64)),
                ("CHUNK", Hole::Int(CHUNK as i64)),
            ])
        };
        match *self {
            MoeKernel::Topk { dtype, k, groups } => topk_source(dtype, k, groups),
            MoeKernel::Count { experts } => histogram(experts, template!("moe_count.cu")),
            MoeKernel::Offsets { experts } => {
                template!("moe_offsets.cu").fill(&[("EXPERTS", Hole::Int(experts as i64))])
            }
            MoeKernel::Scatter { experts } => histogram(experts, template!("moe_scatter.cu")),
        }
    }
}

/// Thread per row: `k` scans for the best untaken allowed expert (groups first, if limited).
fn topk_source(dtype: DType, k: usize, groups: Option<(usize, usize)>) -> String {
    let mut holes = vec![
        ("DTYPE_NAME", Hole::Name(dtype)),
        ("K", Hole::Int(k as i64)),
        ("HALF", Hole::Flag(dtype.needs_half_headers())),
        ("T", Hole::Storage(dtype)),
        ("GROUPS", Hole::Flag(groups.is_some())),
        ("SCORE", Hole::code(dtype.load_expr("s[e]"))),
    ];
    holes.extend(group_holes(k, groups));
    template!("moe_topk.cu").fill(&holes)
}

/// The group limit's holes of a top-k template (`GROUPS_NOTE`, and with a limit `NUM_GROUPS`,
/// `PER_GROUP`, `GROUP_TOPK`), shared with the fused router's.
pub(super) fn group_holes(
    k: usize,
    groups: Option<(usize, usize)>,
) -> Vec<(&'static str, Hole<'static>)> {
    match groups {
        Some((num, group_topk)) => vec![
            (
                "GROUPS_NOTE",
                Hole::code(format!(" groups {num} top {group_topk}")),
            ),
            ("NUM_GROUPS", Hole::Int(num as i64)),
            ("PER_GROUP", Hole::Int((k / group_topk) as i64)),
            ("GROUP_TOPK", Hole::Int(group_topk as i64)),
        ],
        None => vec![("GROUPS_NOTE", Hole::code(""))],
    }
}

/// Whether [`topk`] runs for these scores: a float dtype, `k` and the groups within the
/// kernel's bounds.
pub fn topk_supports(scores: &CudaTensor, k: usize, groups: Option<(usize, usize)>) -> bool {
    let [_, experts] = scores.shape() else {
        return false;
    };
    scores.dtype().is_float()
        && (1..=MAX_TOPK.min(*experts)).contains(&k)
        && groups.is_none_or(|(num, group_topk)| {
            (1..=MAX_GROUPS).contains(&num)
                && experts.is_multiple_of(num)
                && (1..=num).contains(&group_topk)
                && k.is_multiple_of(group_topk)
                && k / group_topk <= (experts / num).min(MAX_TOPK)
        })
}

/// `scores [rows, experts]` → `[rows, k]` i64: each row's best experts, best first.
pub fn topk(scores: &CudaTensor, k: usize, groups: Option<(usize, usize)>) -> Result<CudaTensor> {
    let op = || {
        OpContext::new("moe_topk")
            .shape(scores.shape())
            .dtype(scores.dtype())
    };
    if !topk_supports(scores, k, groups) {
        return Err(CudaError::unsupported(
            op(),
            format!(
                "float [rows, experts] scores, 1 ≤ k ≤ {MAX_TOPK}, at most {MAX_GROUPS} even groups"
            ),
        ));
    }
    let scores = scores.contiguous()?;
    let [rows, experts] = [scores.shape()[0], scores.shape()[1]];
    let out = CudaTensor::empty(scores.device(), &[rows, k], DType::I64)?;
    if rows == 0 {
        return Ok(out);
    }
    let spec = MoeKernel::Topk {
        dtype: scores.dtype(),
        k,
        groups,
    };
    let mut params = Params::new();
    params
        .ptr(scores.data_ptr())
        .ptr(out.data_ptr())
        .int(rows as i64)
        .int(experts as i64);
    let grid = rows.div_ceil(BLOCK as usize) as u32;
    launch(scores.device(), &spec, grid, BLOCK, &params, &op)?;
    Ok(out)
}

/// Whether [`permutation`] runs for this many experts.
pub fn permutation_supports(num_experts: usize) -> bool {
    (1..=MAX_EXPERTS).contains(&num_experts)
}

/// [`permutation`]'s result, all i64.
pub struct Permutation {
    /// `[n]`: the positions sorted stably by expert.
    pub order: CudaTensor,
    /// `[n]`: where each position went in `order`.
    pub rows: CudaTensor,
    /// `[num_experts]`: each expert's count.
    pub counts: CudaTensor,
}

/// `experts [n]` (int) → the positions sorted stably by expert, the inverse, and each expert's
/// count. Positions holding no valid expert are left out (the caller checks that the counts add
/// up to `n`).
pub fn permutation(experts: &CudaTensor, num_experts: usize) -> Result<Permutation> {
    let op = || {
        OpContext::new("moe_permutation")
            .shape(experts.shape())
            .dtype(experts.dtype())
    };
    if !permutation_supports(num_experts) || !experts.dtype().is_int() || experts.shape().len() != 1
    {
        return Err(CudaError::unsupported(
            op(),
            format!("int experts [n], 1 to {MAX_EXPERTS} of them"),
        ));
    }
    let experts = match experts.dtype() {
        DType::I64 => experts.contiguous()?,
        _ => crate::kernels::prim::elementwise::cast(experts, DType::I64)?,
    };
    let device = experts.device();
    let n = experts.numel();
    let blocks = n.div_ceil(CHUNK);
    let order = CudaTensor::empty(device, &[n], DType::I64)?;
    let rows = CudaTensor::empty(device, &[n], DType::I64)?;
    let counts = CudaTensor::empty(device, &[num_experts], DType::I64)?;
    let block_counts = CudaTensor::empty(device, &[blocks.max(1) * num_experts], DType::I64)?;
    if blocks > 0 {
        let mut params = Params::new();
        params
            .ptr(experts.data_ptr())
            .ptr(block_counts.data_ptr())
            .int(n as i64);
        let spec = MoeKernel::Count {
            experts: num_experts,
        };
        launch(device, &spec, blocks as u32, BLOCK, &params, &op)?;
    }
    let mut params = Params::new();
    params
        .ptr(block_counts.data_ptr())
        .ptr(counts.data_ptr())
        .int(blocks as i64);
    let spec = MoeKernel::Offsets {
        experts: num_experts,
    };
    launch(device, &spec, 1, BLOCK, &params, &op)?;
    if blocks > 0 {
        let mut params = Params::new();
        params
            .ptr(experts.data_ptr())
            .ptr(block_counts.data_ptr())
            .ptr(order.data_ptr())
            .ptr(rows.data_ptr())
            .int(n as i64);
        let spec = MoeKernel::Scatter {
            experts: num_experts,
        };
        launch(device, &spec, blocks as u32, 32, &params, &op)?;
    }
    Ok(Permutation {
        order,
        rows,
        counts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources() -> Vec<String> {
        let mut sources = Vec::new();
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for (k, groups) in [(1, None), (2, None), (8, Some((8, 4))), (6, Some((4, 3)))] {
                sources.push(MoeKernel::Topk { dtype, k, groups }.source());
            }
        }
        for experts in [8, 256, MAX_EXPERTS] {
            sources.push(MoeKernel::Count { experts }.source());
            sources.push(MoeKernel::Offsets { experts }.source());
            sources.push(MoeKernel::Scatter { experts }.source());
        }
        sources
    }

    #[test]
    fn moe_sources_are_unchanged() {
        insta::assert_snapshot!(crate::kernels::digests(&sources()));
    }

    #[test]
    fn kernels_are_named_after_their_step() {
        let names: Vec<String> = [
            MoeKernel::Topk {
                dtype: DType::BF16,
                k: 2,
                groups: None,
            },
            MoeKernel::Count { experts: 8 },
            MoeKernel::Offsets { experts: 8 },
            MoeKernel::Scatter { experts: 8 },
        ]
        .iter()
        .map(|spec| crate::engine::kernel_cache::kernel_name(&spec.source()))
        .collect();
        assert_eq!(
            names,
            [
                "moe_topk_bf16_k_2",
                "moe_count_experts_8",
                "moe_offsets_experts_8",
                "moe_scatter_experts_8"
            ]
        );
    }

    /// Every generated source compiles for sm_90 (NVRTC, no GPU needed).
    #[test]
    #[ignore = "needs NVRTC and the CUDA headers: tools/test.sh installs them and runs it"]
    fn moe_sources_compile() {
        for source in sources() {
            crate::engine::kernel_cache::compile_for_test(&source, "sm_90")
                .unwrap_or_else(|e| panic!("{e}\n{source}"));
        }
    }
}
