//! What one pipeline chunk of the model is and what passes between chunks. A stage (or, with
//! interleaving, each virtual stage) owns a contiguous run of layers; the first also embeds
//! tokens and the last also owns the final norm, the output layer and the loss, as in
//! Megatron's `pre_process` / `post_process`.

use std::ops::Range;

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

use crate::{ExpertLoads, LossOutput, ModelConfig};

/// The layers (global indices) of one chunk and whether it has the embedding and the head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkSpec {
    pub layers: Range<usize>,
    /// Embeds tokens (the first stage).
    pub pre_process: bool,
    /// Final norm, output layer and loss (the last stage).
    pub post_process: bool,
}

impl ChunkSpec {
    /// The whole model as one chunk.
    pub fn whole(config: &ModelConfig) -> Self {
        ChunkSpec {
            layers: 0..config.num_layers,
            pre_process: true,
            post_process: true,
        }
    }
}

/// What enters a chunk.
#[derive(Debug, Clone)]
pub enum ChunkData<B: Backend> {
    /// `[batch, seq_local]` token ids (a `pre_process` chunk).
    Tokens(Tensor<B, 2, Int>),
    /// The previous chunk's output, `boundary_shape`.
    Hidden(Tensor<B, 3>),
}

/// A chunk's input, with the targets a `post_process` chunk needs for its loss.
#[derive(Debug, Clone)]
pub struct ChunkInput<B: Backend> {
    pub data: ChunkData<B>,
    /// `[batch, seq_local]`, required by a `post_process` chunk.
    pub labels: Option<Tensor<B, 2, Int>>,
    /// `[batch, seq_local]` of 0/1: the loss averages over the tokens marked 1.
    pub loss_mask: Option<Tensor<B, 2>>,
}

impl<B: Backend> ChunkInput<B> {
    pub fn tokens(tokens: Tensor<B, 2, Int>) -> Self {
        ChunkInput {
            data: ChunkData::Tokens(tokens),
            labels: None,
            loss_mask: None,
        }
    }

    pub fn hidden(hidden: Tensor<B, 3>) -> Self {
        ChunkInput {
            data: ChunkData::Hidden(hidden),
            labels: None,
            loss_mask: None,
        }
    }

    pub fn with_labels(self, labels: Tensor<B, 2, Int>, loss_mask: Option<Tensor<B, 2>>) -> Self {
        ChunkInput {
            labels: Some(labels),
            loss_mask,
            ..self
        }
    }
}

/// What leaves a chunk.
#[derive(Debug, Clone)]
pub enum ChunkOutput<B: Backend> {
    /// A chunk before the last: hidden states for the next chunk and this chunk's MoE losses.
    Hidden {
        /// `boundary_shape`
        hidden: Tensor<B, 3>,
        /// This chunk's MoE auxiliary losses, `[1]` (zero without MoE layers).
        aux_loss: Tensor<B, 1>,
        expert_loads: ExpertLoads,
    },
    /// The last chunk: `loss = lm_loss + this chunk's aux_loss`.
    Loss(LossOutput<B>),
}

impl<B: Backend> ChunkOutput<B> {
    /// This chunk's MoE auxiliary losses.
    pub fn aux_loss(&self) -> &Tensor<B, 1> {
        match self {
            ChunkOutput::Hidden { aux_loss, .. } => aux_loss,
            ChunkOutput::Loss(loss) => &loss.aux_loss,
        }
    }

    /// Tokens per expert of this chunk's MoE layers.
    pub fn expert_loads(&self) -> &ExpertLoads {
        match self {
            ChunkOutput::Hidden { expert_loads, .. } => expert_loads,
            ChunkOutput::Loss(loss) => &loss.expert_loads,
        }
    }
}
