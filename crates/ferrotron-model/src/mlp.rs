//! The feed-forward block used by dense layers, routed experts and shared experts alike. SwiGLU
//! keeps Megatron's fused fc1 (gate half first, then the linear half) so parameter counts and
//! checkpoint layouts match Megatron's. Under tensor parallelism fc1 is column-parallel (each
//! rank holds its slice of the gate half and of the linear half: `parts: 2`) and fc2
//! row-parallel, so the activation needs no communication; fc2's bias is added once, after the
//! reduction.

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::Tensor;
use burn::tensor::activation::{gelu, silu};
use burn::tensor::backend::Backend;
use burn::tensor::module::linear;
use ferrotron_parallel::ParallelOps;
use ferrotron_recipe::Activation;

use crate::ModelError;
use crate::init::normal_linear;
use crate::parallel::{Placement, TensorParallel, cut_module};

#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    /// `[hidden, ffn]` for GELU, `[hidden, 2·ffn]` for SwiGLU (divided by tp on a tp rank).
    fc1: Linear<B>,
    /// `[ffn, hidden]` (rows divided by tp).
    fc2: Linear<B>,
    swiglu: bool,
    #[module(skip)]
    tp: TensorParallel,
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
            tp: TensorParallel::single(),
        }
    }

    /// This rank's part of a full one-rank MLP, computing over `tp`.
    pub fn shard(&self, tp: &TensorParallel) -> Result<Self, ModelError> {
        let [ffn, _] = self.fc2.weight.val().dims();
        if !ffn.is_multiple_of(tp.size()) {
            return Err(ModelError::Layout(format!(
                "an MLP of {ffn} hidden units cannot be split over {} tensor-parallel ranks",
                tp.size()
            )));
        }
        let placed = cut_module(self, |name| self.placement(name, tp))?;
        Ok(Mlp {
            tp: tp.clone(),
            ..placed
        })
    }

    /// How parameter `name` (`fc1.weight`, `fc2.bias`, ...) is split over `tp`.
    pub fn placement(&self, name: &str, tp: &TensorParallel) -> Placement {
        let parts = if self.swiglu { 2 } else { 1 };
        match name {
            "fc1.weight" => Placement::split(tp, 1, parts),
            "fc1.bias" => Placement::split(tp, 0, parts),
            "fc2.weight" => Placement::split(tp, 0, 1),
            _ => Placement::replicated(tp),
        }
    }

    /// The group this MLP computes over.
    pub fn tensor_parallel(&self) -> &TensorParallel {
        &self.tp
    }
}

impl<B: ParallelOps> Mlp<B> {
    /// `[.., tokens, hidden]` → same shape; with sequence parallelism the tokens are this
    /// rank's part of the sequence on the way in and out.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let hidden = self.fc1.forward(self.tp.enter(x));
        let activated = if self.swiglu {
            let [gate, linear] = split_last_in_half(hidden);
            silu(gate) * linear
        } else {
            gelu(hidden)
        };
        let partial = linear(activated, self.fc2.weight.val(), None);
        let output = self.tp.exit(partial);
        match &self.fc2.bias {
            Some(bias) => output + bias.val().unsqueeze(),
            None => output,
        }
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
