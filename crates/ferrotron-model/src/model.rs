//! The decoder-only language model, GPT-2 or LLaMA flavoured by configuration. The loss lives
//! here rather than in the trainer so MoE auxiliary losses and the language-model loss are
//! always combined the same way.

use std::collections::HashSet;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::nn::{Dropout, DropoutConfig, Embedding, Linear};
use burn::tensor::backend::Backend;
use burn::tensor::module::linear;
use burn::tensor::{Int, Tensor};
use ferrotron_recipe::PositionEmbedding;

use crate::block::TransformerBlock;
use crate::init::{normal_embedding, normal_linear};
use crate::norm::Norm;
use crate::{ExpertLoads, ModelConfig, ModelError};

#[derive(Module, Debug)]
pub struct GptModel<B: Backend> {
    /// `[padded_vocab, hidden]`
    embedding: Embedding<B>,
    /// `[max_positions, hidden]` when positions are learned.
    position_embedding: Option<Embedding<B>>,
    embedding_dropout: Dropout,
    layers: Vec<TransformerBlock<B>>,
    final_norm: Norm<B>,
    /// `[hidden, padded_vocab]`; absent when the output layer reuses the embedding.
    output_layer: Option<Linear<B>>,
    #[module(skip)]
    config: ModelConfig,
}

/// The forward pass's results.
#[derive(Debug, Clone)]
pub struct ModelOutput<B: Backend> {
    /// `[batch, seq, padded_vocab]`
    pub logits: Tensor<B, 3>,
    /// Sum of every MoE layer's balancing and z-losses, `[1]`; zero for a dense model.
    pub aux_loss: Tensor<B, 1>,
    /// Tokens per expert of every MoE layer, for auxiliary-loss-free balancing.
    pub expert_loads: ExpertLoads,
}

/// The training objective and its parts.
#[derive(Debug, Clone)]
pub struct LossOutput<B: Backend> {
    /// `lm_loss + aux_loss`, `[1]`: what to differentiate.
    pub loss: Tensor<B, 1>,
    /// Mean token cross-entropy, `[1]`.
    pub lm_loss: Tensor<B, 1>,
    /// `[1]`, zero for a dense model.
    pub aux_loss: Tensor<B, 1>,
    pub expert_loads: ExpertLoads,
}

impl<B: Backend> GptModel<B> {
    pub(crate) fn new(config: &ModelConfig, device: &B::Device) -> Self {
        let std = config.init_method_std;
        let embedding = normal_embedding(config.padded_vocab_size, config.hidden_size, std, device);
        let position_embedding =
            (config.position_embedding == PositionEmbedding::Learned).then(|| {
                normal_embedding(
                    config.max_position_embeddings,
                    config.hidden_size,
                    std,
                    device,
                )
            });
        let layers = (0..config.num_layers)
            .map(|index| TransformerBlock::new(config, index, device))
            .collect();
        let final_norm = Norm::new(
            config.normalization,
            config.hidden_size,
            config.norm_epsilon,
            device,
        );
        let output_layer = (!config.tie_embeddings).then(|| {
            normal_linear(
                config.hidden_size,
                config.padded_vocab_size,
                std,
                false,
                device,
            )
        });
        GptModel {
            embedding,
            position_embedding,
            embedding_dropout: DropoutConfig::new(config.hidden_dropout).init(),
            layers,
            final_norm,
            output_layer,
            config: config.clone(),
        }
    }

    /// The configuration the model was built from.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The longest sequence the position tables cover (unbounded without position embeddings).
    pub fn max_sequence_length(&self) -> usize {
        match self.config.position_embedding {
            PositionEmbedding::Learned => self.config.max_position_embeddings,
            PositionEmbedding::Rope => self
                .config
                .max_position_embeddings
                .max(self.config.seq_length),
            PositionEmbedding::None => usize::MAX,
        }
    }

    /// `tokens`: `[batch, seq]` ids below the padded vocabulary.
    ///
    /// # Panics
    /// When `seq` exceeds [`Self::max_sequence_length`]: a caller bug, since the data pipeline
    /// and `generate` both cut sequences to the recipe's length.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> ModelOutput<B> {
        let [_, seq] = tokens.dims();
        assert!(
            seq <= self.max_sequence_length(),
            "a sequence of {seq} tokens is longer than the {} positions this model covers",
            self.max_sequence_length()
        );
        let device = tokens.device();
        let mut hidden = self.embedding.forward(tokens);
        if let Some(positions) = &self.position_embedding {
            let table = positions.weight.val().slice_dim(0, 0..seq);
            hidden = hidden + table.unsqueeze::<3>();
        }
        let mut hidden = self.embedding_dropout.forward(hidden);
        let mut aux_loss = Tensor::<B, 1>::zeros([1], &device);
        let mut loads = Vec::new();
        for layer in &self.layers {
            let (next, stats) = layer.forward(hidden);
            hidden = next;
            if let Some(stats) = stats {
                aux_loss = aux_loss + stats.aux_loss;
                loads.push(stats.loads);
            }
        }
        let hidden = self.final_norm.forward(hidden);
        let logits = match &self.output_layer {
            Some(output) => output.forward(hidden),
            None => linear(hidden, self.embedding.weight.val().transpose(), None),
        };
        ModelOutput {
            logits,
            aux_loss,
            expert_loads: ExpertLoads { layers: loads },
        }
    }

    /// Mean next-token cross-entropy of `labels` (`[batch, seq]`, each below the padded
    /// vocabulary) plus the MoE auxiliary losses. Like Megatron, the padded logits take part in
    /// the softmax; no real label ever points at them.
    pub fn loss(&self, tokens: Tensor<B, 2, Int>, labels: Tensor<B, 2, Int>) -> LossOutput<B> {
        let output = self.forward(tokens);
        let token_losses = token_cross_entropy(output.logits, labels);
        let lm_loss = token_losses.mean();
        combine(lm_loss, output.aux_loss, output.expert_loads)
    }

    /// As [`Self::loss`], averaging only over tokens where `loss_mask` (`[batch, seq]`, 0 or 1)
    /// is 1, as Megatron's GPT dataset masks end-of-document tokens.
    pub fn loss_masked(
        &self,
        tokens: Tensor<B, 2, Int>,
        labels: Tensor<B, 2, Int>,
        loss_mask: Tensor<B, 2>,
    ) -> LossOutput<B> {
        let output = self.forward(tokens);
        let [batch, seq] = loss_mask.dims();
        let mask = loss_mask.reshape([batch * seq]);
        let token_losses = token_cross_entropy(output.logits, labels);
        let lm_loss = (token_losses * mask.clone()).sum() / mask.sum().clamp_min(1.0);
        combine(lm_loss, output.aux_loss, output.expert_loads)
    }

    /// Parameters exempt from weight decay: every one-dimensional parameter, i.e. norm weights,
    /// LayerNorm biases, linear biases and the MoE expert-bias buffer (Megatron's rule).
    pub fn no_weight_decay_params(&self) -> HashSet<ParamId> {
        let mut collector = OneDimensionalParams::default();
        self.visit(&mut collector);
        collector.ids
    }

    /// Parameters trained by gradients: `num_params()` less the expert-bias buffers, which
    /// Megatron keeps as buffers, not parameters.
    pub fn num_trainable_params(&self) -> usize {
        let buffers: usize = self
            .layers
            .iter()
            .filter_map(|layer| layer.moe())
            .filter_map(|moe| moe.expert_bias())
            .map(|bias| bias.dims()[0])
            .sum();
        self.num_params() - buffers
    }

    /// The selection bias of every MoE layer that uses one, in layer order.
    pub fn expert_biases(&self) -> Vec<Tensor<B, 1>> {
        self.layers
            .iter()
            .filter_map(|layer| layer.moe())
            .filter_map(|moe| moe.expert_bias())
            .collect()
    }

    /// Apply DeepSeek-V3's auxiliary-loss-free update to every MoE layer with an expert bias:
    /// `bias_i += rate · sign(mean_load − load_i)`. `loads` are the tokens per expert summed
    /// over the step (all microbatches, and all data-parallel ranks once there are several).
    pub fn update_expert_bias(self, loads: &ExpertLoads) -> Result<Self, ModelError> {
        let moe_layers: Vec<usize> = self
            .layers
            .iter()
            .filter_map(|layer| layer.moe().map(|moe| moe.num_experts()))
            .collect();
        let shapes_match = loads.layers.len() == moe_layers.len()
            && loads
                .layers
                .iter()
                .zip(&moe_layers)
                .all(|(given, &experts)| given.len() == experts);
        if !shapes_match {
            return Err(ModelError::ExpertLoadsMismatch {
                given: loads.layers.len(),
                given_experts: loads.layers.first().map_or(0, Vec::len),
                expected: moe_layers.len(),
                expected_experts: moe_layers.first().copied().unwrap_or(0),
            });
        }
        let mut per_layer = loads.layers.iter();
        let layers = self
            .layers
            .into_iter()
            .map(|layer| {
                if layer.moe().is_none() {
                    return layer;
                }
                match per_layer.next() {
                    Some(load) => layer.map_moe(|moe| moe.update_expert_bias(load)),
                    None => layer,
                }
            })
            .collect();
        Ok(GptModel { layers, ..self })
    }
}

/// Per-token negative log-likelihood, `[batch·seq]`, as `logsumexp(logits) − logits[label]`:
/// one full-vocabulary pass fewer than gathering from `log_softmax`, forward and backward (about
/// 15-20% of the loss head on the CPU backend, where the vocabulary dominates small models).
fn token_cross_entropy<B: Backend>(
    logits: Tensor<B, 3>,
    labels: Tensor<B, 2, Int>,
) -> Tensor<B, 1> {
    let [batch, seq, vocab] = logits.dims();
    let rows = batch * seq;
    let logits = logits.reshape([rows, vocab]);
    let max = logits.clone().detach().max_dim(1);
    let log_sum_exp = (logits.clone() - max.clone()).exp().sum_dim(1).log() + max;
    let target = logits.gather(1, labels.reshape([rows, 1]));
    (log_sum_exp - target).reshape([rows])
}

fn combine<B: Backend>(
    lm_loss: Tensor<B, 1>,
    aux_loss: Tensor<B, 1>,
    expert_loads: ExpertLoads,
) -> LossOutput<B> {
    LossOutput {
        loss: lm_loss.clone() + aux_loss.clone(),
        lm_loss,
        aux_loss,
        expert_loads,
    }
}

#[derive(Default)]
struct OneDimensionalParams {
    ids: HashSet<ParamId>,
}

impl<B: Backend> ModuleVisitor<B> for OneDimensionalParams {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if D == 1 {
            self.ids.insert(param.id);
        }
    }
}
