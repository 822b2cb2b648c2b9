//! The experts' grouped matmul with the row counts read on the device (`grouped_gemm.cu`, and
//! `grouped_gemm_sm90.cu` on Hopper): forward, input gradient and weight gradient, bf16 and f16,
//! fp32 accumulation.
//!
//! Why our own: cuBLAS's `cublasGemmGroupedBatchedEx` (`blas/grouped.rs`) takes each group's
//! shape as a host number, so a dropless MoE layer reads the routing's counts back and the GPU
//! waits for the host in every layer (the Qwen3-30B-A3B row: GPU busy 25 % of the step), and
//! cuBLASLt's grouped matmul with device shapes needs cuBLAS 13.2, newer than the GPU machine's.
//! Here the grid is the host's upper bound on the tiles (rows / 128 + groups row tiles, which
//! needs only the number of rows) and each block finds its group by a scan of the counts; blocks
//! past the last tile return. The weights are the groups' pointers, passed by value, so a stack
//! and experts' own tensors both work without a copy.
//!
//! Why several kernels: `mma.sync` (the portable one, sm_80 and later) runs on Hopper at about
//! half its tensor-core rate (208 TFLOP/s at Qwen3-30B-A3B's shape, where PyTorch's CUTLASS
//! grouped GEMM reaches 483). On sm_90 the same grid first fed Hopper's warpgroup MMA (`wgmma`)
//! from swizzled shared memory loaded by cp.async: 1.2–1.4× the portable kernel, but its main
//! loop was bound by what it read from L2 (0.41 of peak). The kernel Hopper runs now is organised
//! as CUTLASS's (`tma.rs`): persistent, a producer thread's TMA copies feeding two consumer
//! warpgroups through mbarriers. On one H100 (2026-12-07 22:47 UTC) it ran the four MoE shapes
//! timed at 338–686 TFLOP/s, 1.2–1.6× the cp.async kernel, and matched or beat one cuBLASLt
//! GEMM per expert everywhere but the small MoE's and Mixtral's weight gradient
//! (`backend/fused_ops` keeps those per expert where an expert fills the GPU).

use ferrotron_ops::fp8::scaling::Fp8Format;

use crate::engine::device::CudaDevice;
use crate::engine::dtype::DType;
use crate::engine::experts::Weights;
use crate::engine::launch::{KernelSpec, Params, launch};
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};
use crate::kernels::template::{Hole, template};

mod fp8;
mod tma;

pub use fp8::{fp8_inner, fp8_rows};

/// Tile edge of the output (rows and columns); the inner dimension runs in steps of 32.
const TILE: usize = 128;
/// Groups a launch can take: one thread of the block's scan each, and their pointers fit the
/// by-value parameters (4 KiB).
pub const MAX_GROUPS: usize = 256;
// four pointers, six integers and the groups' pointers, 8 bytes each
const _: () = assert!((4 + 6 + MAX_GROUPS) * 8 <= 4096);

/// Which tensor-core instructions run a grouped matmul.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// `mma.sync` through `ldmatrix`, 128 × 128 tiles (sm_80 and later).
    Portable,
    /// Hopper's warpgroup MMA from descriptors, 128 × 256 tiles where they divide the
    /// output's width, else 128 × 128 (sm_90 only).
    Hopper,
    /// Hopper's kernel with 128 × 128 tiles always (six stages instead of four), timed
    /// against the wide tiles.
    HopperNarrow,
    /// Hopper's kernel with 128 × 128 tiles in three stages (97 KiB) at 128 registers a
    /// thread, so two blocks share an SM and one's prologue and epilogue run under the other's
    /// main loop: timed against the others for the reductions of a few k-steps (an expert's
    /// rows in the weight gradient).
    HopperPair,
    /// Hopper's warp-specialised persistent kernel (`grouped_gemm_sm90_tma.cu`): one block an
    /// SM walks the tiles, a producer warp's Tensor Memory Accelerator copies feed two consumer
    /// warpgroups' MMAs through mbarriers, so a tile's loads run under the previous tile's last
    /// MMAs and stores. 128 × 256 tiles where they divide the output, at most
    /// 252 groups (a 128-byte tensor map each among its parameters).
    HopperTma,
    /// [`Kernel::HopperTma`] in clusters of two blocks on neighbouring column tiles, each
    /// loading half of the shared row tile and multicasting it into both: a third less read from
    /// L2 a step at 128 × 256. Where the output's column tiles do not pair up, the single-block
    /// kernel runs.
    HopperTmaCluster,
    /// [`Kernel::HopperTma`] on CUTLASS's ping-pong schedule: 128 × 128 tiles, each consumer
    /// warpgroup taking every other tile whole, so one's stores run under the other's MMAs.
    /// 16-bit operands only.
    HopperTmaPingpong,
}

impl Kernel {
    /// The fastest kernel the device runs for `groups` groups: on Hopper the one fed by the
    /// TMA (H100, 2026-12-07 22:47 UTC: 1.2–1.6× the cp.async kernel at every MoE shape timed,
    /// Qwen3-30B-A3B's forward 0.870 ms against 1.193), which takes at most 252 groups; past
    /// those, the cp.async kernel.
    pub fn best(device: &CudaDevice, groups: usize) -> Self {
        match device.arch() {
            "sm_90" if groups <= tma::MAX_GROUPS => Kernel::HopperTma,
            "sm_90" => Kernel::Hopper,
            _ => Kernel::Portable,
        }
    }

    /// The kernel the recipe's `runtime.grouped_gemm_kernel` asks for, where the device and the
    /// groups allow it (all are Hopper's, the TMA ones take at most 252 groups); else
    /// [`Kernel::best`].
    pub fn chosen(device: &CudaDevice, groups: usize) -> Self {
        match Self::asked() {
            Some(Kernel::Hopper) if device.arch() == "sm_90" => Kernel::Hopper,
            Some(kernel) if device.arch() == "sm_90" && groups <= tma::MAX_GROUPS => kernel,
            _ => Self::best(device, groups),
        }
    }

    /// The TMA kernel fp8 operands run on (they have no other): the cluster form where
    /// `runtime.grouped_gemm_kernel` asks for it, else the single-block one.
    pub fn chosen_fp8() -> Self {
        match Self::asked() {
            Some(Kernel::HopperTmaCluster) => Kernel::HopperTmaCluster,
            _ => Kernel::HopperTma,
        }
    }

    /// The kernel `runtime.grouped_gemm_kernel` names (none for `auto`).
    fn asked() -> Option<Self> {
        match crate::switches::paths().grouped_gemm_kernel {
            crate::switches::GroupedKernel::Auto => None,
            crate::switches::GroupedKernel::CpAsync => Some(Kernel::Hopper),
            crate::switches::GroupedKernel::Tma => Some(Kernel::HopperTma),
            crate::switches::GroupedKernel::TmaCluster => Some(Kernel::HopperTmaCluster),
            crate::switches::GroupedKernel::TmaPingpong => Some(Kernel::HopperTmaPingpong),
        }
    }

    /// Every kernel the device runs, the best first (for the checks that compare them).
    pub fn available(device: &CudaDevice) -> Vec<Self> {
        match Self::best(device, 1) {
            Kernel::Portable => vec![Kernel::Portable],
            _ => vec![
                Kernel::HopperTma,
                Kernel::Hopper,
                Kernel::HopperNarrow,
                Kernel::HopperPair,
                Kernel::HopperTmaCluster,
                Kernel::HopperTmaPingpong,
                Kernel::Portable,
            ],
        }
    }

    /// Whether this is Hopper's warpgroup-MMA kernel.
    fn is_hopper(self) -> bool {
        matches!(
            self,
            Kernel::Hopper
                | Kernel::HopperNarrow
                | Kernel::HopperPair
                | Kernel::HopperTma
                | Kernel::HopperTmaCluster
                | Kernel::HopperTmaPingpong
        )
    }

    /// Whether this is the kernel fed by the TMA (any form).
    fn is_tma(self) -> bool {
        matches!(
            self,
            Kernel::HopperTma | Kernel::HopperTmaCluster | Kernel::HopperTmaPingpong
        )
    }

    /// Output tile columns for an output `cols` wide: Hopper's widest instruction where it
    /// divides them.
    fn tile_cols(self, cols: usize) -> usize {
        match self {
            Kernel::Hopper | Kernel::HopperTma | Kernel::HopperTmaCluster
                if cols.is_multiple_of(256) =>
            {
                256
            }
            _ => TILE,
        }
    }
}

/// Which product of a grouped matmul `y = x · w_g` (row block `g` of `x [rows, k]` times
/// `w_g [k, n]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Product {
    /// `y = x · w_g`.
    Forward,
    /// `dx = dy · w_gᵀ`.
    InputGrad,
    /// `dw_g = x_gᵀ · dy_g`, summed over the group's rows.
    WeightGrad,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct GroupedGemm {
    /// The operands' and output's dtype (fp8 operands: the output's).
    dtype: DType,
    groups: usize,
    product: Product,
    kernel: Kernel,
    /// Output tile columns ([`Kernel::tile_cols`]).
    tile_cols: usize,
    /// fp8 operands, both stored with the reduction contiguous: then [`Product::Forward`] is
    /// the rows product `A[r] · B_gᵀ` and [`Product::WeightGrad`] the inner one `Aᵀ_g · B_g`
    /// from `Aᵀ` and `Bᵀ` (the TMA kernels only).
    fp8: Option<Fp8Mma>,
}

/// An fp8 grouped GEMM's operand formats (A's, B's) and whether each step's MMAs are summed
/// apart and promoted into the f32 total (the gradients' split accumulation; 128-wide tiles,
/// whose two accumulators fit the registers) or chained (the forward's fast accumulation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Fp8Mma {
    a: Fp8Format,
    b: Fp8Format,
    split: bool,
}

impl GroupedGemm {
    /// Hopper's stages of shared memory: 192 KiB of them whatever the tile, or half of that
    /// for two blocks an SM.
    fn stages(&self) -> usize {
        match (self.kernel, self.tile_cols) {
            (Kernel::HopperPair, _) => 3,
            (_, 256) => 4,
            _ => 6,
        }
    }

    /// Blocks an SM the kernel is compiled for (`__launch_bounds__`).
    fn blocks_per_sm(&self) -> i64 {
        if self.kernel == Kernel::HopperPair {
            2
        } else {
            1
        }
    }

    fn mode(&self) -> &'static str {
        match self.product {
            Product::Forward => "forward",
            Product::InputGrad => "input_grad",
            Product::WeightGrad => "weight_grad",
        }
    }

    fn mma(&self) -> &'static str {
        if self.dtype == DType::BF16 {
            "bf16"
        } else {
            "f16"
        }
    }

    /// What both kernels share: the parameters, the copies, the output's packing and the
    /// lookup of a block's group and tile.
    fn tiles(&self) -> String {
        template!("grouped_gemm_tiles.cu").fill(&[
            ("BF16", Hole::Flag(self.dtype == DType::BF16)),
            ("ROWS", Hole::Flag(self.product != Product::WeightGrad)),
            ("CP_ASYNC", Hole::Flag(!self.kernel.is_tma())),
        ])
    }

    /// Hopper's descriptors and one MMA of the tile's width, for both warpgroup kernels.
    fn wgmma_helpers(&self, a_mn: bool, b_mn: bool) -> String {
        let mma = match self.fp8 {
            Some(fp8) => wgmma_fp8_asm(self.tile_cols, fp8.a, fp8.b),
            None => wgmma_asm(self.tile_cols, self.mma(), a_mn, b_mn),
        };
        template!("grouped_gemm_wgmma.cu").fill(&[("WGMMA", Hole::code(mma))])
    }

    fn portable_source(&self) -> String {
        let (a_t, b_t) = match self.product {
            Product::Forward => (false, false),
            Product::InputGrad => (false, true),
            Product::WeightGrad => (true, false),
        };
        template!("grouped_gemm.cu").fill(&[
            ("NAME", Hole::Name(self.dtype)),
            (
                "MODE",
                Hole::code(format!("{} groups {}", self.mode(), self.groups)),
            ),
            ("GROUPS", Hole::Int(self.groups as i64)),
            ("ELEM", Hole::Storage(self.dtype)),
            ("MMA", Hole::code(self.mma())),
            ("TILES", Hole::code(self.tiles())),
            ("A_T", Hole::Flag(a_t)),
            ("B_T", Hole::Flag(b_t)),
        ])
    }

    /// The warp-specialised kernel: the same operand layouts as [`Self::hopper_source`], loaded
    /// by the TMA.
    fn tma_source(&self) -> String {
        let mut holes = self.sm90_holes();
        holes.extend([
            ("ROWS", Hole::Flag(self.product != Product::WeightGrad)),
            (
                "CLUSTER",
                Hole::Flag(self.kernel == Kernel::HopperTmaCluster),
            ),
            ("FP8", Hole::Flag(self.fp8.is_some())),
            ("SPLIT", Hole::Flag(self.fp8.is_some_and(|fp8| fp8.split))),
            (
                "PINGPONG",
                Hole::Flag(self.kernel == Kernel::HopperTmaPingpong),
            ),
        ]);
        template!("grouped_gemm_sm90_tma.cu").fill(&holes)
    }

    /// The holes both warpgroup kernels' templates have.
    fn sm90_holes(&self) -> Vec<(&'static str, Hole<'static>)> {
        let (a_mn, b_mn) = self.operand_layouts();
        vec![
            ("NAME", Hole::Name(self.dtype)),
            ("MODE", Hole::code(self.header())),
            ("BN", Hole::Int(self.tile_cols as i64)),
            ("STAGES", Hole::Int(self.stages() as i64)),
            ("GROUPS", Hole::Int(self.groups as i64)),
            ("ELEM", Hole::Storage(self.dtype)),
            ("WGMMA_HELPERS", Hole::code(self.wgmma_helpers(a_mn, b_mn))),
            ("TILES", Hole::code(self.tiles())),
            ("A_MN", Hole::Flag(a_mn)),
            ("B_MN", Hole::Flag(b_mn)),
        ]
    }

    /// A warpgroup kernel's header words: the product (fp8's formats and form), the tile width,
    /// the variant, the groups.
    fn header(&self) -> String {
        let what = match self.fp8 {
            Some(fp8) => format!(
                "fp8 {} {} {}{}",
                fp8.a.name(),
                fp8.b.name(),
                if self.product == Product::WeightGrad {
                    "inner"
                } else {
                    "rows"
                },
                if fp8.split { " split" } else { "" }
            ),
            None => self.mode().to_string(),
        };
        let variant = match self.kernel {
            Kernel::HopperPair => " pair",
            Kernel::HopperTmaCluster => " cluster",
            Kernel::HopperTmaPingpong => " pingpong",
            _ => "",
        };
        format!("{what} n{}{variant} groups {}", self.tile_cols, self.groups)
    }

    /// Which operand is stored with the reduction dimension outermost (wgmma's transpose; fp8
    /// operands never are).
    fn operand_layouts(&self) -> (bool, bool) {
        if self.fp8.is_some() {
            return (false, false);
        }
        match self.product {
            Product::Forward => (false, true),
            Product::InputGrad => (false, false),
            Product::WeightGrad => (true, true),
        }
    }

    fn hopper_source(&self) -> String {
        let mut holes = self.sm90_holes();
        holes.push(("BLOCKS_PER_SM", Hole::Int(self.blocks_per_sm())));
        template!("grouped_gemm_sm90.cu").fill(&holes)
    }
}

/// The body of `wgmma(d, a, b)`: one `m64n{n}k16` MMA, fp32 accumulators `d[0..n/2]` added to,
/// both operands from shared-memory descriptors.
fn wgmma_asm(n: usize, mma: &str, a_mn: bool, b_mn: bool) -> String {
    let regs = n / 2;
    let list = (0..regs).map(|i| format!("%{i}")).collect::<Vec<_>>();
    let outputs = (0..regs)
        .map(|i| format!(r#""+f"(d[{i}])"#))
        .collect::<Vec<_>>();
    let (a, b, scale) = (regs, regs + 1, regs + 2);
    let (ta, tb) = (u8::from(a_mn), u8::from(b_mn));
    [
        "  asm volatile(".to_string(),
        format!(r#"      "{{\n.reg .pred p;\nsetp.ne.b32 p, %{scale}, 0;\n""#),
        format!(r#"      "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{mma}.{mma} ""#),
        format!(
            r#"      "{{{}}}, %{a}, %{b}, p, 1, 1, {ta}, {tb};\n}}\n""#,
            list.join(", ")
        ),
        format!("      : {}", outputs.join(", ")),
        r#"      : "l"(a), "l"(b), "r"(1));"#.to_string(),
    ]
    .join("\n")
}

/// The body of `wgmma(d, a, b)` for fp8 operands: one `m64n{n}k32` MMA, both operands
/// K-major from shared-memory descriptors (fp8 has no transpose), fp32 accumulators added to.
fn wgmma_fp8_asm(n: usize, a: Fp8Format, b: Fp8Format) -> String {
    let regs = n / 2;
    let list = (0..regs).map(|i| format!("%{i}")).collect::<Vec<_>>();
    let outputs = (0..regs)
        .map(|i| format!(r#""+f"(d[{i}])"#))
        .collect::<Vec<_>>();
    let (da, db, scale) = (regs, regs + 1, regs + 2);
    let ptx = |f: Fp8Format| match f {
        Fp8Format::E4m3 => "e4m3",
        Fp8Format::E5m2 => "e5m2",
    };
    [
        "  asm volatile(".to_string(),
        format!(r#"      "{{\n.reg .pred p;\nsetp.ne.b32 p, %{scale}, 0;\n""#),
        format!(
            r#"      "wgmma.mma_async.sync.aligned.m64n{n}k32.f32.{}.{} ""#,
            ptx(a),
            ptx(b)
        ),
        format!(
            r#"      "{{{}}}, %{da}, %{db}, p, 1, 1;\n}}\n""#,
            list.join(", ")
        ),
        format!("      : {}", outputs.join(", ")),
        r#"      : "l"(a), "l"(b), "r"(1));"#.to_string(),
    ]
    .join("\n")
}

impl KernelSpec for GroupedGemm {
    fn source(&self) -> String {
        match self.kernel {
            Kernel::HopperTma | Kernel::HopperTmaCluster | Kernel::HopperTmaPingpong => {
                self.tma_source()
            }
            Kernel::Portable => self.portable_source(),
            _ => self.hopper_source(),
        }
    }

    fn arch_specific(&self) -> bool {
        self.kernel.is_hopper()
    }

    /// Hopper: the stages and 1 KiB to align them.
    fn shared_bytes(&self) -> u32 {
        if self.kernel.is_hopper() {
            let stage = (TILE * 64 + 64 * self.tile_cols) * 2;
            (self.stages() * stage + 1024) as u32
        } else {
            0
        }
    }
}

/// Whether the kernels take `x [rows, k]` against the experts' weights (`[groups, k, n]`): a
/// 16-bit dtype for both, `k` and `n` multiples of 128, at most [`MAX_GROUPS`] groups.
/// Otherwise the caller takes cuBLAS's grouped call.
pub fn supports(x: &CudaTensor, weights: Weights<'_>) -> bool {
    let ([_, k], Some((groups, k2, n)), Some(dtype)) = (x.shape(), weights.dims(), weights.dtype())
    else {
        return false;
    };
    *k == k2 && takes(x.dtype(), dtype, k2, n, groups)
}

/// What every product needs: one 16-bit dtype, `k` and `n` whole tiles, 1 to
/// [`MAX_GROUPS`] groups.
fn takes(a: DType, b: DType, k: usize, n: usize, groups: usize) -> bool {
    matches!(a, DType::BF16 | DType::F16)
        && a == b
        && k.is_multiple_of(TILE)
        && n.is_multiple_of(TILE)
        && (1..=MAX_GROUPS).contains(&groups)
}

const TAKES: &str = "16-bit operands of one dtype, k and n multiples of 128, 1 to 256 groups";

/// The TMA kernel's parameters hold a map per group: fewer groups than the others take.
fn check_groups(kernel: Kernel, groups: usize, op: &OpContext) -> Result<()> {
    if kernel.is_tma() && groups > tma::MAX_GROUPS {
        return Err(CudaError::unsupported(
            op.clone(),
            format!("the TMA kernel takes at most {} groups", tma::MAX_GROUPS),
        ));
    }
    Ok(())
}

fn context(name: &str, x: &CudaTensor, weight_shape: &[usize]) -> OpContext {
    OpContext::new(name)
        .shape(x.shape())
        .shape(weight_shape)
        .dtype(x.dtype())
}

/// The experts' weights' `[groups, k, n]`, for messages.
fn weights_shape(weights: Weights<'_>) -> Vec<usize> {
    weights
        .dims()
        .map_or_else(Vec::new, |(groups, k, n)| vec![groups, k, n])
}

/// `counts [groups]` as contiguous i64 on the device, checked against the groups.
fn device_counts(counts: &CudaTensor, groups: usize, op: &OpContext) -> Result<CudaTensor> {
    if counts.shape() != [groups] || !counts.dtype().is_int() {
        return Err(CudaError::invalid(
            op.clone(),
            format!("the counts must be [{groups}] integers"),
        ));
    }
    match counts.dtype() {
        DType::I64 => counts.contiguous(),
        _ => counts.cast(DType::I64),
    }
}

/// A contiguous operand whose start is 16-byte aligned (a view may start anywhere).
fn aligned(x: &CudaTensor) -> Result<CudaTensor> {
    let x = x.contiguous()?;
    if x.data_ptr().is_multiple_of(16) {
        Ok(x)
    } else {
        crate::kernels::prim::elementwise::copy(&x)
    }
}

/// Each expert's matrix's device address, as the kernels take the weights (by value).
fn pointers(matrices: &[CudaTensor]) -> Vec<i64> {
    matrices.iter().map(|m| m.data_ptr() as i64).collect()
}

/// Row block `g` of `x [rows, k]` (`counts[g]` rows, on the device) times expert `g`'s `[k, n]`
/// weight → `[rows, n]`.
pub fn forward(
    kernel: Kernel,
    x: &CudaTensor,
    weights: Weights<'_>,
    counts: &CudaTensor,
) -> Result<CudaTensor> {
    let op = context("grouped_gemm", x, &weights_shape(weights));
    rows_product(kernel, x, weights, counts, Product::Forward, &op)
}

/// `dx = dy · w_gᵀ` for each row block: `grad_output [rows, n]` → `[rows, k]`.
pub fn input_grad(
    kernel: Kernel,
    grad_output: &CudaTensor,
    weights: Weights<'_>,
    counts: &CudaTensor,
) -> Result<CudaTensor> {
    let op = context(
        "grouped_gemm_input_grad",
        grad_output,
        &weights_shape(weights),
    );
    rows_product(
        kernel,
        grad_output,
        weights,
        counts,
        Product::InputGrad,
        &op,
    )
}

/// The forward and the input gradient: one output row block per group, the weights' pointers
/// by value.
fn rows_product(
    kernel: Kernel,
    a: &CudaTensor,
    weights: Weights<'_>,
    counts: &CudaTensor,
    product: Product,
    op: &OpContext,
) -> Result<CudaTensor> {
    let ([rows, a_cols], Some((groups, k, n)), Some(dtype)) =
        (a.shape(), weights.dims(), weights.dtype())
    else {
        return Err(CudaError::invalid(
            op.clone(),
            "the rows must be [rows, cols], the weights [groups, k, n]",
        ));
    };
    let rows = *rows;
    // forward: [rows, k] · [k, n]; input gradient: [rows, n] · [k, n]ᵀ
    let (inner, out_cols) = match product {
        Product::InputGrad => (n, k),
        _ => (k, n),
    };
    if *a_cols != inner || !takes(a.dtype(), dtype, k, n, groups) {
        return Err(CudaError::unsupported(op.clone(), TAKES));
    }
    check_groups(kernel, groups, op)?;
    let counts = device_counts(counts, groups, op)?;
    let a = aligned(a)?;
    let weights: Vec<CudaTensor> = weights
        .matrices()?
        .iter()
        .map(aligned)
        .collect::<Result<_>>()?;
    let out = CudaTensor::empty(a.device(), &[rows, out_cols], a.dtype())?;
    let spec = GroupedGemm {
        dtype: a.dtype(),
        groups,
        product,
        kernel,
        tile_cols: kernel.tile_cols(out_cols),
        fp8: None,
    };
    let n_tiles = out_cols / spec.tile_cols;
    let row_tiles = rows.div_ceil(TILE) + groups;
    let blocks = row_tiles * n_tiles;
    if rows == 0 {
        return Ok(out);
    }
    if kernel.is_tma() {
        tma::rows_product(&spec, &a, &weights, &counts, &out, None, op)?;
        return Ok(out);
    }
    let mut params = Params::new();
    params
        .ptr(a.data_ptr())
        .ptr(0)
        .ptr(out.data_ptr())
        .ptr(counts.data_ptr())
        .int(n_tiles as i64)
        .int(row_tiles as i64)
        .int(inner as i64)
        .int(inner as i64)
        .int(n as i64)
        .int(out_cols as i64)
        .padded(&pointers(&weights), groups);
    launch_blocks(&a, &spec, blocks, &params, op)?;
    Ok(out)
}

/// `dweight[g] = x_gᵀ · dy_g` over each group's rows: `x [rows, k]`, `grad_output [rows, n]`
/// → `[groups, k, n]` (zeros for a group without rows).
pub fn weight_grad(
    kernel: Kernel,
    x: &CudaTensor,
    grad_output: &CudaTensor,
    counts: &CudaTensor,
    groups: usize,
) -> Result<CudaTensor> {
    let op = context("grouped_gemm_weight_grad", x, grad_output.shape());
    let ([rows, k], [rows2, n]) = (x.shape(), grad_output.shape()) else {
        return Err(CudaError::invalid(
            op,
            "x must be [rows, k], the output gradient [rows, n]",
        ));
    };
    let (rows, k, n) = (*rows, *k, *n);
    if rows != *rows2 || !takes(x.dtype(), grad_output.dtype(), k, n, groups) {
        return Err(CudaError::unsupported(op, TAKES));
    }
    check_groups(kernel, groups, &op)?;
    // No rows: every group's gradient is zeros, which the cp.async kernel writes without a
    // tensor map (the TMA's cannot describe an empty matrix).
    let kernel = if rows == 0 && kernel.is_tma() {
        Kernel::Hopper
    } else {
        kernel
    };
    let counts = device_counts(counts, groups, &op)?;
    let x = aligned(x)?;
    let grad_output = aligned(grad_output)?;
    let out = CudaTensor::empty(x.device(), &[groups, k, n], x.dtype())?;
    let spec = GroupedGemm {
        dtype: x.dtype(),
        groups,
        product: Product::WeightGrad,
        kernel,
        tile_cols: kernel.tile_cols(n),
        fp8: None,
    };
    if kernel.is_tma() {
        tma::weight_grad(&spec, &x, &grad_output, &counts, &out, None, &op)?;
        return Ok(out);
    }
    let (m_tiles, n_tiles) = (k / TILE, n / spec.tile_cols);
    let blocks = groups * m_tiles * n_tiles;
    let mut params = Params::new();
    params
        .ptr(x.data_ptr())
        .ptr(grad_output.data_ptr())
        .ptr(0)
        .ptr(counts.data_ptr())
        .int(n_tiles as i64)
        .int(m_tiles as i64)
        .int(0)
        .int(k as i64)
        .int(n as i64)
        .int(n as i64)
        .padded(&pointers(&Weights::Stacked(&out).matrices()?), groups);
    launch_blocks(&x, &spec, blocks, &params, &op)?;
    Ok(out)
}

fn launch_blocks(
    on: &CudaTensor,
    spec: &GroupedGemm,
    blocks: usize,
    params: &Params,
    op: &OpContext,
) -> Result<()> {
    let grid = u32::try_from(blocks).map_err(|_| {
        CudaError::unsupported(op.clone(), format!("{blocks} tiles exceed one grid"))
    })?;
    launch(on.device(), spec, grid, 256, params, &|| op.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs() -> Vec<GroupedGemm> {
        let mut specs = Vec::new();
        for dtype in [DType::BF16, DType::F16] {
            for product in [Product::Forward, Product::InputGrad, Product::WeightGrad] {
                for groups in [8, 128, MAX_GROUPS] {
                    for (kernel, tile_cols) in [
                        (Kernel::Portable, TILE),
                        (Kernel::HopperNarrow, 128),
                        (Kernel::HopperPair, 128),
                        (Kernel::Hopper, 256),
                    ] {
                        specs.push(GroupedGemm {
                            dtype,
                            groups,
                            product,
                            kernel,
                            tile_cols,
                            fp8: None,
                        });
                    }
                }
            }
        }
        for dtype in [DType::BF16, DType::F16] {
            for product in [Product::Forward, Product::InputGrad, Product::WeightGrad] {
                // the most groups (32 KiB of parameters) once per product and dtype
                for (groups, widths) in [
                    (8, &[128, 256][..]),
                    (128, &[128, 256]),
                    (tma::MAX_GROUPS, &[256]),
                ] {
                    for &tile_cols in widths {
                        for kernel in [Kernel::HopperTma, Kernel::HopperTmaCluster] {
                            specs.push(GroupedGemm {
                                dtype,
                                groups,
                                product,
                                kernel,
                                tile_cols,
                                fp8: None,
                            });
                        }
                    }
                }
            }
        }
        // fp8: the rows product (forward e4m3 · e4m3, fast; input gradient e5m2 · e4m3, split)
        // and the inner one (weight gradient e4m3 · e5m2, split)
        let (e4m3, e5m2) = (Fp8Format::E4m3, Fp8Format::E5m2);
        let fp8 = [
            (Product::Forward, e4m3, e4m3, false, &[128, 256][..]),
            (Product::Forward, e5m2, e4m3, true, &[128]),
            (Product::WeightGrad, e4m3, e5m2, true, &[128]),
        ];
        for (product, a, b, split, widths) in fp8 {
            for groups in [8, 128] {
                for &tile_cols in widths {
                    for kernel in [Kernel::HopperTma, Kernel::HopperTmaCluster] {
                        specs.push(GroupedGemm {
                            dtype: DType::BF16,
                            groups,
                            product,
                            kernel,
                            tile_cols,
                            fp8: Some(Fp8Mma { a, b, split }),
                        });
                    }
                }
            }
        }
        // the ping-pong schedule: 16-bit, 128 × 128 tiles
        for dtype in [DType::BF16, DType::F16] {
            for product in [Product::Forward, Product::InputGrad, Product::WeightGrad] {
                for groups in [8, 128, tma::MAX_GROUPS] {
                    specs.push(GroupedGemm {
                        dtype,
                        groups,
                        product,
                        kernel: Kernel::HopperTmaPingpong,
                        tile_cols: TILE,
                        fp8: None,
                    });
                }
            }
        }
        specs
    }

    #[test]
    fn hopper_stages_fit_a_block_of_shared_memory() {
        for spec in specs() {
            // sm_90's opt-in limit a block, and 228 KiB an SM (1 KiB of it the system's a block)
            assert!(spec.shared_bytes() <= 227 * 1024, "{spec:?}");
            let blocks = spec.blocks_per_sm() as u32;
            assert!(
                blocks * (spec.shared_bytes() + 1024) <= 228 * 1024,
                "{spec:?}"
            );
        }
    }

    #[test]
    fn the_widest_tile_divides_the_output() {
        assert_eq!(Kernel::Hopper.tile_cols(768), 256);
        assert_eq!(Kernel::Hopper.tile_cols(14336), 256);
        assert_eq!(Kernel::Hopper.tile_cols(1408), 128);
        assert_eq!(Kernel::HopperNarrow.tile_cols(768), 128);
        assert_eq!(Kernel::HopperPair.tile_cols(768), 128);
        assert_eq!(Kernel::Portable.tile_cols(768), 128);
    }

    #[test]
    fn grouped_gemm_sources_are_unchanged() {
        let sources: Vec<String> = specs().iter().map(KernelSpec::source).collect();
        insta::assert_snapshot!(crate::kernels::digests(&sources));
    }

    /// Every generated source compiles for sm_90 (the Hopper kernels for `sm_90a`; NVRTC, no
    /// GPU needed).
    #[test]
    #[ignore = "needs NVRTC and the CUDA headers: tools/test.sh installs them and runs it"]
    fn grouped_gemm_sources_compile() {
        let specs = specs();
        // NVRTC is thread-safe: one share of the specs a core (CI has two).
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        std::thread::scope(|scope| {
            for share in specs.chunks(specs.len().div_ceil(cores)) {
                scope.spawn(move || {
                    for spec in share {
                        let source = spec.source();
                        let arch = if spec.arch_specific() {
                            "sm_90a"
                        } else {
                            "sm_90"
                        };
                        crate::engine::kernel_cache::compile_for_test(&source, arch)
                            .unwrap_or_else(|e| panic!("{e}\n{source}"));
                    }
                });
            }
        });
    }
}
