//! Model-shape rules: head arithmetic, positions, FFN sizes, MoE routing combinations.

use crate::{
    Activation, Finding, LayerFreq, LayerFreqError, Moe, PositionEmbedding, Recipe, ScoreFunction,
};

pub(super) fn check(recipe: &Recipe, out: &mut Vec<Finding>) {
    let m = &recipe.model;
    let heads = m.num_attention_heads;
    // Multi-latent attention reads its own head sizes (`model.mla`), never kv_channels.
    let grouped_query = m.mla.is_none();
    if grouped_query && m.kv_channels.is_none() && !m.hidden_size.is_multiple_of(heads) {
        out.push(
            Finding::error(
                "model::hidden-divisible-by-heads",
                "model.num_attention_heads",
                format!(
                    "hidden_size {} is not divisible by num_attention_heads {heads}",
                    m.hidden_size
                ),
            )
            .with_help(format!(
                "use a head count that divides {} (e.g. {}), or set model.kv_channels explicitly",
                m.hidden_size,
                divisors_near(m.hidden_size, heads)
            )),
        );
    }
    if let Some(groups) = m.num_query_groups
        && !heads.is_multiple_of(groups)
    {
        out.push(
            Finding::error(
                "model::heads-divisible-by-query-groups",
                "model.num_query_groups",
                format!(
                    "num_attention_heads {heads} is not divisible by num_query_groups {groups}"
                ),
            )
            .with_help(format!(
                "use a group count that divides {heads} (e.g. {})",
                divisors_near(heads, groups)
            )),
        );
    }
    if grouped_query
        && m.position_embedding == PositionEmbedding::Rope
        && !m.kv_channels().is_multiple_of(2)
    {
        out.push(
            Finding::error(
                "model::rope-needs-even-head-dim",
                if m.kv_channels.is_some() {
                    "model.kv_channels"
                } else {
                    "model.hidden_size"
                },
                format!(
                    "rotary embeddings need an even head dimension, got {}",
                    m.kv_channels()
                ),
            )
            .with_help("make hidden_size / num_attention_heads (or kv_channels) even"),
        );
    }
    if m.position_embedding != PositionEmbedding::None
        && let Some(max) = m.max_position_embeddings
        && m.seq_length > max
    {
        out.push(
            Finding::error(
                "model::seq-length-exceeds-positions",
                "model.seq_length",
                format!(
                    "seq_length {} exceeds max_position_embeddings {max}",
                    m.seq_length
                ),
            )
            .with_help(format!(
                "lower seq_length to at most {max} or raise max_position_embeddings"
            )),
        );
    }
    if m.activation == Activation::Swiglu && m.ffn_hidden_size.is_none() {
        out.push(
            Finding::warning(
                "model::swiglu-default-ffn",
                "model.activation",
                format!(
                    "SwiGLU with the default ffn_hidden_size 4 × hidden = {} has 1.5× the FFN \
                     parameters of a GELU block",
                    4 * m.hidden_size
                ),
            )
            .with_help(format!(
                "LLaMA-style models set model.ffn_hidden_size to about 8/3 × hidden ({})",
                (m.hidden_size * 8 / 3).div_ceil(256) * 256
            )),
        );
    }
    if let Some(moe) = &m.moe {
        check_moe(moe, m.num_layers, out);
    }
}

fn check_moe(moe: &Moe, num_layers: u32, out: &mut Vec<Finding>) {
    if moe.router_topk > moe.num_experts {
        out.push(
            Finding::error(
                "moe::topk-exceeds-experts",
                "model.moe.router_topk",
                format!(
                    "router_topk {} is larger than num_experts {}",
                    moe.router_topk, moe.num_experts
                ),
            )
            .with_help(format!("use router_topk ≤ {}", moe.num_experts)),
        );
    }
    match (moe.num_groups, moe.group_topk) {
        (Some(groups), Some(group_topk)) => {
            if !moe.num_experts.is_multiple_of(groups) {
                out.push(
                    Finding::error(
                        "moe::groups-divide-experts",
                        "model.moe.num_groups",
                        format!(
                            "num_groups {groups} does not divide num_experts {}",
                            moe.num_experts
                        ),
                    )
                    .with_help(format!(
                        "use a group count that divides {} (e.g. {})",
                        moe.num_experts,
                        divisors_near(moe.num_experts, groups)
                    )),
                );
            }
            if group_topk > groups {
                out.push(
                    Finding::error(
                        "moe::group-topk-exceeds-groups",
                        "model.moe.group_topk",
                        format!("group_topk {group_topk} is larger than num_groups {groups}"),
                    )
                    .with_help(format!("use group_topk ≤ {groups}")),
                );
            }
        }
        (Some(_), None) => out.push(
            Finding::error(
                "moe::group-routing-incomplete",
                "model.moe.num_groups",
                "num_groups is set but group_topk is not",
            )
            .with_help(
                "group-limited routing needs both model.moe.num_groups and model.moe.group_topk",
            ),
        ),
        (None, Some(_)) => out.push(
            Finding::error(
                "moe::group-routing-incomplete",
                "model.moe.group_topk",
                "group_topk is set but num_groups is not",
            )
            .with_help(
                "group-limited routing needs both model.moe.num_groups and model.moe.group_topk",
            ),
        ),
        (None, None) => {}
    }
    if moe.expert_bias && moe.score_function != ScoreFunction::Sigmoid {
        out.push(
            Finding::error(
                "moe::expert-bias-needs-sigmoid",
                "model.moe.expert_bias",
                "expert_bias (auxiliary-loss-free balancing) needs sigmoid router scores",
            )
            .with_help("set model.moe.score_function: sigmoid, or expert_bias: false"),
        );
    }
    if moe.pad_to_capacity && moe.capacity_factor.is_none() {
        out.push(
            Finding::error(
                "moe::pad-needs-capacity",
                "model.moe.pad_to_capacity",
                "pad_to_capacity needs a capacity_factor (a dropless MoE has no capacity to pad to)",
            )
            .with_help("set model.moe.capacity_factor (e.g. 1.0) or pad_to_capacity: false"),
        );
    }
    if moe.load_balancing == crate::LoadBalancing::Sinkhorn && moe.router_topk != 1 {
        out.push(
            Finding::error(
                "moe::sinkhorn-needs-top1",
                "model.moe.load_balancing",
                format!(
                    "sinkhorn balancing routes each token to one expert, but router_topk is {}",
                    moe.router_topk
                ),
            )
            .with_help("set model.moe.router_topk: 1 or use load_balancing: aux_loss"),
        );
    }
    check_layer_freq(&moe.layer_freq, num_layers, out);
    if moe.router_topk_scaling_factor == Some(0.0) {
        out.push(
            Finding::error(
                "moe::zero-topk-scaling-factor",
                "model.moe.router_topk_scaling_factor",
                "router_topk_scaling_factor 0 would zero every routed expert's output \
                 (Megatron reads 0 as unset)",
            )
            .with_help(
                "leave the key out for a factor of 1, or give the model's factor \
                 (DeepSeek-V3: 2.5)",
            ),
        );
    }
}

/// `layer_freq`: an integer no larger than the model, or one 0/1 per layer.
fn check_layer_freq(freq: &LayerFreq, num_layers: u32, out: &mut Vec<Finding>) {
    const PATH: &str = "model.moe.layer_freq";
    if let Some(n) = freq.every()
        && n > num_layers
    {
        out.push(
            Finding::error(
                "moe::layer-freq-exceeds-layers",
                PATH,
                format!(
                    "layer_freq {n} is larger than num_layers {num_layers}: only layer 0 would \
                     be MoE"
                ),
            )
            .with_help(format!(
                "use layer_freq ≤ {num_layers} (1 makes every layer MoE)"
            )),
        );
        return;
    }
    match freq.pattern(num_layers) {
        Ok(pattern) if pattern.contains(&true) => {}
        Ok(_) => out.push(
            Finding::error(
                "moe::layer-freq-no-moe-layer",
                PATH,
                "every entry of layer_freq is 0: no layer would be MoE",
            )
            .with_help("mark the MoE layers with 1, or leave model.moe out for a dense model"),
        ),
        Err(LayerFreqError::Length { found, num_layers }) => out.push(
            Finding::error(
                "moe::layer-freq-length",
                PATH,
                format!(
                    "layer_freq lists {found} layers but num_layers is {num_layers} \
                     (one 0/1 per layer)"
                ),
            )
            .with_help(if found > num_layers as usize {
                format!("drop the last {}", entries(found - num_layers as usize))
            } else {
                format!(
                    "add the missing {} (1 = MoE, 0 = dense)",
                    entries(num_layers as usize - found)
                )
            }),
        ),
        Err(LayerFreqError::Value { index, value }) => out.push(
            Finding::error(
                "moe::layer-freq-value",
                format!("{PATH}.{index}"),
                format!(
                    "layer_freq entry {index} is {value}: only 0 (dense) and 1 (MoE) are \
                     allowed"
                ),
            )
            .with_help(format!(
                "write 1 to make layer {index} an MoE layer or 0 to keep it dense; for every N-th \
                 layer use the integer form, layer_freq: N"
            )),
        ),
        Err(LayerFreqError::Expression(message)) => out.push(
            Finding::error(
                "moe::layer-freq-expression",
                PATH,
                format!("layer_freq is not a Megatron pattern: {message}"),
            )
            .with_help(format!(
                "write a list expression such as \"([0]*1+[1]*{})\" (no spaces), or the list \
                 itself",
                num_layers.saturating_sub(1)
            )),
        ),
        Err(LayerFreqError::Zero) => {} // the schema's minimum reports it
    }
}

fn entries(n: usize) -> String {
    if n == 1 {
        "entry".to_owned()
    } else {
        format!("{n} entries")
    }
}

/// Up to three divisors of `n` closest to `wanted`, as a readable list.
pub(super) fn divisors_near(n: u32, wanted: u32) -> String {
    let mut divisors: Vec<u32> = (1..=n).filter(|d| n.is_multiple_of(*d)).collect();
    divisors.sort_by_key(|d| d.abs_diff(wanted));
    divisors.truncate(3);
    divisors.sort_unstable();
    divisors
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::fixture::{codes, recipe};

    fn run(recipe: &Recipe) -> Vec<Finding> {
        crate::rules::fixture::run(check, recipe)
    }

    #[test]
    fn valid_fixture_has_no_findings() {
        assert!(run(&recipe()).is_empty());
    }

    #[test]
    fn hidden_must_divide_by_heads_unless_kv_channels_given() {
        let mut r = recipe();
        r.model.num_attention_heads = 5;
        let findings = run(&r);
        assert_eq!(codes(&findings), ["model::hidden-divisible-by-heads"]);
        assert_eq!(
            findings[0].help.as_deref(),
            Some(
                "use a head count that divides 64 (e.g. 2, 4, 8), or set model.kv_channels explicitly"
            )
        );
        r.model.kv_channels = Some(16);
        assert!(run(&r).is_empty());
    }

    #[test]
    fn query_groups_and_positions() {
        let mut r = recipe();
        r.model.num_query_groups = Some(3);
        r.model.max_position_embeddings = Some(16);
        assert_eq!(
            codes(&run(&r)),
            [
                "model::heads-divisible-by-query-groups",
                "model::seq-length-exceeds-positions"
            ]
        );
    }

    #[test]
    fn moe_combinations() {
        let mut r = recipe();
        r.model.moe = Some(
            serde_json::from_value(serde_json::json!({
                "num_experts": 6, "router_topk": 8, "num_groups": 4, "group_topk": 5,
                "expert_bias": true, "pad_to_capacity": true
            }))
            .expect("moe"),
        );
        assert_eq!(
            codes(&run(&r)),
            [
                "moe::topk-exceeds-experts",
                "moe::groups-divide-experts",
                "moe::group-topk-exceeds-groups",
                "moe::expert-bias-needs-sigmoid",
                "moe::pad-needs-capacity",
            ]
        );
    }

    fn with_layer_freq(layer_freq: serde_json::Value) -> Recipe {
        let mut r = recipe();
        r.model.moe = Some(
            serde_json::from_value(serde_json::json!({
                "num_experts": 4, "layer_freq": layer_freq
            }))
            .expect("moe"),
        );
        r
    }

    #[test]
    fn layer_freq_lists_need_one_zero_or_one_per_layer() {
        // The fixture has two layers.
        assert!(run(&with_layer_freq(serde_json::json!([0, 1]))).is_empty());
        assert!(run(&with_layer_freq(serde_json::json!("([0]+[1])"))).is_empty());
        assert!(run(&with_layer_freq(serde_json::json!(2))).is_empty());

        let short = run(&with_layer_freq(serde_json::json!([1])));
        assert_eq!(codes(&short), ["moe::layer-freq-length"]);
        assert_eq!(short[0].path, "model.moe.layer_freq");
        assert_eq!(
            short[0].help.as_deref(),
            Some("add the missing entry (1 = MoE, 0 = dense)")
        );
        let long = run(&with_layer_freq(serde_json::json!([1, 1, 0])));
        assert_eq!(long[0].help.as_deref(), Some("drop the last entry"));
        let longer = run(&with_layer_freq(serde_json::json!([1, 1, 0, 0])));
        assert_eq!(longer[0].help.as_deref(), Some("drop the last 2 entries"));

        let two = run(&with_layer_freq(serde_json::json!([0, 2])));
        assert_eq!(codes(&two), ["moe::layer-freq-value"]);
        assert_eq!(two[0].path, "model.moe.layer_freq.1");

        let dense = run(&with_layer_freq(serde_json::json!([0, 0])));
        assert_eq!(codes(&dense), ["moe::layer-freq-no-moe-layer"]);
        let too_rare = run(&with_layer_freq(serde_json::json!(3)));
        assert_eq!(codes(&too_rare), ["moe::layer-freq-exceeds-layers"]);

        let malformed = run(&with_layer_freq(serde_json::json!("([0]+[1]")));
        assert_eq!(codes(&malformed), ["moe::layer-freq-expression"]);
        assert!(
            malformed[0].message.contains("expected `)`"),
            "{malformed:?}"
        );
    }

    #[test]
    fn a_zero_topk_scaling_factor_is_refused() {
        let mut r = with_layer_freq(serde_json::json!(1));
        let moe = r.model.moe.as_mut().expect("moe");
        moe.router_topk_scaling_factor = Some(2.5);
        assert!(run(&r).is_empty());
        r.model
            .moe
            .as_mut()
            .expect("moe")
            .router_topk_scaling_factor = Some(0.0);
        assert_eq!(codes(&run(&r)), ["moe::zero-topk-scaling-factor"]);
    }

    #[test]
    fn divisors_near_picks_the_closest() {
        assert_eq!(divisors_near(4096, 30), "8, 16, 32");
        assert_eq!(divisors_near(8, 3), "1, 2, 4");
    }
}
