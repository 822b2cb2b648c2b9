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
use crate::engine::launch::{BLOCK, KernelSpec, Params, includes, launch};
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};

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

/// A score's `total_cmp` key, and the scan that keeps the first of the best keys.
const TOTAL_ORDER: &str = r#"__device__ __forceinline__ int moe_key(float v) {
  const int bits = __float_as_int(v);
  return bits ^ ((bits >> 31) & 0x7fffffff);
}
"#;

impl KernelSpec for MoeKernel {
    fn source(&self) -> String {
        match *self {
            MoeKernel::Topk { dtype, k, groups } => topk_source(dtype, k, groups),
            MoeKernel::Count { experts } => format!(
                "// moe count experts {experts}\n\
                 struct Params {{ unsigned long long experts, block_counts; long long n; }};\n\
                 extern \"C\" __global__ void ferrotron_kernel(const Params p) {{\n\
                 \x20 __shared__ int hist[{experts}];\n\
                 \x20 for (int e = threadIdx.x; e < {experts}; e += blockDim.x) hist[e] = 0;\n\
                 \x20 __syncthreads();\n\
                 \x20 const long long start = (long long)blockIdx.x * {CHUNK};\n\
                 \x20 const long long end = min(start + {CHUNK}LL, p.n);\n\
                 \x20 const long long* __restrict__ x = (const long long*)p.experts;\n\
                 \x20 for (long long i = start + threadIdx.x; i < end; i += blockDim.x) {{\n\
                 \x20   const long long e = x[i];\n\
                 \x20   if (e >= 0 && e < {experts}) atomicAdd(&hist[e], 1);\n\
                 \x20 }}\n\
                 \x20 __syncthreads();\n\
                 \x20 long long* out = (long long*)p.block_counts + (long long)blockIdx.x * {experts};\n\
                 \x20 for (int e = threadIdx.x; e < {experts}; e += blockDim.x) out[e] = hist[e];\n\
                 }}\n"
            ),
            MoeKernel::Offsets { experts } => format!(
                "// moe offsets experts {experts}\n\
                 struct Params {{ unsigned long long block_counts, counts; long long blocks; }};\n\
                 extern \"C\" __global__ void ferrotron_kernel(const Params p) {{\n\
                 \x20 __shared__ long long first[{experts}];\n\
                 \x20 long long* bc = (long long*)p.block_counts;\n\
                 \x20 for (int e = threadIdx.x; e < {experts}; e += blockDim.x) {{\n\
                 \x20   long long run = 0;\n\
                 \x20   for (long long b = 0; b < p.blocks; ++b) {{\n\
                 \x20     const long long c = bc[b * {experts} + e];\n\
                 \x20     bc[b * {experts} + e] = run;\n\
                 \x20     run += c;\n\
                 \x20   }}\n\
                 \x20   first[e] = run;\n\
                 \x20   ((long long*)p.counts)[e] = run;\n\
                 \x20 }}\n\
                 \x20 __syncthreads();\n\
                 \x20 if (threadIdx.x == 0) {{\n\
                 \x20   long long run = 0;\n\
                 \x20   for (int e = 0; e < {experts}; ++e) {{ const long long c = first[e]; first[e] = run; run += c; }}\n\
                 \x20 }}\n\
                 \x20 __syncthreads();\n\
                 \x20 for (int e = threadIdx.x; e < {experts}; e += blockDim.x)\n\
                 \x20   for (long long b = 0; b < p.blocks; ++b) bc[b * {experts} + e] += first[e];\n\
                 }}\n"
            ),
            MoeKernel::Scatter { experts } => format!(
                "// moe scatter experts {experts}\n\
                 struct Params {{ unsigned long long experts, block_offsets, order, rows; long long n; }};\n\
                 extern \"C\" __global__ void ferrotron_kernel(const Params p) {{\n\
                 \x20 __shared__ long long next[{experts}];\n\
                 \x20 const long long* offsets = (const long long*)p.block_offsets + (long long)blockIdx.x * {experts};\n\
                 \x20 for (int e = threadIdx.x; e < {experts}; e += 32) next[e] = offsets[e];\n\
                 \x20 __syncwarp();\n\
                 \x20 const long long start = (long long)blockIdx.x * {CHUNK};\n\
                 \x20 const long long end = min(start + {CHUNK}LL, p.n);\n\
                 \x20 const long long* __restrict__ x = (const long long*)p.experts;\n\
                 \x20 long long* order = (long long*)p.order;\n\
                 \x20 long long* rows = (long long*)p.rows;\n\
                 \x20 const unsigned lane = threadIdx.x;\n\
                 \x20 for (long long base = start; base < end; base += 32) {{\n\
                 \x20   const long long i = base + lane;\n\
                 \x20   const long long e = i < end ? x[i] : -1;\n\
                 \x20   const bool valid = e >= 0 && e < {experts};\n\
                 \x20   const unsigned active = __ballot_sync(0xffffffffu, valid);\n\
                 \x20   if (valid) {{\n\
                 \x20     const unsigned peers = __match_any_sync(active, e);\n\
                 \x20     const unsigned rank = __popc(peers & ((1u << lane) - 1u));\n\
                 \x20     const long long row = next[e] + rank;\n\
                 \x20     order[row] = i;\n\
                 \x20     rows[i] = row;\n\
                 \x20     __syncwarp(active);\n\
                 \x20     if (rank == 0) next[e] += __popc(peers);\n\
                 \x20   }}\n\
                 \x20   __syncwarp();\n\
                 \x20 }}\n\
                 }}\n"
            ),
        }
    }
}

/// Thread per row: `k` scans for the best untaken allowed expert (groups first, if limited).
fn topk_source(dtype: DType, k: usize, groups: Option<(usize, usize)>) -> String {
    let label = groups.map_or(String::new(), |(g, gk)| format!(" groups {g} top {gk}"));
    let mut s = format!("// moe topk {dtype} k {k}{label}\n");
    s += includes(dtype.needs_half_headers());
    s += TOTAL_ORDER;
    s += "struct Params { unsigned long long scores, out; long long rows, experts; };\n";
    s += "extern \"C\" __global__ void ferrotron_kernel(const Params p) {\n";
    s += "  const long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n";
    s += "  if (row >= p.rows) return;\n";
    s += "  const int experts = (int)p.experts;\n";
    s += &format!(
        "  const {st}* __restrict__ s = (const {st}*)p.scores + row * experts;\n",
        st = dtype.storage_c()
    );
    let score = dtype.load_expr("s[e]");
    if let Some((num, group_topk)) = groups {
        let per_group = k / group_topk;
        s += &format!("  const int group_size = experts / {num};\n");
        s += &format!("  float sums[{num}];\n");
        s += &format!("  for (int g = 0; g < {num}; ++g) {{\n");
        s += "    int taken[32]; float sum = -0.0f;\n";
        s += &format!("    for (int j = 0; j < {per_group}; ++j) {{\n");
        s += "      int best = -1; int best_key = 0; float best_v = 0.f;\n";
        s += "      for (int e = g * group_size; e < (g + 1) * group_size; ++e) {\n";
        s += "        bool used = false;\n";
        s += "        for (int t = 0; t < j; ++t) used |= taken[t] == e;\n";
        s += &format!("        const float v = {score};\n");
        s += "        const int key = moe_key(v);\n";
        s += "        if (!used && (best < 0 || key > best_key)) { best = e; best_key = key; best_v = v; }\n";
        s += "      }\n";
        s += "      taken[j] = best; sum += best_v;\n";
        s += "    }\n";
        s += "    sums[g] = sum;\n";
        s += "  }\n";
        s += "  unsigned long long allowed = 0ull;\n";
        s += &format!("  for (int j = 0; j < {group_topk}; ++j) {{\n");
        s += "    int best = -1; int best_key = 0;\n";
        s += &format!("    for (int g = 0; g < {num}; ++g) {{\n");
        s += "      const int key = moe_key(sums[g]);\n";
        s += "      if (!((allowed >> g) & 1ull) && (best < 0 || key > best_key)) { best = g; best_key = key; }\n";
        s += "    }\n";
        s += "    allowed |= 1ull << best;\n";
        s += "  }\n";
    }
    s += &format!("  long long* out = (long long*)p.out + row * {k};\n");
    s += &format!("  int picked[{k}];\n");
    s += &format!("  for (int j = 0; j < {k}; ++j) {{\n");
    s += "    int best = -1; int best_key = 0;\n";
    s += "    for (int e = 0; e < experts; ++e) {\n";
    if groups.is_some() {
        s += "      if (!((allowed >> (e / group_size)) & 1ull)) continue;\n";
    }
    s += "      bool used = false;\n";
    s += "      for (int t = 0; t < j; ++t) used |= picked[t] == e;\n";
    s += &format!("      const int key = moe_key({score});\n");
    s += "      if (!used && (best < 0 || key > best_key)) { best = e; best_key = key; }\n";
    s += "    }\n";
    s += "    picked[j] = best; out[j] = best;\n";
    s += "  }\n}\n";
    s
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
        .map(|spec| crate::engine::launch::kernel_name(&spec.source()))
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
