//! Reductions along one dim (and over everything): sum, mean, prod, max, min, max-abs,
//! any, all, argmax, argmin.
//!
//! One block reduces one output element: its threads stride over the reduced dim, then meet in
//! a shared-memory tree. Full reductions of large tensors run in two passes (many blocks write
//! partials in the accumulator type, one block finishes), so they use the whole GPU.

use crate::engine::dtype::DType;
use crate::engine::launch::{Params, launch};
use crate::engine::layout::coalesce;
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, Result};
use crate::kernels::template::{Hole, template};

/// Threads per reduction block (also the shared-memory tree size).
const REDUCE_BLOCK: u32 = 256;
/// Full reductions above this many elements use the two-pass path.
const SPLIT_THRESHOLD: usize = 1 << 16;

/// Value reductions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Mean,
    Prod,
    Max,
    Min,
    /// max(|x|)
    MaxAbs,
    /// Σ x², accumulated and returned in the accumulator type (f32 for 16-bit floats): a
    /// gradient's share of the global norm in one pass, without an fp32 copy of it.
    SumSquares,
    /// Any element non-zero (bool result).
    Any,
    /// All elements non-zero (bool result).
    All,
}

/// Index reductions (i64 result; the first index wins ties).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArgOp {
    ArgMax,
    ArgMin,
}

impl ReduceOp {
    pub fn output_dtype(self, input: DType) -> DType {
        match self {
            ReduceOp::Any | ReduceOp::All => DType::Bool,
            ReduceOp::SumSquares => self.partial_dtype(input),
            _ => input,
        }
    }

    fn acc_c(self, input: DType) -> &'static str {
        match self {
            ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Prod | ReduceOp::SumSquares => {
                input.accumulate_c()
            }
            ReduceOp::Max | ReduceOp::Min | ReduceOp::MaxAbs => input.compute_c(),
            ReduceOp::Any | ReduceOp::All => "bool",
        }
    }

    /// Dtype that holds partial results of the two-pass path exactly.
    fn partial_dtype(self, input: DType) -> DType {
        match self.acc_c(input) {
            "float" => DType::F32,
            "long long" => DType::I64,
            "int" => DType::I32,
            "unsigned int" => DType::U8,
            _ => DType::Bool,
        }
    }

    fn init(self, input: DType) -> &'static str {
        match self {
            ReduceOp::Sum | ReduceOp::Mean | ReduceOp::MaxAbs | ReduceOp::SumSquares => "0",
            ReduceOp::Prod => "1",
            ReduceOp::Max => input.min_value_c(),
            ReduceOp::Min => input.max_value_c(),
            ReduceOp::Any => "false",
            ReduceOp::All => "true",
        }
    }

    /// Maps a loaded value to the accumulator domain.
    fn lift(self, input: DType) -> String {
        let acc = self.acc_c(input);
        match self {
            ReduceOp::MaxAbs if input.is_float() => "fabsf(v)".into(),
            ReduceOp::MaxAbs if input == DType::U8 || input.is_bool() => "v".into(),
            ReduceOp::MaxAbs => "(v < 0 ? -v : v)".into(),
            ReduceOp::Any | ReduceOp::All => "(v != 0)".into(),
            ReduceOp::SumSquares => format!("(({acc})v * ({acc})v)"),
            _ => format!("(({acc})v)"),
        }
    }

    /// Combines two accumulators `x` and `y`.
    fn combine(self) -> &'static str {
        match self {
            ReduceOp::Sum | ReduceOp::Mean | ReduceOp::SumSquares => "(x + y)",
            ReduceOp::Prod => "(x * y)",
            ReduceOp::Max | ReduceOp::MaxAbs => "(y > x ? y : x)",
            ReduceOp::Min => "(y < x ? y : x)",
            ReduceOp::Any => "(x || y)",
            ReduceOp::All => "(x && y)",
        }
    }
}

/// Everything that determines one generated reduction kernel.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReduceSpec {
    pub op: ReduceOp,
    pub input: DType,
    pub out: DType,
    /// Rank of the (merged) outer shape.
    pub rank: usize,
    pub strategy: Strategy,
}

/// How the work of a reduction is spread over threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// One block per output, threads stride over the reduced dim (long, contiguous rows).
    BlockPerOutput,
    /// One thread per output, looping over the reduced dim: neighbouring threads read
    /// neighbouring elements when the reduced dim is not the innermost one (column sums such
    /// as bias gradients), and short rows waste no threads.
    ThreadPerOutput,
    /// First pass of a two-pass full reduction: every block writes one raw partial.
    SplitPartials,
}

/// Picks the strategy for a reduction with this geometry (full reductions decide separately).
pub fn choose_strategy(outer_n: usize, red_n: usize, red_stride: isize) -> Strategy {
    if outer_n >= 1024 && (red_stride != 1 || red_n <= 32) {
        Strategy::ThreadPerOutput
    } else {
        Strategy::BlockPerOutput
    }
}

/// The parameter struct every reduction takes (`reduce_params.cu`).
fn params_decl(rank: usize) -> String {
    template!("reduce_params.cu").fill_piece(&[("RANK", Hole::Int(rank as i64))])
}

/// Where output `o`'s row starts (`outer_offset.cu`).
fn outer_offset_code(rank: usize) -> String {
    template!("outer_offset.cu").fill_piece(&[("RANK", Hole::Int(rank as i64))])
}

impl ReduceSpec {
    pub fn source(&self) -> String {
        let split = self.strategy == Strategy::SplitPartials;
        let thread_per_output = self.strategy == Strategy::ThreadPerOutput;
        let op = self.op;
        let result = match op {
            ReduceOp::Mean if thread_per_output => "(acc / p.divisor)",
            _ if thread_per_output => "acc",
            ReduceOp::Mean if !split => "(sdata[0] / p.divisor)",
            _ => "sdata[0]",
        };
        let holes = [
            ("OP", Hole::code(format!("{op:?}"))),
            ("INPUT_NAME", Hole::Name(self.input)),
            ("OUT_NAME", Hole::Name(self.out)),
            ("RANK", Hole::Int(self.rank as i64)),
            ("SPLIT_NOTE", Hole::code(if split { " split" } else { "" })),
            ("SPLIT", Hole::Flag(split)),
            (
                "HALF",
                Hole::Flag(self.input.needs_half_headers() || self.out.needs_half_headers()),
            ),
            ("PARAMS", Hole::code(params_decl(self.rank))),
            ("ACC", Hole::code(op.acc_c(self.input))),
            ("COMBINE", Hole::code(op.combine())),
            ("BLOCK", Hole::Int(REDUCE_BLOCK.into())),
            ("IN", Hole::Storage(self.input)),
            ("OUT", Hole::Storage(self.out)),
            ("OUTER_OFFSET", Hole::code(outer_offset_code(self.rank))),
            ("INIT", Hole::code(op.init(self.input))),
            ("COMPUTE", Hole::code(self.input.compute_c())),
            (
                "LOAD",
                Hole::code(self.input.load_expr("in[base + j * p.red_stride]")),
            ),
            ("LIFT", Hole::code(op.lift(self.input))),
            ("STORE", Hole::code(self.out.store_expr(result))),
        ];
        if thread_per_output {
            // the thread kernel has no shared memory, no split and no split note
            let unused = ["SPLIT_NOTE", "SPLIT", "BLOCK"];
            let holes: Vec<_> = holes
                .into_iter()
                .filter(|(n, _)| !unused.contains(n))
                .collect();
            template!("reduce_thread.cu").fill(&holes)
        } else {
            template!("reduce_block.cu").fill(&holes)
        }
    }
}

/// Everything that determines one generated arg-reduction kernel.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ArgReduceSpec {
    pub op: ArgOp,
    pub input: DType,
    pub rank: usize,
}

impl ArgReduceSpec {
    pub fn source(&self) -> String {
        let (init, better) = match self.op {
            ArgOp::ArgMax => (self.input.min_value_c(), ">"),
            ArgOp::ArgMin => (self.input.max_value_c(), "<"),
        };
        template!("arg_reduce.cu").fill(&[
            ("OP", Hole::code(format!("{:?}", self.op))),
            ("INPUT_NAME", Hole::Name(self.input)),
            ("RANK", Hole::Int(self.rank as i64)),
            ("HALF", Hole::Flag(self.input.needs_half_headers())),
            ("PARAMS", Hole::code(params_decl(self.rank))),
            ("CT", Hole::code(self.input.compute_c())),
            ("BLOCK", Hole::Int(REDUCE_BLOCK.into())),
            ("IN", Hole::Storage(self.input)),
            ("OUTER_OFFSET", Hole::code(outer_offset_code(self.rank))),
            ("INIT", Hole::code(init)),
            ("BETTER", Hole::code(better)),
            (
                "LOAD",
                Hole::code(self.input.load_expr("in[base + j * p.red_stride]")),
            ),
        ])
    }
}

/// The outer (kept) dims of `x` around `dim`, merged, plus the reduced dim's size and stride.
struct Geometry {
    outer_shape: Vec<usize>,
    outer_strides: Vec<isize>,
    outer_n: usize,
    red_n: usize,
    red_stride: isize,
}

fn geometry(x: &CudaTensor, dim: usize) -> Geometry {
    let mut shape = x.shape().to_vec();
    let mut strides = x.strides().to_vec();
    let red_n = shape.remove(dim);
    let red_stride = strides.remove(dim);
    let merged = coalesce(&shape, &[&strides]);
    Geometry {
        outer_n: shape.iter().product(),
        outer_shape: merged.shape,
        outer_strides: merged.strides[0].clone(),
        red_n,
        red_stride,
    }
}

fn reduce_params(g: &Geometry, x: &CudaTensor, out_ptr: u64, idx_ptr: u64, divisor: f64) -> Params {
    let mut p = Params::new();
    p.int(g.outer_n as i64).int(g.red_n as i64);
    p.ints(g.outer_shape.iter().map(|&d| d as i64));
    p.ints(g.outer_strides.iter().map(|&d| d as i64));
    p.int(g.red_stride as i64).int(x.offset() as i64);
    p.ptr(x.buffer_ptr())
        .ptr(out_ptr)
        .ptr(idx_ptr)
        .float(divisor);
    p
}

fn check_dim(x: &CudaTensor, dim: usize, op: &str) -> Result<()> {
    if dim >= x.rank() {
        return Err(CudaError::invalid(
            x.op(op),
            format!("dim {dim} out of range for rank {}", x.rank()),
        ));
    }
    Ok(())
}

fn keepdim_shape(x: &CudaTensor, dim: usize) -> Vec<usize> {
    let mut shape = x.shape().to_vec();
    shape[dim] = 1;
    shape
}

/// Reduces along `dim`, keeping it with size 1 (burn's `*_dim` shape).
pub fn reduce_dim(x: &CudaTensor, dim: usize, op: ReduceOp) -> Result<CudaTensor> {
    let name = format!("{op:?}_dim").to_lowercase();
    check_dim(x, dim, &name)?;
    let out = CudaTensor::empty(
        x.device(),
        &keepdim_shape(x, dim),
        op.output_dtype(x.dtype()),
    )?;
    run_reduce(x, dim, op, &out, false, x.shape()[dim] as f64, &name)?;
    Ok(out)
}

fn run_reduce(
    x: &CudaTensor,
    dim: usize,
    op: ReduceOp,
    out: &CudaTensor,
    split: bool,
    divisor: f64,
    name: &str,
) -> Result<()> {
    let g = geometry(x, dim);
    if g.outer_n == 0 {
        return Ok(());
    }
    let strategy = if split {
        Strategy::SplitPartials
    } else {
        choose_strategy(g.outer_n, g.red_n, g.red_stride)
    };
    let spec = ReduceSpec {
        op,
        input: x.dtype(),
        out: out.dtype(),
        rank: g.outer_shape.len(),
        strategy,
    };
    let blocks = match strategy {
        Strategy::SplitPartials => out.numel() as u32,
        Strategy::BlockPerOutput => {
            g.outer_n.clamp(1, crate::engine::launch::MAX_GRID as usize) as u32
        }
        Strategy::ThreadPerOutput => {
            crate::engine::launch::grid_for(g.outer_n as u64, REDUCE_BLOCK)
        }
    };
    let p = reduce_params(&g, x, out.data_ptr(), 0, divisor);
    launch(x.device(), &spec, blocks, REDUCE_BLOCK, &p, &|| x.op(name))
}

/// Reduces every element into a tensor of shape `[1]`.
pub fn reduce_all(x: &CudaTensor, op: ReduceOp) -> Result<CudaTensor> {
    let name = format!("{op:?}").to_lowercase();
    let flat = x.reshape(&[x.numel()])?;
    let n = flat.numel();
    let out_dtype = op.output_dtype(x.dtype());
    if n <= SPLIT_THRESHOLD {
        let out = CudaTensor::empty(x.device(), &[1], out_dtype)?;
        run_reduce(&flat, 0, op, &out, false, n as f64, &name)?;
        return Ok(out);
    }
    let partial_op = if op == ReduceOp::Mean {
        ReduceOp::Sum
    } else {
        op
    };
    let blocks = n.div_ceil(REDUCE_BLOCK as usize * 16).min(1024);
    let partials = CudaTensor::empty(x.device(), &[blocks], op.partial_dtype(x.dtype()))?;
    run_reduce(&flat, 0, partial_op, &partials, true, n as f64, &name)?;
    // Second pass: the same op over the partials (Mean divides by the original count).
    let second = match op {
        ReduceOp::Any | ReduceOp::All | ReduceOp::Mean | ReduceOp::Sum | ReduceOp::Prod => op,
        ReduceOp::SumSquares => ReduceOp::Sum,
        ReduceOp::Max | ReduceOp::MaxAbs => ReduceOp::Max,
        ReduceOp::Min => ReduceOp::Min,
    };
    let out = CudaTensor::empty(x.device(), &[1], out_dtype)?;
    run_reduce(&partials, 0, second, &out, false, n as f64, &name)?;
    Ok(out)
}

/// Index of the max/min along `dim` (kept with size 1), as i64.
pub fn arg_reduce_dim(x: &CudaTensor, dim: usize, op: ArgOp) -> Result<CudaTensor> {
    let name = format!("{op:?}").to_lowercase();
    check_dim(x, dim, &name)?;
    let out = CudaTensor::empty(x.device(), &keepdim_shape(x, dim), DType::I64)?;
    let g = geometry(x, dim);
    if g.outer_n == 0 {
        return Ok(out);
    }
    let spec = ArgReduceSpec {
        op,
        input: x.dtype(),
        rank: g.outer_shape.len(),
    };
    let p = reduce_params(&g, x, 0, out.data_ptr(), 1.0);
    launch(
        x.device(),
        &spec,
        g.outer_n.clamp(1, crate::engine::launch::MAX_GRID as usize) as u32,
        REDUCE_BLOCK,
        &p,
        &|| x.op(&name),
    )?;
    Ok(out)
}

impl crate::engine::launch::KernelSpec for ReduceSpec {
    fn source(&self) -> String {
        ReduceSpec::source(self)
    }
}

impl crate::engine::launch::KernelSpec for ArgReduceSpec {
    fn source(&self) -> String {
        ArgReduceSpec::source(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduce_sources_are_unchanged() {
        use ReduceOp::*;
        let strategies = [
            Strategy::BlockPerOutput,
            Strategy::ThreadPerOutput,
            Strategy::SplitPartials,
        ];
        let mut sources = Vec::new();
        for op in [Sum, Mean, Prod, Max, Min, MaxAbs, SumSquares, Any, All] {
            for input in DType::ALL {
                for out in [input, DType::F32] {
                    for strategy in strategies {
                        let rank = 2;
                        let spec = ReduceSpec {
                            op,
                            input,
                            out,
                            rank,
                            strategy,
                        };
                        sources.push(spec.source());
                    }
                }
            }
        }
        for op in [ArgOp::ArgMax, ArgOp::ArgMin] {
            for input in DType::ALL {
                for rank in [1, 3] {
                    sources.push(ArgReduceSpec { op, input, rank }.source());
                }
            }
        }
        insta::assert_snapshot!(crate::kernels::digests(&sources));
    }

    #[test]
    fn sum_bf16_accumulates_in_float() {
        let spec = ReduceSpec {
            op: ReduceOp::Sum,
            input: DType::BF16,
            out: DType::BF16,
            rank: 1,
            strategy: Strategy::BlockPerOutput,
        };
        insta::assert_snapshot!("reduce_sum_bf16", spec.source());
    }

    #[test]
    fn column_sums_use_one_thread_per_output() {
        assert_eq!(
            choose_strategy(2048, 16384, 2048),
            Strategy::ThreadPerOutput
        );
        assert_eq!(choose_strategy(1_000_000, 4, 1), Strategy::ThreadPerOutput);
        assert_eq!(choose_strategy(16, 4096, 1), Strategy::BlockPerOutput);
        assert_eq!(choose_strategy(100, 4096, 100), Strategy::BlockPerOutput);
        let spec = ReduceSpec {
            op: ReduceOp::Mean,
            input: DType::F32,
            out: DType::F32,
            rank: 1,
            strategy: Strategy::ThreadPerOutput,
        };
        insta::assert_snapshot!("reduce_mean_f32_thread_per_output", spec.source());
    }

    #[test]
    fn split_pass_writes_one_partial_per_block() {
        let spec = ReduceSpec {
            op: ReduceOp::Mean,
            input: DType::F32,
            out: DType::F32,
            rank: 1,
            strategy: Strategy::SplitPartials,
        };
        let src = spec.source();
        assert!(src.contains("out[blockIdx.x]"), "{src}");
        assert!(!src.contains("p.divisor"), "the first pass must not divide");
    }

    #[test]
    fn argmax_breaks_ties_by_lowest_index() {
        let spec = ArgReduceSpec {
            op: ArgOp::ArgMax,
            input: DType::I64,
            rank: 2,
        };
        insta::assert_snapshot!("argmax_i64", spec.source());
    }

    /// A bf16 gradient's Σ x²: squared after widening, summed and stored in f32, both passes.
    #[test]
    fn sum_of_squares_widens_before_squaring() {
        assert_eq!(ReduceOp::SumSquares.output_dtype(DType::BF16), DType::F32);
        for strategy in [Strategy::SplitPartials, Strategy::BlockPerOutput] {
            let spec = ReduceSpec {
                op: ReduceOp::SumSquares,
                input: DType::BF16,
                out: DType::F32,
                rank: 1,
                strategy,
            };
            let src = spec.source();
            assert!(src.contains("((float)v * (float)v)"), "{src}");
            assert!(src.contains("float* out = (float*)"), "{src}");
        }
    }

    #[test]
    #[ignore = "needs NVRTC and the CUDA headers: tools/test.sh installs them and runs it"]
    fn sum_of_squares_sources_compile() {
        for (input, strategy) in [
            (DType::BF16, Strategy::SplitPartials),
            (DType::BF16, Strategy::BlockPerOutput),
            (DType::F32, Strategy::SplitPartials),
        ] {
            let spec = ReduceSpec {
                op: ReduceOp::SumSquares,
                input,
                out: DType::F32,
                rank: 1,
                strategy,
            };
            let source = spec.source();
            crate::engine::kernel_cache::compile_for_test(&source, "sm_90")
                .unwrap_or_else(|e| panic!("{e}\n{source}"));
        }
    }

    #[test]
    fn partial_dtypes_hold_accumulators() {
        assert_eq!(ReduceOp::Sum.partial_dtype(DType::BF16), DType::F32);
        assert_eq!(ReduceOp::Sum.partial_dtype(DType::I32), DType::I64);
        assert_eq!(ReduceOp::Max.partial_dtype(DType::I32), DType::I32);
        assert_eq!(ReduceOp::Any.partial_dtype(DType::F32), DType::Bool);
    }
}
