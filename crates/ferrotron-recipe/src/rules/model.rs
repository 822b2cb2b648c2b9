//! Model-shape rules: head arithmetic, positions, FFN sizes, MoE routing combinations.

use crate::{Activation, Finding, Moe, PositionEmbedding, Recipe, ScoreFunction};

pub(super) fn check(recipe: &Recipe, out: &mut Vec<Finding>) {
    let m = &recipe.model;
    let heads = m.num_attention_heads;
    if m.kv_channels.is_none() && !m.hidden_size.is_multiple_of(heads) {
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
    if m.position_embedding == PositionEmbedding::Rope && !m.kv_channels().is_multiple_of(2) {
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
    if moe.layer_freq > num_layers {
        out.push(
            Finding::error(
                "moe::layer-freq-exceeds-layers",
                "model.moe.layer_freq",
                format!(
                    "layer_freq {} is larger than num_layers {num_layers}: no layer would be MoE",
                    moe.layer_freq
                ),
            )
            .with_help(format!(
                "use layer_freq ≤ {num_layers} (1 makes every layer MoE)"
            )),
        );
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

    #[test]
    fn divisors_near_picks_the_closest() {
        assert_eq!(divisors_near(4096, 30), "8, 16, 32");
        assert_eq!(divisors_near(8, 3), "1, 2, 4");
    }
}
