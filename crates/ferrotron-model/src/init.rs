//! Megatron's initialisation, drawn eagerly. burn's stock initialisers are lazy: a parameter
//! draws its random values the first time it is read, so the values would depend on the order in
//! which later code happens to touch parameters. Drawing at construction makes a model a pure
//! function of the backend seed and the configuration.

use burn::module::Param;
use burn::nn::{Embedding, Linear};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};

/// A `[d_input, d_output]` linear layer with normal(0, std) weights and zero biases.
pub(crate) fn normal_linear<B: Backend>(
    d_input: usize,
    d_output: usize,
    std: f64,
    bias: bool,
    device: &B::Device,
) -> Linear<B> {
    Linear {
        weight: normal_param([d_input, d_output], std, device),
        bias: bias.then(|| Param::from_tensor(Tensor::zeros([d_output], device))),
    }
}

/// A `[rows, dim]` embedding table with normal(0, std) rows.
pub(crate) fn normal_embedding<B: Backend>(
    rows: usize,
    dim: usize,
    std: f64,
    device: &B::Device,
) -> Embedding<B> {
    Embedding {
        weight: normal_param([rows, dim], std, device),
    }
}

fn normal_param<B: Backend>(
    shape: [usize; 2],
    std: f64,
    device: &B::Device,
) -> Param<Tensor<B, 2>> {
    Param::from_tensor(Tensor::random(
        shape,
        Distribution::Normal(0.0, std),
        device,
    ))
}

/// Megatron's `scaled_init_method_normal`: the last linear of each residual branch gets
/// std / sqrt(2·layers) so the residual stream's variance does not grow with depth.
pub(crate) fn scaled_std(std: f64, num_layers: usize) -> f64 {
    std / (2.0 * num_layers as f64).sqrt()
}
