//! A recipe's model section against a `config.json`: every difference is a [`Finding`] at the
//! recipe key to change, so `recipe run` with `checkpoint.init_from` and `recipe import --recipe`
//! report them at their lines like any validation error.

use ferrotron_recipe::{Finding, Model, PositionEmbedding, ScoreFunction};

use crate::config::HfConfig;

/// The value of an optional section the model does not set.
const ABSENT: &str = "absent";

/// Every way `recipe` (with its real vocabulary `vocab`) differs from `hf` or asks for what
/// `hf`'s class cannot compute. Empty when the weights load into exactly that model.
pub(crate) fn check(recipe: &Model, vocab: u32, hf: &HfConfig) -> Vec<Finding> {
    // a window over the recipe's whole sequence masks nothing: compare windows over it
    let seq = recipe.seq_length;
    let theirs = fields(&hf.model, hf.vocab, seq);
    let mut out: Vec<Finding> = fields(recipe, vocab, seq)
        .into_iter()
        .filter_map(|(path, a)| {
            let (_, b) = theirs.iter().find(|(p, _)| *p == path)?;
            (a != *b).then_some((path, a, b))
        })
        .map(|(path, a, b)| {
            let key = path.rsplit('.').next().unwrap_or(path);
            Finding::error(
                "hf::config-mismatch",
                path,
                format!("{path} is {a}; the Hugging Face model's config.json says {b}"),
            )
            .with_help(if b == ABSENT {
                format!("remove {path}")
            } else {
                format!("set {key}: {b}")
            })
        })
        .collect();
    for refusal in hf.family.refusals(recipe) {
        if !out.iter().any(|f| f.path == refusal.path) {
            out.push(Finding::error(
                "hf::inexpressible",
                refusal.path,
                refusal.reason,
            ));
        }
    }
    out.extend(hf.problems.iter().cloned());
    out
}

/// The values that decide tensor shapes or the function computed, by recipe key, over
/// sequences of `seq` tokens.
fn fields(model: &Model, vocab: u32, seq: u32) -> Vec<(&'static str, String)> {
    let moe = model.moe.as_ref();
    let mut out = vec![
        ("model.num_layers", model.num_layers.to_string()),
        ("model.hidden_size", model.hidden_size.to_string()),
        (
            "model.num_attention_heads",
            model.num_attention_heads.to_string(),
        ),
        (
            "model.num_query_groups",
            model.num_query_groups().to_string(),
        ),
        (
            "model.kv_channels",
            // multi-latent attention's head sizes are its own (model.mla)
            match model.mla {
                Some(_) => "(multi-latent attention's)".to_owned(),
                None => model.kv_channels().to_string(),
            },
        ),
        ("model.vocab_size", vocab.to_string()),
        (
            "model.position_embedding",
            format!("{:?}", model.position_embedding).to_lowercase(),
        ),
        (
            "model.normalization",
            format!("{:?}", model.normalization).to_lowercase(),
        ),
        ("model.norm_epsilon", model.norm_epsilon.to_string()),
        (
            "model.activation",
            format!("{:?}", model.activation).to_lowercase(),
        ),
        ("model.tie_embeddings", model.tie_embeddings.to_string()),
        ("model.add_bias_linear", model.add_bias_linear.to_string()),
        ("model.add_qkv_bias", model.qkv_bias().to_string()),
        ("model.qk_layernorm", model.qk_layernorm.to_string()),
        (
            "model.window_size",
            match model
                .window_size
                .filter(|[left, _]| left.saturating_add(1) < seq)
            {
                Some([left, right]) => format!("[{left}, {right}]"),
                None => ABSENT.to_owned(),
            },
        ),
        (
            "model.moe",
            if moe.is_some() { "set" } else { ABSENT }.to_owned(),
        ),
    ];
    out.push((
        "model.mla",
        if model.mla.is_some() { "set" } else { ABSENT }.to_owned(),
    ));
    if let Some(mla) = &model.mla {
        out.extend([
            (
                "model.mla.q_lora_rank",
                mla.q_lora_rank
                    .map_or_else(|| ABSENT.to_owned(), |r| r.to_string()),
            ),
            ("model.mla.kv_lora_rank", mla.kv_lora_rank.to_string()),
            ("model.mla.qk_head_dim", mla.qk_head_dim.to_string()),
            (
                "model.mla.qk_pos_emb_head_dim",
                mla.qk_pos_emb_head_dim.to_string(),
            ),
            ("model.mla.v_head_dim", mla.v_head_dim.to_string()),
        ]);
    }
    let layers = model.moe_layers();
    if !layers.iter().all(|&l| l) {
        out.push(("model.ffn_hidden_size", model.ffn_hidden_size().to_string()));
    }
    if let Some(moe) = moe {
        let optional =
            |value: Option<u32>| value.map_or_else(|| ABSENT.to_owned(), |v| v.to_string());
        let pattern: Vec<&str> = layers.iter().map(|&l| if l { "1" } else { "0" }).collect();
        out.extend([
            ("model.moe.num_experts", moe.num_experts.to_string()),
            ("model.moe.router_topk", moe.router_topk.to_string()),
            (
                "model.moe.ffn_hidden_size",
                moe.expert_ffn_hidden_size(model).to_string(),
            ),
            (
                "model.moe.score_function",
                format!("{:?}", moe.score_function).to_lowercase(),
            ),
            // softmax before top-k differs only where more than one expert is picked
            (
                "model.moe.pre_softmax",
                (moe.pre_softmax
                    && moe.router_topk > 1
                    && moe.score_function == ScoreFunction::Softmax)
                    .to_string(),
            ),
            ("model.moe.expert_bias", moe.expert_bias.to_string()),
            (
                "model.moe.num_groups",
                optional(moe.num_groups.filter(|&g| g > 1)),
            ),
            (
                "model.moe.group_topk",
                optional(
                    moe.group_topk
                        .filter(|_| moe.num_groups.is_some_and(|g| g > 1)),
                ),
            ),
            (
                "model.moe.shared_expert_ffn_hidden_size",
                optional(moe.shared_expert_ffn_hidden_size),
            ),
            (
                "model.moe.router_topk_scaling_factor",
                moe.topk_scaling_factor().to_string(),
            ),
            ("model.moe.layer_freq", format!("[{}]", pattern.join(", "))),
        ]);
    }
    match model.position_embedding {
        PositionEmbedding::Learned => out.push((
            "model.max_position_embeddings",
            model.max_position_embeddings().to_string(),
        )),
        PositionEmbedding::Rope => {
            out.push(("model.rotary_base", model.rotary_base.to_string()));
            out.push(rope_scaling(model));
        }
        PositionEmbedding::None => {}
    }
    out
}

/// The rotary scaling as a YAML flow mapping with every key of its type (defaults filled in),
/// so that a difference anywhere in it reads as the value to set.
fn rope_scaling(model: &Model) -> (&'static str, String) {
    let Some(s) = model.rope_scaling.map(|s| s.with_defaults()) else {
        return ("model.rope_scaling", ABSENT.to_owned());
    };
    let mut keys = vec![
        format!("type: {}", s.scaling_type.name()),
        format!("factor: {}", s.factor),
    ];
    for (key, value) in [
        ("low_freq_factor", s.low_freq_factor),
        ("high_freq_factor", s.high_freq_factor),
        (
            "original_max_position_embeddings",
            s.original_max_position_embeddings.map(f64::from),
        ),
        ("beta_fast", s.beta_fast),
        ("beta_slow", s.beta_slow),
        ("mscale", s.mscale),
        ("mscale_all_dim", s.mscale_all_dim),
    ] {
        if let Some(value) = value {
            keys.push(format!("{key}: {value}"));
        }
    }
    ("model.rope_scaling", format!("{{{}}}", keys.join(", ")))
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::config::CONFIG_FILE;

    fn hf(config: Value) -> HfConfig {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(CONFIG_FILE), config.to_string()).expect("write");
        HfConfig::read(dir.path()).expect("reads")
    }

    /// A Qwen3 with a window and scaled RoPE against a recipe of plain LLaMA: each difference at
    /// its key, with the value to set (or the key to remove).
    #[test]
    fn qk_norms_windows_and_rope_scaling_are_compared_at_their_keys() {
        let qwen3 = hf(json!({
            "model_type": "qwen3", "vocab_size": 41, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 8, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
            "use_sliding_window": true, "sliding_window": 8, "max_window_layers": 0,
            "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}
        }));
        let mut section = json!({
            "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
            "num_query_groups": 2, "ffn_hidden_size": 64, "seq_length": 32,
            "position_embedding": "rope", "normalization": "rmsnorm", "activation": "swiglu",
            "norm_epsilon": 1e-6, "tie_embeddings": false, "add_bias_linear": false,
            "rope_scaling": {"type": "linear", "factor": 4.0}
        });
        let findings = |section: &Value| {
            let model: Model = serde_json::from_value(section.clone()).expect("a model");
            check(&model, 41, &qwen3)
        };
        let found: Vec<(String, Option<String>)> = findings(&section)
            .into_iter()
            .map(|f| (f.path, f.help))
            .collect();
        let help = |h: &str| Some(h.to_owned());
        assert_eq!(
            found,
            [
                (
                    "model.qk_layernorm".to_owned(),
                    help("set qk_layernorm: true")
                ),
                (
                    "model.window_size".to_owned(),
                    help("set window_size: [7, 0]")
                ),
                (
                    "model.rope_scaling".to_owned(),
                    help("set rope_scaling: {type: linear, factor: 2}")
                ),
            ]
        );
        // a window over the whole sequence is none
        section["seq_length"] = json!(8);
        section["qk_layernorm"] = json!(true);
        section["rope_scaling"]["factor"] = json!(2.0);
        assert_eq!(findings(&section), vec![]);
        section["window_size"] = json!([3, 0]);
        let found = findings(&section);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].help.as_deref(), Some("remove model.window_size"));
    }

    /// DeepSeek-V3's routing and latent sizes against a recipe that differs in each: every
    /// difference at its key, with the value to set.
    #[test]
    fn moe_routing_and_latent_sizes_are_compared_at_their_keys() {
        let deepseek = hf(json!({
            "model_type": "deepseek_v3", "vocab_size": 41, "hidden_size": 32,
            "intermediate_size": 64, "moe_intermediate_size": 16, "num_hidden_layers": 3,
            "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 8,
            "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "n_shared_experts": 2,
            "routed_scaling_factor": 2.5, "first_k_dense_replace": 1, "q_lora_rank": null,
            "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
            "max_position_embeddings": 32, "rms_norm_eps": 1e-6, "num_nextn_predict_layers": 0,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}
        }));
        assert_eq!(deepseek.problems, vec![]);
        let section = json!({
            "num_layers": 3, "hidden_size": 32, "num_attention_heads": 4, "ffn_hidden_size": 64,
            "seq_length": 32, "position_embedding": "rope", "normalization": "rmsnorm",
            "activation": "swiglu", "norm_epsilon": 1e-6, "tie_embeddings": false,
            "add_bias_linear": false, "qk_layernorm": true,
            "mla": {"q_lora_rank": 8, "kv_lora_rank": 16, "qk_head_dim": 8,
                    "qk_pos_emb_head_dim": 4, "v_head_dim": 8},
            "moe": {"num_experts": 8, "router_topk": 2, "ffn_hidden_size": 16,
                    "score_function": "sigmoid", "expert_bias": true, "num_groups": 2,
                    "group_topk": 1, "shared_expert_ffn_hidden_size": 16,
                    "layer_freq": [0, 0, 1]}
        });
        let model: Model = serde_json::from_value(section).expect("a model");
        let found: Vec<(String, Option<String>)> = check(&model, 41, &deepseek)
            .into_iter()
            .map(|f| (f.path, f.help))
            .collect();
        let at = |path: &str, help: &str| (path.to_owned(), Some(help.to_owned()));
        assert_eq!(
            found,
            [
                at("model.mla.q_lora_rank", "remove model.mla.q_lora_rank"),
                at(
                    "model.moe.shared_expert_ffn_hidden_size",
                    "set shared_expert_ffn_hidden_size: 32"
                ),
                at(
                    "model.moe.router_topk_scaling_factor",
                    "set router_topk_scaling_factor: 2.5"
                ),
                at("model.moe.layer_freq", "set layer_freq: [0, 1, 1]"),
            ]
        );
    }
}
