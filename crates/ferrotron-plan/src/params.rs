//! Parameter counts, exactly as Megatron-Core's GPT model allocates them.
//!
//! The model crate builds its burn modules from the same recipe and tests that its parameter
//! count equals [`ParameterCount::total`], so this file is the single written-down definition of
//! "what tensors a layer has". Buffers (RoPE tables, the MoE expert bias) are not parameters.

use ferrotron_recipe::{Activation, Mla, Model, Normalization, PositionEmbedding};
use serde::{Deserialize, Serialize};

/// Parameters of the whole (unsharded) model, broken down the way the planner shards them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ParameterCount {
    /// Every parameter of the model, counting a tied embedding once.
    pub total: u64,
    /// Word embedding: padded vocab × hidden.
    pub embedding: u64,
    /// Learned absolute positions: max_position_embeddings × hidden (0 for RoPE / none).
    pub position_embedding: u64,
    /// Self-attention of one layer: QKV and output projections with their biases, and
    /// QK-norm's two norms where the model has them.
    pub attention_per_layer: u64,
    /// The two norms of one layer (input and pre-MLP).
    pub norms_per_layer: u64,
    /// Dense MLP of one non-MoE layer.
    pub mlp_per_layer: u64,
    /// MoE router of one MoE layer (hidden × experts, no bias).
    pub router_per_moe_layer: u64,
    /// All routed experts of one MoE layer.
    pub experts_per_moe_layer: u64,
    /// Shared expert of one MoE layer.
    pub shared_expert_per_moe_layer: u64,
    pub dense_layers: u32,
    pub moe_layers: u32,
    /// Final norm before the output layer.
    pub final_norm: u64,
    /// Output layer: padded vocab × hidden, 0 when tied to the embedding.
    pub output_layer: u64,
    /// Parameters one token passes through (MoE: only top-k experts), embeddings excluded.
    pub active_non_embedding: u64,
}

impl ParameterCount {
    /// A dense layer: attention, norms and MLP.
    pub fn dense_layer(&self) -> u64 {
        self.attention_per_layer + self.norms_per_layer + self.mlp_per_layer
    }

    /// Parameters one token passes through, embeddings included (the input embedding's and
    /// positions' tables and the output layer count whole, as models publish "active" sizes).
    pub fn active(&self) -> u64 {
        self.active_non_embedding + self.embedding + self.position_embedding + self.output_layer
    }

    /// An MoE layer: attention, norms, router, experts and shared expert.
    pub fn moe_layer(&self) -> u64 {
        self.attention_per_layer
            + self.norms_per_layer
            + self.router_per_moe_layer
            + self.experts_per_moe_layer
            + self.shared_expert_per_moe_layer
    }
}

/// Parameters of one norm over `width` features.
pub(crate) fn norm_parameters(model: &Model, width: u64) -> u64 {
    match model.normalization {
        Normalization::Layernorm => 2 * width,
        Normalization::Rmsnorm => width,
    }
}

/// QK-norm's query and key norms of one layer (each over `kv_channels`, shared by the heads),
/// 0 without `qk_layernorm`. With multi-latent attention they are Megatron's latent norms: over
/// the query latent (when there is one) and the key/value latent.
pub(crate) fn qk_norm_parameters(model: &Model) -> u64 {
    if !model.qk_layernorm {
        return 0;
    }
    match &model.mla {
        Some(mla) => {
            mla.q_lora_rank
                .map_or(0, |rank| norm_parameters(model, u64::from(rank)))
                + norm_parameters(model, u64::from(mla.kv_lora_rank))
        }
        None => 2 * norm_parameters(model, u64::from(model.kv_channels())),
    }
}

/// Multi-latent attention's weights that every tensor rank holds whole (Megatron replicates the
/// down projections over tensor ranks): the query's and the key/value's down projections.
pub(crate) fn mla_replicated_parameters(model: &Model) -> u64 {
    let Some(mla) = &model.mla else { return 0 };
    let h = u64::from(model.hidden_size);
    mla.q_lora_rank.map_or(0, |rank| h * u64::from(rank))
        + h * u64::from(mla.kv_lora_rank + mla.qk_pos_emb_head_dim)
}

/// One layer's multi-latent attention without its norms: the down projections, the query's
/// up (or full-rank) projection, the key/value up projection and the output projection, all
/// without biases but the output's (`add_bias_linear`).
fn mla_projection_parameters(model: &Model, mla: &Mla) -> u64 {
    let h = u64::from(model.hidden_size);
    let heads = u64::from(model.num_attention_heads);
    let q_up = match mla.q_lora_rank {
        Some(rank) => u64::from(rank) * heads * u64::from(mla.q_head_dim()),
        None => h * heads * u64::from(mla.q_head_dim()),
    };
    let kv_up = u64::from(mla.kv_lora_rank) * heads * u64::from(mla.qk_head_dim + mla.v_head_dim);
    let output = heads * u64::from(mla.v_head_dim) * h;
    let output_bias = if model.add_bias_linear { h } else { 0 };
    mla_replicated_parameters(model) + q_up + kv_up + output + output_bias
}

/// Parameters of one MLP (fc1 and fc2, with biases when the model has them).
pub(crate) fn mlp_parameters(model: &Model, ffn: u64) -> u64 {
    let h = u64::from(model.hidden_size);
    let fc1_out = match model.activation {
        Activation::Gelu | Activation::GeluTanh => ffn,
        Activation::Swiglu => 2 * ffn,
    };
    let biases = if model.add_bias_linear {
        fc1_out + h
    } else {
        0
    };
    h * fc1_out + ffn * h + biases
}

/// Counts `model`'s parameters with the vocabulary padded to `padded_vocab_size`.
pub fn parameter_count(model: &Model, padded_vocab_size: u32) -> ParameterCount {
    let h = u64::from(model.hidden_size);
    let v = u64::from(padded_vocab_size);
    let heads = u64::from(model.num_attention_heads);
    let groups = u64::from(model.num_query_groups());
    let kv = u64::from(model.kv_channels());

    let qkv_out = (heads + 2 * groups) * kv;
    let proj_in = heads * kv;
    let qkv_bias = if model.qkv_bias() { qkv_out } else { 0 };
    let proj_bias = if model.add_bias_linear { h } else { 0 };
    let attention_per_layer = match &model.mla {
        Some(mla) => mla_projection_parameters(model, mla) + qk_norm_parameters(model),
        None => h * qkv_out + proj_in * h + qkv_bias + proj_bias + qk_norm_parameters(model),
    };
    let norms_per_layer = 2 * norm_parameters(model, h);
    let mlp_per_layer = mlp_parameters(model, u64::from(model.ffn_hidden_size()));

    let (router, experts, shared, topk) = match &model.moe {
        Some(moe) => {
            let expert = mlp_parameters(model, u64::from(moe.expert_ffn_hidden_size(model)));
            let shared = moe
                .shared_expert_ffn_hidden_size
                .map_or(0, |f| mlp_parameters(model, u64::from(f)));
            (
                h * u64::from(moe.num_experts),
                expert * u64::from(moe.num_experts),
                shared,
                (expert, u64::from(moe.router_topk)),
            )
        }
        None => (0, 0, 0, (0, 0)),
    };
    let moe_layers = model.num_moe_layers();
    let dense_layers = model.num_layers - moe_layers;

    let embedding = v * h;
    let position_embedding = match model.position_embedding {
        PositionEmbedding::Learned => u64::from(model.max_position_embeddings()) * h,
        PositionEmbedding::Rope | PositionEmbedding::None => 0,
    };
    let final_norm = norm_parameters(model, h);
    let output_layer = if model.tie_embeddings { 0 } else { v * h };

    let mut count = ParameterCount {
        total: 0,
        embedding,
        position_embedding,
        attention_per_layer,
        norms_per_layer,
        mlp_per_layer,
        router_per_moe_layer: router,
        experts_per_moe_layer: experts,
        shared_expert_per_moe_layer: shared,
        dense_layers,
        moe_layers,
        final_norm,
        output_layer,
        active_non_embedding: 0,
    };
    let layers =
        u64::from(dense_layers) * count.dense_layer() + u64::from(moe_layers) * count.moe_layer();
    count.total = embedding + position_embedding + layers + final_norm + output_layer;
    let (expert, topk) = topk;
    let active_moe_layer = attention_per_layer + norms_per_layer + router + expert * topk + shared;
    count.active_non_embedding = u64::from(dense_layers) * count.dense_layer()
        + u64::from(moe_layers) * active_moe_layer
        + final_norm;
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{gpt2_small, llama3_8b, mixtral_8x7b};

    #[test]
    fn gpt2_small_has_its_published_124m_parameters() {
        // GPT-2 small with the vocabulary padded 50257 -> 50304 (Megatron, tp 1):
        // embedding 50304·768 = 38,633,472; positions 1024·768 = 786,432;
        // per layer: qkv 768·2304 + 2304 = 1,771,776; proj 768·768 + 768 = 590,592;
        // norms 2·2·768 = 3,072; mlp 768·3072 + 3072 + 3072·768 + 768 = 4,722,432
        // => 7,087,872 per layer, ×12 = 85,054,464; final norm 1,536; output tied.
        let model = gpt2_small().model;
        let count = parameter_count(&model, 50304);
        assert_eq!(count.dense_layer(), 7_087_872);
        assert_eq!(count.total, 38_633_472 + 786_432 + 85_054_464 + 1_536);
        assert_eq!(count.total, 124_475_904);
    }

    #[test]
    fn llama3_8b_has_8_03b_parameters() {
        // hidden 4096, 32 heads × 128, 8 groups, ffn 14336, vocab 128256, untied, no biases.
        // attention: 4096·(32+16)·128 + 4096·4096 = 25,165,824 + 16,777,216 = 41,943,040
        // mlp: 4096·28672 + 14336·4096 = 176,160,768; norms 2·4096 = 8,192
        // layer 218,112,000 × 32 = 6,979,584,000; embeddings 2 × 128256·4096 = 1,050,673,152
        // final norm 4,096 => 8,030,261,248 (Meta's "8.03B").
        let model = llama3_8b().model;
        let count = parameter_count(&model, 128256);
        assert_eq!(count.dense_layer(), 218_112_000);
        assert_eq!(count.total, 8_030_261_248);
    }

    #[test]
    fn mixtral_has_46_7b_total_and_12_9b_active_parameters() {
        // expert: 4096·28672 + 14336·4096 = 176,160,768; ×8 = 1,409,286,144; router 4096·8 = 32,768
        // attention 41,943,040; norms 8,192 => layer 1,451,270,144 × 32 = 46,440,644,608
        // embeddings 2 × 32000·4096 = 262,144,000; final norm 4,096 => 46,702,792,704.
        let model = mixtral_8x7b().model;
        let count = parameter_count(&model, 32000);
        assert_eq!(count.moe_layers, 32);
        assert_eq!(count.total, 46_702_792_704);
        // active: (41,943,040 + 8,192 + 32,768 + 2·176,160,768) = 394,305,536 per layer,
        // × 32 + 4,096 = 12,617,781,248; plus the 262M embeddings: Mistral's "12.9B active".
        assert_eq!(count.active_non_embedding, 12_617_781_248);
        assert_eq!(count.active(), 12_617_781_248 + 262_144_000);
    }

    /// Multi-latent attention as Megatron allocates it (DeepSeek-V3's sizes): no biases, the
    /// latent norms under `qk_layernorm`.
    #[test]
    fn multi_latent_attention_has_megatrons_tensors() {
        let mut model = llama3_8b().model;
        model.hidden_size = 7168;
        model.num_attention_heads = 128;
        model.qk_layernorm = true;
        model.mla = Some(
            serde_json::from_value(serde_json::json!({"q_lora_rank": 1536, "kv_lora_rank": 512}))
                .expect("mla"),
        );
        // q: 7168·1536 + 1536 (q_layernorm) + 1536·128·192; kv: 7168·576 + 512 (kv_layernorm)
        // + 512·128·256; output 128·128·7168.
        let expected = 11_010_048 + 1_536 + 37_748_736 + 4_128_768 + 512 + 16_777_216 + 117_440_512;
        assert_eq!(
            parameter_count(&model, 128256).attention_per_layer,
            expected
        );
        assert_eq!(qk_norm_parameters(&model), 1_536 + 512);
        assert_eq!(mla_replicated_parameters(&model), 11_010_048 + 4_128_768);
        model.mla =
            Some(serde_json::from_value(serde_json::json!({"kv_lora_rank": 512})).expect("mla"));
        // Without a query latent: 7168·128·192 and no q_layernorm.
        let full_rank_q = 7168 * 128 * 192;
        assert_eq!(
            parameter_count(&model, 128256).attention_per_layer,
            full_rank_q + 4_128_768 + 512 + 16_777_216 + 117_440_512
        );
    }
}
