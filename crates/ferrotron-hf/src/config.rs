//! `config.json` both ways. Writing spells our model section in the class's keys; reading fills
//! every key the file leaves out with the class's documented default (transformers'
//! `GPT2Config`, `LlamaConfig`, `MixtralConfig`, `MistralConfig`, `Qwen2Config`,
//! `Qwen3Config`, `Qwen3MoeConfig`, `DeepseekV3Config`), then expresses the result as a recipe
//! model section, so one comparison ([`crate::check`]) covers a recipe against any config.json.
//!
//! MoE layers: Qwen3-MoE's are those not in `mlp_only_layers` whose `layer + 1` is a multiple of
//! `decoder_sparse_step`, DeepSeek-V3's those from `first_k_dense_replace` on; both are Megatron's
//! `layer_freq` list (its number where one says the same). DeepSeek-V3's multi-token prediction
//! layers (`num_nextn_predict_layers`, stored as layers past `num_hidden_layers`) are not part of
//! this model: import skips them, export writes none.
//!
//! Sliding windows: Mistral and Mixtral apply `sliding_window` to every layer when it is set;
//! Qwen2 and Qwen3 only when `use_sliding_window` is, and then to the layers `layer_types` (or,
//! without it, layers from `max_window_layers` on) name. A recipe's `window_size` is every
//! layer's, so a window on some layers only is refused, and written as `max_window_layers: 0`.

use std::path::Path;

use ferrotron_recipe::{Activation, Finding, LoadBalancing, Model};
use serde_json::{Value, json};

use crate::HfError;
use crate::family::Family;
use crate::names::{Dims, MlaDims};
use crate::rope_config;
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
        _ => {
            let mut config = json!({
                "num_hidden_layers": dims.layers, "hidden_size": dims.hidden,
                "intermediate_size": dims.ffn, "num_attention_heads": dims.heads,
                "num_key_value_heads": dims.groups, "head_dim": dims.head_dim,
                "hidden_act": "silu",
                "max_position_embeddings": model.max_position_embeddings().max(model.seq_length),
                "rms_norm_eps": model.norm_epsilon, "attention_dropout": model.attention_dropout,
            });
            for (key, value) in rope_config::write(model) {
                config[key] = value;
            }
            config
        }
    };
    // transformers' sliding_window: W keys, the query's own included
    let window = model.window_size.map(|[left, _]| left + 1);
    let extra = match family {
        Family::Gpt2 => json!({}),
        Family::Llama => json!({"attention_bias": dims.bias, "mlp_bias": dims.bias}),
        Family::Mistral => json!({"sliding_window": window}),
        Family::Qwen2 | Family::Qwen3 => {
            let kind = if window.is_some() {
                "sliding_attention"
            } else {
                "full_attention"
            };
            let mut qwen = json!({
                "use_sliding_window": window.is_some(), "sliding_window": window,
                "max_window_layers": if window.is_some() { 0 } else { dims.layers },
                "layer_types": vec![kind; dims.layers],
            });
            if family == Family::Qwen3 {
                qwen["attention_bias"] = json!(false);
            }
            qwen
        }
        Family::Qwen3Moe => {
            let moe = model.moe.as_ref();
            json!({
                "attention_bias": false,
                "use_sliding_window": window.is_some(), "sliding_window": window,
                "moe_intermediate_size": dims.expert_ffn,
                "num_experts": dims.experts,
                "num_experts_per_tok": moe.map_or(1, |m| m.router_topk),
                "norm_topk_prob": !moe.is_some_and(|m| m.pre_softmax),
                "decoder_sparse_step": 1,
                "mlp_only_layers": dense_layers(dims),
                "router_aux_loss_coef": moe.map_or(0.0, |m| m.aux_loss_coeff),
                "output_router_logits": false,
            })
        }
        Family::DeepseekV3 => deepseek_v3(model, dims),
        Family::Mixtral => {
            let moe = model.moe.as_ref();
            json!({
                "intermediate_size": dims.expert_ffn,
                "num_local_experts": dims.experts,
                "num_experts_per_tok": moe.map_or(2, |m| m.router_topk),
                "router_aux_loss_coef": moe.map_or(0.0, |m| m.aux_loss_coeff),
                "output_router_logits": false, "router_jitter_noise": 0.0,
                "sliding_window": window,
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

/// The layers without experts.
fn dense_layers(dims: &Dims) -> Vec<usize> {
    (0..dims.layers).filter(|&l| !dims.moe_layers[l]).collect()
}

/// DeepSeek-V3's own keys: multi-latent attention, routing, dense first layers; no MTP layers.
fn deepseek_v3(model: &Model, dims: &Dims) -> Value {
    let mla = dims.mla.unwrap_or(MlaDims {
        q_lora_rank: None,
        kv_lora_rank: 0,
        qk_head_dim: 0,
        qk_pos_emb_head_dim: 0,
        v_head_dim: 0,
        rope_interleave: true,
    });
    let moe = model.moe.as_ref();
    let topk = moe.map_or(1, |m| m.router_topk);
    let dense_first = dims.moe_layers.iter().take_while(|&&l| !l).count();
    let (experts, expert_ffn) = match moe {
        Some(_) => (dims.experts, dims.expert_ffn),
        // a dense model: every layer is one of the first dense ones
        None => (1, dims.ffn),
    };
    json!({
        "num_key_value_heads": dims.heads, "head_dim": mla.qk_pos_emb_head_dim,
        "attention_bias": false,
        "q_lora_rank": mla.q_lora_rank, "kv_lora_rank": mla.kv_lora_rank,
        "qk_nope_head_dim": mla.qk_head_dim, "qk_rope_head_dim": mla.qk_pos_emb_head_dim,
        "v_head_dim": mla.v_head_dim, "rope_interleave": true,
        "moe_intermediate_size": expert_ffn,
        "n_routed_experts": experts,
        "num_experts_per_tok": topk,
        "n_shared_experts": dims.shared_ffn.map_or(0, |s| s / expert_ffn.max(1)),
        "routed_scaling_factor": moe.map_or(1.0, |m| m.topk_scaling_factor()),
        "n_group": moe.and_then(|m| m.num_groups).unwrap_or(1),
        "topk_group": moe.and_then(|m| m.group_topk).unwrap_or(1),
        "topk_method": "noaux_tc", "scoring_func": "sigmoid",
        "norm_topk_prob": topk > 1,
        "first_k_dense_replace": dense_first, "moe_layer_freq": 1,
        "aux_loss_alpha": moe.map_or(0.0, |m| m.aux_loss_coeff),
        "seq_aux": moe.is_some_and(|m| m.load_balancing == LoadBalancing::SeqAuxLoss),
        "num_nextn_predict_layers": 0,
    })
}

/// A transformers model's configuration as a recipe model section.
#[derive(Debug, Clone)]
pub struct HfConfig {
    pub family: Family,
    pub model: Model,
    /// The vocabulary (embedding rows).
    pub vocab: u32,
    /// Settings of the file no recipe can express, at the recipe key they concern.
    pub problems: Vec<Finding>,
    /// DeepSeek-V3's multi-token prediction layers (`num_nextn_predict_layers`), which import
    /// skips.
    pub mtp_layers: u64,
    /// DeepSeek-V3's `rope_interleave`: whether the rotary channels are stored as pairs.
    pub rope_interleave: bool,
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
                    "model_type `{model_type}` is not one of {}",
                    Family::ALL
                        .map(|f| format!("{} ({})", f.model_type(), f.class()))
                        .join(", ")
                ),
            )
        })?;
        let get = Getter {
            json: &json,
            path: &path,
        };
        let (section, mut problems) = match family {
            Family::Gpt2 => gpt2(&get)?,
            Family::DeepseekV3 => deepseek_v3_section(&get)?,
            _ => llama(&get, family)?,
        };
        if let Some(method) = json.get("quantization_config").filter(|q| !q.is_null()) {
            problems.push(Finding::error(
                "hf::inexpressible",
                "model",
                format!(
                    "config.json's quantization_config ({}) stores quantized weights with their \
                     scales; import reads full-precision weights (dequantize them first, e.g. \
                     DeepSeek-V3's fp8_cast_bf16.py)",
                    method["quant_method"].as_str().unwrap_or("quantized")
                ),
            ));
        }
        let model: Model = serde_json::from_value(section)
            .map_err(|e| HfError::config(&path, format!("not a model this build reads: {e}")))?;
        let deepseek = family == Family::DeepseekV3;
        Ok(HfConfig {
            family,
            vocab: model.vocab_size.unwrap_or_default(),
            model,
            problems,
            mtp_layers: if deepseek {
                get.u64("num_nextn_predict_layers", 1)?
            } else {
                0
            },
            rope_interleave: get.or("rope_interleave", json!(true)) == json!(true),
        })
    }

    /// The mapping's sizes of this model (its real vocabulary unpadded).
    pub fn dims(&self) -> Dims {
        let vocab = self.vocab as usize;
        let mut dims = Dims::of(&self.model, vocab, vocab);
        if let Some(mla) = &mut dims.mla {
            mla.rope_interleave = self.rope_interleave;
        }
        dims
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

/// transformers' defaults of the rotary classes, where they differ.
struct Defaults {
    ffn: u64,
    positions: u64,
    /// `None`: as many as attention heads.
    groups: Option<u64>,
    /// `None`: hidden_size / heads.
    head_dim: Option<u64>,
    vocab: u64,
    eps: f64,
    theta: f64,
    /// `sliding_window` when the file leaves it out (Mistral's, and Qwen's where
    /// `use_sliding_window` is on); a file says `null` for none.
    window: Option<u64>,
}

impl Defaults {
    fn of(family: Family) -> Defaults {
        let llama = Defaults {
            ffn: 11008,
            positions: 2048,
            groups: None,
            head_dim: None,
            vocab: 32000,
            eps: 1e-6,
            theta: 1e4,
            window: None,
        };
        let qwen = Defaults {
            ffn: 22016,
            positions: 32768,
            groups: Some(32),
            vocab: 151936,
            window: Some(4096),
            ..llama
        };
        match family {
            Family::Mixtral => Defaults {
                ffn: 14336,
                positions: 131072,
                groups: Some(8),
                eps: 1e-5,
                theta: 1e6,
                ..llama
            },
            Family::Mistral => Defaults {
                ffn: 14336,
                positions: 131072,
                groups: Some(8),
                window: Some(4096),
                ..llama
            },
            Family::Qwen2 => qwen,
            Family::Qwen3 => Defaults {
                head_dim: Some(128),
                ..qwen
            },
            Family::Qwen3Moe => Defaults {
                ffn: 6144,
                groups: Some(4),
                ..qwen
            },
            Family::DeepseekV3 => Defaults {
                ffn: 18432,
                positions: 4096,
                vocab: 129280,
                window: None,
                ..llama
            },
            Family::Gpt2 | Family::Llama => llama,
        }
    }
}

fn llama(get: &Getter<'_>, family: Family) -> Result<(Value, Vec<Finding>), HfError> {
    let defaults = Defaults::of(family);
    let hidden = get.u64("hidden_size", 4096)?;
    let heads = get.u64("num_attention_heads", 32)?;
    let layers = get.u64("num_hidden_layers", 32)?;
    let positions = get.u64("max_position_embeddings", defaults.positions)?;
    let rope = rope_config::read(get.json, defaults.theta, positions);
    let mut problems = rope.problems;
    let window = window(get, family, layers, &mut problems)?;
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
    let attention_bias = get.or("attention_bias", json!(false));
    let bias = match family {
        Family::Llama => {
            if get.or("mlp_bias", json!(false)) != attention_bias {
                refuse(
                    "model.add_bias_linear",
                    "config.json's attention_bias and mlp_bias differ; add_bias_linear sets both"
                        .to_owned(),
                );
            }
            attention_bias
        }
        Family::Qwen3 | Family::Qwen3Moe => {
            if attention_bias != json!(false) {
                refuse(
                    "model.add_bias_linear",
                    "config.json's attention_bias puts biases on q, k, v and o_proj and none in \
                     the MLP; add_bias_linear sets all of them, add_qkv_bias q, k and v only"
                        .to_owned(),
                );
            }
            json!(false)
        }
        Family::DeepseekV3 => {
            if attention_bias != json!(false) {
                refuse(
                    "model.add_bias_linear",
                    "config.json's attention_bias puts biases on q_a_proj, kv_a_proj_with_mqa and \
                     o_proj only; add_bias_linear puts them on every linear layer"
                        .to_owned(),
                );
            }
            json!(false)
        }
        _ => json!(false),
    };
    let mut section = json!({
        "num_layers": layers, "hidden_size": hidden,
        "ffn_hidden_size": get.u64("intermediate_size", defaults.ffn)?,
        "num_attention_heads": heads,
        "num_query_groups": get.u64("num_key_value_heads", defaults.groups.unwrap_or(heads))?,
        "kv_channels": get.u64("head_dim", defaults.head_dim.unwrap_or(hidden / heads.max(1)))?,
        "vocab_size": get.u64("vocab_size", defaults.vocab)?,
        "seq_length": positions, "max_position_embeddings": positions,
        "position_embedding": "rope", "rotary_base": rope.theta,
        "normalization": "rmsnorm", "activation": "swiglu",
        "norm_epsilon": get.or("rms_norm_eps", json!(defaults.eps)),
        "tie_embeddings": get.or("tie_word_embeddings", json!(false)),
        "add_bias_linear": bias,
        "hidden_dropout": 0.0,
        "attention_dropout": get.or("attention_dropout", json!(0.0)),
        "init_method_std": get.or("initializer_range", json!(0.02)),
    });
    if let Some(scaling) = rope.scaling {
        section["rope_scaling"] = json!(scaling);
    }
    if let Some(w) = window {
        section["window_size"] = json!([w.saturating_sub(1), 0]);
    }
    match family {
        Family::Qwen2 => section["add_qkv_bias"] = json!(true),
        Family::Qwen3 => section["qk_layernorm"] = json!(true),
        Family::Qwen3Moe => {
            section["qk_layernorm"] = json!(true);
            let layers = layers as usize;
            let step = get.u64("decoder_sparse_step", 1)?.max(1) as usize;
            let dense: Vec<u64> = serde_json::from_value(get.or("mlp_only_layers", json!([])))
                .map_err(|_| {
                    HfError::config(get.path, "mlp_only_layers is not a list of layers")
                })?;
            let moe_layers: Vec<bool> = (0..layers)
                .map(|l| !dense.contains(&(l as u64)) && (l + 1).is_multiple_of(step))
                .collect();
            let experts = match get.json.get("num_experts") {
                Some(Value::Number(_)) => get.u64("num_experts", 128)?,
                _ => get.u64("num_local_experts", 128)?,
            };
            section["moe"] = json!({
                "num_experts": experts,
                "router_topk": get.u64("num_experts_per_tok", 8)?,
                "pre_softmax": get.or("norm_topk_prob", json!(false)) != json!(true),
                "aux_loss_coeff": get.or("router_aux_loss_coef", json!(0.001)),
                "ffn_hidden_size": get.u64("moe_intermediate_size", 768)?,
                "layer_freq": layer_freq(&moe_layers),
            });
        }
        Family::Mixtral => {
            let ffn = section["ffn_hidden_size"].clone();
            section["moe"] = json!({
                "num_experts": get.u64("num_local_experts", 8)?,
                "router_topk": get.u64("num_experts_per_tok", 2)?,
                "aux_loss_coeff": get.or("router_aux_loss_coef", json!(0.001)),
                "ffn_hidden_size": ffn,
            });
        }
        _ => {}
    }
    Ok((section, problems))
}

/// Megatron's `layer_freq` for which layers are MoE layers: its number where one gives them
/// (layer `i` is MoE when `i % n == 0`), else the list of 0/1.
fn layer_freq(moe_layers: &[bool]) -> Value {
    let every = (1..=moe_layers.len().max(1)).find(|&n| {
        moe_layers
            .iter()
            .enumerate()
            .all(|(i, &moe)| moe == i.is_multiple_of(n))
    });
    match every {
        Some(n) => json!(n),
        None => json!(moe_layers.iter().map(|&m| u32::from(m)).collect::<Vec<_>>()),
    }
}

/// `DeepseekV3Config` as a model section: the rotary families' keys, then multi-latent
/// attention's sizes and DeepSeek's routing, and what of them Megatron computes otherwise.
fn deepseek_v3_section(get: &Getter<'_>) -> Result<(Value, Vec<Finding>), HfError> {
    let (mut section, mut problems) = llama(get, Family::DeepseekV3)?;
    let mut refuse = |path: &str, message: String| {
        problems.push(Finding::error("hf::inexpressible", path, message));
    };
    if let Some(object) = section.as_object_mut() {
        // every head has its own keys and values, and the head sizes are MLA's
        object.remove("num_query_groups");
        object.remove("kv_channels");
    }
    section["qk_layernorm"] = json!(true);
    let mut mla = json!({
        "kv_lora_rank": get.u64("kv_lora_rank", 512)?,
        "qk_head_dim": get.u64("qk_nope_head_dim", 128)?,
        "qk_pos_emb_head_dim": get.u64("qk_rope_head_dim", 64)?,
        "v_head_dim": get.u64("v_head_dim", 128)?,
    });
    match get.json.get("q_lora_rank") {
        Some(Value::Null) => {}
        _ => mla["q_lora_rank"] = json!(get.u64("q_lora_rank", 1536)?),
    }
    section["mla"] = mla;
    let layers = get.u64("num_hidden_layers", 61)?;
    let dense_first = get.u64("first_k_dense_replace", 3)?.min(layers);
    let topk = get.u64("num_experts_per_tok", 8)?;
    let groups = get.u64("n_group", 8)?;
    let group_topk = get.u64("topk_group", 4)?;
    for (key, expected) in [("topk_method", "noaux_tc"), ("scoring_func", "sigmoid")] {
        let given = get.or(key, json!(expected));
        if given != json!(expected) {
            refuse(
                "model.moe.score_function",
                format!(
                    "config.json's {key} {given} is not DeepSeek-V3's {expected:?}, the only \
                     routing DeepseekV3ForCausalLM computes"
                ),
            );
        }
    }
    if get.or("norm_topk_prob", json!(true)) != json!(topk > 1) {
        refuse(
            "model.moe.router_topk",
            format!(
                "config.json's norm_topk_prob {} with {topk} experts a token: Megatron's \
                 sigmoid router normalises the top-k scores exactly when router_topk > 1",
                get.or("norm_topk_prob", json!(true))
            ),
        );
    }
    if groups > 1 && topk / group_topk.max(1) != 2 {
        refuse(
            "model.moe.group_topk",
            format!(
                "config.json's groups are scored by their top 2 experts; Megatron's by \
                 num_experts_per_tok / topk_group = {}",
                topk / group_topk.max(1)
            ),
        );
    }
    let expert_ffn = get.u64("moe_intermediate_size", 2048)?;
    let shared = get.u64("n_shared_experts", 1)?;
    if shared == 0 && dense_first < layers {
        refuse(
            "model.moe.shared_expert_ffn_hidden_size",
            "config.json's n_shared_experts 0 builds shared experts of no channels; this model's \
             MoE layers have a shared expert or none"
                .to_owned(),
        );
    }
    let all_dim = get.json["rope_parameters"]["mscale_all_dim"]
        .as_f64()
        .or_else(|| get.json["rope_scaling"]["mscale_all_dim"].as_f64());
    let read_all_dim = section["rope_scaling"]["mscale_all_dim"].as_f64();
    if let (Some(given), Some(read)) = (all_dim, read_all_dim)
        && given != read
    {
        refuse(
            "model.rope_scaling.mscale_all_dim",
            format!(
                "config.json's YaRN mscale_all_dim {given} scales DeepSeek-V3's softmax, while \
                 its cos/sin factor needs mscale_all_dim {read}; one value cannot give both"
            ),
        );
    }
    if get.or("rms_norm_eps", json!(1e-6)).as_f64() != Some(1e-6) {
        refuse(
            "model.norm_epsilon",
            "config.json's rms_norm_eps is not 1e-6, the epsilon DeepseekV3ForCausalLM \
             normalises its latents with; this model uses one epsilon for every norm"
                .to_owned(),
        );
    }
    if dense_first < layers {
        let mut moe = json!({
            "num_experts": get.u64("n_routed_experts", 256)?,
            "router_topk": topk,
            "score_function": "sigmoid",
            "expert_bias": true,
            "ffn_hidden_size": expert_ffn,
            "layer_freq": layer_freq(&(0..layers).map(|l| l >= dense_first).collect::<Vec<_>>()),
        });
        if groups > 1 {
            moe["num_groups"] = json!(groups);
            moe["group_topk"] = json!(group_topk);
        }
        if shared > 0 {
            moe["shared_expert_ffn_hidden_size"] = json!(shared * expert_ffn);
        }
        let scaling = get.or("routed_scaling_factor", json!(2.5));
        if scaling.as_f64() != Some(1.0) {
            moe["router_topk_scaling_factor"] = scaling;
        }
        if get.or("seq_aux", json!(true)) == json!(true) {
            moe["load_balancing"] = json!("seq_aux_loss");
        }
        moe["aux_loss_coeff"] = get.or("aux_loss_alpha", json!(0.001));
        section["moe"] = moe;
    }
    Ok((section, problems))
}

/// The sliding window (transformers' `sliding_window`: keys a query sees, itself included) every
/// layer attends through; a window on some layers only is a problem at `model.window_size`.
fn window(
    get: &Getter<'_>,
    family: Family,
    layers: u64,
    problems: &mut Vec<Finding>,
) -> Result<Option<u64>, HfError> {
    let defaults = Defaults::of(family);
    // null is no window; only a missing key takes the class's default
    let size = |default: Option<u64>| -> Result<Option<u64>, HfError> {
        match get.json.get("sliding_window") {
            None => Ok(default),
            Some(Value::Null) => Ok(None),
            Some(w) => w.as_u64().map(Some).ok_or_else(|| {
                HfError::config(get.path, "sliding_window is not a whole number or null")
            }),
        }
    };
    match family {
        Family::Gpt2 | Family::Llama | Family::DeepseekV3 => Ok(None),
        Family::Mistral | Family::Mixtral => size(defaults.window),
        // `Qwen3MoeConfig` keeps sliding_window only with use_sliding_window, for every layer
        Family::Qwen3Moe => {
            if get.or("use_sliding_window", json!(false)) == json!(true) {
                size(defaults.window)
            } else {
                Ok(None)
            }
        }
        Family::Qwen2 | Family::Qwen3 => {
            if get.or("use_sliding_window", json!(false)) != json!(true) {
                return Ok(None);
            }
            let Some(w) = size(defaults.window)? else {
                return Ok(None);
            };
            let sliding: Vec<bool> = match get.json["layer_types"].as_array() {
                Some(kinds) => kinds.iter().map(|k| k == "sliding_attention").collect(),
                None => {
                    let first = get.u64("max_window_layers", 28)?;
                    (0..layers).map(|layer| layer >= first).collect()
                }
            };
            if sliding.iter().all(|&s| s) {
                return Ok(Some(w));
            }
            if sliding.iter().any(|&s| s) {
                let on: Vec<String> = (0..sliding.len())
                    .filter(|&l| sliding[l])
                    .map(|l| l.to_string())
                    .collect();
                problems.push(Finding::error(
                    "hf::inexpressible",
                    "model.window_size",
                    format!(
                        "config.json's use_sliding_window with layer_types / max_window_layers \
                         puts its sliding window of {w} on layers {} of {} only; window_size \
                         applies to every layer",
                        on.join(", "),
                        sliding.len()
                    ),
                ));
            }
            Ok(None)
        }
    }
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
        let with = |extra: Value| {
            let mut section = llama.clone();
            section["add_bias_linear"] = json!(false);
            for (k, v) in extra.as_object().expect("an object") {
                section[k] = v.clone();
            }
            section
        };
        let mixtral = with(json!({"window_size": [31, 0],
                                  "moe": {"num_experts": 4, "router_topk": 2,
                                          "ffn_hidden_size": 24}}));
        let llama3 = with(json!({"rope_scaling": {"type": "llama3", "factor": 8.0,
                                                  "original_max_position_embeddings": 16}}));
        let linear = with(json!({"rope_scaling": {"type": "linear", "factor": 2.0}}));
        let yarn = json!({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                          "mscale": 0.7, "beta_fast": 16.0});
        let qwen2 = with(json!({"add_qkv_bias": true, "rope_scaling": yarn}));
        let qwen2_sliding = with(json!({"add_qkv_bias": true, "window_size": [7, 0]}));
        let qwen3 = with(json!({"qk_layernorm": true, "window_size": [7, 0],
                                "rope_scaling": {"type": "yarn", "factor": 2.0,
                                                 "mscale": 1.0, "mscale_all_dim": 1.0}}));
        let mistral = with(json!({"window_size": [4095, 0]}));
        let qwen3_moe = with(json!({"qk_layernorm": true, "window_size": [7, 0],
                                    "moe": {"num_experts": 8, "router_topk": 2,
                                            "ffn_hidden_size": 8, "layer_freq": [0, 1],
                                            "pre_softmax": true}}));
        let mut deepseek = with(json!({
            "num_layers": 3, "qk_layernorm": true, "norm_epsilon": 1e-6,
            "mla": {"kv_lora_rank": 16, "qk_head_dim": 8, "qk_pos_emb_head_dim": 4,
                    "v_head_dim": 6},
            "rope_scaling": {"type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.8,
                             "original_max_position_embeddings": 8},
            "moe": {"num_experts": 8, "router_topk": 4, "ffn_hidden_size": 8,
                    "score_function": "sigmoid", "expert_bias": true, "num_groups": 4,
                    "group_topk": 2, "shared_expert_ffn_hidden_size": 16,
                    "router_topk_scaling_factor": 2.5, "layer_freq": [0, 1, 1]}}));
        if let Some(section) = deepseek.as_object_mut() {
            section.remove("num_query_groups");
            section.remove("kv_channels");
        }
        // multi-latent attention without experts: every layer one of the dense first ones
        let mut dense_mla = deepseek.clone();
        if let Some(section) = dense_mla.as_object_mut() {
            section.remove("moe");
        }
        let sections = [
            gpt2,
            llama,
            mixtral,
            llama3,
            linear,
            qwen2,
            qwen2_sliding,
            qwen3,
            mistral,
            qwen3_moe,
            deepseek,
            dense_mla,
        ];
        for section in sections {
            let ours = model(section);
            let dims = Dims::of(&ours, 41, 128);
            let dir = tempfile::tempdir().expect("tempdir");
            let written = write_config(&ours, &dims, OutDtype::Bf16, Some(0));
            std::fs::write(dir.path().join(CONFIG_FILE), written.to_string()).expect("write");
            let read = HfConfig::read(dir.path()).expect("reads");
            assert_eq!(read.family, dims.family);
            assert_eq!(read.problems, vec![], "{written}");
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
            err.to_string().contains(
                "model_type `bert` is not one of gpt2 (GPT2LMHeadModel), llama \
                 (LlamaForCausalLM), mixtral (MixtralForCausalLM), mistral (MistralForCausalLM), \
                 qwen2 (Qwen2ForCausalLM), qwen3 (Qwen3ForCausalLM), qwen3_moe \
                 (Qwen3MoeForCausalLM), deepseek_v3 (DeepseekV3ForCausalLM)"
            ),
            "{err}"
        );
    }

    fn read(config: Value) -> HfConfig {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(CONFIG_FILE), config.to_string()).expect("write");
        HfConfig::read(dir.path()).expect("reads")
    }

    fn problems(config: &HfConfig) -> Vec<&str> {
        config.problems.iter().map(|f| f.path.as_str()).collect()
    }

    #[test]
    fn unscaled_rope_types_and_mismatched_biases_cannot_be_expressed() {
        let config = read(
            json!({"model_type": "llama", "rope_scaling": {"rope_type": "dynamic"},
                                 "attention_bias": true, "mlp_bias": false,
                                 "hidden_act": "gelu"}),
        );
        assert_eq!(
            problems(&config),
            [
                "model.rope_scaling",
                "model.activation",
                "model.add_bias_linear"
            ]
        );
        let qwen3 = read(json!({"model_type": "qwen3", "attention_bias": true}));
        assert_eq!(problems(&qwen3), ["model.add_bias_linear"]);
    }

    /// Qwen3-MoE's MoE layers: not in mlp_only_layers and `layer + 1` a multiple of
    /// decoder_sparse_step; Megatron's number where one gives them, else the list.
    #[test]
    fn qwen3_moe_layers_read_as_layer_freq() {
        let layers = |extra: Value| {
            let mut config = json!({"model_type": "qwen3_moe", "num_hidden_layers": 4});
            for (k, v) in extra.as_object().expect("an object") {
                config[k] = v.clone();
            }
            let read = read(config);
            let moe = read.model.moe.as_ref().expect("MoE");
            (
                serde_json::to_value(&moe.layer_freq).expect("JSON"),
                read.model.moe_layers(),
            )
        };
        assert_eq!(layers(json!({})), (json!(1), vec![true; 4]));
        assert_eq!(
            layers(json!({"mlp_only_layers": [1, 3]})),
            (json!(2), vec![true, false, true, false])
        );
        assert_eq!(
            layers(json!({"decoder_sparse_step": 2, "mlp_only_layers": [3]})),
            (json!([0, 1, 0, 0]), vec![false, true, false, false])
        );
        // transformers 5 writes num_local_experts, the Hub's files num_experts
        let experts = |key: &str| {
            let config = read(json!({"model_type": "qwen3_moe", key: 6}));
            config.model.moe.expect("MoE").num_experts
        };
        assert_eq!(
            (experts("num_experts"), experts("num_local_experts")),
            (6, 6)
        );
    }

    /// Llama 3.1 8B's config.json as published (transformers 4.x spelling).
    #[test]
    fn llama_3_1_reads_with_its_scaling() {
        let config = read(json!({
            "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
            "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
            "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
            "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "vocab_size": 128256, "attention_bias": false, "mlp_bias": false
        }));
        assert!(config.problems.is_empty());
        assert_eq!(config.model.rotary_base, 5e5);
        let expected: ferrotron_recipe::RopeScaling = serde_json::from_value(json!({
            "type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192
        }))
        .expect("a rope_scaling");
        assert_eq!(config.model.rope_scaling, Some(expected));
    }

    /// Qwen attends through its window only with use_sliding_window, and only on the layers
    /// from max_window_layers on (or those layer_types names); one window for some layers is
    /// refused at window_size. Mistral's window is every layer's, null none, absent 4096.
    #[test]
    fn sliding_windows_read_as_each_class_applies_them() {
        let qwen = |extra: Value| {
            let mut config = json!({"model_type": "qwen2", "num_hidden_layers": 4,
                                    "sliding_window": 8});
            for (k, v) in extra.as_object().expect("an object") {
                config[k] = v.clone();
            }
            read(config)
        };
        let off = qwen(json!({"use_sliding_window": false, "max_window_layers": 0}));
        assert_eq!(off.model.window_size, None);
        let all = qwen(json!({"use_sliding_window": true, "max_window_layers": 0}));
        assert_eq!(all.model.window_size, Some([7, 0]));
        assert!(all.problems.is_empty());
        let none = qwen(json!({"use_sliding_window": true, "max_window_layers": 4}));
        assert_eq!((none.model.window_size, none.problems.len()), (None, 0));
        let some = qwen(json!({"use_sliding_window": true, "max_window_layers": 2}));
        assert_eq!(problems(&some), ["model.window_size"]);
        assert!(
            some.problems[0]
                .message
                .contains("on layers 2, 3 of 4 only"),
            "{}",
            some.problems[0].message
        );
        let typed = qwen(json!({"use_sliding_window": true, "max_window_layers": 4,
                                "layer_types": vec!["sliding_attention"; 4]}));
        assert_eq!(typed.model.window_size, Some([7, 0]));
        let mistral = |window: Option<Value>| {
            let mut config = json!({"model_type": "mistral"});
            if let Some(w) = window {
                config["sliding_window"] = w;
            }
            read(config).model.window_size
        };
        assert_eq!(mistral(Some(json!(null))), None);
        assert_eq!(mistral(Some(json!(8))), Some([7, 0]));
        assert_eq!(mistral(None), Some([4095, 0]));
    }
}
