//! Attention-variant rules: rotary scaling (each type's own keys, factors in range), sliding
//! windows (causal, at least one key back). The model refuses the same combinations when it is
//! built; these say it first, at the key's line, with the fix.

use crate::{Finding, PositionEmbedding, Recipe, RopeScaling, RopeScalingType};

pub(super) fn check(recipe: &Recipe, out: &mut Vec<Finding>) {
    let m = &recipe.model;
    if let Some(scaling) = &m.rope_scaling {
        if m.position_embedding != PositionEmbedding::Rope {
            out.push(
                Finding::error(
                    "model::rope-scaling-needs-rope",
                    "model.rope_scaling",
                    format!(
                        "rope_scaling scales rotary embeddings, but position_embedding is {}",
                        position_name(m.position_embedding)
                    ),
                )
                .with_help("set model.position_embedding: rope, or remove model.rope_scaling"),
            );
        }
        check_rope_scaling(scaling, out);
    }
    if let Some([left, right]) = m.window_size {
        if right != 0 {
            out.push(
                Finding::error(
                    "model::window-not-causal",
                    "model.window_size.1",
                    format!("window_size [{left}, {right}] looks {right} keys ahead of the query"),
                )
                .with_help(format!(
                    "causal language models see no later key: use window_size: [{}, 0]",
                    left.max(1)
                )),
            );
        }
        if left == 0 {
            out.push(
                Finding::error(
                    "model::window-too-small",
                    "model.window_size.0",
                    "window_size [0, …] lets each query see only itself",
                )
                .with_help(
                    "use the number of earlier keys each query sees, e.g. [4095, 0] for Hugging \
                     Face's sliding_window: 4096",
                ),
            );
        } else if left >= m.seq_length.saturating_sub(1) {
            out.push(
                Finding::warning(
                    "model::window-covers-sequence",
                    "model.window_size.0",
                    format!(
                        "window_size [{left}, 0] reaches every earlier key of a seq_length {} \
                         sequence: it is full causal attention",
                        m.seq_length
                    ),
                )
                .with_help("remove model.window_size, or lower it below seq_length - 1"),
            );
        }
    }
}

fn check_rope_scaling(scaling: &RopeScaling, out: &mut Vec<Finding>) {
    let kind = scaling.scaling_type;
    for key in scaling.foreign_keys() {
        let owners: Vec<&str> = [
            RopeScalingType::Llama3,
            RopeScalingType::Linear,
            RopeScalingType::Yarn,
        ]
        .into_iter()
        .filter(|other| other.keys().contains(&key))
        .map(RopeScalingType::name)
        .collect();
        out.push(
            Finding::error(
                "model::rope-scaling-foreign-key",
                format!("model.rope_scaling.{key}"),
                format!(
                    "{key} belongs to rope_scaling type {}, not {}",
                    owners.join(" or "),
                    kind.name()
                ),
            )
            .with_help(match kind.keys() {
                [] => format!("remove it: type {} reads only factor", kind.name()),
                keys => format!(
                    "remove it: type {} reads factor, {}",
                    kind.name(),
                    keys.join(", ")
                ),
            }),
        );
    }
    if !(scaling.factor.is_finite() && scaling.factor > 0.0) {
        out.push(
            Finding::error(
                "model::rope-scaling-factor",
                "model.rope_scaling.factor",
                format!("rope_scaling.factor must be > 0, got {}", scaling.factor),
            )
            .with_help("use the context extension ratio, e.g. 8.0 for Llama 3.1"),
        );
    }
    match kind {
        RopeScalingType::Llama3 => {
            let (low, high) = (scaling.low_freq_factor(), scaling.high_freq_factor());
            if !(low > 0.0 && low < high) {
                out.push(
                    Finding::error(
                        "model::rope-scaling-freq-factors",
                        "model.rope_scaling.high_freq_factor",
                        format!(
                            "llama3 scaling needs 0 < low_freq_factor < high_freq_factor, got \
                             {low} and {high}"
                        ),
                    )
                    .with_help("Llama 3.1 uses low_freq_factor: 1.0, high_freq_factor: 4.0"),
                );
            }
        }
        RopeScalingType::Linear => {}
        RopeScalingType::Yarn => {
            let (fast, slow) = (scaling.beta_fast(), scaling.beta_slow());
            if !(slow > 0.0 && slow < fast) {
                out.push(
                    Finding::error(
                        "model::rope-scaling-betas",
                        "model.rope_scaling.beta_fast",
                        format!(
                            "yarn scaling needs 0 < beta_slow < beta_fast, got {slow} and {fast}"
                        ),
                    )
                    .with_help("YaRN's defaults are beta_fast: 32.0, beta_slow: 1.0"),
                );
            }
            for (key, value) in [
                ("mscale", scaling.mscale()),
                ("mscale_all_dim", scaling.mscale_all_dim()),
            ] {
                if value < 0.0 {
                    out.push(
                        Finding::error(
                            "model::rope-scaling-mscale",
                            format!("model.rope_scaling.{key}"),
                            format!("rope_scaling.{key} must be ≥ 0, got {value}"),
                        )
                        .with_help(format!("use {key}: 1.0 or leave it out")),
                    );
                }
            }
        }
    }
}

fn position_name(position: PositionEmbedding) -> &'static str {
    match position {
        PositionEmbedding::Learned => "learned",
        PositionEmbedding::Rope => "rope",
        PositionEmbedding::None => "none",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::fixture::{codes, recipe};

    fn run(recipe: &Recipe) -> Vec<Finding> {
        crate::rules::fixture::run(check, recipe)
    }

    fn scaling(json: serde_json::Value) -> Option<RopeScaling> {
        Some(serde_json::from_value(json).expect("rope_scaling parses"))
    }

    #[test]
    fn llama3_scaling_on_rope_passes_and_on_learned_positions_is_refused() {
        let mut r = recipe();
        r.model.rope_scaling = scaling(serde_json::json!({"type": "llama3", "factor": 8.0}));
        let findings = run(&r);
        assert_eq!(codes(&findings), ["model::rope-scaling-needs-rope"]);
        assert_eq!(
            findings[0].help.as_deref(),
            Some("set model.position_embedding: rope, or remove model.rope_scaling")
        );
        r.model.position_embedding = PositionEmbedding::Rope;
        assert!(run(&r).is_empty());
    }

    #[test]
    fn keys_of_another_type_and_bad_factors_are_refused_at_their_key() {
        let mut r = recipe();
        r.model.position_embedding = PositionEmbedding::Rope;
        r.model.rope_scaling = scaling(serde_json::json!({
            "type": "linear", "factor": 0.0, "beta_fast": 32.0, "low_freq_factor": 1.0
        }));
        let findings = run(&r);
        assert_eq!(
            codes(&findings),
            [
                "model::rope-scaling-foreign-key",
                "model::rope-scaling-foreign-key",
                "model::rope-scaling-factor"
            ]
        );
        assert_eq!(findings[0].path, "model.rope_scaling.low_freq_factor");
        assert_eq!(
            findings[0].message,
            "low_freq_factor belongs to rope_scaling type llama3, not linear"
        );
        assert_eq!(
            findings[0].help.as_deref(),
            Some("remove it: type linear reads only factor")
        );
        assert_eq!(
            findings[1].message,
            "beta_fast belongs to rope_scaling type yarn, not linear"
        );
        r.model.rope_scaling = scaling(serde_json::json!({
            "type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0
        }));
        assert_eq!(codes(&run(&r)), ["model::rope-scaling-freq-factors"]);
        r.model.rope_scaling = scaling(serde_json::json!({
            "type": "yarn", "factor": 40.0, "beta_fast": 1.0, "beta_slow": 32.0, "mscale": -1.0
        }));
        assert_eq!(
            codes(&run(&r)),
            ["model::rope-scaling-betas", "model::rope-scaling-mscale"]
        );
    }

    #[test]
    fn windows_are_causal_and_reach_back_at_least_one_key() {
        let mut r = recipe();
        r.model.window_size = Some([4, 0]);
        assert!(run(&r).is_empty());
        r.model.window_size = Some([0, 2]);
        let findings = run(&r);
        assert_eq!(
            codes(&findings),
            ["model::window-not-causal", "model::window-too-small"]
        );
        assert_eq!(findings[0].path, "model.window_size.1");
        assert_eq!(
            findings[0].help.as_deref(),
            Some("causal language models see no later key: use window_size: [1, 0]")
        );
        r.model.window_size = Some([31, 0]);
        assert_eq!(codes(&run(&r)), ["model::window-covers-sequence"]);
    }
}
