//! One pre-norm transformer layer, Megatron's order: x + drop(attn(norm(x))), then
//! x + drop(ffn(norm(x))). The feed-forward part is dense or a mixture of experts, chosen per
//! layer by `layer_freq`.

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::ModelConfig;
use crate::attention::SelfAttention;
use crate::init::scaled_std;
use crate::mlp::{Mlp, MlpShape};
use crate::moe::{MoeLayer, MoeStats};
use crate::norm::Norm;

/// Both variants live once per layer for the model's lifetime, so their size difference costs
/// nothing worth boxing for (and burn's `Module` derive does not see through a `Box`).
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum FeedForward<B: Backend> {
    Dense(Mlp<B>),
    Moe(MoeLayer<B>),
}

#[derive(Module, Debug)]
pub struct TransformerBlock<B: Backend> {
    input_norm: Norm<B>,
    attention: SelfAttention<B>,
    pre_mlp_norm: Norm<B>,
    feed_forward: FeedForward<B>,
    hidden_dropout: Dropout,
}

impl<B: Backend> TransformerBlock<B> {
    pub fn new(config: &ModelConfig, index: usize, device: &B::Device) -> Self {
        let norm = || {
            Norm::new(
                config.normalization,
                config.hidden_size,
                config.norm_epsilon,
                device,
            )
        };
        let input_norm = norm();
        let attention = SelfAttention::new(config, device);
        let pre_mlp_norm = norm();
        let feed_forward = match &config.moe {
            Some(moe) if config.is_moe_layer(index) => {
                FeedForward::Moe(MoeLayer::new(config, moe, device))
            }
            _ => FeedForward::Dense(Mlp::new(
                &MlpShape {
                    hidden: config.hidden_size,
                    ffn: config.ffn_hidden_size,
                    activation: config.activation,
                    bias: config.add_bias_linear,
                    std: config.init_method_std,
                    output_std: scaled_std(config.init_method_std, config.num_layers),
                },
                device,
            )),
        };
        TransformerBlock {
            input_norm,
            attention,
            pre_mlp_norm,
            feed_forward,
            hidden_dropout: DropoutConfig::new(config.hidden_dropout).init(),
        }
    }

    /// `[batch, seq, hidden]` → same shape, plus routing statistics for an MoE layer.
    pub fn forward(&self, x: Tensor<B, 3>) -> (Tensor<B, 3>, Option<MoeStats<B>>) {
        let attended = self.attention.forward(self.input_norm.forward(x.clone()));
        let x = x + self.hidden_dropout.forward(attended);
        let normed = self.pre_mlp_norm.forward(x.clone());
        let (transformed, stats) = match &self.feed_forward {
            FeedForward::Dense(mlp) => (mlp.forward(normed), None),
            FeedForward::Moe(moe) => {
                let (out, stats) = moe.forward(normed);
                (out, Some(stats))
            }
        };
        (x + self.hidden_dropout.forward(transformed), stats)
    }

    pub(crate) fn moe(&self) -> Option<&MoeLayer<B>> {
        match &self.feed_forward {
            FeedForward::Moe(moe) => Some(moe),
            FeedForward::Dense(_) => None,
        }
    }

    pub(crate) fn map_moe(self, update: impl FnOnce(MoeLayer<B>) -> MoeLayer<B>) -> Self {
        let feed_forward = match self.feed_forward {
            FeedForward::Moe(moe) => FeedForward::Moe(update(moe)),
            dense => dense,
        };
        TransformerBlock {
            feed_forward,
            ..self
        }
    }
}
