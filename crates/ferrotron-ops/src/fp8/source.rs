//! What an fp8 cast reads: a tensor as it is, or an activation (or its gradient) computed on
//! the way in, with the bias gradient summed in the same pass.
//!
//! An fp8 step's casts move as many bytes as its GEMMs save: on the H200, gpt-1.3b's input and
//! gradient casts took 27 ms of a 304 ms step and the bias gradients' GEMVs another 8, all at
//! the memory's speed. Transformer Engine fuses them into the kernels around the GEMMs: the
//! MLP's activation writes its fp8 copy directly (the 16-bit activation is never stored), the
//! activation's backward writes the fp8 gradient fc1's GEMMs read, and a gradient cast sums the
//! bias gradient while it reads `dy`. [`FusedOps::fp8_quantize_source`] is that one pass; its
//! default materialises the source with the backend's own activation ops, then casts, so a
//! kernel is held to the unfused arithmetic.

use burn::tensor::TensorMetadata;
use burn::tensor::ops::FloatTensor;

use crate::FusedOps;
use crate::fp8::linear::{Fp8Linear, Fp8Tensor};
use crate::fp8::rope::Fp8Rope;
use crate::fp8::scaling::Fp8Role;
use crate::op::dropout::DropoutMask;

/// The activation between an MLP's two fp8 linears.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Activation {
    /// GELU, erf form, over `[rows, f]`.
    Gelu,
    /// `silu(gate) · up` of the packed `[rows, 2f]` projection (gate first).
    Swiglu,
}

/// The tensor an fp8 cast writes, by what it is computed from.
#[derive(Debug, Clone)]
pub enum Fp8Source<B: FusedOps> {
    /// `x [rows, cols]` itself.
    Plain(FloatTensor<B>),
    /// `act(pre)`: `pre` is `[rows, f]` (GELU) or `[rows, 2f]` (SwiGLU), the cast `[rows, f]`.
    Activation {
        pre: FloatTensor<B>,
        act: Fp8Activation,
    },
    /// The gradient of `pre` through `act` given the activation's output gradient
    /// `grad [rows, f]`: the cast is `pre`'s shape.
    ActivationGrad {
        grad: FloatTensor<B>,
        pre: FloatTensor<B>,
        act: Fp8Activation,
    },
    /// The packed QKV projection's gradient from its rotated version's, `grad [rows, cols]`
    /// (RoPE's backward, `op/rope.rs`; the layout and tables in `rope`).
    RopeGrad {
        grad: FloatTensor<B>,
        rope: Fp8Rope<B>,
    },
    /// The dropped input's gradient of a residual add with hidden dropout from the output's
    /// gradient `grad [rows, cols]`, the keep bits regenerated from `mask` (`op/dropout.rs`).
    DropoutGrad {
        grad: FloatTensor<B>,
        mask: DropoutMask<B>,
        prob: f64,
    },
}

impl<B: FusedOps> Fp8Source<B> {
    /// The 16-bit tensor the cast stands for, through the backend's activation kernels (their
    /// composed arithmetic where it has none).
    pub fn materialize(self) -> FloatTensor<B> {
        match self {
            Fp8Source::Plain(x) => x,
            Fp8Source::Activation { pre, act } => match act {
                Fp8Activation::Gelu => B::gelu_kernel_forward(pre),
                Fp8Activation::Swiglu => B::swiglu_kernel_forward(pre),
            },
            Fp8Source::ActivationGrad { grad, pre, act } => match act {
                Fp8Activation::Gelu => B::gelu_kernel_backward(pre, grad),
                Fp8Activation::Swiglu => B::swiglu_kernel_backward(pre, grad),
            },
            Fp8Source::DropoutGrad { grad, mask, prob } => {
                // A kept mask (the reference kernels') has the forward's shape, not the rows'.
                let shape = grad.shape();
                let grad = match &mask.kept {
                    Some(kept) => B::float_reshape(grad, kept.shape()),
                    None => grad,
                };
                B::float_reshape(B::dropout_add_kernel_backward(grad, prob, mask), shape)
            }
            Fp8Source::RopeGrad { grad, rope } => {
                let shape = grad.shape();
                let packed = rope.packed(grad);
                B::float_reshape(
                    B::rope_qkv_kernel_backward(packed, rope.cos, rope.sin),
                    shape,
                )
            }
        }
    }
}

/// Default of [`FusedOps::fp8_quantize_source`]: the source materialised, cast by
/// [`FusedOps::fp8_quantize`], its column sums by the backend's `linear_bias_backward`.
pub fn fp8_quantize_source_composed<B: FusedOps>(
    source: Fp8Source<B>,
    fp8: &Fp8Linear,
    role: Fp8Role,
    record: bool,
    bias_grad: bool,
) -> (Fp8Tensor<B>, Option<FloatTensor<B>>) {
    let x = source.materialize();
    let bias = bias_grad.then(|| B::linear_bias_backward(x.clone()));
    (B::fp8_quantize(x, fp8, role, record), bias)
}
