//! The op table: which backend op runs on which random inputs.
//!
//! Every case calls the op-trait method itself (`B::float_add`, `B::int_gather`, ...) rather than
//! burn's `Tensor` API, so a row names exactly one backend entry point and a failure points at
//! it. Shapes are deliberately odd (33, 65, 37) so that kernels whose grid or tail handling is
//! off by one leave poisoned elements behind.

use burn::tensor::backend::Backend;
use burn::tensor::ops::{
    AttentionModuleOptions, BoolTensor, ConvOptions, ConvTransposeOptions, Device, FloatTensor,
    IntTensor,
};
use burn::tensor::{
    BoolDType, Distribution, FloatDType, IntDType, Scalar, Shape, Slice, get_device_settings,
};

/// One random input of a case.
#[derive(Clone, Copy, Debug)]
pub(crate) enum In {
    /// Float tensor, uniform in `[lo, hi)`, in the case's float dtype.
    F(&'static [usize], f64, f64),
    /// Float tensor of whole numbers in `[lo, hi]`, so comparisons meet ties.
    Fq(&'static [usize], i64, i64),
    /// Int tensor, uniform in `[lo, hi]`.
    I(&'static [usize], i64, i64),
    /// Bool tensor, true with probability one half.
    B(&'static [usize]),
}

/// Which dtypes a case runs at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Float op: one row each for f32, bf16 and f16.
    Float,
    /// Float op whose CPU reference is only meaningful in f32 (long reductions, attention).
    FloatF32,
    /// Int op (the backend's int dtype).
    Int,
    /// Bool op.
    Bool,
}

/// One row (or three, for [`Kind::Float`]) of the op table.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Case {
    pub op: &'static str,
    pub kind: Kind,
    pub inputs: &'static [In],
    /// Multiplies the dtype's tolerance: reductions and matmuls accumulate rounding.
    pub tol: f64,
}

const fn case(op: &'static str, kind: Kind, inputs: &'static [In]) -> Case {
    Case {
        op,
        kind,
        inputs,
        tol: 1.0,
    }
}

const fn loose(op: &'static str, kind: Kind, inputs: &'static [In], tol: f64) -> Case {
    Case {
        op,
        kind,
        inputs,
        tol,
    }
}

const S: &[usize] = &[4, 33, 65];
const X: In = In::F(S, -2.0, 2.0);
const POS: In = In::F(S, 0.1, 3.0);
const AWAY0: In = In::F(S, 0.5, 2.0);
const UNIT: In = In::F(S, -0.95, 0.95);
const Q: In = In::Fq(S, -3, 3);
const IX: In = In::I(S, -50, 50);
const IQ: In = In::I(S, -3, 3);
const BX: In = In::B(S);

use Kind::{Bool, Float, FloatF32, Int};

/// Every case of the table, in the order the table prints.
pub(crate) const CASES: &[Case] = &[
    // element-wise binary, same shape and broadcast
    case("add", Float, &[X, X]),
    case(
        "add_broadcast",
        Float,
        &[In::F(&[4, 1, 65], -2.0, 2.0), In::F(&[1, 33, 1], -2.0, 2.0)],
    ),
    case("sub", Float, &[X, X]),
    case("mul", Float, &[X, X]),
    case("div", Float, &[X, AWAY0]),
    case("remainder", Float, &[X, AWAY0]),
    case("powf", Float, &[POS, X]),
    case("atan2", Float, &[X, X]),
    // scalar
    case("add_scalar", Float, &[X]),
    case("sub_scalar", Float, &[X]),
    case("mul_scalar", Float, &[X]),
    case("div_scalar", Float, &[X]),
    case("remainder_scalar", Float, &[X]),
    case("powf_scalar", Float, &[POS]),
    case("powi_scalar", Float, &[X]),
    case("clamp", Float, &[X]),
    // unary
    case("neg", Float, &[X]),
    case("recip", Float, &[AWAY0]),
    case("exp", Float, &[X]),
    case("log", Float, &[POS]),
    case("log1p", Float, &[POS]),
    case("sqrt", Float, &[POS]),
    case("abs", Float, &[X]),
    case("cos", Float, &[X]),
    case("sin", Float, &[X]),
    case("tan", Float, &[UNIT]),
    case("cosh", Float, &[X]),
    case("sinh", Float, &[X]),
    case("tanh", Float, &[X]),
    case("acos", Float, &[UNIT]),
    case("acosh", Float, &[In::F(S, 1.1, 4.0)]),
    case("asin", Float, &[UNIT]),
    case("asinh", Float, &[X]),
    case("atan", Float, &[X]),
    case("atanh", Float, &[UNIT]),
    case("round", Float, &[X]),
    case("floor", Float, &[X]),
    case("ceil", Float, &[X]),
    case("trunc", Float, &[X]),
    case("erf", Float, &[X]),
    case("sign", Float, &[Q]),
    case("is_nan", Float, &[X]),
    // activations
    case("relu", Float, &[X]),
    case("gelu", Float, &[X]),
    case("sigmoid", Float, &[X]),
    case("softmax", Float, &[X]),
    case("log_softmax", Float, &[X]),
    case("leaky_relu", Float, &[X]),
    // comparisons
    case("equal", Float, &[Q, Q]),
    case("not_equal", Float, &[Q, Q]),
    case("greater", Float, &[Q, Q]),
    case("greater_equal", Float, &[Q, Q]),
    case("lower", Float, &[Q, Q]),
    case("lower_equal", Float, &[Q, Q]),
    case("equal_elem", Float, &[Q]),
    case("greater_elem", Float, &[Q]),
    case("lower_equal_elem", Float, &[Q]),
    case("mask_where", Float, &[X, BX, X]),
    case("mask_fill", Float, &[X, BX]),
    // reductions
    loose("sum", FloatF32, &[X], 8.0),
    loose("sum_dim", Float, &[X], 4.0),
    loose("mean", FloatF32, &[X], 8.0),
    loose("mean_dim", Float, &[X], 4.0),
    loose("prod_dim", Float, &[In::F(&[4, 9, 5], 0.8, 1.2)], 4.0),
    case("max", Float, &[X]),
    case("max_dim", Float, &[X]),
    case("min_dim", Float, &[X]),
    case("argmax", Float, &[X]),
    case("argmin", Float, &[X]),
    case("max_dim_with_indices", Float, &[X]),
    case("any_dim", Float, &[In::Fq(S, 0, 1)]),
    case("all", Float, &[In::Fq(S, 0, 1)]),
    // scans
    loose("cumsum", Float, &[X], 4.0),
    loose("cumprod", Float, &[In::F(&[4, 9, 5], 0.8, 1.2)], 4.0),
    case("cummin", Float, &[X]),
    case("cummax", Float, &[X]),
    // matmul
    loose(
        "matmul",
        Float,
        &[
            In::F(&[3, 37, 64], -1.0, 1.0),
            In::F(&[3, 64, 29], -1.0, 1.0),
        ],
        4.0,
    ),
    loose(
        "matmul_large",
        Float,
        &[In::F(&[256, 512], -1.0, 1.0), In::F(&[512, 384], -1.0, 1.0)],
        8.0,
    ),
    loose(
        "matmul_broadcast",
        Float,
        &[
            In::F(&[2, 1, 17, 32], -1.0, 1.0),
            In::F(&[1, 3, 32, 9], -1.0, 1.0),
        ],
        4.0,
    ),
    loose(
        "matmul_transposed",
        Float,
        &[
            In::F(&[3, 64, 37], -1.0, 1.0),
            In::F(&[3, 29, 64], -1.0, 1.0),
        ],
        4.0,
    ),
    // layout: views and copies
    case("reshape", Float, &[X]),
    case("permute", Float, &[X]),
    case("permute_then_exp", Float, &[X]),
    case("swap_dims_reshape", Float, &[X]),
    case("flip", Float, &[X]),
    case("expand", Float, &[In::F(&[4, 1, 65], -2.0, 2.0)]),
    case("slice", Float, &[X]),
    case("slice_step", Float, &[X]),
    case("slice_assign", Float, &[X, In::F(&[2, 10, 65], -2.0, 2.0)]),
    case("cat", Float, &[X, In::F(&[4, 7, 65], -2.0, 2.0)]),
    case("repeat_dim", Float, &[In::F(&[4, 3, 5], -2.0, 2.0)]),
    case("unfold", Float, &[X]),
    // casts
    case("cast_f32", Float, &[X]),
    case("cast_bf16", Float, &[X]),
    case("cast_f16", Float, &[X]),
    case("into_int", Float, &[In::F(S, -50.0, 50.0)]),
    // indexing
    case("gather", Float, &[X, In::I(&[4, 7, 65], 0, 32)]),
    loose(
        "scatter_add",
        Float,
        &[X, In::I(&[4, 7, 65], 0, 32), In::F(&[4, 7, 65], -2.0, 2.0)],
        4.0,
    ),
    case("select", Float, &[X, In::I(&[12], 0, 32)]),
    // Duplicate indices accumulate in a different order than on the CPU: in bf16 each partial
    // sum rounds, hence the looser tolerance.
    loose(
        "select_add",
        Float,
        &[X, In::I(&[12], 0, 32), In::F(&[4, 12, 65], -2.0, 2.0)],
        4.0,
    ),
    case(
        "embedding",
        Float,
        &[In::F(&[50, 24], -1.0, 1.0), In::I(&[3, 11], 0, 49)],
    ),
    case(
        "embedding_backward",
        Float,
        &[
            In::F(&[50, 24], -1.0, 1.0),
            In::F(&[3, 11, 24], -1.0, 1.0),
            In::I(&[3, 11], 0, 49),
        ],
    ),
    case("sort", Float, &[X]),
    // burn-flex sorts unstably, so indices of tied values are not comparable: `argsort` uses
    // distinct f32 values and compares indices; `argsort_gather` uses ties and compares the
    // values the indices pick.
    case("argsort", FloatF32, &[X]),
    case("argsort_gather", Float, &[Q]),
    case("sort_with_indices", FloatF32, &[X]),
    case("topk", Float, &[X]),
    case(
        "cross",
        Float,
        &[In::F(&[5, 3], -2.0, 2.0), In::F(&[5, 3], -2.0, 2.0)],
    ),
    // fused/composite module ops
    loose(
        "attention_causal",
        Float,
        &[
            In::F(&[2, 3, 17, 16], -1.0, 1.0),
            In::F(&[2, 3, 17, 16], -1.0, 1.0),
            In::F(&[2, 3, 17, 16], -1.0, 1.0),
        ],
        4.0,
    ),
    // convolutions (im2col + matmul) and the backward passes burn derives from them
    loose(
        "conv2d",
        Float,
        &[
            In::F(&[2, 6, 13, 11], -1.0, 1.0),
            In::F(&[8, 3, 3, 3], -1.0, 1.0),
            In::F(&[8], -1.0, 1.0),
        ],
        4.0,
    ),
    loose(
        "conv2d_x_backward",
        Float,
        &[
            In::F(&[2, 6, 13, 11], -1.0, 1.0),
            In::F(&[8, 3, 3, 3], -1.0, 1.0),
            In::F(&[2, 8, 7, 3], -1.0, 1.0),
        ],
        4.0,
    ),
    loose(
        "conv2d_weight_backward",
        Float,
        &[
            In::F(&[2, 6, 13, 11], -1.0, 1.0),
            In::F(&[8, 3, 3, 3], -1.0, 1.0),
            In::F(&[2, 8, 7, 3], -1.0, 1.0),
        ],
        4.0,
    ),
    loose(
        "conv1d",
        Float,
        &[
            In::F(&[2, 4, 19], -1.0, 1.0),
            In::F(&[5, 4, 3], -1.0, 1.0),
            In::F(&[5], -1.0, 1.0),
        ],
        4.0,
    ),
    loose(
        "conv_transpose2d",
        Float,
        &[
            In::F(&[2, 4, 5, 6], -1.0, 1.0),
            In::F(&[4, 3, 3, 2], -1.0, 1.0),
            In::F(&[6], -1.0, 1.0),
        ],
        4.0,
    ),
    loose(
        "conv_transpose1d",
        Float,
        &[
            In::F(&[2, 4, 9], -1.0, 1.0),
            In::F(&[4, 5, 3], -1.0, 1.0),
            In::F(&[5], -1.0, 1.0),
        ],
        4.0,
    ),
    loose(
        "layer_norm",
        Float,
        &[X, In::F(&[65], 0.5, 1.5), In::F(&[65], -0.5, 0.5)],
        4.0,
    ),
    // creation and the remaining entry points
    case("zeros", Float, &[]),
    case("ones", Float, &[]),
    case("full", Float, &[]),
    case("powi", Float, &[X, In::I(S, 0, 4)]),
    case("clamp_min", Float, &[X]),
    case("clamp_max", Float, &[X]),
    case("not_equal_elem", Float, &[Q]),
    case("greater_equal_elem", Float, &[Q]),
    case("lower_elem", Float, &[Q]),
    case(
        "mask_where_broadcast",
        Float,
        &[X, In::B(&[1, 33, 1]), In::F(&[4, 1, 65], -2.0, 2.0)],
    ),
    loose("prod", FloatF32, &[In::F(&[64], 0.9, 1.1)], 4.0),
    case("min", Float, &[X]),
    case("max_abs", Float, &[X]),
    case("max_abs_dim", Float, &[X]),
    case("min_dim_with_indices", Float, &[X]),
    case("any", Float, &[In::Fq(S, 0, 1)]),
    case("all_dim", Float, &[In::Fq(S, 0, 1)]),
    case("is_inf", Float, &[X]),
    case("transpose", Float, &[X]),
    case("to_device", Float, &[X]),
    case("argtopk", FloatF32, &[X]),
    case(
        "linear",
        Float,
        &[
            In::F(&[2, 9, 24], -1.0, 1.0),
            In::F(&[24, 13], -1.0, 1.0),
            In::F(&[13], -1.0, 1.0),
        ],
    ),
    // int
    case("int_add", Int, &[IX, IX]),
    case("int_sub", Int, &[IX, IX]),
    case("int_mul", Int, &[IX, IX]),
    case("int_div", Int, &[IX, In::I(S, 1, 9)]),
    case("int_remainder", Int, &[IX, In::I(S, 1, 9)]),
    case("int_add_scalar", Int, &[IX]),
    case("int_mul_scalar", Int, &[IX]),
    case("int_div_scalar", Int, &[IX]),
    case("int_remainder_scalar", Int, &[IX]),
    case("int_neg", Int, &[IX]),
    case("int_abs", Int, &[IX]),
    case("int_sign", Int, &[IQ]),
    case("int_clamp", Int, &[IX]),
    case("int_powi_scalar", Int, &[IQ]),
    case("int_sum", Int, &[IX]),
    case("int_sum_dim", Int, &[IX]),
    case("int_prod_dim", Int, &[In::I(&[4, 6, 5], -2, 2)]),
    case("int_mean_dim", Int, &[IX]),
    case("int_max_dim", Int, &[IX]),
    case("int_min", Int, &[IX]),
    case("int_argmax", Int, &[IX]),
    case("int_argmin", Int, &[IX]),
    case("int_cumsum", Int, &[IX]),
    case("int_cumprod", Int, &[In::I(&[4, 6, 5], -2, 2)]),
    case("int_cummin", Int, &[IX]),
    case("int_cummax", Int, &[IX]),
    case("int_equal", Int, &[IQ, IQ]),
    case("int_greater", Int, &[IQ, IQ]),
    case("int_lower_equal", Int, &[IQ, IQ]),
    case("int_greater_elem", Int, &[IQ]),
    case("int_mask_where", Int, &[IX, BX, IX]),
    case("int_mask_fill", Int, &[IX, BX]),
    case("int_gather", Int, &[IX, In::I(&[4, 7, 65], 0, 32)]),
    case(
        "int_scatter_add",
        Int,
        &[IX, In::I(&[4, 7, 65], 0, 32), In::I(&[4, 7, 65], -5, 5)],
    ),
    case("int_select", Int, &[IX, In::I(&[12], 0, 32)]),
    case(
        "int_select_add",
        Int,
        &[IX, In::I(&[12], 0, 32), In::I(&[4, 12, 65], -5, 5)],
    ),
    case("int_slice", Int, &[IX]),
    case("int_slice_assign", Int, &[IX, In::I(&[2, 10, 65], -5, 5)]),
    case("int_cat", Int, &[IX, In::I(&[4, 7, 65], -5, 5)]),
    case("int_flip", Int, &[IX]),
    case("int_permute", Int, &[IX]),
    case("int_expand", Int, &[In::I(&[4, 1, 65], -5, 5)]),
    case("int_into_float", Int, &[IX]),
    case("int_cast_i32", Int, &[IX]),
    case(
        "int_matmul",
        Int,
        &[In::I(&[3, 7, 5], -4, 4), In::I(&[3, 5, 6], -4, 4)],
    ),
    case("int_arange", Int, &[]),
    case("int_sort", Int, &[IX]),
    case(
        "int_argsort",
        Int,
        &[In::I(&[4, 33, 7], -1_000_000, 1_000_000)],
    ),
    case("int_argsort_gather", Int, &[IX]),
    case(
        "int_topk",
        Int,
        &[In::I(&[4, 33, 7], -1_000_000, 1_000_000)],
    ),
    case("bitwise_and", Int, &[IX, IX]),
    case("bitwise_or", Int, &[IX, IX]),
    case("bitwise_xor", Int, &[IX, IX]),
    case("bitwise_not", Int, &[IX]),
    case("bitwise_and_scalar", Int, &[IX]),
    case("bitwise_left_shift", Int, &[IX, In::I(S, 0, 5)]),
    case("bitwise_right_shift", Int, &[IX, In::I(S, 0, 5)]),
    case("bitwise_right_shift_scalar", Int, &[IX]),
    case("int_full", Int, &[]),
    case("int_arange_step", Int, &[]),
    case("int_sub_scalar", Int, &[IX]),
    case("int_powi", Int, &[IQ, In::I(S, 0, 3)]),
    case("int_not_equal", Int, &[IQ, IQ]),
    case("int_lower", Int, &[IQ, IQ]),
    case("int_greater_equal", Int, &[IQ, IQ]),
    case("int_max", Int, &[IX]),
    case("int_prod", Int, &[In::I(&[12], -2, 2)]),
    case("int_mean", Int, &[IX]),
    case("int_any", Int, &[In::I(S, 0, 1)]),
    case("int_all_dim", Int, &[In::I(S, 0, 1)]),
    case(
        "int_max_dim_with_indices",
        Int,
        &[In::I(&[4, 33, 7], -1_000_000, 1_000_000)],
    ),
    case("int_swap_dims", Int, &[IX]),
    case("int_repeat_dim", Int, &[In::I(&[4, 3, 5], -5, 5)]),
    case("int_unfold", Int, &[IX]),
    case("bitwise_or_scalar", Int, &[IX]),
    case("bitwise_xor_scalar", Int, &[IX]),
    case("bitwise_left_shift_scalar", Int, &[IX]),
    // bool
    case("bool_not", Bool, &[BX]),
    case("bool_and", Bool, &[BX, BX]),
    case("bool_or", Bool, &[BX, BX]),
    case("bool_xor", Bool, &[BX, BX]),
    case("bool_equal", Bool, &[BX, BX]),
    case("bool_into_int", Bool, &[BX]),
    case("bool_into_float", Bool, &[BX]),
    case("bool_mask_where", Bool, &[BX, BX, BX]),
    case("bool_mask_fill", Bool, &[BX, BX]),
    case("bool_any_dim", Bool, &[In::B(&[4, 3, 2])]),
    case("bool_all", Bool, &[BX]),
    case("bool_slice", Bool, &[BX]),
    case("bool_cat", Bool, &[BX, In::B(&[4, 7, 65])]),
    case("bool_flip", Bool, &[BX]),
    case("bool_permute", Bool, &[BX]),
    case("bool_expand", Bool, &[In::B(&[4, 1, 65])]),
    case("bool_gather", Bool, &[BX, In::I(&[4, 7, 65], 0, 32)]),
    case("bool_select", Bool, &[BX, In::I(&[12], 0, 32)]),
    case(
        "bool_scatter_or",
        Bool,
        &[BX, In::I(&[4, 7, 65], 0, 32), In::B(&[4, 7, 65])],
    ),
    case("bool_repeat_dim", Bool, &[In::B(&[4, 3, 5])]),
    case("bool_zeros", Bool, &[]),
    case("bool_ones", Bool, &[]),
    case("bool_not_equal", Bool, &[BX, BX]),
    case("bool_equal_elem", Bool, &[BX]),
    case("bool_any", Bool, &[In::B(&[4, 3, 2])]),
    case("bool_all_dim", Bool, &[BX]),
    case("bool_slice_assign", Bool, &[BX, In::B(&[2, 10, 65])]),
    case("bool_reshape", Bool, &[BX]),
    case("bool_unfold", Bool, &[BX]),
    case(
        "bool_select_or",
        Bool,
        &[BX, In::I(&[12], 0, 32), In::B(&[4, 12, 65])],
    ),
];

/// A tensor of either kind, as the op traits pass them.
pub(crate) enum Val<B: Backend> {
    F(FloatTensor<B>),
    I(IntTensor<B>),
    B(BoolTensor<B>),
}

/// The inputs of one case on one backend, plus what the ops need to know about dtypes.
pub(crate) struct Ctx<B: Backend> {
    pub vals: Vec<Val<B>>,
    pub float: FloatDType,
    pub device: Device<B>,
}

impl<B: Backend> Ctx<B> {
    fn f(&self, i: usize) -> FloatTensor<B> {
        match &self.vals[i] {
            Val::F(t) => t.clone(),
            _ => panic!("input {i} is not a float tensor"),
        }
    }
    fn i(&self, i: usize) -> IntTensor<B> {
        match &self.vals[i] {
            Val::I(t) => t.clone(),
            _ => panic!("input {i} is not an int tensor"),
        }
    }
    fn b(&self, i: usize) -> BoolTensor<B> {
        match &self.vals[i] {
            Val::B(t) => t.clone(),
            _ => panic!("input {i} is not a bool tensor"),
        }
    }
    fn int(&self) -> IntDType {
        get_device_settings::<B>(&self.device).int_dtype
    }
    fn bool(&self) -> BoolDType {
        get_device_settings::<B>(&self.device).bool_dtype
    }
}

fn s(start: isize, end: Option<isize>, step: isize) -> Slice {
    Slice::new(start, end, step)
}

const FULL: Slice = Slice::full();

/// Stride (2, 3), padding (1, 0), dilation (1, 2), 2 groups: every index term of im2col.
fn conv2d_options() -> ConvOptions<2> {
    ConvOptions::new([2, 3], [1, 0], [1, 2], 2)
}

/// Runs one op of the table on backend `B`.
///
/// # Panics
/// On an op name the table does not know (the GPU-free test runs every case, so a typo there
/// fails CI rather than the GPU run).
pub(crate) fn exec<B: Backend>(op: &str, c: &Ctx<B>) -> Val<B> {
    use Val::{B as Bo, F, I};
    let sc = |v: f64| Scalar::Float(v);
    let si = |v: i64| Scalar::Int(v);
    match op {
        "add" | "add_broadcast" => F(B::float_add(c.f(0), c.f(1))),
        "sub" => F(B::float_sub(c.f(0), c.f(1))),
        "mul" => F(B::float_mul(c.f(0), c.f(1))),
        "div" => F(B::float_div(c.f(0), c.f(1))),
        "remainder" => F(B::float_remainder(c.f(0), c.f(1))),
        "powf" => F(B::float_powf(c.f(0), c.f(1))),
        "atan2" => F(B::float_atan2(c.f(0), c.f(1))),
        "add_scalar" => F(B::float_add_scalar(c.f(0), sc(0.75))),
        "sub_scalar" => F(B::float_sub_scalar(c.f(0), sc(1.25))),
        "mul_scalar" => F(B::float_mul_scalar(c.f(0), sc(-1.5))),
        "div_scalar" => F(B::float_div_scalar(c.f(0), sc(3.0))),
        // 0.75 is exact in every float dtype: x mod s jumps by s near multiples of s, so a divisor
        // that rounds differently per dtype would compare two different functions.
        "remainder_scalar" => F(B::float_remainder_scalar(c.f(0), sc(0.75))),
        "powf_scalar" => F(B::float_powf_scalar(c.f(0), sc(2.5))),
        "powi_scalar" => F(B::float_powi_scalar(c.f(0), si(3))),
        "clamp" => F(B::float_clamp(c.f(0), sc(-0.5), sc(1.0))),
        "neg" => F(B::float_neg(c.f(0))),
        "recip" => F(B::float_recip(c.f(0))),
        "exp" => F(B::float_exp(c.f(0))),
        "log" => F(B::float_log(c.f(0))),
        "log1p" => F(B::float_log1p(c.f(0))),
        "sqrt" => F(B::float_sqrt(c.f(0))),
        "abs" => F(B::float_abs(c.f(0))),
        "cos" => F(B::float_cos(c.f(0))),
        "sin" => F(B::float_sin(c.f(0))),
        "tan" => F(B::float_tan(c.f(0))),
        "cosh" => F(B::float_cosh(c.f(0))),
        "sinh" => F(B::float_sinh(c.f(0))),
        "tanh" => F(B::float_tanh(c.f(0))),
        "acos" => F(B::float_acos(c.f(0))),
        "acosh" => F(B::float_acosh(c.f(0))),
        "asin" => F(B::float_asin(c.f(0))),
        "asinh" => F(B::float_asinh(c.f(0))),
        "atan" => F(B::float_atan(c.f(0))),
        "atanh" => F(B::float_atanh(c.f(0))),
        "round" => F(B::float_round(c.f(0))),
        "floor" => F(B::float_floor(c.f(0))),
        "ceil" => F(B::float_ceil(c.f(0))),
        "trunc" => F(B::float_trunc(c.f(0))),
        "erf" => F(B::float_erf(c.f(0))),
        "sign" => F(B::float_sign(c.f(0))),
        "is_nan" => Bo(B::float_is_nan(c.f(0), c.bool())),
        "relu" => F(B::relu(c.f(0))),
        "gelu" => F(B::gelu(c.f(0))),
        "sigmoid" => F(B::sigmoid(c.f(0))),
        "softmax" => F(B::softmax(c.f(0), 2)),
        "log_softmax" => F(B::log_softmax(c.f(0), 2)),
        "leaky_relu" => F(B::leaky_relu(c.f(0), sc(0.1))),
        "equal" => Bo(B::float_equal(c.f(0), c.f(1), c.bool())),
        "not_equal" => Bo(B::float_not_equal(c.f(0), c.f(1), c.bool())),
        "greater" => Bo(B::float_greater(c.f(0), c.f(1), c.bool())),
        "greater_equal" => Bo(B::float_greater_equal(c.f(0), c.f(1), c.bool())),
        "lower" => Bo(B::float_lower(c.f(0), c.f(1), c.bool())),
        "lower_equal" => Bo(B::float_lower_equal(c.f(0), c.f(1), c.bool())),
        "equal_elem" => Bo(B::float_equal_elem(c.f(0), sc(1.0), c.bool())),
        "greater_elem" => Bo(B::float_greater_elem(c.f(0), sc(0.0), c.bool())),
        "lower_equal_elem" => Bo(B::float_lower_equal_elem(c.f(0), sc(-1.0), c.bool())),
        "mask_where" => F(B::float_mask_where(c.f(0), c.b(1), c.f(2))),
        "mask_fill" => F(B::float_mask_fill(c.f(0), c.b(1), sc(-7.5))),
        "sum" => F(B::float_sum(c.f(0))),
        "sum_dim" => F(B::float_sum_dim(c.f(0), 1)),
        "mean" => F(B::float_mean(c.f(0))),
        "mean_dim" => F(B::float_mean_dim(c.f(0), 2)),
        "prod_dim" => F(B::float_prod_dim(c.f(0), 1)),
        "max" => F(B::float_max(c.f(0))),
        "max_dim" => F(B::float_max_dim(c.f(0), 1)),
        "min_dim" => F(B::float_min_dim(c.f(0), 2)),
        "argmax" => I(B::float_argmax(c.f(0), 1, c.int())),
        "argmin" => I(B::float_argmin(c.f(0), 2, c.int())),
        "max_dim_with_indices" => {
            let (values, indices) = B::float_max_dim_with_indices(c.f(0), 0, c.int());
            let as_float = B::int_into_float(indices, c.float);
            F(B::float_cat(vec![values, as_float], 0))
        }
        "any_dim" => Bo(B::float_any_dim(c.f(0), 2, c.bool())),
        "all" => Bo(B::float_all(c.f(0), c.bool())),
        "cumsum" => F(B::float_cumsum(c.f(0), 1)),
        "cumprod" => F(B::float_cumprod(c.f(0), 1)),
        "cummin" => F(B::float_cummin(c.f(0), 2)),
        "cummax" => F(B::float_cummax(c.f(0), 1)),
        "matmul" | "matmul_large" | "matmul_broadcast" => F(B::float_matmul(c.f(0), c.f(1))),
        "matmul_transposed" => {
            let lhs = B::float_swap_dims(c.f(0), 1, 2);
            let rhs = B::float_swap_dims(c.f(1), 1, 2);
            F(B::float_matmul(lhs, rhs))
        }
        "reshape" => F(B::float_reshape(c.f(0), Shape::new([33, 4 * 65]))),
        "permute" => F(B::float_permute(c.f(0), &[2, 0, 1])),
        "permute_then_exp" => F(B::float_exp(B::float_permute(c.f(0), &[1, 2, 0]))),
        "swap_dims_reshape" => {
            let swapped = B::float_swap_dims(c.f(0), 0, 2);
            F(B::float_reshape(swapped, Shape::new([65 * 33, 4])))
        }
        "flip" => F(B::float_flip(c.f(0), &[0, 2])),
        "expand" => F(B::float_expand(c.f(0), Shape::new([2, 4, 33, 65]))),
        "slice" => F(B::float_slice(
            c.f(0),
            &[s(1, Some(3), 1), s(5, Some(30), 1), FULL],
        )),
        "slice_step" => F(B::float_slice(
            c.f(0),
            &[FULL, s(1, None, 3), s(0, None, -2)],
        )),
        "slice_assign" => F(B::float_slice_assign(
            c.f(0),
            &[s(1, Some(3), 1), s(3, Some(23), 2), FULL],
            c.f(1),
        )),
        "cat" => F(B::float_cat(vec![c.f(0), c.f(1), c.f(0)], 1)),
        "repeat_dim" => F(B::float_repeat_dim(c.f(0), 1, 3)),
        "unfold" => F(B::float_unfold(c.f(0), 2, 8, 5)),
        "cast_f32" => F(B::float_cast(c.f(0), FloatDType::F32)),
        "cast_bf16" => F(B::float_cast(c.f(0), FloatDType::BF16)),
        "cast_f16" => F(B::float_cast(c.f(0), FloatDType::F16)),
        "into_int" => I(B::float_into_int(c.f(0), c.int())),
        "gather" => F(B::float_gather(1, c.f(0), c.i(1))),
        "scatter_add" => F(B::float_scatter_add(1, c.f(0), c.i(1), c.f(2))),
        "select" => F(B::float_select(c.f(0), 1, c.i(1))),
        "select_add" => F(B::float_select_add(c.f(0), 1, c.i(1), c.f(2))),
        "embedding" => F(B::embedding(c.f(0), c.i(1))),
        "embedding_backward" => F(B::embedding_backward(c.f(0), c.f(1), c.i(2))),
        "sort" => F(B::float_sort(c.f(0), 2, true)),
        "argsort" => I(B::float_argsort(c.f(0), 1, false, c.int())),
        "argsort_gather" => {
            let order = B::float_argsort(c.f(0), 1, false, c.int());
            F(B::float_gather(1, c.f(0), order))
        }
        "sort_with_indices" => {
            let (values, indices) = B::float_sort_with_indices(c.f(0), 2, false, c.int());
            F(B::float_cat(
                vec![values, B::int_into_float(indices, c.float)],
                2,
            ))
        }
        "topk" => F(B::float_topk(c.f(0), 2, 5)),
        "cross" => F(B::float_cross(c.f(0), c.f(1), 1)),
        "attention_causal" => {
            let options = AttentionModuleOptions {
                scale: None,
                softcap: None,
                is_causal: true,
            };
            F(B::attention(c.f(0), c.f(1), c.f(2), None, None, options))
        }
        "conv2d" => F(B::conv2d(c.f(0), c.f(1), Some(c.f(2)), conv2d_options())),
        "conv2d_x_backward" => F(B::conv2d_x_backward(
            c.f(0),
            c.f(1),
            c.f(2),
            conv2d_options(),
        )),
        "conv2d_weight_backward" => F(B::conv2d_weight_backward(
            c.f(0),
            c.f(1),
            c.f(2),
            conv2d_options(),
        )),
        "conv1d" => F(B::conv1d(
            c.f(0),
            c.f(1),
            Some(c.f(2)),
            ConvOptions::new([2], [1], [2], 1),
        )),
        "conv_transpose2d" => F(B::conv_transpose2d(
            c.f(0),
            c.f(1),
            Some(c.f(2)),
            ConvTransposeOptions::new([2, 1], [1, 0], [1, 0], [1, 2], 2),
        )),
        "conv_transpose1d" => F(B::conv_transpose1d(
            c.f(0),
            c.f(1),
            Some(c.f(2)),
            ConvTransposeOptions::new([3], [1], [2], [1], 1),
        )),
        "layer_norm" => F(B::layer_norm(c.f(0), c.f(1), Some(c.f(2)), 1e-5)),
        "zeros" => F(B::float_zeros(Shape::new([3, 70]), &c.device, c.float)),
        "ones" => F(B::float_ones(Shape::new([3, 70]), &c.device, c.float)),
        "full" => F(B::float_full(
            Shape::new([3, 70]),
            sc(-2.5),
            &c.device,
            c.float,
        )),
        "powi" => F(B::float_powi(c.f(0), c.i(1))),
        "clamp_min" => F(B::float_clamp_min(c.f(0), sc(-0.25))),
        "clamp_max" => F(B::float_clamp_max(c.f(0), sc(0.5))),
        "not_equal_elem" => Bo(B::float_not_equal_elem(c.f(0), sc(2.0), c.bool())),
        "greater_equal_elem" => Bo(B::float_greater_equal_elem(c.f(0), sc(1.0), c.bool())),
        "lower_elem" => Bo(B::float_lower_elem(c.f(0), sc(0.0), c.bool())),
        "mask_where_broadcast" => F(B::float_mask_where(c.f(0), c.b(1), c.f(2))),
        "prod" => F(B::float_prod(c.f(0))),
        "min" => F(B::float_min(c.f(0))),
        "max_abs" => F(B::float_max_abs(c.f(0))),
        "max_abs_dim" => F(B::float_max_abs_dim(c.f(0), 1)),
        "min_dim_with_indices" => {
            let (values, indices) = B::float_min_dim_with_indices(c.f(0), 2, c.int());
            F(B::float_cat(
                vec![values, B::int_into_float(indices, c.float)],
                2,
            ))
        }
        "any" => Bo(B::float_any(c.f(0), c.bool())),
        "all_dim" => Bo(B::float_all_dim(c.f(0), 0, c.bool())),
        "is_inf" => Bo(B::float_is_inf(
            B::float_exp(B::float_mul_scalar(c.f(0), sc(60.0))),
            c.bool(),
        )),
        "transpose" => F(B::float_transpose(c.f(0))),
        "to_device" => F(B::float_to_device(c.f(0), &c.device)),
        "argtopk" => I(B::float_argtopk(c.f(0), 1, 4, c.int())),
        "argtopk_by_argsort" => {
            let order = B::float_argsort(c.f(0), 1, true, c.int());
            I(B::int_slice(order, &[FULL, s(0, Some(4), 1)]))
        }
        "linear" => F(B::linear(c.f(0), c.f(1), Some(c.f(2)))),
        "int_add" => I(B::int_add(c.i(0), c.i(1))),
        "int_sub" => I(B::int_sub(c.i(0), c.i(1))),
        "int_mul" => I(B::int_mul(c.i(0), c.i(1))),
        "int_div" => I(B::int_div(c.i(0), c.i(1))),
        "int_remainder" => I(B::int_remainder(c.i(0), c.i(1))),
        "int_add_scalar" => I(B::int_add_scalar(c.i(0), si(7))),
        "int_mul_scalar" => I(B::int_mul_scalar(c.i(0), si(-3))),
        "int_div_scalar" => I(B::int_div_scalar(c.i(0), si(4))),
        "int_remainder_scalar" => I(B::int_remainder_scalar(c.i(0), si(6))),
        "int_neg" => I(B::int_neg(c.i(0))),
        "int_abs" => I(B::int_abs(c.i(0))),
        "int_sign" => I(B::int_sign(c.i(0))),
        "int_clamp" => I(B::int_clamp(c.i(0), si(-10), si(20))),
        "int_powi_scalar" => I(B::int_powi_scalar(c.i(0), si(3))),
        "int_sum" => I(B::int_sum(c.i(0))),
        "int_sum_dim" => I(B::int_sum_dim(c.i(0), 2)),
        "int_prod_dim" => I(B::int_prod_dim(c.i(0), 1)),
        "int_mean_dim" => I(B::int_mean_dim(c.i(0), 1)),
        "int_max_dim" => I(B::int_max_dim(c.i(0), 0)),
        "int_min" => I(B::int_min(c.i(0))),
        "int_argmax" => I(B::int_argmax(c.i(0), 2)),
        "int_argmin" => I(B::int_argmin(c.i(0), 1)),
        "int_cumsum" => I(B::int_cumsum(c.i(0), 2)),
        "int_cumprod" => I(B::int_cumprod(c.i(0), 1)),
        "int_cummin" => I(B::int_cummin(c.i(0), 1)),
        "int_cummax" => I(B::int_cummax(c.i(0), 2)),
        "int_equal" => Bo(B::int_equal(c.i(0), c.i(1), c.bool())),
        "int_greater" => Bo(B::int_greater(c.i(0), c.i(1), c.bool())),
        "int_lower_equal" => Bo(B::int_lower_equal(c.i(0), c.i(1), c.bool())),
        "int_greater_elem" => Bo(B::int_greater_elem(c.i(0), si(0), c.bool())),
        "int_mask_where" => I(B::int_mask_where(c.i(0), c.b(1), c.i(2))),
        "int_mask_fill" => I(B::int_mask_fill(c.i(0), c.b(1), si(-9))),
        "int_gather" => I(B::int_gather(1, c.i(0), c.i(1))),
        "int_scatter_add" => I(B::int_scatter_add(1, c.i(0), c.i(1), c.i(2))),
        "int_select" => I(B::int_select(c.i(0), 1, c.i(1))),
        "int_select_add" => I(B::int_select_add(c.i(0), 1, c.i(1), c.i(2))),
        "int_slice" => I(B::int_slice(
            c.i(0),
            &[FULL, s(2, Some(31), 3), s(-10, None, 1)],
        )),
        "int_slice_assign" => I(B::int_slice_assign(
            c.i(0),
            &[s(1, Some(3), 1), s(3, Some(23), 2), FULL],
            c.i(1),
        )),
        "int_cat" => I(B::int_cat(vec![c.i(0), c.i(1)], 1)),
        "int_flip" => I(B::int_flip(c.i(0), &[1])),
        "int_permute" => I(B::int_permute(c.i(0), &[1, 2, 0])),
        "int_expand" => I(B::int_expand(c.i(0), Shape::new([4, 33, 65]))),
        "int_into_float" => F(B::int_into_float(c.i(0), c.float)),
        "int_cast_i32" => I(B::int_cast(c.i(0), IntDType::I32)),
        "int_matmul" => I(B::int_matmul(c.i(0), c.i(1))),
        "int_arange" => I(B::int_arange(-5..300, &c.device, c.int())),
        "int_sort" => I(B::int_sort(c.i(0), 1, false)),
        "int_argsort" => I(B::int_argsort(c.i(0), 2, true)),
        "int_argsort_gather" => I(B::int_gather(2, c.i(0), B::int_argsort(c.i(0), 2, true))),
        "int_topk" => I(B::int_topk(c.i(0), 2, 3)),
        "bitwise_and" => I(B::bitwise_and(c.i(0), c.i(1))),
        "bitwise_or" => I(B::bitwise_or(c.i(0), c.i(1))),
        "bitwise_xor" => I(B::bitwise_xor(c.i(0), c.i(1))),
        "bitwise_not" => I(B::bitwise_not(c.i(0))),
        "bitwise_and_scalar" => I(B::bitwise_and_scalar(c.i(0), si(0b1011))),
        "bitwise_left_shift" => I(B::bitwise_left_shift(c.i(0), c.i(1))),
        "bitwise_right_shift" => I(B::bitwise_right_shift(c.i(0), c.i(1))),
        "bitwise_right_shift_scalar" => I(B::bitwise_right_shift_scalar(c.i(0), si(2))),
        "int_full" => I(B::int_full(Shape::new([5, 9]), si(-4), &c.device, c.int())),
        "int_arange_step" => I(B::int_arange_step(-7..100, 3, &c.device, c.int())),
        "int_sub_scalar" => I(B::int_sub_scalar(c.i(0), si(11))),
        "int_powi" => I(B::int_powi(c.i(0), c.i(1))),
        "int_not_equal" => Bo(B::int_not_equal(c.i(0), c.i(1), c.bool())),
        "int_lower" => Bo(B::int_lower(c.i(0), c.i(1), c.bool())),
        "int_greater_equal" => Bo(B::int_greater_equal(c.i(0), c.i(1), c.bool())),
        "int_max" => I(B::int_max(c.i(0))),
        "int_prod" => I(B::int_prod(c.i(0))),
        "int_mean" => I(B::int_mean(c.i(0))),
        "int_any" => Bo(B::int_any(c.i(0), c.bool())),
        "int_all_dim" => Bo(B::int_all_dim(c.i(0), 1, c.bool())),
        "int_max_dim_with_indices" => {
            let (values, indices) = B::int_max_dim_with_indices(c.i(0), 1);
            I(B::int_cat(vec![values, indices], 1))
        }
        "int_swap_dims" => I(B::int_swap_dims(c.i(0), 0, 2)),
        "int_repeat_dim" => I(B::int_repeat_dim(c.i(0), 0, 3)),
        "int_unfold" => I(B::int_unfold(c.i(0), 1, 4, 4)),
        "bitwise_or_scalar" => I(B::bitwise_or_scalar(c.i(0), si(0b0110))),
        "bitwise_xor_scalar" => I(B::bitwise_xor_scalar(c.i(0), si(0b1001))),
        "bitwise_left_shift_scalar" => I(B::bitwise_left_shift_scalar(c.i(0), si(3))),
        "bool_not" => Bo(B::bool_not(c.b(0))),
        "bool_and" => Bo(B::bool_and(c.b(0), c.b(1))),
        "bool_or" => Bo(B::bool_or(c.b(0), c.b(1))),
        "bool_xor" => Bo(B::bool_xor(c.b(0), c.b(1))),
        "bool_equal" => Bo(B::bool_equal(c.b(0), c.b(1))),
        "bool_into_int" => I(B::bool_into_int(c.b(0), c.int())),
        "bool_into_float" => F(B::bool_into_float(c.b(0), c.float)),
        "bool_mask_where" => Bo(B::bool_mask_where(c.b(0), c.b(1), c.b(2))),
        "bool_mask_fill" => Bo(B::bool_mask_fill(c.b(0), c.b(1), Scalar::Bool(true))),
        "bool_any_dim" => Bo(B::bool_any_dim(c.b(0), 1)),
        "bool_all" => Bo(B::bool_all(c.b(0))),
        "bool_slice" => Bo(B::bool_slice(
            c.b(0),
            &[s(1, None, 2), FULL, s(3, Some(60), 4)],
        )),
        "bool_cat" => Bo(B::bool_cat(vec![c.b(0), c.b(1)], 1)),
        "bool_flip" => Bo(B::bool_flip(c.b(0), &[2])),
        "bool_permute" => Bo(B::bool_permute(c.b(0), &[2, 1, 0])),
        "bool_expand" => Bo(B::bool_expand(c.b(0), Shape::new([4, 33, 65]))),
        "bool_gather" => Bo(B::bool_gather(1, c.b(0), c.i(1))),
        "bool_select" => Bo(B::bool_select(c.b(0), 1, c.i(1))),
        "bool_scatter_or" => Bo(B::bool_scatter_or(1, c.b(0), c.i(1), c.b(2))),
        "bool_repeat_dim" => Bo(B::bool_repeat_dim(c.b(0), 2, 4)),
        "bool_zeros" => Bo(B::bool_zeros(Shape::new([3, 70]), &c.device, c.bool())),
        "bool_ones" => Bo(B::bool_ones(Shape::new([3, 70]), &c.device, c.bool())),
        "bool_not_equal" => Bo(B::bool_not_equal(c.b(0), c.b(1))),
        "bool_equal_elem" => Bo(B::bool_equal_elem(c.b(0), Scalar::Bool(true))),
        "bool_any" => Bo(B::bool_any(c.b(0))),
        "bool_all_dim" => Bo(B::bool_all_dim(c.b(0), 2)),
        "bool_slice_assign" => Bo(B::bool_slice_assign(
            c.b(0),
            &[s(1, Some(3), 1), s(3, Some(23), 2), FULL],
            c.b(1),
        )),
        "bool_reshape" => Bo(B::bool_reshape(
            B::bool_permute(c.b(0), &[1, 0, 2]),
            Shape::new([33, 260]),
        )),
        "bool_unfold" => Bo(B::bool_unfold(c.b(0), 2, 6, 7)),
        "bool_select_or" => Bo(B::bool_select_or(c.b(0), 1, c.i(1), c.b(2))),
        other => panic!("gpu_check has no op named {other:?}"),
    }
}

/// The op the CPU reference runs for `op`: the same one, except where burn-flex lacks it and a
/// composition of ops it has computes the same function.
pub(crate) fn reference_op(op: &str) -> &str {
    match op {
        "argtopk" => "argtopk_by_argsort",
        other => other,
    }
}

/// The random-number ops, checked by their moments instead of against the CPU (the two
/// backends draw from different generators by design).
pub(crate) const RANDOM: &[&str] = &[
    "random_uniform",
    "random_normal",
    "random_bernoulli",
    "int_random",
];

/// Draws a large sample on `B` and returns (sample mean, sample variance, expected mean,
/// expected variance).
pub(crate) fn random_moments<B: Backend>(
    op: &str,
    float: FloatDType,
    device: &Device<B>,
) -> Val<B> {
    let shape = Shape::new([1 << 20]);
    match op {
        "random_uniform" => Val::F(B::float_random(
            shape,
            Distribution::Uniform(-1.0, 3.0),
            device,
            float,
        )),
        "random_normal" => Val::F(B::float_random(
            shape,
            Distribution::Normal(0.5, 2.0),
            device,
            float,
        )),
        "random_bernoulli" => Val::F(B::float_random(
            shape,
            Distribution::Bernoulli(0.3),
            device,
            float,
        )),
        "int_random" => Val::I(B::int_random(
            shape,
            Distribution::Uniform(0.0, 10.0),
            device,
            get_device_settings::<B>(device).int_dtype,
        )),
        other => panic!("gpu_check has no random op named {other:?}"),
    }
}

/// The expected (mean, variance) of each random op's distribution.
pub(crate) fn expected_moments(op: &str) -> (f64, f64) {
    match op {
        "random_uniform" => (1.0, 16.0 / 12.0),
        "random_normal" => (0.5, 4.0),
        "random_bernoulli" => (0.3, 0.3 * 0.7),
        // Uniform over the integers 0..=9 (burn's int Uniform(lo, hi) excludes hi).
        "int_random" => (4.5, 99.0 / 12.0),
        other => panic!("gpu_check has no random op named {other:?}"),
    }
}
