//! Model-level tests on burn's CPU backend with tiny dimensions, so the whole suite stays fast.

mod causal;
mod counts;
mod dense_families;
mod fp8;
mod init;
mod linear_loss;
mod mla_parallel;
mod moe;
mod moe_parallel;
mod parallel;
mod prefetch;
mod presets;
mod sampling;
mod training;

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use ferrotron_recipe::{
    Activation, LayerFreq, LoadBalancing, Mla, Model, Moe, Normalization, PositionEmbedding,
    ScoreFunction, TokenDispatcher, TokenDropPolicy,
};

use crate::{ExpertLoads, GptModel, ModelConfig};

/// The thread ranks' recorded calls replayed under NCCL's rules (`ferrotron_dist::replay`):
/// every layout these tests split the model over issues one collective order on every rank.
pub(crate) fn assert_one_call_order(logs: &ferrotron_dist::CallLogs) {
    if let Err(err) = logs.replay() {
        panic!("{err}");
    }
}

pub(crate) type Cpu = Flex;
pub(crate) type CpuAutodiff = Autodiff<Flex>;

pub(crate) const PADDED_VOCAB: u32 = 128;

/// GPT-2 style: learned positions, LayerNorm, GELU, biases, tied embeddings. No dropout unless
/// a test asks for it.
pub(crate) fn gpt2_model() -> Model {
    Model {
        num_layers: 2,
        hidden_size: 16,
        ffn_hidden_size: Some(64),
        num_attention_heads: 4,
        num_query_groups: None,
        kv_channels: None,
        vocab_size: Some(100),
        make_vocab_size_divisible_by: 128,
        seq_length: 8,
        max_position_embeddings: None,
        position_embedding: PositionEmbedding::Learned,
        rotary_base: 10000.0,
        normalization: Normalization::Layernorm,
        norm_epsilon: 1e-5,
        activation: Activation::Gelu,
        tie_embeddings: true,
        add_bias_linear: true,
        hidden_dropout: 0.0,
        attention_dropout: 0.0,
        init_method_std: 0.02,
        moe: None,
        rope_scaling: None,
        add_qkv_bias: false,
        qk_layernorm: false,
        window_size: None,
        mla: None,
    }
}

/// LLaMA style: RoPE, RMSNorm, SwiGLU, grouped-query attention, untied, no biases.
pub(crate) fn llama_model() -> Model {
    Model {
        ffn_hidden_size: Some(32),
        num_query_groups: Some(2),
        position_embedding: PositionEmbedding::Rope,
        normalization: Normalization::Rmsnorm,
        activation: Activation::Swiglu,
        tie_embeddings: false,
        add_bias_linear: false,
        ..gpt2_model()
    }
}

pub(crate) fn moe_section() -> Moe {
    Moe {
        num_experts: 4,
        router_topk: 2,
        load_balancing: LoadBalancing::AuxLoss,
        aux_loss_coeff: 1e-2,
        z_loss_coeff: None,
        score_function: ScoreFunction::Softmax,
        pre_softmax: false,
        expert_bias: false,
        expert_bias_update_rate: 1e-3,
        num_groups: None,
        group_topk: None,
        capacity_factor: None,
        token_drop_policy: TokenDropPolicy::Probs,
        pad_to_capacity: false,
        token_dispatcher: TokenDispatcher::Alltoall,
        layer_freq: LayerFreq::Every(2),
        router_topk_scaling_factor: None,
        ffn_hidden_size: Some(8),
        shared_expert_ffn_hidden_size: Some(16),
    }
}

/// LLaMA style with an MoE first layer (layer_freq 2 over 2 layers) and a shared expert.
pub(crate) fn moe_model() -> Model {
    Model {
        moe: Some(moe_section()),
        ..llama_model()
    }
}

/// LLaMA-style trunk (hidden 16, 4 heads, RMSNorm) with MLA: q latent 12, kv latent 8, per
/// head 6 plain + 4 rotary query/key channels and 5 value channels, latent norms on.
pub(crate) fn mla_model() -> Model {
    Model {
        num_query_groups: None,
        qk_layernorm: true,
        mla: Some(Mla {
            q_lora_rank: Some(12),
            kv_lora_rank: 8,
            qk_head_dim: 6,
            qk_pos_emb_head_dim: 4,
            v_head_dim: 5,
        }),
        ..llama_model()
    }
}

pub(crate) fn config(model: &Model) -> ModelConfig {
    ModelConfig::from_model(model, PADDED_VOCAB).expect("test model is valid")
}

pub(crate) fn build<B: Backend>(model: &Model, seed: u64) -> GptModel<B> {
    let device = Default::default();
    B::seed(&device, seed);
    config(model).init::<B>(&device)
}

pub(crate) fn tokens<B: Backend>(rows: &[&[u32]]) -> Tensor<B, 2, Int> {
    let width = rows[0].len();
    let ids: Vec<i64> = rows
        .iter()
        .flat_map(|row| row.iter().map(|&t| i64::from(t)))
        .collect();
    Tensor::from_data(
        TensorData::new(ids, [rows.len(), width]),
        &Default::default(),
    )
}

pub(crate) fn values<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Vec<f32> {
    tensor.into_data().iter::<f32>().collect()
}

/// Two sequences of 8 tokens and their next tokens: the batch the training tests fit.
pub(crate) fn fixed_batch() -> (Tensor<CpuAutodiff, 2, Int>, Tensor<CpuAutodiff, 2, Int>) {
    (
        tokens(&[
            &[11, 42, 7, 93, 5, 61, 28, 70],
            &[3, 3, 58, 14, 99, 0, 36, 81],
        ]),
        tokens(&[
            &[42, 7, 93, 5, 61, 28, 70, 12],
            &[3, 58, 14, 99, 0, 36, 81, 47],
        ]),
    )
}

pub(crate) fn scalar<B: Backend>(tensor: Tensor<B, 1>) -> f32 {
    values(tensor)[0]
}
