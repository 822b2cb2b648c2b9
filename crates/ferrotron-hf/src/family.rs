//! Which transformers class a model is, and what in a recipe's model section that class cannot
//! express. The classes are fixed functions: `GPT2LMHeadModel` has learned positions, LayerNorm,
//! GELU and biases; `LlamaForCausalLM` rotary positions, RMSNorm and SwiGLU, biases everywhere or
//! nowhere; `MistralForCausalLM` is LLaMA without biases and with a sliding window;
//! `Qwen2ForCausalLM` has biases on q, k and v only; `Qwen3ForCausalLM` per-head RMSNorms on q
//! and k; Mixtral adds softmax top-k routing without shared experts; `Qwen3MoeForCausalLM` is
//! Qwen3 with softmax top-k experts (normalised or not) on any set of layers;
//! `DeepseekV3ForCausalLM` has multi-latent attention, sigmoid routing with a selection bias,
//! group-limited top-k, one shared expert size and dense first layers. Every rotary class scales
//! RoPE the same way (transformers' `rope_parameters`). A model outside them would export
//! weights that transformers silently computes something else with, so every such feature is
//! refused, by the recipe key that turns it on, before anything is written (and reported at that
//! key's line when a recipe is imported into).

use ferrotron_recipe::{
    Activation, LoadBalancing, Model, Normalization, PositionEmbedding, ScoreFunction,
};

/// The epsilon of DeepSeek-V3's `q_a_layernorm` and `kv_a_layernorm` (`DeepseekV3RMSNorm`'s
/// default; transformers does not pass `rms_norm_eps` to them).
const DEEPSEEK_LATENT_NORM_EPSILON: f64 = 1e-6;

/// DeepSeek-V3 scores an expert group by the sum of its top two experts' scores (transformers'
/// `topk(2)`); Megatron-Core by its top `router_topk / group_topk`.
const DEEPSEEK_GROUP_SCORE_TOPK: u32 = 2;

/// A supported transformers class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Gpt2,
    Llama,
    Mixtral,
    Mistral,
    Qwen2,
    Qwen3,
    Qwen3Moe,
    DeepseekV3,
}

/// A feature of a model section that its class cannot express, at the key that sets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Dot path into the recipe, e.g. `model.moe.shared_expert_ffn_hidden_size`.
    pub path: String,
    pub reason: String,
}

impl Family {
    pub const ALL: [Family; 8] = [
        Family::Gpt2,
        Family::Llama,
        Family::Mixtral,
        Family::Mistral,
        Family::Qwen2,
        Family::Qwen3,
        Family::Qwen3Moe,
        Family::DeepseekV3,
    ];

    /// The class a model section maps to: multi-latent attention or DeepSeek's routing (sigmoid
    /// scores, a selection bias, groups, shared experts) to DeepSeek-V3; other MoE models to
    /// Qwen3-MoE when they have q/k norms, unnormalised top-k probabilities or dense layers,
    /// else to Mixtral; learned positions to GPT-2, q/k norms to Qwen3, q/k/v biases alone to
    /// Qwen2, a sliding window to Mistral, everything else to LLaMA (whose refusals then say
    /// what differs).
    pub fn of(model: &Model) -> Family {
        let moe = model.moe.as_ref();
        let deepseek_routing = moe.is_some_and(|m| {
            m.score_function == ScoreFunction::Sigmoid
                || m.expert_bias
                || m.num_groups.is_some()
                || m.shared_expert_ffn_hidden_size.is_some()
        });
        let qwen_moe = moe.is_some_and(|m| {
            model.qk_layernorm
                || (m.pre_softmax && m.router_topk > 1)
                || !model.moe_layers().iter().all(|&l| l)
        });
        if model.mla.is_some() || deepseek_routing {
            Family::DeepseekV3
        } else if qwen_moe {
            Family::Qwen3Moe
        } else if model.moe.is_some() {
            Family::Mixtral
        } else if model.position_embedding == PositionEmbedding::Learned {
            Family::Gpt2
        } else if model.qk_layernorm {
            Family::Qwen3
        } else if model.add_qkv_bias && !model.add_bias_linear {
            Family::Qwen2
        } else if model.window_size.is_some() {
            Family::Mistral
        } else {
            Family::Llama
        }
    }

    /// The `architectures` entry of `config.json`.
    pub fn class(self) -> &'static str {
        match self {
            Family::Gpt2 => "GPT2LMHeadModel",
            Family::Llama => "LlamaForCausalLM",
            Family::Mixtral => "MixtralForCausalLM",
            Family::Mistral => "MistralForCausalLM",
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
            Family::Qwen3Moe => "Qwen3MoeForCausalLM",
            Family::DeepseekV3 => "DeepseekV3ForCausalLM",
        }
    }

    /// The `model_type` of `config.json`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Gpt2 => "gpt2",
            Family::Llama => "llama",
            Family::Mixtral => "mixtral",
            Family::Mistral => "mistral",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Qwen3Moe => "qwen3_moe",
            Family::DeepseekV3 => "deepseek_v3",
        }
    }

    /// The class for a `model_type`.
    pub fn from_model_type(model_type: &str) -> Option<Family> {
        Family::ALL
            .into_iter()
            .find(|f| f.model_type() == model_type)
    }

    /// Whether the class can attend through a sliding window on every layer.
    pub fn has_sliding_window(self) -> bool {
        !matches!(self, Family::Gpt2 | Family::Llama | Family::DeepseekV3)
    }

    /// Whether the class routes tokens to experts.
    pub fn is_moe(self) -> bool {
        matches!(
            self,
            Family::Mixtral | Family::Qwen3Moe | Family::DeepseekV3
        )
    }

    /// Everything in `model` this class cannot express; empty when it is exactly expressible.
    pub fn refusals(self, model: &Model) -> Vec<Refusal> {
        let mut out = Vec::new();
        let class = self.class();
        let mut refuse = |path: &str, reason: String| {
            out.push(Refusal {
                path: path.to_owned(),
                reason,
            })
        };
        match self {
            Family::Gpt2 => {
                if model.normalization != Normalization::Layernorm {
                    refuse("model.normalization", format!("{class} uses LayerNorm"));
                }
                if !matches!(model.activation, Activation::Gelu | Activation::GeluTanh) {
                    refuse("model.activation", format!("{class} has a GELU MLP"));
                }
                if model.num_query_groups() != model.num_attention_heads {
                    refuse(
                        "model.num_query_groups",
                        format!("{class} has no grouped-query attention"),
                    );
                }
                if model.kv_channels() * model.num_attention_heads != model.hidden_size {
                    refuse(
                        "model.kv_channels",
                        format!("{class} derives the head size as hidden_size / heads"),
                    );
                }
                if model.rope_scaling.is_some() {
                    refuse(
                        "model.rope_scaling",
                        format!("{class} has learned positions, no rotary embeddings to scale"),
                    );
                }
            }
            _ => {
                if model.position_embedding != PositionEmbedding::Rope {
                    refuse(
                        "model.position_embedding",
                        format!("{class} always applies rotary position embeddings"),
                    );
                }
                if model.normalization != Normalization::Rmsnorm {
                    refuse("model.normalization", format!("{class} uses RMSNorm"));
                }
                if model.activation != Activation::Swiglu {
                    refuse("model.activation", format!("{class} has a SwiGLU MLP"));
                }
            }
        }
        match self {
            // GPT-2 exports the biases a model lacks as zeros: any of them are expressible
            Family::Gpt2 => {}
            Family::Llama => {
                if model.add_qkv_bias && !model.add_bias_linear {
                    refuse(
                        "model.add_qkv_bias",
                        format!(
                            "{class}'s attention_bias puts biases on o_proj too; a q/k/v bias \
                             alone is Qwen2ForCausalLM's"
                        ),
                    );
                }
            }
            Family::Qwen2 => {
                if model.add_bias_linear {
                    refuse(
                        "model.add_bias_linear",
                        format!("{class} has biases on q, k and v only"),
                    );
                } else if !model.add_qkv_bias {
                    refuse(
                        "model.add_qkv_bias",
                        format!("{class} always has biases on q, k and v"),
                    );
                }
            }
            Family::Mixtral
            | Family::Mistral
            | Family::Qwen3
            | Family::Qwen3Moe
            | Family::DeepseekV3 => {
                if model.add_bias_linear {
                    refuse(
                        "model.add_bias_linear",
                        format!("{class} has no biases in its linear layers"),
                    );
                } else if model.add_qkv_bias {
                    refuse(
                        "model.add_qkv_bias",
                        format!("{class} has no biases on q, k and v"),
                    );
                }
            }
        }
        let qk_norms = matches!(self, Family::Qwen3 | Family::Qwen3Moe | Family::DeepseekV3);
        if model.qk_layernorm != qk_norms {
            let reason = match self {
                Family::DeepseekV3 => {
                    format!("{class} always normalises the query and key/value latents")
                }
                _ if qk_norms => format!("{class} always normalises each query and key head"),
                _ => format!("{class} has no query/key norms (Qwen3ForCausalLM has)"),
            };
            refuse("model.qk_layernorm", reason);
        }
        if model.window_size.is_some() && !self.has_sliding_window() {
            refuse(
                "model.window_size",
                format!("{class} has no sliding-window attention"),
            );
        }
        match (self, &model.mla) {
            (Family::DeepseekV3, None) => refuse(
                "model.mla",
                format!("{class} always has multi-latent attention"),
            ),
            (Family::DeepseekV3, Some(_)) => {
                // q_a_layernorm and kv_a_layernorm are built with RMSNorm's default epsilon
                if model.norm_epsilon != DEEPSEEK_LATENT_NORM_EPSILON {
                    refuse(
                        "model.norm_epsilon",
                        format!(
                            "{class} normalises its latents with epsilon \
                             {DEEPSEEK_LATENT_NORM_EPSILON} whatever rms_norm_eps says; this \
                             model uses norm_epsilon for every norm"
                        ),
                    );
                }
            }
            (_, Some(_)) => refuse(
                "model.mla",
                format!("{class} has no multi-latent attention (DeepseekV3ForCausalLM has)"),
            ),
            (_, None) => {}
        }
        if self == Family::Qwen3Moe && model.moe.is_none() {
            refuse(
                "model.moe",
                format!("{class} routes to experts (a dense model is Qwen3ForCausalLM)"),
            );
        }
        if let Some(moe) = &model.moe {
            let mut unsupported = |key: &str, set: bool, reason: &str| {
                if set {
                    refuse(&format!("model.moe.{key}"), format!("{class} {reason}"));
                }
            };
            if !self.is_moe() {
                unsupported("num_experts", true, "has no experts");
                return out;
            }
            let deepseek = self == Family::DeepseekV3;
            let sigmoid = moe.score_function == ScoreFunction::Sigmoid;
            unsupported(
                "score_function",
                sigmoid != deepseek,
                if deepseek {
                    "routes with sigmoid scores"
                } else {
                    "routes with softmax scores (sigmoid routers are DeepSeek-V3's)"
                },
            );
            unsupported(
                "pre_softmax",
                self == Family::Mixtral && moe.pre_softmax && moe.router_topk > 1,
                "renormalises the top-k probabilities (softmax after top-k)",
            );
            unsupported(
                "expert_bias",
                moe.expert_bias != deepseek,
                if deepseek {
                    "always adds its selection bias e_score_correction_bias (a zero bias selects \
                     as none does)"
                } else {
                    "has no expert selection bias"
                },
            );
            let groups = moe.num_groups.is_some() || moe.group_topk.is_some();
            unsupported(
                "num_groups",
                groups && !deepseek,
                "has no group-limited routing",
            );
            if deepseek && moe.num_groups.unwrap_or(1) > 1 {
                let per_group = moe.router_topk / moe.group_topk.unwrap_or(1).max(1);
                unsupported(
                    "group_topk",
                    per_group != DEEPSEEK_GROUP_SCORE_TOPK,
                    &format!(
                        "scores each expert group by the sum of its top \
                         {DEEPSEEK_GROUP_SCORE_TOPK} experts; this model by its top \
                         router_topk / group_topk = {per_group}"
                    ),
                );
            }
            unsupported(
                "capacity_factor",
                moe.capacity_factor.is_some(),
                "routes dropless (no expert capacity)",
            );
            unsupported(
                "load_balancing",
                moe.load_balancing == LoadBalancing::Sinkhorn,
                "weights experts by its router scores, not Sinkhorn",
            );
            let layers = model.moe_layers();
            let dense_first = layers.iter().skip_while(|&&l| !l).all(|&l| l);
            unsupported(
                "layer_freq",
                match self {
                    Family::Mixtral => !layers.iter().all(|&l| l),
                    Family::DeepseekV3 => !dense_first,
                    _ => false,
                },
                if deepseek {
                    "has its dense layers first (first_k_dense_replace), then MoE layers only"
                } else {
                    "has an MoE feed-forward in every layer"
                },
            );
            unsupported(
                "router_topk_scaling_factor",
                !deepseek && moe.topk_scaling_factor() != 1.0,
                "does not scale its routed experts' weights (DeepSeek-V3's routed_scaling_factor)",
            );
            let expert_ffn = moe.expert_ffn_hidden_size(model);
            match moe.shared_expert_ffn_hidden_size {
                Some(_) if !deepseek => unsupported(
                    "shared_expert_ffn_hidden_size",
                    true,
                    "has no shared experts",
                ),
                Some(shared) => unsupported(
                    "shared_expert_ffn_hidden_size",
                    !shared.is_multiple_of(expert_ffn),
                    &format!(
                        "has n_shared_experts shared experts of moe_intermediate_size \
                         ({expert_ffn}) each, and {shared} is no multiple of it"
                    ),
                ),
                None => unsupported(
                    "shared_expert_ffn_hidden_size",
                    deepseek,
                    "always has shared experts",
                ),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn model(extra: serde_json::Value) -> Model {
        let mut base = json!({
            "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 16,
            "position_embedding": "rope", "normalization": "rmsnorm", "activation": "swiglu",
            "add_bias_linear": false
        });
        for (k, v) in extra.as_object().expect("an object") {
            base[k] = v.clone();
        }
        serde_json::from_value(base).expect("a model section")
    }

    fn paths(model: &Model) -> Vec<String> {
        Family::of(model)
            .refusals(model)
            .into_iter()
            .map(|r| r.path)
            .collect()
    }

    /// DeepSeek's routing maps to DeepSeek-V3, which then names everything of this model it
    /// cannot compute: biases, no latent attention or norms, groups scored by their top 1
    /// (router_topk / group_topk) where DeepSeek-V3 takes the top 2, a dense layer after an MoE
    /// one, a shared expert that is no whole number of experts.
    #[test]
    fn deepseek_style_moe_is_refused_feature_by_feature() {
        let deepseek = model(json!({"moe": {
            "num_experts": 8, "router_topk": 2, "score_function": "sigmoid", "expert_bias": true,
            "num_groups": 4, "group_topk": 2, "layer_freq": 2, "shared_expert_ffn_hidden_size": 64
        }, "add_bias_linear": true}));
        assert_eq!(Family::of(&deepseek), Family::DeepseekV3);
        assert_eq!(
            paths(&deepseek),
            [
                "model.add_bias_linear",
                "model.qk_layernorm",
                "model.mla",
                "model.moe.group_topk",
                "model.moe.layer_freq",
                "model.moe.shared_expert_ffn_hidden_size",
            ]
        );
        let mixtral = model(json!({"moe": {"num_experts": 8, "router_topk": 2}}));
        assert!(paths(&mixtral).is_empty());
    }

    /// DeepSeek-V3 and Qwen3-MoE as their classes compute them: no refusal; each feature of
    /// one class is refused by the other at its key.
    #[test]
    fn todays_moe_families_are_told_apart_by_their_features() {
        let deepseek = model(json!({
            "num_layers": 4, "qk_layernorm": true, "norm_epsilon": 1e-6,
            "mla": {"q_lora_rank": 24, "kv_lora_rank": 16, "qk_head_dim": 8,
                    "qk_pos_emb_head_dim": 4, "v_head_dim": 8},
            "moe": {"num_experts": 8, "router_topk": 4, "ffn_hidden_size": 16,
                    "score_function": "sigmoid", "expert_bias": true, "num_groups": 4,
                    "group_topk": 2, "shared_expert_ffn_hidden_size": 32,
                    "router_topk_scaling_factor": 2.5, "layer_freq": [0, 0, 1, 1]}
        }));
        assert_eq!(Family::of(&deepseek), Family::DeepseekV3);
        assert!(paths(&deepseek).is_empty(), "{:?}", paths(&deepseek));
        let qwen = model(json!({
            "qk_layernorm": true, "kv_channels": 16,
            "moe": {"num_experts": 8, "router_topk": 2, "pre_softmax": true,
                    "layer_freq": [0, 1]}
        }));
        assert_eq!(Family::of(&qwen), Family::Qwen3Moe);
        assert!(paths(&qwen).is_empty(), "{:?}", paths(&qwen));
        assert_eq!(
            Family::Qwen3Moe
                .refusals(&deepseek)
                .into_iter()
                .map(|r| r.path)
                .collect::<Vec<_>>(),
            [
                "model.mla",
                "model.moe.score_function",
                "model.moe.expert_bias",
                "model.moe.num_groups",
                "model.moe.router_topk_scaling_factor",
                "model.moe.shared_expert_ffn_hidden_size",
            ]
        );
        let loose = model(json!({
            "num_layers": 2, "qk_layernorm": true, "norm_epsilon": 1e-5,
            "mla": {"kv_lora_rank": 16, "qk_head_dim": 8, "qk_pos_emb_head_dim": 4,
                    "v_head_dim": 8},
            "moe": {"num_experts": 8, "router_topk": 2, "score_function": "sigmoid",
                    "expert_bias": false, "layer_freq": [1, 0]}
        }));
        assert_eq!(
            paths(&loose),
            [
                "model.norm_epsilon",
                "model.moe.expert_bias",
                "model.moe.layer_freq",
                "model.moe.shared_expert_ffn_hidden_size",
            ]
        );
        // a dense Mixtral-like model with softmax before top-k is Qwen3-MoE's norm_topk_prob
        // false, which then asks for its q/k norms
        let unnormalised = model(json!({"moe": {"num_experts": 4, "pre_softmax": true}}));
        assert_eq!(Family::of(&unnormalised), Family::Qwen3Moe);
        assert_eq!(paths(&unnormalised), ["model.qk_layernorm"]);
    }

    #[test]
    fn mixed_families_name_what_differs() {
        let learned_rms = model(json!({"position_embedding": "learned"}));
        assert_eq!(Family::of(&learned_rms), Family::Gpt2);
        assert_eq!(
            paths(&learned_rms),
            ["model.normalization", "model.activation"]
        );
        let gqa_gpt = model(json!({
            "position_embedding": "learned", "normalization": "layernorm", "activation": "gelu",
            "num_query_groups": 2
        }));
        assert_eq!(paths(&gqa_gpt), ["model.num_query_groups"]);
        let nope = model(json!({"position_embedding": "none"}));
        assert_eq!(paths(&nope), ["model.position_embedding"]);
        // LLaMA has attention_bias and mlp_bias: biases are expressible there
        assert!(paths(&model(json!({"add_bias_linear": true}))).is_empty());
    }

    #[test]
    fn todays_dense_families_are_told_apart_by_their_features() {
        let cases = [
            (
                json!({"rope_scaling": {"type": "llama3", "factor": 8.0}}),
                Family::Llama,
            ),
            (json!({"add_qkv_bias": true}), Family::Qwen2),
            (
                json!({"add_qkv_bias": true, "window_size": [7, 0]}),
                Family::Qwen2,
            ),
            (
                json!({"qk_layernorm": true, "kv_channels": 16}),
                Family::Qwen3,
            ),
            (
                json!({"qk_layernorm": true, "window_size": [7, 0]}),
                Family::Qwen3,
            ),
            (json!({"window_size": [4095, 0]}), Family::Mistral),
        ];
        for (extra, family) in cases {
            let m = model(extra.clone());
            assert_eq!(Family::of(&m), family, "{extra}");
            assert_eq!(paths(&m), Vec::<String>::new(), "{extra}");
            assert_eq!(Family::from_model_type(family.model_type()), Some(family));
        }
    }

    /// Each class refuses, at its key, what it has no weights or switch for, whichever class
    /// the model section would map to (a recipe checked against another class's config.json).
    #[test]
    fn each_class_refuses_the_features_it_lacks() {
        let refused = |family: Family, extra: serde_json::Value| -> Vec<String> {
            family
                .refusals(&model(extra))
                .into_iter()
                .map(|r| r.path)
                .collect()
        };
        let window = json!({"window_size": [7, 0]});
        assert_eq!(
            refused(Family::Llama, window.clone()),
            ["model.window_size"]
        );
        assert!(refused(Family::Mistral, window.clone()).is_empty());
        assert_eq!(
            refused(Family::Qwen2, window.clone()),
            ["model.add_qkv_bias"]
        );
        assert_eq!(
            refused(Family::Qwen3, json!({"add_qkv_bias": true})),
            ["model.add_qkv_bias", "model.qk_layernorm"]
        );
        assert_eq!(
            refused(
                Family::Qwen2,
                json!({"add_bias_linear": true, "qk_layernorm": true})
            ),
            ["model.add_bias_linear", "model.qk_layernorm"]
        );
        assert_eq!(
            refused(Family::Llama, json!({"add_qkv_bias": true})),
            ["model.add_qkv_bias"]
        );
        assert_eq!(
            refused(Family::Mistral, json!({"add_bias_linear": true})),
            ["model.add_bias_linear"]
        );
        let gpt2 = json!({"position_embedding": "learned", "normalization": "layernorm",
                          "activation": "gelu", "add_bias_linear": false, "add_qkv_bias": true,
                          "qk_layernorm": true, "window_size": [7, 0]});
        // q/k/v biases alone export with zero biases elsewhere
        assert_eq!(
            refused(Family::Gpt2, gpt2),
            ["model.qk_layernorm", "model.window_size"]
        );
    }
}
