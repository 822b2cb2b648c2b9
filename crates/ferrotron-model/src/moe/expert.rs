//! One routed expert: the same feed-forward block as a dense layer (Megatron's fused SwiGLU fc1,
//! gate half first), with the cut Megatron's expert-tensor parallelism makes: fc1 split by
//! output columns (each SwiGLU half separately), fc2 by input rows. A cut expert computes a
//! partial sum; the dispatcher sums the etp ranks' partials, so the expert itself never talks.
//! The parameter layout equals the dense `Mlp`'s, so one-rank checkpoints are unchanged.

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::Tensor;
use burn::tensor::activation::{gelu, silu};
use burn::tensor::backend::Backend;
use ferrotron_parallel::{ParamRole, Split};
use ferrotron_recipe::Activation;

use crate::error::ModelError;
use crate::init::normal_linear;
use crate::mlp::{MlpShape, gelu_tanh};
use crate::parallel::{Placement, cut_module, roles_of};

#[derive(Module, Debug)]
pub struct Expert<B: Backend> {
    /// `[hidden, ffn]` for GELU, `[hidden, 2·ffn]` for SwiGLU (this rank's columns when cut).
    pub(super) fc1: Linear<B>,
    /// `[ffn, hidden]` (this rank's rows when cut); its bias is whole on every rank.
    pub(super) fc2: Linear<B>,
    #[module(skip)]
    pub(super) activation: Activation,
    /// Which etp piece this is ([`Piece::WHOLE`] on one rank).
    #[module(skip)]
    piece: Piece,
}

/// Piece `index` of `count` of an expert cut over expert-tensor-parallel ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub index: usize,
    pub count: usize,
}

impl Piece {
    pub const WHOLE: Piece = Piece { index: 0, count: 1 };
}

impl<B: Backend> Expert<B> {
    /// Draws fc1 then fc2, in the dense `Mlp`'s order, so seeded models are unchanged.
    pub fn new(shape: &MlpShape, device: &B::Device) -> Self {
        let fc1_out = if shape.activation == Activation::Swiglu {
            2 * shape.ffn
        } else {
            shape.ffn
        };
        Expert {
            fc1: normal_linear(shape.hidden, fc1_out, shape.std, shape.bias, device),
            fc2: normal_linear(
                shape.ffn,
                shape.hidden,
                shape.output_std,
                shape.bias,
                device,
            ),
            activation: shape.activation,
            piece: Piece::WHOLE,
        }
    }

    /// The whole expert: `[tokens, hidden]` → `[tokens, hidden]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.fc2.forward(self.activated(x))
    }

    /// This etp rank's share of the output, without fc2's bias (added once, after the sum).
    pub fn forward_partial(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.activated(x).matmul(self.fc2.weight.val())
    }

    pub fn fc2_bias(&self) -> Option<Tensor<B, 1>> {
        self.fc2.bias.as_ref().map(Param::val)
    }

    fn activated(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let hidden = self.fc1.forward(x);
        match self.activation {
            Activation::Swiglu => {
                let width = hidden.dims()[1];
                let gate = hidden.clone().slice_dim(1, 0..width / 2);
                let linear = hidden.slice_dim(1, width / 2..width);
                silu(gate) * linear
            }
            Activation::Gelu => gelu(hidden),
            Activation::GeluTanh => gelu_tanh(hidden),
        }
    }

    /// This rank's piece of a whole one-rank expert.
    pub fn shard(&self, piece: Piece) -> Result<Self, ModelError> {
        if self.piece != Piece::WHOLE {
            return Err(ModelError::Layout(
                "an expert can only be cut from the whole one-rank expert".to_owned(),
            ));
        }
        let [ffn, _] = self.fc2.weight.dims();
        if !ffn.is_multiple_of(piece.count) {
            return Err(ModelError::Layout(format!(
                "an expert of {ffn} hidden units cannot be split over {} expert-tensor-parallel ranks",
                piece.count
            )));
        }
        let cut = cut_module(self, |name| self.placement(name, piece))?;
        Ok(Expert { piece, ..cut })
    }

    /// Roles of this (possibly cut) expert's parameters, named `{prefix}.fc1.weight`, ….
    pub fn param_roles(&self, prefix: &str) -> Vec<ParamRole> {
        roles_of(self, prefix, |name| self.placement(name, self.piece))
    }

    /// fc1 by output columns (`parts: 2` for SwiGLU's fused halves), fc2 by input rows, fc2's
    /// bias whole. Every parameter is an expert's: reduced over edp.
    fn placement(&self, name: &str, piece: Piece) -> Placement {
        let parts = if self.activation == Activation::Swiglu {
            2
        } else {
            1
        };
        let split = match name {
            "fc1.weight" => Some(Split::fused(1, parts, piece.index, piece.count)),
            "fc1.bias" => Some(Split::fused(0, parts, piece.index, piece.count)),
            "fc2.weight" => Some(Split::new(0, piece.index, piece.count)),
            _ => None,
        };
        Placement {
            splits: split.filter(|_| piece.count > 1).into_iter().collect(),
            expert: true,
            ..Placement::default()
        }
    }
}
