//! Which transformers class a model is, and what in a recipe's model section that class cannot
//! express. The classes are fixed functions: `GPT2LMHeadModel` has learned positions, LayerNorm,
//! GELU and biases; `LlamaForCausalLM` rotary positions, RMSNorm and SwiGLU; Mixtral adds
//! softmax top-k routing without shared experts. A model outside them would export weights that
//! transformers silently computes something else with, so every such feature is refused, by the
//! recipe key that turns it on, before anything is written (and reported at that key's line when
//! a recipe is imported into).

use ferrotron_recipe::{
    Activation, LoadBalancing, Model, Normalization, PositionEmbedding, ScoreFunction,
};

/// A supported transformers class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Gpt2,
    Llama,
    Mixtral,
}

/// A feature of a model section that its class cannot express, at the key that sets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Dot path into the recipe, e.g. `model.moe.shared_expert_ffn_hidden_size`.
    pub path: String,
    pub reason: String,
}

impl Family {
    /// The class a model section maps to: MoE models to Mixtral, learned positions to GPT-2,
    /// everything else to LLaMA (whose refusals then say what differs).
    pub fn of(model: &Model) -> Family {
        if model.moe.is_some() {
            Family::Mixtral
        } else if model.position_embedding == PositionEmbedding::Learned {
            Family::Gpt2
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
        }
    }

    /// The `model_type` of `config.json`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Gpt2 => "gpt2",
            Family::Llama => "llama",
            Family::Mixtral => "mixtral",
        }
    }

    /// The class for a `model_type`.
    pub fn from_model_type(model_type: &str) -> Option<Family> {
        [Family::Gpt2, Family::Llama, Family::Mixtral]
            .into_iter()
            .find(|f| f.model_type() == model_type)
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
            }
            Family::Llama | Family::Mixtral => {
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
        if self == Family::Mixtral && model.add_bias_linear {
            refuse(
                "model.add_bias_linear",
                format!("{class} has no biases in its linear layers"),
            );
        }
        if let Some(moe) = &model.moe {
            let mut unsupported = |key: &str, set: bool, reason: &str| {
                if set {
                    refuse(&format!("model.moe.{key}"), format!("{class} {reason}"));
                }
            };
            unsupported(
                "score_function",
                moe.score_function != ScoreFunction::Softmax,
                "routes with softmax scores (sigmoid routers are DeepSeek's)",
            );
            unsupported(
                "pre_softmax",
                moe.pre_softmax && moe.router_topk > 1,
                "renormalises the top-k probabilities (softmax after top-k)",
            );
            unsupported(
                "expert_bias",
                moe.expert_bias,
                "has no expert selection bias",
            );
            unsupported(
                "num_groups",
                moe.num_groups.is_some() || moe.group_topk.is_some(),
                "has no group-limited routing",
            );
            unsupported(
                "capacity_factor",
                moe.capacity_factor.is_some(),
                "routes dropless (no expert capacity)",
            );
            unsupported(
                "load_balancing",
                moe.load_balancing == LoadBalancing::Sinkhorn,
                "weights experts by softmax, not Sinkhorn",
            );
            unsupported(
                "layer_freq",
                moe.layer_freq != 1,
                "has an MoE feed-forward in every layer",
            );
            unsupported(
                "shared_expert_ffn_hidden_size",
                moe.shared_expert_ffn_hidden_size.is_some(),
                "has no shared experts",
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(extra: serde_json::Value) -> Model {
        let mut base = serde_json::json!({
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

    #[test]
    fn deepseek_style_moe_is_refused_feature_by_feature() {
        let deepseek = model(serde_json::json!({"moe": {
            "num_experts": 8, "router_topk": 2, "score_function": "sigmoid", "expert_bias": true,
            "num_groups": 4, "group_topk": 2, "layer_freq": 2, "shared_expert_ffn_hidden_size": 64
        }, "add_bias_linear": true}));
        assert_eq!(Family::of(&deepseek), Family::Mixtral);
        assert_eq!(
            paths(&deepseek),
            [
                "model.add_bias_linear",
                "model.moe.score_function",
                "model.moe.expert_bias",
                "model.moe.num_groups",
                "model.moe.layer_freq",
                "model.moe.shared_expert_ffn_hidden_size",
            ]
        );
        let mixtral = model(serde_json::json!({"moe": {"num_experts": 8, "router_topk": 2}}));
        assert!(paths(&mixtral).is_empty());
    }

    #[test]
    fn mixed_families_name_what_differs() {
        let learned_rms = model(serde_json::json!({"position_embedding": "learned"}));
        assert_eq!(Family::of(&learned_rms), Family::Gpt2);
        assert_eq!(
            paths(&learned_rms),
            ["model.normalization", "model.activation"]
        );
        let gqa_gpt = model(serde_json::json!({
            "position_embedding": "learned", "normalization": "layernorm", "activation": "gelu",
            "num_query_groups": 2
        }));
        assert_eq!(paths(&gqa_gpt), ["model.num_query_groups"]);
        let nope = model(serde_json::json!({"position_embedding": "none"}));
        assert_eq!(paths(&nope), ["model.position_embedding"]);
        // LLaMA has attention_bias and mlp_bias: biases are expressible there
        assert!(paths(&model(serde_json::json!({"add_bias_linear": true}))).is_empty());
    }
}
