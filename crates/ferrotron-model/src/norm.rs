//! One norm type for both model families, so a block does not care whether the recipe asked for
//! GPT-2's LayerNorm (weight and bias) or LLaMA's RMSNorm (weight only).
//!
//! The forward goes through `ferrotron_ops::norm`: burn's arithmetic where the backend has
//! no norm kernel, one fused node where it has (the CUDA backend). `LayerNorm` is declared here
//! (burn's, field for field, so parameter names and initial values are unchanged) because burn
//! keeps its epsilon private and the fused path needs it.

use burn::module::{Module, Param};
use burn::nn::Initializer;
use burn::nn::{RmsNorm, RmsNormConfig};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Shape, Tensor, TensorMetadata};
use ferrotron_ops::{Fp8InputNorm, FusedOps, NormKind, NormSpec};
use ferrotron_recipe::Normalization;

/// `(x − mean) / sqrt(var + ε) · γ + β` over the last dimension.
#[derive(Module, Debug)]
pub struct LayerNorm<B: Backend> {
    pub gamma: Param<Tensor<B, 1>>,
    pub beta: Option<Param<Tensor<B, 1>>>,
    epsilon: f64,
}

#[derive(Module, Debug)]
pub enum Norm<B: Backend> {
    Layer(LayerNorm<B>),
    Rms(RmsNorm<B>),
}

impl<B: Backend> Norm<B> {
    /// Weights start at one and LayerNorm's bias at zero, as in Megatron.
    pub fn new(kind: Normalization, dim: usize, epsilon: f64, device: &B::Device) -> Self {
        match kind {
            Normalization::Layernorm => Norm::Layer(LayerNorm {
                gamma: Initializer::Ones.init([dim], device),
                beta: Some(Initializer::Zeros.init([dim], device)),
                epsilon,
            }),
            Normalization::Rmsnorm => {
                Norm::Rms(RmsNormConfig::new(dim).with_epsilon(epsilon).init(device))
            }
        }
    }
}

impl<B: Backend> Norm<B> {
    /// The weight, the bias (LayerNorm's) and the spec, as primitives for a fused op.
    pub(crate) fn primitives(&self) -> (FloatTensor<B>, Option<FloatTensor<B>>, NormSpec) {
        let primitive = |param: &Param<Tensor<B, 1>>| param.val().into_primitive().tensor();
        match self {
            Norm::Layer(norm) => (
                primitive(&norm.gamma),
                norm.beta.as_ref().map(primitive),
                NormSpec {
                    kind: NormKind::Layer,
                    epsilon: norm.epsilon,
                },
            ),
            Norm::Rms(norm) => (
                primitive(&norm.gamma),
                None,
                NormSpec {
                    kind: NormKind::Rms,
                    epsilon: norm.epsilon,
                },
            ),
        }
    }
}

impl<B: FusedOps> Norm<B> {
    /// This norm as the first step of an fp8 node reading `x` (Transformer Engine's
    /// `LayerNormLinear`), where the backend normalises with a kernel: the node then casts the
    /// normalised rows without a 16-bit copy of them. `None`: the norm runs on its own.
    pub(crate) fn fp8_input<const D: usize>(&self, x: &Tensor<B, D>) -> Option<Fp8InputNorm<B>> {
        let (gamma, beta, spec) = match self {
            Norm::Layer(norm) => (
                norm.gamma.val(),
                norm.beta.as_ref().map(Param::val),
                NormSpec {
                    kind: NormKind::Layer,
                    epsilon: norm.epsilon,
                },
            ),
            Norm::Rms(norm) => (
                norm.gamma.val(),
                None,
                NormSpec {
                    kind: NormKind::Rms,
                    epsilon: norm.epsilon,
                },
            ),
        };
        let gamma = gamma.into_primitive().tensor();
        // The node normalises the rows `[rows, hidden]`: ask about those.
        let [hidden] = gamma.shape().dims();
        let rows = B::float_reshape(
            x.clone().into_primitive().tensor(),
            Shape::new([x.shape().num_elements() / hidden.max(1), hidden]),
        );
        B::has_norm_kernel(&rows, &gamma, &spec).then(|| Fp8InputNorm {
            gamma,
            beta: beta.map(|b| b.into_primitive().tensor()),
            spec,
        })
    }

    pub fn forward<const D: usize>(&self, input: Tensor<B, D>) -> Tensor<B, D> {
        match self {
            Norm::Layer(norm) => ferrotron_ops::norm(
                input,
                norm.gamma.val(),
                norm.beta.as_ref().map(Param::val),
                NormSpec {
                    kind: NormKind::Layer,
                    epsilon: norm.epsilon,
                },
            ),
            Norm::Rms(norm) => ferrotron_ops::norm(
                input,
                norm.gamma.val(),
                None,
                NormSpec {
                    kind: NormKind::Rms,
                    epsilon: norm.epsilon,
                },
            ),
        }
    }
}
