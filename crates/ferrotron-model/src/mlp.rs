//! The feed-forward block used by dense layers, routed experts and shared experts alike. SwiGLU
//! keeps Megatron's fused fc1 (gate half first, then the linear half) so parameter counts and
//! checkpoint layouts match Megatron's.

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::Tensor;
use burn::tensor::activation::{gelu, silu};
use burn::tensor::backend::Backend;
use ferrotron_recipe::Activation;

use crate::init::normal_linear;

#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    /// `[hidden, ffn]` for GELU, `[hidden, 2·ffn]` for SwiGLU.
    fc1: Linear<B>,
    /// `[ffn, hidden]`
    fc2: Linear<B>,
    swiglu: bool,
}

/// Sizes and init of one MLP.
pub struct MlpShape {
    pub hidden: usize,
    pub ffn: usize,
    pub activation: Activation,
    pub bias: bool,
    pub std: f64,
    /// Std of fc2, the residual branch's output layer.
    pub output_std: f64,
}

impl<B: Backend> Mlp<B> {
    pub fn new(shape: &MlpShape, device: &B::Device) -> Self {
        let swiglu = shape.activation == Activation::Swiglu;
        let fc1_out = if swiglu { 2 * shape.ffn } else { shape.ffn };
        Mlp {
            fc1: normal_linear(shape.hidden, fc1_out, shape.std, shape.bias, device),
            fc2: normal_linear(
                shape.ffn,
                shape.hidden,
                shape.output_std,
                shape.bias,
                device,
            ),
            swiglu,
        }
    }

    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let hidden = self.fc1.forward(x);
        let activated = if self.swiglu {
            let [gate, linear] = split_last_in_half(hidden);
            silu(gate) * linear
        } else {
            gelu(hidden)
        };
        self.fc2.forward(activated)
    }
}

fn split_last_in_half<B: Backend, const D: usize>(x: Tensor<B, D>) -> [Tensor<B, D>; 2] {
    let width = x.dims()[D - 1];
    let half = width / 2;
    [
        x.clone().slice_dim(D - 1, 0..half),
        x.slice_dim(D - 1, half..width),
    ]
}
