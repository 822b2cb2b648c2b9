//! A recipe's model section against a `config.json`: every difference is a [`Finding`] at the
//! recipe key to change, so `recipe run` with `checkpoint.init_from` and `recipe import --recipe`
//! report them at their lines like any validation error.

use ferrotron_recipe::{Finding, Model, PositionEmbedding};

use crate::config::HfConfig;

/// Every way `recipe` (with its real vocabulary `vocab`) differs from `hf` or asks for what
/// `hf`'s class cannot compute. Empty when the weights load into exactly that model.
pub(crate) fn check(recipe: &Model, vocab: u32, hf: &HfConfig) -> Vec<Finding> {
    let theirs = fields(&hf.model, hf.vocab);
    let mut out: Vec<Finding> = fields(recipe, vocab)
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
            .with_help(format!("set {key}: {b}"))
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
    if let Some(window) = hf.sliding_window.filter(|&w| w < recipe.seq_length) {
        out.push(
            Finding::error(
                "hf::inexpressible",
                "model.seq_length",
                format!(
                    "config.json's sliding_window {window} masks tokens further back; this \
                     model attends to the whole sequence"
                ),
            )
            .with_help(format!("train with seq_length at most {window}")),
        );
    }
    out.extend(hf.problems.iter().cloned());
    out
}

/// The values that decide tensor shapes or the function computed, by recipe key.
fn fields(model: &Model, vocab: u32) -> Vec<(&'static str, String)> {
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
        ("model.kv_channels", model.kv_channels().to_string()),
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
        (
            "model.moe",
            if moe.is_some() { "set" } else { "absent" }.to_owned(),
        ),
    ];
    match moe {
        Some(moe) => out.extend([
            ("model.moe.num_experts", moe.num_experts.to_string()),
            ("model.moe.router_topk", moe.router_topk.to_string()),
            (
                "model.moe.ffn_hidden_size",
                moe.expert_ffn_hidden_size(model).to_string(),
            ),
        ]),
        None => out.push(("model.ffn_hidden_size", model.ffn_hidden_size().to_string())),
    }
    match model.position_embedding {
        PositionEmbedding::Learned => out.push((
            "model.max_position_embeddings",
            model.max_position_embeddings().to_string(),
        )),
        PositionEmbedding::Rope => out.push(("model.rotary_base", model.rotary_base.to_string())),
        PositionEmbedding::None => {}
    }
    out
}
