//! One norm type for both model families, so a block does not care whether the recipe asked for
//! GPT-2's LayerNorm (weight and bias) or LLaMA's RMSNorm (weight only).

use burn::module::Module;
use burn::nn::{LayerNorm, LayerNormConfig, RmsNorm, RmsNormConfig};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use ferrotron_recipe::Normalization;

#[derive(Module, Debug)]
pub enum Norm<B: Backend> {
    Layer(LayerNorm<B>),
    Rms(RmsNorm<B>),
}

impl<B: Backend> Norm<B> {
    /// Weights start at one and LayerNorm's bias at zero, as in Megatron.
    pub fn new(kind: Normalization, dim: usize, epsilon: f64, device: &B::Device) -> Self {
        match kind {
            Normalization::Layernorm => {
                Norm::Layer(LayerNormConfig::new(dim).with_epsilon(epsilon).init(device))
            }
            Normalization::Rmsnorm => {
                Norm::Rms(RmsNormConfig::new(dim).with_epsilon(epsilon).init(device))
            }
        }
    }

    pub fn forward<const D: usize>(&self, input: Tensor<B, D>) -> Tensor<B, D> {
        match self {
            Norm::Layer(norm) => norm.forward(input),
            Norm::Rms(norm) => norm.forward(input),
        }
    }
}
