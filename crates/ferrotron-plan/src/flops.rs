//! Model FLOPs per iteration, the numerator of MFU.
//!
//! This is Megatron-LM's `num_floating_point_operations` (megatron/training/training.py,
//! `transformer_flops`, as of commit 001b00c2): model FLOPs, not hardware FLOPs, so activation
//! recomputation is not counted, and core attention is halved for the causal mask (newer
//! Megatron; older releases counted the full s² term). Keeping the exact formula lets users
//! compare our MFU with Megatron's logs number for number.
//!
//! Multi-latent attention is counted by the function's `multi_latent_attention` branch: the
//! low-rank projections with one FMA per latent channel for each latent norm (its `+ 1`), the
//! shared rotary key projection, and a core attention of `n·(d_qk + d_rope)/2` (QKᵀ) plus
//! `n·d_v/2` (PV) per key. MoE layers come from `layer_freq` in any form (Megatron's
//! `moe_layer_pattern`), each with its top-k routed experts and its shared expert; the dense
//! layers (DeepSeek-V3's first three) have the model's `ffn_hidden_size`.
//!
//! The same function counts neither a sliding window (`--window-size`: the core-attention term
//! stays `s/2` per query, as if every earlier key were seen), nor QK-norm, nor the QKV bias,
//! nor RoPE scaling: Megatron's MFU of a Mistral or Qwen3 run is computed that way, so ours is.

use ferrotron_recipe::{Activation, Mla, Model, Recipe};

/// Per-token FLOPs of one forward+backward pass (× 3 for fwd, wgrad, dgrad; × 2 per FMA),
/// split the way the time model needs them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenFlops {
    /// Attention projections (QKV and output) of all layers.
    pub attention_projections: f64,
    /// Core attention (QKᵀ and PV), causal-halved, of all layers.
    pub core_attention: f64,
    /// Dense MLPs, routed experts (top-k) and shared experts of all layers.
    pub mlp: f64,
    /// The output layer (logits).
    pub logits: f64,
}

impl TokenFlops {
    pub fn total(&self) -> f64 {
        self.attention_projections + self.core_attention + self.mlp + self.logits
    }
}

/// Multiplier for forward, backward-wgrad and backward-dgrad GEMMs.
const FORWARD_BACKWARD: f64 = 3.0;
/// A multiply-add is two floating-point operations.
const FMA: f64 = 2.0;

/// GEMM stack factor of an MLP: h→ffn and ffn→h (GELU), h→2·ffn and ffn→h (SwiGLU).
fn ffn_expansion(model: &Model) -> f64 {
    match model.activation {
        Activation::Gelu | Activation::GeluTanh => 2.0,
        Activation::Swiglu => 3.0,
    }
}

/// Core attention per layer per token at sequence length `seq`: q_size · s/2 (causal) · 2
/// (QKᵀ and PV), times the fwd/bwd and FMA factors. With MLA, QKᵀ over the query head dim and
/// PV over the value head dim: (n·d_q/2 + n·d_v/2) · s.
pub(crate) fn core_attention_per_layer_token(model: &Model, seq: f64) -> f64 {
    let heads = f64::from(model.num_attention_heads);
    if let Some(mla) = &model.mla {
        let qk = heads * f64::from(mla.q_head_dim());
        let v = heads * f64::from(mla.v_head_dim);
        return FORWARD_BACKWARD * FMA * (qk / 2.0 + v / 2.0) * seq;
    }
    let q = f64::from(model.kv_channels()) * heads;
    FORWARD_BACKWARD * FMA * q * seq / 2.0 * 2.0
}

/// The share of the causal score triangle a sliding window leaves (1 without one): each query
/// `i` of a sequence of `s` sees `min(i + 1, left + 1)` keys instead of `i + 1`. Megatron's
/// FLOPs ignore it (see the module docs); the time model scales core attention by it, because
/// a windowed kernel skips the hidden blocks.
pub(crate) fn window_share(model: &Model) -> f64 {
    let s = f64::from(model.seq_length);
    let Some([left, _]) = model.window_size else {
        return 1.0;
    };
    let w = f64::from(left) + 1.0;
    if w >= s {
        return 1.0;
    }
    let seen = w * (w + 1.0) / 2.0 + (s - w) * w;
    seen / (s * (s + 1.0) / 2.0)
}

/// Attention projections per layer per token: h·(q + k + v) + q·h, or MLA's (see
/// [`mla_projections_per_layer_token`]).
pub(crate) fn attention_projections_per_layer_token(model: &Model) -> f64 {
    if let Some(mla) = &model.mla {
        return mla_projections_per_layer_token(model, mla);
    }
    let h = f64::from(model.hidden_size);
    let kv = f64::from(model.kv_channels());
    let q = kv * f64::from(model.num_attention_heads);
    let k = kv * f64::from(model.num_query_groups());
    FORWARD_BACKWARD * FMA * (h * (q + 2.0 * k) + q * h)
}

/// Megatron's MLA `standard_self_attn_term`: the query's down and up projections (or its
/// full-rank one) with the latent norm's `+ 1`, the key/value down projection's latent part,
/// up projection and norm, the shared rotary key's projection, and the output projection.
fn mla_projections_per_layer_token(model: &Model, mla: &Mla) -> f64 {
    let h = f64::from(model.hidden_size);
    let heads = f64::from(model.num_attention_heads);
    let q_head = f64::from(mla.q_head_dim());
    let q_term = match mla.q_lora_rank {
        None => h * heads * q_head,
        Some(rank) => f64::from(rank) * (h + heads * q_head + 1.0),
    };
    let kv_term = f64::from(mla.kv_lora_rank)
        * (h + heads * f64::from(mla.qk_head_dim + mla.v_head_dim) + 1.0)
        + h * f64::from(mla.qk_pos_emb_head_dim);
    let output = heads * f64::from(mla.v_head_dim) * h;
    FORWARD_BACKWARD * FMA * (q_term + kv_term + output)
}

/// Dense MLP per layer per token.
pub(crate) fn dense_mlp_per_layer_token(model: &Model) -> f64 {
    FORWARD_BACKWARD
        * FMA
        * f64::from(model.hidden_size)
        * f64::from(model.ffn_hidden_size())
        * ffn_expansion(model)
}

/// MoE MLP per MoE layer per token: top-k routed experts plus the shared expert.
pub(crate) fn moe_mlp_per_layer_token(model: &Model) -> f64 {
    let Some(moe) = &model.moe else { return 0.0 };
    let shared = f64::from(moe.shared_expert_ffn_hidden_size.unwrap_or(0));
    routed_experts_per_layer_token(model)
        + FORWARD_BACKWARD * FMA * f64::from(model.hidden_size) * shared * ffn_expansion(model)
}

/// The top-k routed experts' part of [`moe_mlp_per_layer_token`]: the grouped GEMMs.
pub(crate) fn routed_experts_per_layer_token(model: &Model) -> f64 {
    let Some(moe) = &model.moe else { return 0.0 };
    let routed = f64::from(moe.expert_ffn_hidden_size(model)) * f64::from(moe.router_topk);
    FORWARD_BACKWARD * FMA * f64::from(model.hidden_size) * routed * ffn_expansion(model)
}

/// Logits per token: h × padded vocab.
pub(crate) fn logits_per_token(model: &Model, padded_vocab_size: u32) -> f64 {
    FORWARD_BACKWARD * FMA * f64::from(model.hidden_size) * f64::from(padded_vocab_size)
}

/// Per-token model FLOPs of the whole model, by kind.
pub fn token_flops(model: &Model, padded_vocab_size: u32) -> TokenFlops {
    let layers = f64::from(model.num_layers);
    let moe_layers = f64::from(model.num_moe_layers());
    let dense_layers = layers - moe_layers;
    TokenFlops {
        attention_projections: layers * attention_projections_per_layer_token(model),
        core_attention: layers * core_attention_per_layer_token(model, f64::from(model.seq_length)),
        mlp: dense_layers * dense_mlp_per_layer_token(model)
            + moe_layers * moe_mlp_per_layer_token(model),
        logits: logits_per_token(model, padded_vocab_size),
    }
}

/// Megatron's `num_floating_point_operations(args, global_batch_size)`.
pub fn flops_per_iteration(recipe: &Recipe, padded_vocab_size: u32, global_batch_size: u32) -> f64 {
    let model = &recipe.model;
    let tokens = f64::from(global_batch_size) * f64::from(model.seq_length);
    tokens * token_flops(model, padded_vocab_size).total()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{gpt3_175b, llama3_8b, mixtral_8x7b};

    fn close(actual: f64, expected: f64) {
        assert!(
            ((actual - expected) / expected).abs() < 1e-12,
            "actual {actual:e}, expected {expected:e}"
        );
    }

    #[test]
    fn gpt3_175b_matches_megatron() {
        // Megatron, per token: 6·[h(q+k+v) + q·s + q·h] per layer attention
        //   = 6·(12288·36864 + 12288·2048 + 12288·12288) = 6·(452,984,832 + 25,165,824 + 150,994,944)
        //   = 6·629,145,600 = 3,774,873,600
        // MLP (GELU, ffn 49152): 6·12288·49152·2 = 7,247,757,312
        // per layer 11,022,630,912 × 96 = 1,058,172,567,552
        // logits: 6·12288·51200 = 3,774,873,600 (vocab 50257 padded to 51200)
        // per token 1,061,947,441,152; × 1536·2048 tokens = 3,340,828,938,345,086,976 (3.34e18).
        let recipe = gpt3_175b();
        let per_token = token_flops(&recipe.model, 51200).total();
        close(per_token, 1_061_947_441_152.0);
        close(
            flops_per_iteration(&recipe, 51200, 1536),
            1_061_947_441_152.0 * 1536.0 * 2048.0,
        );
    }

    #[test]
    fn llama3_8b_matches_megatron_with_gqa_and_swiglu() {
        // q = 4096, k = v = 1024, s = 8192:
        // attention 6·(4096·6144 + 4096·8192 + 4096·4096) = 6·75,497,472 = 452,984,832
        // MLP (SwiGLU ×3): 6·4096·14336·3 = 1,056,964,608
        // per layer 1,509,949,440 × 32 = 48,318,382,080
        // logits 6·4096·128256 = 3,152,019,456 => per token 51,470,401,536
        let recipe = llama3_8b();
        close(token_flops(&recipe.model, 128256).total(), 51_470_401_536.0);
        close(
            flops_per_iteration(&recipe, 128256, 128),
            51_470_401_536.0 * 128.0 * 8192.0,
        );
    }

    #[test]
    fn mixtral_counts_top_k_experts() {
        // attention (q 4096, k=v 1024, s 4096): 6·(4096·6144 + 4096·4096 + 4096·4096)
        //   = 6·58,720,256 = 352,321,536
        // MoE MLP, top-2 SwiGLU experts: 6·4096·(14336·2)·3 = 2,113,929,216
        // per layer 2,466,250,752 × 32 = 78,920,024,064; logits 6·4096·32000 = 786,432,000
        // per token 79,706,456,064
        let recipe = mixtral_8x7b();
        close(token_flops(&recipe.model, 32000).total(), 79_706_456_064.0);
    }

    #[test]
    fn shared_experts_and_layer_frequency_are_counted() {
        let mut recipe = mixtral_8x7b();
        let moe = recipe.model.moe.as_mut().expect("moe");
        moe.layer_freq = ferrotron_recipe::LayerFreq::Every(2);
        moe.shared_expert_ffn_hidden_size = Some(1024);
        // 16 MoE layers: 6·4096·(14336·2 + 1024)·3 = 2,189,426,688 each;
        // 16 dense layers: 6·4096·14336·3 = 1,056,964,608 each.
        let flops = token_flops(&recipe.model, 32000);
        close(flops.mlp, 16.0 * 2_189_426_688.0 + 16.0 * 1_056_964_608.0);
    }

    /// Megatron's `multi_latent_attention` branch without a query latent (DeepSeek-V2-Lite's
    /// shape: one dense layer by the list form of layer_freq, then 64 experts, top-6, two shared
    /// experts of 1408). Megatron-LM's own function gives 16,386,180,096 per token:
    /// attention 6·(2048·16·192 + 512·(2048 + 16·256 + 1) + 2048·64 + 16·128·2048)
    /// = 82,578,432
    /// and core 6·(16·192/2 + 16·128/2)·4096 = 62,914,560 per layer, × 27;
    /// MLPs 6·2048·10944·3 + 26 · 6·2048·(1408·6 + 2816)·3 = 11,199,578,112;
    /// logits 6·2048·102400 = 1,258,291,200.
    #[test]
    fn multi_latent_attention_without_a_query_latent_matches_megatron() {
        let recipe = crate::testing::recipe(
            serde_json::json!({"num_layers": 27, "hidden_size": 2048, "ffn_hidden_size": 10944,
                "num_attention_heads": 16, "vocab_size": 102400, "seq_length": 4096,
                "position_embedding": "rope", "normalization": "rmsnorm", "activation": "swiglu",
                "tie_embeddings": false, "add_bias_linear": false, "qk_layernorm": true,
                "mla": {"kv_lora_rank": 512, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64,
                        "v_head_dim": 128},
                "moe": {"num_experts": 64, "router_topk": 6, "ffn_hidden_size": 1408,
                        "shared_expert_ffn_hidden_size": 2816,
                        "layer_freq": [0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                       1, 1, 1, 1, 1, 1, 1, 1]}}),
            serde_json::json!({}),
            serde_json::json!({"micro_batch_size": 1, "global_batch_size": 1, "train_iters": 1}),
        );
        let flops = token_flops(&recipe.model, 102400);
        close(flops.attention_projections, 27.0 * 82_578_432.0);
        close(flops.core_attention, 27.0 * 62_914_560.0);
        close(flops.mlp, 11_199_578_112.0);
        close(flops.total(), 16_386_180_096.0);
    }

    /// Megatron's formula has no term for a window, QK-norm, the QKV bias or scaled RoPE.
    #[test]
    fn window_qk_norm_qkv_bias_and_rope_scaling_add_no_flops() {
        let plain = llama3_8b();
        let mut variant = plain.clone();
        variant.model.window_size = Some([4095, 0]);
        variant.model.qk_layernorm = true;
        variant.model.add_qkv_bias = true;
        variant.model.rope_scaling = Some(
            serde_json::from_value(serde_json::json!({"type": "llama3", "factor": 8.0}))
                .expect("rope_scaling"),
        );
        assert_eq!(
            flops_per_iteration(&variant, 128_256, 128),
            flops_per_iteration(&plain, 128_256, 128)
        );
    }

    #[test]
    fn a_window_keeps_its_share_of_the_causal_triangle() {
        let mut recipe = llama3_8b();
        assert_eq!(window_share(&recipe.model), 1.0);
        recipe.model.seq_length = 4;
        recipe.model.window_size = Some([1, 0]);
        // queries see 1, 2, 2, 2 keys of the causal 1, 2, 3, 4
        close(window_share(&recipe.model), 7.0 / 10.0);
        recipe.model.window_size = Some([3, 0]);
        assert_eq!(window_share(&recipe.model), 1.0);
    }
}
