//! `config.json` both ways. Writing spells our model section in the class's keys; reading fills
//! every key the file leaves out with the class's documented default (transformers'
//! `GPT2Config`, `LlamaConfig`, `MixtralConfig`), then expresses the result as a recipe model
//! section, so one comparison ([`crate::check`]) covers a recipe against any config.json.

use std::path::Path;

use ferrotron_recipe::{Activation, Finding, Model};
use serde_json::{Value, json};

use crate::HfError;
use crate::family::Family;
use crate::names::Dims;
use crate::sink::OutDtype;

pub const CONFIG_FILE: &str = "config.json";

/// `config.json` of the exported model.
pub(crate) fn write_config(model: &Model, dims: &Dims, dtype: OutDtype, eod: Option<u32>) -> Value {
    let family = dims.family;
    let mut config = match family {
        Family::Gpt2 => json!({
            "n_layer": dims.layers, "n_embd": dims.hidden, "n_head": dims.heads,
            "n_inner": dims.ffn, "n_positions": dims.positions,
            "activation_function": match model.activation {
                Activation::GeluTanh => "gelu_new",
                _ => "gelu",
            },
            "layer_norm_epsilon": model.norm_epsilon,
            "resid_pdrop": model.hidden_dropout, "embd_pdrop": model.hidden_dropout,
            "attn_pdrop": model.attention_dropout,
            "scale_attn_weights": true, "scale_attn_by_inverse_layer_idx": false,
            "reorder_and_upcast_attn": false,
        }),
        Family::Llama | Family::Mixtral => json!({
            "num_hidden_layers": dims.layers, "hidden_size": dims.hidden,
            "intermediate_size": dims.ffn, "num_attention_heads": dims.heads,
            "num_key_value_heads": dims.groups, "head_dim": dims.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": model.max_position_embeddings().max(model.seq_length),
            "rms_norm_eps": model.norm_epsilon, "rope_theta": model.rotary_base,
            "rope_scaling": null, "attention_dropout": model.attention_dropout,
        }),
    };
    let extra = match family {
        Family::Gpt2 => json!({}),
        Family::Llama => json!({"attention_bias": dims.bias, "mlp_bias": dims.bias}),
        Family::Mixtral => {
            let moe = model.moe.as_ref();
            json!({
                "num_local_experts": dims.experts,
                "num_experts_per_tok": moe.map_or(2, |m| m.router_topk),
                "router_aux_loss_coef": moe.map_or(0.0, |m| m.aux_loss_coeff),
                "output_router_logits": false, "router_jitter_noise": 0.0,
                "sliding_window": null,
            })
        }
    };
    let common = json!({
        "architectures": [family.class()], "model_type": family.model_type(),
        "vocab_size": dims.vocab, "tie_word_embeddings": dims.tied,
        "initializer_range": model.init_method_std, "torch_dtype": dtype.torch_name(),
        "use_cache": true, "bos_token_id": eod, "eos_token_id": eod,
    });
    for part in [extra, common] {
        if let (Value::Object(config), Value::Object(part)) = (&mut config, part) {
            config.extend(part);
        }
    }
    config
}

/// A transformers model's configuration as a recipe model section.
#[derive(Debug, Clone)]
pub struct HfConfig {
    pub family: Family,
    pub model: Model,
    /// The vocabulary (embedding rows).
    pub vocab: u32,
    /// Mixtral's sliding attention window, if the file sets one.
    pub sliding_window: Option<u32>,
    /// Settings of the file no recipe can express, at the recipe key they concern.
    pub problems: Vec<Finding>,
}

impl HfConfig {
    pub fn read(dir: &Path) -> Result<HfConfig, HfError> {
        let path = dir.join(CONFIG_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| HfError::io("read", &path, e))?;
        let json: Value = serde_json::from_str(&text)
            .map_err(|e| HfError::config(&path, format!("invalid JSON: {e}")))?;
        let model_type = json["model_type"].as_str().unwrap_or_default();
        let family = Family::from_model_type(model_type).ok_or_else(|| {
            HfError::config(
                &path,
                format!(
                    "model_type `{model_type}` is not one of gpt2 (GPT2LMHeadModel), llama \
                     (LlamaForCausalLM), mixtral (MixtralForCausalLM)"
                ),
            )
        })?;
        let get = Getter {
            json: &json,
            path: &path,
        };
        let (section, problems) = match family {
            Family::Gpt2 => gpt2(&get)?,
            Family::Llama | Family::Mixtral => llama(&get, family)?,
        };
        let model: Model = serde_json::from_value(section)
            .map_err(|e| HfError::config(&path, format!("not a model this build reads: {e}")))?;
        Ok(HfConfig {
            family,
            vocab: model.vocab_size.unwrap_or_default(),
            sliding_window: json["sliding_window"]
                .as_u64()
                .and_then(|w| u32::try_from(w).ok()),
            model,
            problems,
        })
    }
}

struct Getter<'a> {
    json: &'a Value,
    path: &'a Path,
}

impl Getter<'_> {
    /// The value at `key`, or `default` when absent or null.
    fn or(&self, key: &str, default: Value) -> Value {
        match self.json.get(key) {
            None | Some(Value::Null) => default,
            Some(value) => value.clone(),
        }
    }

    fn u64(&self, key: &str, default: u64) -> Result<u64, HfError> {
        self.or(key, json!(default))
            .as_u64()
            .ok_or_else(|| HfError::config(self.path, format!("{key} is not a whole number")))
    }
}

fn gpt2(get: &Getter<'_>) -> Result<(Value, Vec<Finding>), HfError> {
    let hidden = get.u64("n_embd", 768)?;
    let positions = get.u64("n_positions", 1024)?;
    let mut problems = Vec::new();
    let activation = get.or("activation_function", json!("gelu_new"));
    let ours = match activation.as_str() {
        Some("gelu") => "gelu",
        Some("gelu_new" | "gelu_pytorch_tanh") => "gelu_tanh",
        _ => {
            problems.push(Finding::error(
                "hf::inexpressible",
                "model.activation",
                format!("config.json's activation_function {activation} is not GELU"),
            ));
            "gelu"
        }
    };
    for (key, expressible) in [
        ("scale_attn_weights", true),
        ("scale_attn_by_inverse_layer_idx", false),
        ("add_cross_attention", false),
    ] {
        if get.or(key, json!(expressible)) != json!(expressible) {
            problems.push(Finding::error(
                "hf::inexpressible",
                "model",
                format!("config.json sets {key}, which this model does not compute"),
            ));
        }
    }
    let section = json!({
        "num_layers": get.u64("n_layer", 12)?, "hidden_size": hidden,
        "ffn_hidden_size": get.u64("n_inner", 4 * hidden)?,
        "num_attention_heads": get.u64("n_head", 12)?,
        "vocab_size": get.u64("vocab_size", 50257)?,
        "seq_length": positions, "max_position_embeddings": positions,
        "position_embedding": "learned", "normalization": "layernorm", "activation": ours,
        "norm_epsilon": get.or("layer_norm_epsilon", json!(1e-5)),
        "tie_embeddings": get.or("tie_word_embeddings", json!(true)),
        "add_bias_linear": true,
        "hidden_dropout": get.or("resid_pdrop", json!(0.1)),
        "attention_dropout": get.or("attn_pdrop", json!(0.1)),
        "init_method_std": get.or("initializer_range", json!(0.02)),
    });
    Ok((section, problems))
}

fn llama(get: &Getter<'_>, family: Family) -> Result<(Value, Vec<Finding>), HfError> {
    let mixtral = family == Family::Mixtral;
    let hidden = get.u64("hidden_size", 4096)?;
    let heads = get.u64("num_attention_heads", 32)?;
    let ffn = get.u64("intermediate_size", if mixtral { 14336 } else { 11008 })?;
    let positions = get.u64(
        "max_position_embeddings",
        if mixtral { 131072 } else { 2048 },
    )?;
    let mut problems = Vec::new();
    let mut refuse = |path: &str, message: String| {
        problems.push(Finding::error("hf::inexpressible", path, message));
    };
    let activation = get.or("hidden_act", json!("silu"));
    if activation != json!("silu") {
        refuse(
            "model.activation",
            format!("config.json's hidden_act {activation} is not SiLU (SwiGLU)"),
        );
    }
    let scaling = get.or("rope_scaling", Value::Null);
    let rope_type = get.or("rope_parameters", json!({}))["rope_type"].clone();
    if !scaling.is_null() || !(rope_type.is_null() || rope_type == json!("default")) {
        refuse(
            "model.rotary_base",
            "config.json scales RoPE (rope_scaling / rope_parameters); this model's rotary \
             embeddings are unscaled"
                .to_owned(),
        );
    }
    // transformers 5 moved rope_theta into rope_parameters
    let theta = get.or(
        "rope_theta",
        get.or("rope_parameters", json!({}))
            .get("rope_theta")
            .cloned()
            .unwrap_or(json!(if mixtral { 1.0e6 } else { 1.0e4 })),
    );
    let bias = get.or("attention_bias", json!(false));
    if !mixtral && get.or("mlp_bias", json!(false)) != bias {
        refuse(
            "model.add_bias_linear",
            "config.json's attention_bias and mlp_bias differ; add_bias_linear sets both"
                .to_owned(),
        );
    }
    // a window at least as long as the sequence never masks anything
    let window = get.or("sliding_window", Value::Null).as_u64();
    let mut section = json!({
        "num_layers": get.u64("num_hidden_layers", 32)?, "hidden_size": hidden,
        "ffn_hidden_size": ffn, "num_attention_heads": heads,
        "num_query_groups": get.u64("num_key_value_heads", if mixtral { 8 } else { heads })?,
        "kv_channels": get.u64("head_dim", hidden / heads.max(1))?,
        "vocab_size": get.u64("vocab_size", 32000)?,
        "seq_length": window.map_or(positions, |w| w.min(positions)),
        "max_position_embeddings": positions, "position_embedding": "rope", "rotary_base": theta,
        "normalization": "rmsnorm", "activation": "swiglu",
        "norm_epsilon": get.or("rms_norm_eps", json!(if mixtral { 1e-5 } else { 1e-6 })),
        "tie_embeddings": get.or("tie_word_embeddings", json!(false)),
        "add_bias_linear": bias,
        "hidden_dropout": 0.0,
        "attention_dropout": get.or("attention_dropout", json!(0.0)),
        "init_method_std": get.or("initializer_range", json!(0.02)),
    });
    if mixtral {
        section["moe"] = json!({
            "num_experts": get.u64("num_local_experts", 8)?,
            "router_topk": get.u64("num_experts_per_tok", 2)?,
            "aux_loss_coeff": get.or("router_aux_loss_coef", json!(0.001)),
            "ffn_hidden_size": ffn,
        });
    }
    Ok((section, problems))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(json: Value) -> Model {
        serde_json::from_value(json).expect("a model section")
    }

    /// What we write reads back as the same model, for each family.
    #[test]
    fn written_configs_read_back_as_the_same_model() {
        let gpt2 = json!({"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
                          "seq_length": 16, "vocab_size": 41, "norm_epsilon": 1e-5});
        let llama = json!({"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
                           "num_query_groups": 2, "kv_channels": 16, "ffn_hidden_size": 48,
                           "seq_length": 64, "max_position_embeddings": 32, "vocab_size": 41,
                           "position_embedding": "rope", "rotary_base": 5e5,
                           "normalization": "rmsnorm", "activation": "swiglu",
                           "tie_embeddings": false, "add_bias_linear": true});
        let mut mixtral = llama.clone();
        mixtral["add_bias_linear"] = json!(false);
        mixtral["moe"] = json!({"num_experts": 4, "router_topk": 2, "ffn_hidden_size": 24});
        for section in [gpt2, llama, mixtral] {
            let ours = model(section);
            let dims = Dims::of(&ours, 41, 128);
            let dir = tempfile::tempdir().expect("tempdir");
            let written = write_config(&ours, &dims, OutDtype::Bf16, Some(0));
            std::fs::write(dir.path().join(CONFIG_FILE), written.to_string()).expect("write");
            let read = HfConfig::read(dir.path()).expect("reads");
            assert_eq!(read.family, dims.family);
            assert_eq!(crate::check::check(&ours, 41, &read), vec![], "{written}");
            assert_eq!(written["torch_dtype"], "bfloat16");
        }
    }

    #[test]
    fn unreadable_classes_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(CONFIG_FILE), r#"{"model_type": "bert"}"#).expect("write");
        let err = HfConfig::read(dir.path()).expect_err("not a causal LM we read");
        assert!(
            err.to_string().contains("model_type `bert` is not one of"),
            "{err}"
        );
    }

    #[test]
    fn scaled_rope_and_mismatched_biases_cannot_be_expressed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = json!({"model_type": "llama", "rope_scaling": {"rope_type": "llama3"},
                            "attention_bias": true, "mlp_bias": false, "hidden_act": "gelu"});
        std::fs::write(dir.path().join(CONFIG_FILE), config.to_string()).expect("write");
        let read = HfConfig::read(dir.path()).expect("reads");
        let paths: Vec<&str> = read.problems.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "model.activation",
                "model.rotary_base",
                "model.add_bias_linear"
            ]
        );
    }
}
