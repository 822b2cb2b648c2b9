//! Element-wise "map" kernels: unary and binary math, comparisons, casts, where/mask, clamp,
//! copies into strided views, fills, arange and the random fills.
//!
//! One generator covers them all: operand 0 is the output, the others are inputs sharing its
//! (broadcast) shape; each op is a C expression over the inputs `a` to `d` (already widened
//! to their compute type), the scalars `sf0 sf1` (double) / `si0 si1` (long long) and the flat
//! index `i`. Dims that every operand walks contiguously are merged before generation, so the
//! common all-contiguous case compiles to a flat loop with no index math.

use std::sync::Arc;

use crate::engine::device::CudaDevice;
use crate::engine::dtype::{DType, Scalar};
use crate::engine::launch::{BLOCK, Params, grid_for, includes, launch};
use crate::engine::layout::{Layout, broadcast_shapes, coalesce, contiguous_strides};
use crate::engine::tensor::{CudaTensor, check_rank};
use crate::error::{CudaError, OpContext, Result};

/// `exp2_ftz` and `rcp_ftz`: the hardware's `ex2.approx` and `rcp.approx` (about 2 and 1 ulp)
/// with denormals flushed, one instruction each. `exp2f`/`__expf`/`__fdividef` wrap the same
/// instructions in denormal range checks that doubled the cost of the activations below, and
/// the fused fp8 casts of those activations were bound by that math rather than their bytes.
/// A flushed denormal is a value below 1.2e-38, which bf16 and fp8 cannot tell from zero anyway.
pub(crate) const FAST_MATH: &str = "__device__ __forceinline__ float exp2_ftz(const float x) { float r; asm(\"ex2.approx.ftz.f32 %0, %1;\" : \"=f\"(r) : \"f\"(x)); return r; }\n__device__ __forceinline__ float rcp_ftz(const float x) { float r; asm(\"rcp.approx.ftz.f32 %0, %1;\" : \"=f\"(r) : \"f\"(x)); return r; }\n";

// The normal distribution's upper tail Q(|a|) = φ(a)·t·P(t), t = 1/(1 + 0.2316419·|a|)
// (Abramowitz & Stegun 26.2.17, |error| < 7.5e-8): one exponential shared with the density and
// five FMAs, where `erff` evaluates two polynomials with selects and an `exp2` per element. The
// Φ it gives is within 7.5e-8 of the exact one: far inside bf16's and fp8's rounding, and closer
// than the tanh form Megatron's fused bias-GELU uses. `e^(-a²/2)` is `exp2(-a²·log2(e)/2)`.
macro_rules! density_exp {
    () => {
        "exp2_ftz(-0.7213475204444817f * a * a)"
    };
}
macro_rules! tail_t {
    () => {
        "rcp_ftz(1.f + 0.2316419f * fabsf(a))"
    };
}
macro_rules! upper_tail {
    () => {
        concat!(
            "(0.3989422804014327f * ",
            density_exp!(),
            " * ",
            tail_t!(),
            " * (0.31938153f + ",
            tail_t!(),
            " * (-0.356563782f + ",
            tail_t!(),
            " * (1.781477937f + ",
            tail_t!(),
            " * (-1.821255978f + ",
            tail_t!(),
            " * 1.330274429f)))))"
        )
    };
}
/// Φ(a), the normal distribution's CDF.
macro_rules! normal_cdf {
    () => {
        concat!(
            "(a >= 0.f ? 1.f - ",
            upper_tail!(),
            " : ",
            upper_tail!(),
            ")"
        )
    };
}

/// GELU (the exact, CDF form) of `a`, in f32, with [`FAST_MATH`]: the map kernel's, and the
/// fused fp8 cast's (`kernels/fp8/sources.rs`).
pub(crate) const GELU: &str = concat!("(a * ", normal_cdf!(), ")");
/// GELU's input gradient at `a` given the output gradient `b`, `b · (Φ(a) + a·φ(a))`, in f32,
/// with [`FAST_MATH`].
pub(crate) const GELU_BACKWARD: &str = concat!(
    "(b * (",
    normal_cdf!(),
    " + a * 0.3989422804014327f * ",
    density_exp!(),
    "))"
);

/// Names the generated C gives to inputs 0 to 3 (`d` is also the index loop's counter, scoped
/// to that loop, which ends before the inputs are loaded).
const INPUT_NAMES: [&str; 4] = ["a", "b", "c", "d"];

/// Everything that determines one generated map kernel.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MapSpec {
    /// Short description for the header comment (and error messages).
    pub name: String,
    pub out: DType,
    pub inputs: Vec<DType>,
    /// C expression of the result (any arithmetic type; converted to `out` on store).
    pub expr: String,
    /// Rank of the (merged) iteration shape, >= 1.
    pub rank: usize,
    /// Per operand (output first): walks its buffer contiguously, needing no index math.
    pub contiguous: Vec<bool>,
    /// Extra device functions the expression calls.
    pub helpers: String,
    /// `VECTOR` elements per thread and iteration: every operand contiguous and aligned (then
    /// a scalar tail), or every operand's last dim contiguous in whole aligned vectors (see
    /// `rows_of_vectors`; no tail).
    pub vector: bool,
}

impl MapSpec {
    /// The CUDA C++ source of this kernel.
    pub fn source(&self) -> String {
        let k = self.inputs.len() + 1;
        let r = self.rank;
        let uses_half = std::iter::once(self.out)
            .chain(self.inputs.iter().copied())
            .any(DType::needs_half_headers);
        let mut s = String::new();
        let ins: Vec<String> = self.inputs.iter().map(|d| d.to_string()).collect();
        s += &format!(
            "// map {} {} <- [{}] rank {r}\n",
            self.name,
            self.out,
            ins.join(", ")
        );
        s += includes(uses_half);
        s += &self.helpers;
        s += &format!(
            "struct Params {{\n  long long n;\n  long long shape[{r}];\n  long long strides[{k}][{r}];\n  long long offsets[{k}];\n  unsigned long long ptrs[{k}];\n  double sf[2];\n  long long si[2];\n}};\n"
        );
        s += "extern \"C\" __global__ void ferrotron_kernel(const Params p) {\n";
        s += "  const double sf0 = p.sf[0], sf1 = p.sf[1];\n";
        s += "  const long long si0 = p.si[0], si1 = p.si[1];\n";
        s += &format!(
            "  {}* out = ({}*)p.ptrs[0];\n",
            self.out.storage_c(),
            self.out.storage_c()
        );
        for (j, d) in self.inputs.iter().enumerate() {
            s += &format!(
                "  const {t}* in_{n} = (const {t}*)p.ptrs[{}];\n",
                j + 1,
                t = d.storage_c(),
                n = INPUT_NAMES[j]
            );
        }
        s += "  const long long step = (long long)blockDim.x * gridDim.x;\n";
        s += "  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n";
        if self.vector {
            s += &self.vector_loop();
            s += "  for (long long i = p.n / VECTOR * VECTOR + first; i < p.n; i += step) {\n";
        } else {
            s += "  for (long long i = first; i < p.n; i += step) {\n";
        }
        s += &self.element_body();
        s += "  }\n}\n";
        s
    }

    /// One element `i` of the grid-stride loop: its operands' offsets, loads and the store.
    fn element_body(&self) -> String {
        let mut s = self.offsets_of("i");
        for (j, d) in self.inputs.iter().enumerate() {
            let n = INPUT_NAMES[j];
            s += &format!(
                "    const {} {n} = {};\n",
                d.compute_c(),
                d.load_expr(&format!("in_{n}[off{}]", j + 1))
            );
        }
        s += &format!("    out[off0] = {};\n", self.out.store_expr(&self.expr));
        s
    }

    /// `off0`.. : each operand's buffer offset of flat element `index`.
    fn offsets_of(&self, index: &str) -> String {
        let k = self.inputs.len() + 1;
        let mut s = String::new();
        for op in 0..k {
            if self.contiguous[op] {
                s += &format!("    long long off{op} = p.offsets[{op}] + {index};\n");
            } else {
                s += &format!("    long long off{op} = p.offsets[{op}];\n");
            }
        }
        if self.contiguous.iter().any(|c| !c) {
            s += &format!("    long long rem = {index};\n");
            s += "#pragma unroll\n";
            s += &format!("    for (int d = {} - 1; d >= 0; --d) {{\n", self.rank);
            s += "      const long long coord = rem % p.shape[d];\n";
            s += "      rem /= p.shape[d];\n";
            for op in 0..k {
                if !self.contiguous[op] {
                    s += &format!("      off{op} += coord * p.strides[{op}][d];\n");
                }
            }
            s += "    }\n";
        }
        s
    }

    /// The bulk of a contiguous map: `VECTOR` consecutive elements per thread and iteration,
    /// each operand moved as one aligned struct (16-byte loads for 16-bit types, where one
    /// element per thread reached about half the memory bandwidth).
    fn vector_loop(&self) -> String {
        let mut s = format!("  const int VECTOR = {VECTOR};\n");
        let operands = std::iter::once(("out", self.out))
            .chain(INPUT_NAMES.iter().copied().zip(self.inputs.iter().copied()));
        for (name, dtype) in operands {
            s += &format!(
                "  struct alignas({}) V_{name} {{ {} v[{VECTOR}]; }};\n",
                dtype.size_in_bytes() * VECTOR,
                dtype.storage_c()
            );
        }
        s += "  for (long long t = first; t < p.n / VECTOR; t += step) {\n";
        let strided = self.contiguous.iter().any(|c| !c);
        if strided {
            // Every operand walks its last dim contiguously and that dim holds whole vectors,
            // so one offset per operand and vector, from the vector's first element.
            s += "    const long long i0 = t * VECTOR;\n";
            s += &self.offsets_of("i0");
        }
        for (j, _) in self.inputs.iter().enumerate() {
            let n = INPUT_NAMES[j];
            s += &if strided {
                format!(
                    "    const V_{n} v_{n} = *(const V_{n}*)(in_{n} + off{});\n",
                    j + 1
                )
            } else {
                format!(
                    "    const V_{n} v_{n} = ((const V_{n}*)(in_{n} + p.offsets[{}]))[t];\n",
                    j + 1
                )
            };
        }
        s += "    V_out v_out;\n#pragma unroll\n    for (int e = 0; e < VECTOR; ++e) {\n";
        s += "      const long long i = t * VECTOR + e;\n      (void)i;\n";
        for (j, d) in self.inputs.iter().enumerate() {
            let n = INPUT_NAMES[j];
            s += &format!(
                "      const {} {n} = {};\n",
                d.compute_c(),
                d.load_expr(&format!("v_{n}.v[e]"))
            );
        }
        s += &format!(
            "      v_out.v[e] = {};\n    }}\n",
            self.out.store_expr(&self.expr)
        );
        s += if strided {
            "    *(V_out*)(out + off0) = v_out;\n  }\n"
        } else {
            "    ((V_out*)(out + p.offsets[0]))[t] = v_out;\n  }\n"
        };
        s
    }
}

/// Whether a strided map can still move whole vectors: every operand walks the last dim
/// contiguously (a slice of a packed projection, a broadcast table), that dim holds whole
/// vectors, and every other stride keeps them aligned. Broadcast along the last dim is out.
fn rows_of_vectors(shape: &[usize], strides: &[Vec<isize>]) -> bool {
    let Some(&inner) = shape.last() else {
        return false;
    };
    inner % VECTOR == 0
        && strides.iter().all(|s| match s.split_last() {
            Some((&last, outer)) => {
                last == 1 && outer.iter().all(|x| x.unsigned_abs() % VECTOR == 0)
            }
            None => false,
        })
}

/// Elements per thread and iteration of a vectorised map.
const VECTOR: usize = 8;

/// Whether contiguous maps take the vectorised loop (the recipe's `runtime.vector_maps`; off
/// to compare).
fn vector_maps_enabled() -> bool {
    crate::switches::paths().vector_maps
}

/// Run-time scalars of a map kernel: `sf0 sf1` (double) and `si0 si1` (long long).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct MapScalars {
    pub f: [f64; 2],
    pub i: [i64; 2],
}

impl MapScalars {
    /// Each scalar in both forms, so the expression can use whichever suits the dtype.
    pub fn from_scalars(s: [Scalar; 2]) -> Self {
        Self {
            f: [s[0].as_f64(), s[1].as_f64()],
            i: [s[0].as_i64(), s[1].as_i64()],
        }
    }
}

/// Launches a map kernel writing `out` (any strided view) from `inputs` broadcast to its shape.
pub(crate) fn run_map(
    name: &str,
    out: &CudaTensor,
    inputs: &[&CudaTensor],
    expr: String,
    scalars: MapScalars,
    helpers: &str,
) -> Result<()> {
    let op = || {
        let mut c = OpContext::new(name).dtype(out.dtype());
        for t in inputs {
            c = c.shape(t.shape());
        }
        c.shape(out.shape())
    };
    let n = out.numel();
    if n == 0 {
        return Ok(());
    }
    let device = out.device();
    let mut layouts: Vec<Layout> = vec![out.layout().clone()];
    for t in inputs {
        if !Arc::ptr_eq(t.device(), device) {
            return Err(CudaError::invalid(
                op(),
                "operands live on different devices",
            ));
        }
        layouts.push(t.layout().expand(out.shape()).map_err(|_| {
            CudaError::invalid(
                op(),
                format!(
                    "shape {:?} does not broadcast to {:?}",
                    t.shape(),
                    out.shape()
                ),
            )
        })?);
    }
    let strides: Vec<&[isize]> = layouts.iter().map(|l| l.strides.as_slice()).collect();
    let merged = coalesce(out.shape(), &strides);
    let row_major = contiguous_strides(&merged.shape);
    let contiguous: Vec<bool> = merged.strides.iter().map(|s| *s == row_major).collect();
    let vector = vector_maps_enabled()
        && n >= VECTOR
        && layouts.iter().all(|l| l.offset % VECTOR == 0)
        && if contiguous.iter().all(|c| *c) {
            merged.shape.len() == 1
        } else {
            rows_of_vectors(&merged.shape, &merged.strides)
        };
    let spec = MapSpec {
        name: name.to_string(),
        out: out.dtype(),
        inputs: inputs.iter().map(|t| t.dtype()).collect(),
        expr,
        rank: merged.shape.len(),
        contiguous,
        helpers: helpers.to_string(),
        vector,
    };
    let k = layouts.len();
    let r = spec.rank;
    let mut p = Params::new();
    p.int(n as i64);
    p.ints(merged.shape.iter().map(|&d| d as i64));
    for s in &merged.strides {
        p.ints(s.iter().map(|&x| x as i64));
    }
    p.ints(layouts.iter().map(|l| l.offset as i64));
    p.ptr(out.buffer_ptr());
    for t in inputs {
        p.ptr(t.buffer_ptr());
    }
    debug_assert_eq!(p.words().len(), 1 + r + k * r + 2 * k);
    p.float(scalars.f[0]).float(scalars.f[1]);
    p.int(scalars.i[0]).int(scalars.i[1]);
    let items = if vector { n / VECTOR } else { n };
    launch(device, &spec, grid_for(items as u64, BLOCK), BLOCK, &p, &op)
}

const NO_SCALARS: MapScalars = MapScalars {
    f: [0.0; 2],
    i: [0; 2],
};

fn one_scalar(s: Scalar) -> MapScalars {
    MapScalars::from_scalars([s, Scalar::Int(0)])
}

/// The scalar operand `k` as a C value of `dtype`'s compute type.
fn scalar_var(dtype: DType, k: usize) -> String {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => format!("((float)sf{k})"),
        DType::Bool => format!("(si{k} != 0)"),
        other => format!("(({})si{k})", other.compute_c()),
    }
}

/// Element-wise functions of one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Log1p,
    Sqrt,
    Sin,
    Cos,
    Tan,
    Tanh,
    Sinh,
    Cosh,
    Asin,
    Acos,
    Atan,
    Asinh,
    Acosh,
    Atanh,
    Erf,
    Recip,
    Floor,
    Ceil,
    /// Ties to even (burn's rounding).
    Round,
    Trunc,
    Sign,
    Sigmoid,
    /// Exact (erf) GELU.
    Gelu,
    Relu,
    Silu,
    /// Logical not (bool) .
    Not,
    /// Bitwise not (integers).
    BitNot,
    IsNan,
    IsInf,
}

impl UnaryOp {
    /// Output dtype for an input of `dtype`.
    pub fn output_dtype(self, dtype: DType) -> DType {
        match self {
            UnaryOp::IsNan | UnaryOp::IsInf | UnaryOp::Not => DType::Bool,
            _ => dtype,
        }
    }

    /// The C expression over `a`, or `None` when the op does not apply to this dtype.
    pub fn expr(self, dtype: DType) -> Option<String> {
        use UnaryOp::*;
        let float = dtype.is_float();
        let func = |f: &str| float.then(|| format!("{f}(a)"));
        Some(match self {
            Neg if !dtype.is_bool() => "-a".into(),
            Abs if float => "fabsf(a)".into(),
            Abs if dtype == DType::U8 => "a".into(),
            Abs if dtype.is_int() => "(a < 0 ? -a : a)".into(),
            Exp => return func("expf"),
            Log => return func("logf"),
            Log1p => return func("log1pf"),
            Sqrt => return func("sqrtf"),
            Sin => return func("sinf"),
            Cos => return func("cosf"),
            Tan => return func("tanf"),
            Tanh => return func("tanhf"),
            Sinh => return func("sinhf"),
            Cosh => return func("coshf"),
            Asin => return func("asinf"),
            Acos => return func("acosf"),
            Atan => return func("atanf"),
            Asinh => return func("asinhf"),
            Acosh => return func("acoshf"),
            Atanh => return func("atanhf"),
            Erf => return func("erff"),
            Recip if float => "(1.0f / a)".into(),
            Floor if float => "floorf(a)".into(),
            Ceil if float => "ceilf(a)".into(),
            Round if float => "rintf(a)".into(),
            Trunc if float => "truncf(a)".into(),
            Floor | Ceil | Round | Trunc if dtype.is_int() => "a".into(),
            Sign if float => "(isnan(a) ? a : (float)((a > 0.0f) - (a < 0.0f)))".into(),
            Sign if dtype.is_int() => "((a > 0) - (a < 0))".into(),
            Sigmoid if float => "(1.0f / (1.0f + expf(-a)))".into(),
            Gelu if float => GELU.into(),
            Silu if float => "(a / (1.0f + expf(-a)))".into(),
            Relu if float => "(a > 0.0f ? a : 0.0f)".into(),
            Relu if dtype.is_int() => "(a > 0 ? a : 0)".into(),
            Not if dtype.is_bool() => "!a".into(),
            Not => "(a == 0)".into(),
            BitNot if dtype.is_int() => "~a".into(),
            IsNan if float => "isnan(a)".into(),
            IsInf if float => "isinf(a)".into(),
            IsNan | IsInf => "false".into(),
            _ => return None,
        })
    }

    fn helpers(self) -> &'static str {
        match self {
            UnaryOp::Gelu => FAST_MATH,
            _ => "",
        }
    }
}

/// Element-wise functions of two tensors (broadcast) or a tensor and a scalar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    /// Truncating division for integers.
    Div,
    /// Remainder with the divisor's sign (Python/burn semantics).
    Rem,
    /// Float power (`powf`); integer power by repeated squaring for ints.
    Pow,
    Atan2,
    Max,
    Min,
    /// Logical and/or/xor (bool).
    And,
    Or,
    Xor,
    /// Bitwise ops (integers).
    BitAnd,
    BitOr,
    BitXor,
    Shl,
    Shr,
    /// `a` = input x, `b` = output gradient: d/dx gelu(x) * grad.
    GeluBackward,
    /// `a` = input x, `b` = gradient: grad where x > 0.
    ReluBackward,
    /// `a` = sigmoid output y, `b` = gradient: grad * y * (1 - y).
    SigmoidBackward,
}

/// Integer power helper used by [`BinaryOp::Pow`] on integer tensors.
const IPOW_HELPER: &str = "template <typename T> __device__ T ipow(T base, T e) {\n  if (e < 0) return base == 1 ? 1 : (base == -1 ? ((e & 1) ? -1 : 1) : 0);\n  T r = 1;\n  while (e) { if (e & 1) r *= base; base *= base; e >>= 1; }\n  return r;\n}\n";

impl BinaryOp {
    /// The C expression over `a` and `b` (both of `dtype`'s compute type).
    pub fn expr(self, dtype: DType) -> Option<String> {
        use BinaryOp::*;
        let float = dtype.is_float();
        let int = dtype.is_int();
        let boolean = dtype.is_bool();
        Some(match self {
            Add if !boolean => "(a + b)".into(),
            Sub if !boolean => "(a - b)".into(),
            Mul if !boolean => "(a * b)".into(),
            Div if !boolean => "(a / b)".into(),
            Rem if float => "fmodf(fmodf(a, b) + b, b)".into(),
            Rem if int => "(((a % b) + b) % b)".into(),
            Pow if float => "powf(a, b)".into(),
            Pow if int => format!("ipow<{}>(a, b)", dtype.compute_c()),
            Atan2 if float => "atan2f(a, b)".into(),
            Max if !boolean => "(a > b ? a : b)".into(),
            Min if !boolean => "(a < b ? a : b)".into(),
            Max | Or if boolean => "(a || b)".into(),
            Min | And if boolean => "(a && b)".into(),
            Xor if boolean => "(a != b)".into(),
            And | BitAnd if int => "(a & b)".into(),
            Or | BitOr if int => "(a | b)".into(),
            Xor | BitXor if int => "(a ^ b)".into(),
            Shl if int => "(a << b)".into(),
            Shr if int => "(a >> b)".into(),
            GeluBackward if float => GELU_BACKWARD.into(),
            ReluBackward if float => "(a > 0.0f ? b : 0.0f)".into(),
            SigmoidBackward if float => "(b * a * (1.0f - a))".into(),
            _ => return None,
        })
    }

    fn helpers(self) -> &'static str {
        match self {
            BinaryOp::Pow => IPOW_HELPER,
            BinaryOp::GeluBackward => FAST_MATH,
            _ => "",
        }
    }
}

/// Comparisons; the result is a bool tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompareOp {
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
}

impl CompareOp {
    pub fn c_operator(self) -> &'static str {
        match self {
            CompareOp::Eq => "==",
            CompareOp::Ne => "!=",
            CompareOp::Gt => ">",
            CompareOp::Ge => ">=",
            CompareOp::Lt => "<",
            CompareOp::Le => "<=",
        }
    }
}

fn unsupported_dtype(t: &CudaTensor, op: &str) -> CudaError {
    CudaError::unsupported(t.op(op), format!("not defined for dtype {}", t.dtype()))
}

fn broadcast_out(op: &str, a: &CudaTensor, b: &CudaTensor, dtype: DType) -> Result<CudaTensor> {
    if a.dtype() != b.dtype() {
        return Err(CudaError::invalid(
            OpContext::new(op).shape(a.shape()).shape(b.shape()),
            format!("dtypes differ: {} vs {}", a.dtype(), b.dtype()),
        ));
    }
    let shape = broadcast_shapes(a.shape(), b.shape()).ok_or_else(|| {
        CudaError::invalid(
            OpContext::new(op)
                .shape(a.shape())
                .shape(b.shape())
                .dtype(a.dtype()),
            "shapes do not broadcast",
        )
    })?;
    check_rank(op, &shape)?;
    CudaTensor::empty(a.device(), &shape, dtype)
}

/// `op(x)` element-wise.
pub fn unary(x: &CudaTensor, op: UnaryOp) -> Result<CudaTensor> {
    let name = format!("{op:?}").to_lowercase();
    let expr = op
        .expr(x.dtype())
        .ok_or_else(|| unsupported_dtype(x, &name))?;
    let out = CudaTensor::empty(x.device(), x.shape(), op.output_dtype(x.dtype()))?;
    run_map(&name, &out, &[x], expr, NO_SCALARS, op.helpers())?;
    Ok(out)
}

/// `op(a, b)` element-wise with NumPy broadcasting; both operands share one dtype.
pub fn binary(a: &CudaTensor, b: &CudaTensor, op: BinaryOp) -> Result<CudaTensor> {
    let name = format!("{op:?}").to_lowercase();
    let expr = op
        .expr(a.dtype())
        .ok_or_else(|| unsupported_dtype(a, &name))?;
    let out = broadcast_out(&name, a, b, a.dtype())?;
    run_map(&name, &out, &[a, b], expr, NO_SCALARS, op.helpers())?;
    Ok(out)
}

/// `op(a, s)` with a scalar right operand (converted to `a`'s compute type).
pub fn binary_scalar(a: &CudaTensor, s: Scalar, op: BinaryOp) -> Result<CudaTensor> {
    let name = format!("{op:?}_scalar").to_lowercase();
    let expr = op
        .expr(a.dtype())
        .ok_or_else(|| unsupported_dtype(a, &name))?;
    let expr = scalar_right(&expr, &scalar_var(a.dtype(), 0));
    let out = CudaTensor::empty(a.device(), a.shape(), a.dtype())?;
    run_map(&name, &out, &[a], expr, one_scalar(s), op.helpers())?;
    Ok(out)
}

/// `op(s, a)` with a scalar left operand (e.g. `2 - x`, `2 / x`, `2 ^ x`).
pub fn scalar_binary(s: Scalar, a: &CudaTensor, op: BinaryOp) -> Result<CudaTensor> {
    let name = format!("scalar_{op:?}").to_lowercase();
    let expr = op
        .expr(a.dtype())
        .ok_or_else(|| unsupported_dtype(a, &name))?;
    let expr = scalar_left(&expr, &scalar_var(a.dtype(), 0));
    let out = CudaTensor::empty(a.device(), a.shape(), a.dtype())?;
    run_map(&name, &out, &[a], expr, one_scalar(s), op.helpers())?;
    Ok(out)
}

/// Renames the lone identifier `from` (not letters inside words such as `atan2f`, `fabsf`).
fn rename_ident(expr: &str, from: char, to: &str) -> String {
    let chars: Vec<char> = expr.chars().collect();
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::new();
    for (i, &ch) in chars.iter().enumerate() {
        let prev = i.checked_sub(1).map(|j| chars[j]);
        let next = chars.get(i + 1).copied();
        if ch == from && !prev.is_some_and(is_ident) && !next.is_some_and(is_ident) {
            out += to;
        } else {
            out.push(ch);
        }
    }
    out
}

/// A binary expression with its right operand `b` bound to a scalar.
fn scalar_right(expr: &str, scalar: &str) -> String {
    rename_ident(expr, 'b', scalar)
}

/// A binary expression with its left operand bound to a scalar and the tensor (kernel input
/// `a`) on the right.
fn scalar_left(expr: &str, scalar: &str) -> String {
    let t = rename_ident(expr, 'a', "__SCALAR__");
    rename_ident(&t, 'b', "a").replace("__SCALAR__", scalar)
}

/// `a <op> b` element-wise with broadcasting; bool result.
pub fn compare(a: &CudaTensor, b: &CudaTensor, op: CompareOp) -> Result<CudaTensor> {
    let name = format!("{op:?}").to_lowercase();
    let out = broadcast_out(&name, a, b, DType::Bool)?;
    run_map(
        &name,
        &out,
        &[a, b],
        format!("(a {} b)", op.c_operator()),
        NO_SCALARS,
        "",
    )?;
    Ok(out)
}

/// `a <op> s` element-wise; bool result.
pub fn compare_scalar(a: &CudaTensor, s: Scalar, op: CompareOp) -> Result<CudaTensor> {
    let name = format!("{op:?}_scalar").to_lowercase();
    let out = CudaTensor::empty(a.device(), a.shape(), DType::Bool)?;
    let expr = format!("(a {} {})", op.c_operator(), scalar_var(a.dtype(), 0));
    run_map(&name, &out, &[a], expr, one_scalar(s), "")?;
    Ok(out)
}

/// Clamps into `[min, max]` (either bound optional); NaN stays NaN.
pub fn clamp(x: &CudaTensor, min: Option<Scalar>, max: Option<Scalar>) -> Result<CudaTensor> {
    if x.dtype().is_bool() {
        return Err(unsupported_dtype(x, "clamp"));
    }
    let lo = scalar_var(x.dtype(), 0);
    let hi = scalar_var(x.dtype(), 1);
    let expr = match (min.is_some(), max.is_some()) {
        (true, true) => format!("(a < {lo} ? {lo} : (a > {hi} ? {hi} : a))"),
        (true, false) => format!("(a < {lo} ? {lo} : a)"),
        (false, true) => format!("(a > {hi} ? {hi} : a)"),
        (false, false) => return copy(x),
    };
    let out = CudaTensor::empty(x.device(), x.shape(), x.dtype())?;
    let scalars =
        MapScalars::from_scalars([min.unwrap_or(Scalar::Int(0)), max.unwrap_or(Scalar::Int(0))]);
    run_map("clamp", &out, &[x], expr, scalars, "")?;
    Ok(out)
}

/// `cond ? on_true : on_false` with all three broadcast together (`cond` is bool).
pub fn where_(
    cond: &CudaTensor,
    on_true: &CudaTensor,
    on_false: &CudaTensor,
) -> Result<CudaTensor> {
    if cond.dtype() != DType::Bool {
        return Err(CudaError::invalid(
            cond.op("where"),
            "condition must be a bool tensor",
        ));
    }
    let value_shape = broadcast_out("where", on_true, on_false, on_true.dtype())?;
    let shape = broadcast_shapes(cond.shape(), value_shape.shape()).ok_or_else(|| {
        CudaError::invalid(
            OpContext::new("where")
                .shape(cond.shape())
                .shape(on_true.shape())
                .shape(on_false.shape()),
            "shapes do not broadcast",
        )
    })?;
    let out = CudaTensor::empty(cond.device(), &shape, on_true.dtype())?;
    run_map(
        "where",
        &out,
        &[cond, on_true, on_false],
        "(a ? b : c)".into(),
        NO_SCALARS,
        "",
    )?;
    Ok(out)
}

/// `mask ? value : x` (mask broadcast to `x`).
pub fn mask_fill(x: &CudaTensor, mask: &CudaTensor, value: Scalar) -> Result<CudaTensor> {
    if mask.dtype() != DType::Bool {
        return Err(CudaError::invalid(
            mask.op("mask_fill"),
            "mask must be a bool tensor",
        ));
    }
    let shape = broadcast_shapes(x.shape(), mask.shape()).ok_or_else(|| {
        CudaError::invalid(
            OpContext::new("mask_fill")
                .shape(x.shape())
                .shape(mask.shape()),
            "shapes do not broadcast",
        )
    })?;
    let out = CudaTensor::empty(x.device(), &shape, x.dtype())?;
    let expr = format!("(b ? {} : a)", scalar_var(x.dtype(), 0));
    run_map("mask_fill", &out, &[x, mask], expr, one_scalar(value), "")?;
    Ok(out)
}

/// Converts to `dtype` (floats to ints truncate toward zero; anything to bool is `!= 0`).
pub fn cast(x: &CudaTensor, dtype: DType) -> Result<CudaTensor> {
    let out = CudaTensor::empty(x.device(), x.shape(), dtype)?;
    run_map("cast", &out, &[x], "a".into(), NO_SCALARS, "")?;
    Ok(out)
}

/// A fresh row-major copy of `x`.
pub fn copy(x: &CudaTensor) -> Result<CudaTensor> {
    let out = CudaTensor::empty(x.device(), x.shape(), x.dtype())?;
    run_map("copy", &out, &[x], "a".into(), NO_SCALARS, "")?;
    Ok(out)
}

/// Writes `src` (broadcast, converted) into the strided view `dst` in place. `dst` must be a
/// view of a buffer this op owns (used by cat, slice_assign, scatter set-up).
pub(crate) fn copy_into(dst: &CudaTensor, src: &CudaTensor) -> Result<()> {
    run_map("copy_into", dst, &[src], "a".into(), NO_SCALARS, "")
}

/// A contiguous tensor filled with `value`.
pub fn full(
    device: &Arc<CudaDevice>,
    shape: &[usize],
    value: Scalar,
    dtype: DType,
) -> Result<CudaTensor> {
    let out = CudaTensor::empty(device, shape, dtype)?;
    run_map(
        "fill",
        &out,
        &[],
        scalar_var(dtype, 0),
        one_scalar(value),
        "",
    )?;
    Ok(out)
}

pub fn zeros(device: &Arc<CudaDevice>, shape: &[usize], dtype: DType) -> Result<CudaTensor> {
    full(device, shape, Scalar::Int(0), dtype)
}

pub fn ones(device: &Arc<CudaDevice>, shape: &[usize], dtype: DType) -> Result<CudaTensor> {
    full(device, shape, Scalar::Int(1), dtype)
}

/// `[start, start + step, ...)` below `end` (above it for negative steps), 1-D.
pub fn arange(
    device: &Arc<CudaDevice>,
    start: i64,
    end: i64,
    step: i64,
    dtype: DType,
) -> Result<CudaTensor> {
    let ctx = || OpContext::new(format!("arange {start}..{end} step {step}")).dtype(dtype);
    if step == 0 {
        return Err(CudaError::invalid(ctx(), "step must not be 0"));
    }
    let span = if step > 0 { end - start } else { start - end };
    let len = if span <= 0 {
        0
    } else {
        (span as u64).div_ceil(step.unsigned_abs()) as usize
    };
    let out = CudaTensor::empty(device, &[len], dtype)?;
    run_map(
        "arange",
        &out,
        &[],
        "(si0 + i * si1)".into(),
        MapScalars::from_scalars([Scalar::Int(start), Scalar::Int(step)]),
        "",
    )?;
    Ok(out)
}

impl crate::engine::launch::KernelSpec for MapSpec {
    fn source(&self) -> String {
        MapSpec::source(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(
        expr: &str,
        inputs: Vec<DType>,
        out: DType,
        rank: usize,
        contiguous: Vec<bool>,
    ) -> MapSpec {
        MapSpec {
            name: "test".into(),
            out,
            inputs,
            expr: expr.into(),
            rank,
            contiguous,
            helpers: String::new(),
            vector: false,
        }
    }

    #[test]
    fn contiguous_add_is_a_flat_loop() {
        let s = spec(
            &BinaryOp::Add.expr(DType::F32).unwrap(),
            vec![DType::F32, DType::F32],
            DType::F32,
            1,
            vec![true, true, true],
        );
        insta::assert_snapshot!("map_add_f32_contiguous", s.source());
    }

    #[test]
    fn aligned_contiguous_bf16_add_moves_sixteen_bytes_per_operand() {
        let mut s = spec(
            &BinaryOp::Add.expr(DType::BF16).unwrap(),
            vec![DType::BF16, DType::BF16],
            DType::BF16,
            1,
            vec![true, true, true],
        );
        s.vector = true;
        insta::assert_snapshot!("map_add_bf16_vector", s.source());
    }

    /// SwiGLU's halves of a packed `[rows, 2f]` projection: one offset per operand and vector.
    #[test]
    fn strided_halves_move_whole_vectors_from_one_offset_each() {
        let mut s = spec(
            &BinaryOp::Mul.expr(DType::BF16).unwrap(),
            vec![DType::BF16, DType::BF16],
            DType::BF16,
            2,
            vec![true, false, false],
        );
        s.vector = true;
        insta::assert_snapshot!("map_mul_bf16_strided_vector", s.source());
    }

    #[test]
    fn rows_of_vectors_need_a_contiguous_aligned_last_dim() {
        // The gate half of [4096, 2·8192] and a broadcast [8192] row, into a [4096, 8192] output.
        let half = vec![vec![8192, 1], vec![16384, 1], vec![0, 1]];
        assert!(rows_of_vectors(&[4096, 8192], &half));
        // A row of 12 elements straddles vectors; a column stride of 2 is not contiguous; a row
        // stride of 12 misaligns every other row; broadcast along the last dim moves no vector.
        assert!(!rows_of_vectors(&[4, 12], &[vec![12, 1], vec![24, 1]]));
        assert!(!rows_of_vectors(&[4, 16], &[vec![16, 1], vec![32, 2]]));
        assert!(!rows_of_vectors(&[4, 16], &[vec![16, 1], vec![12, 1]]));
        assert!(!rows_of_vectors(&[4, 16], &[vec![16, 1], vec![1, 0]]));
    }

    /// Vectorised sources compile for sm_90 (NVRTC, no GPU needed): mixed widths (a cast), an
    /// expression of the index (arange), no inputs (a fill), GELU's fast-math expressions.
    #[test]
    #[ignore = "needs NVRTC and the CUDA headers: tools/test.sh installs them and runs it"]
    fn vector_map_sources_compile() {
        let cases = [
            ("a", vec![DType::F32], DType::BF16),
            ("(a + b)", vec![DType::BF16, DType::BF16], DType::BF16),
            (
                "(c ? a : b)",
                vec![DType::F16, DType::F16, DType::Bool],
                DType::F16,
            ),
            ("(si0 + i * si1)", vec![], DType::I64),
            ("((float)sf0)", vec![], DType::F32),
        ];
        for (expr, inputs, out) in cases {
            let mut s = spec(expr, inputs.clone(), out, 1, vec![true; inputs.len() + 1]);
            s.vector = true;
            let source = s.source();
            crate::engine::kernel_cache::compile_for_test(&source, "sm_90")
                .unwrap_or_else(|e| panic!("{e}\n{source}"));
        }
        // Rows of vectors: strided inputs, an index expression, four inputs (RoPE's shape).
        let mut s = spec(
            "(a * c - b * d + 0 * i)",
            vec![DType::BF16; 4],
            DType::BF16,
            3,
            vec![false, false, false, false, true],
        );
        s.vector = true;
        let source = s.source();
        crate::engine::kernel_cache::compile_for_test(&source, "sm_90")
            .unwrap_or_else(|e| panic!("{e}\n{source}"));
        // GELU and its gradient, on the inline-PTX approximations of FAST_MATH.
        for (expr, inputs) in [(GELU, 1), (GELU_BACKWARD, 2)] {
            for dtype in [DType::BF16, DType::F16, DType::F32] {
                let mut s = spec(expr, vec![dtype; inputs], dtype, 1, vec![true; inputs + 1]);
                s.vector = true;
                s.helpers = FAST_MATH.into();
                let source = s.source();
                crate::engine::kernel_cache::compile_for_test(&source, "sm_90")
                    .unwrap_or_else(|e| panic!("{e}\n{source}"));
            }
        }
    }

    #[test]
    fn broadcast_bf16_mul_has_index_math_and_half_headers() {
        let s = spec(
            &BinaryOp::Mul.expr(DType::BF16).unwrap(),
            vec![DType::BF16, DType::BF16],
            DType::BF16,
            2,
            vec![true, true, false],
        );
        insta::assert_snapshot!("map_mul_bf16_broadcast", s.source());
    }

    #[test]
    fn float_only_ops_refuse_ints() {
        assert_eq!(UnaryOp::Exp.expr(DType::I64), None);
        assert_eq!(UnaryOp::Abs.expr(DType::I32).unwrap(), "(a < 0 ? -a : a)");
        assert_eq!(BinaryOp::Atan2.expr(DType::I64), None);
        assert_eq!(BinaryOp::Shl.expr(DType::F32), None);
        assert_eq!(UnaryOp::IsNan.output_dtype(DType::F16), DType::Bool);
    }

    #[test]
    fn scalar_operands_rename_only_lone_identifiers() {
        assert_eq!(scalar_right("atan2f(a, b)", "S"), "atan2f(a, S)");
        assert_eq!(scalar_left("(a - b)", "((float)sf0)"), "(((float)sf0) - a)");
        assert_eq!(rename_ident("(a > b ? a : b)", 'a', "X"), "(X > b ? X : b)");
    }

    #[test]
    fn remainder_follows_the_divisor_sign() {
        assert_eq!(
            BinaryOp::Rem.expr(DType::I64).unwrap(),
            "(((a % b) + b) % b)"
        );
        assert!(
            BinaryOp::Pow
                .expr(DType::I32)
                .unwrap()
                .starts_with("ipow<int>")
        );
    }
}
