//! Rotary scaling in `config.json` both ways. transformers 5 writes `rope_parameters` (with
//! `rope_theta` inside); 4.x and every Hub checkpoint of Llama 3.1 / Qwen2.5 write `rope_theta`
//! beside a `rope_scaling` dict, which 5 still reads, ahead of `rope_parameters`. We write both
//! spellings of the same dict, and read them in transformers 5's order of precedence, with its
//! defaults (an `original_max_position_embeddings` left out is `max_position_embeddings`, a YaRN
//! `factor` left out is their ratio).
//!
//! YaRN's attention factor is the one place the two conventions differ: Megatron-Core scales
//! cos/sin by `mscale(factor, mscale) / mscale(factor, mscale_all_dim)` with defaults 1 and 0,
//! transformers by that ratio only when both keys are set and non-zero, else by
//! `mscale(factor, 1)`, unless `attention_factor` says outright. So export writes
//! `attention_factor` explicitly, and import takes the Megatron pair that gives transformers'
//! factor, refusing a file whose `attention_factor` no such pair gives.

use ferrotron_recipe::{Finding, Model, RopeScaling, RopeScalingType};
use serde_json::{Map, Value, json};

/// The rope keys of `config.json`: `(rope_theta, rope_scaling, rope_parameters)`.
pub(crate) fn write(model: &Model) -> [(&'static str, Value); 3] {
    let theta = model.rotary_base;
    let mut scaling = Map::new();
    if let Some(s) = model.rope_scaling.map(|s| s.with_defaults()) {
        let mut set = |key: &str, value: Option<Value>| {
            if let Some(value) = value {
                scaling.insert(key.to_owned(), value);
            }
        };
        set("rope_type", Some(json!(s.scaling_type.name())));
        set("factor", Some(json!(s.factor)));
        set("low_freq_factor", s.low_freq_factor.map(|v| json!(v)));
        set("high_freq_factor", s.high_freq_factor.map(|v| json!(v)));
        set(
            "original_max_position_embeddings",
            s.original_max_position_embeddings.map(|v| json!(v)),
        );
        set("beta_fast", s.beta_fast.map(|v| json!(v)));
        set("beta_slow", s.beta_slow.map(|v| json!(v)));
        set("mscale", s.mscale.map(|v| json!(v)));
        set("mscale_all_dim", s.mscale_all_dim.map(|v| json!(v)));
        if s.scaling_type == RopeScalingType::Yarn {
            set(
                "attention_factor",
                Some(json!(megatron_attention_factor(&s))),
            );
        }
    }
    let legacy = if scaling.is_empty() {
        Value::Null
    } else {
        Value::Object(scaling.clone())
    };
    if scaling.is_empty() {
        scaling.insert("rope_type".to_owned(), json!("default"));
    }
    scaling.insert("rope_theta".to_owned(), json!(theta));
    [
        ("rope_theta", json!(theta)),
        ("rope_scaling", legacy),
        ("rope_parameters", Value::Object(scaling)),
    ]
}

/// What a `config.json` says about rotary embeddings, as recipe values.
pub(crate) struct Read {
    pub theta: Value,
    pub scaling: Option<RopeScaling>,
    pub problems: Vec<Finding>,
}

/// Read the rope keys of `json` (`positions`: its `max_position_embeddings`).
pub(crate) fn read(json: &Value, default_theta: f64, positions: u64) -> Read {
    let dict = |key: &str| json.get(key).filter(|v| v.is_object()).cloned();
    let params = dict("rope_scaling")
        .or_else(|| dict("rope_parameters"))
        .unwrap_or_else(|| json!({}));
    let given = |key: &str| params.get(key).filter(|v| !v.is_null());
    let number = |key: &str| given(key).and_then(Value::as_f64);
    let theta = given("rope_theta")
        .or_else(|| json.get("rope_theta").filter(|v| !v.is_null()))
        .cloned()
        .unwrap_or(json!(default_theta));
    let mut problems = Vec::new();
    let mut refuse = |path: &str, message: String| {
        problems.push(Finding::error("hf::inexpressible", path, message));
    };
    let partial = number("partial_rotary_factor")
        .or_else(|| json.get("partial_rotary_factor").and_then(Value::as_f64));
    if partial.is_some_and(|p| p != 1.0) {
        refuse(
            "model.position_embedding",
            format!(
                "config.json's partial_rotary_factor {} rotates part of each head; this model \
                 rotates all of it",
                partial.unwrap_or_default()
            ),
        );
    }
    let layer_types = json["layer_types"].as_array().cloned().unwrap_or_default();
    if params
        .as_object()
        .is_some_and(|p| p.keys().any(|k| layer_types.contains(&json!(k))))
    {
        refuse(
            "model.rope_scaling",
            "config.json's rope_parameters differ by layer type; this model's are one for all \
             layers"
                .to_owned(),
        );
    }
    let rope_type = given("rope_type")
        .or_else(|| given("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let scaling_type = match rope_type {
        "default" => None,
        "llama3" => Some(RopeScalingType::Llama3),
        "linear" => Some(RopeScalingType::Linear),
        "yarn" => Some(RopeScalingType::Yarn),
        other => {
            refuse(
                "model.rope_scaling",
                format!(
                    "config.json's RoPE type `{other}` is not one of llama3, linear, yarn, \
                     which this model computes"
                ),
            );
            None
        }
    };
    let Some(scaling_type) = scaling_type else {
        return Read {
            theta,
            scaling: None,
            problems,
        };
    };
    // Phi-3 keeps the original context beside rope_parameters, and transformers prefers it there
    let original = json["original_max_position_embeddings"]
        .as_u64()
        .or_else(|| given("original_max_position_embeddings").and_then(Value::as_u64))
        .unwrap_or(positions);
    let original = u32::try_from(original).unwrap_or(u32::MAX);
    let yarn = scaling_type == RopeScalingType::Yarn;
    let factor = number("factor")
        .or_else(|| yarn.then(|| positions as f64 / f64::from(original.max(1))))
        .unwrap_or(1.0);
    let mut scaling = RopeScaling {
        scaling_type,
        factor,
        low_freq_factor: None,
        high_freq_factor: None,
        original_max_position_embeddings: None,
        beta_fast: None,
        beta_slow: None,
        mscale: None,
        mscale_all_dim: None,
    };
    match scaling_type {
        RopeScalingType::Linear => {}
        RopeScalingType::Llama3 => {
            scaling.original_max_position_embeddings = Some(original);
            scaling.low_freq_factor = number("low_freq_factor");
            scaling.high_freq_factor = number("high_freq_factor");
        }
        RopeScalingType::Yarn => {
            scaling.original_max_position_embeddings = Some(original);
            // transformers: `beta_fast or 32`, so a zero is the default too
            scaling.beta_fast = Some(number("beta_fast").filter(|&b| b != 0.0).unwrap_or(32.0));
            scaling.beta_slow = Some(number("beta_slow").filter(|&b| b != 0.0).unwrap_or(1.0));
            if given("truncate").is_some_and(|t| t != &json!(true)) {
                refuse(
                    "model.rope_scaling",
                    "config.json's YaRN truncate: false keeps the correction range fractional; \
                     this model rounds it to whole dimensions (Megatron-Core's default)"
                        .to_owned(),
                );
            }
            let (mscale, all_dim) = (number("mscale"), number("mscale_all_dim"));
            let both = match (mscale, all_dim) {
                (Some(m), Some(a)) if m != 0.0 && a != 0.0 => Some((m, a)),
                _ => None,
            };
            // transformers' factor when the file does not give it, and the pair that gives it
            let (implied, pair) = match both {
                Some((m, a)) => (yarn_mscale(factor, m) / yarn_mscale(factor, a), (m, a)),
                None => (yarn_mscale(factor, 1.0), (1.0, 0.0)),
            };
            let (m, a) = match number("attention_factor") {
                None => pair,
                Some(given) => {
                    let literal = (mscale.unwrap_or(1.0), all_dim.unwrap_or(0.0));
                    let of = |(m, a): (f64, f64)| yarn_mscale(factor, m) / yarn_mscale(factor, a);
                    if close(of(literal), given) {
                        literal
                    } else if close(implied, given) {
                        pair
                    } else {
                        refuse(
                            "model.rope_scaling.mscale",
                            format!(
                                "config.json's YaRN attention_factor {given} is not \
                                 mscale(factor, mscale) / mscale(factor, mscale_all_dim) of its \
                                 keys, the only attention factor this model computes"
                            ),
                        );
                        pair
                    }
                }
            };
            scaling.mscale = Some(m);
            scaling.mscale_all_dim = Some(a);
        }
    }
    Read {
        theta,
        scaling: Some(scaling),
        problems,
    }
}

/// YaRN's `0.1 · mscale · ln(scale) + 1` (1 at scales up to 1), in Megatron-Core and transformers.
fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

/// The factor Megatron-Core scales cos/sin by.
fn megatron_attention_factor(scaling: &RopeScaling) -> f64 {
    yarn_mscale(scaling.factor, scaling.mscale())
        / yarn_mscale(scaling.factor, scaling.mscale_all_dim())
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yarn(params: Value) -> Read {
        let mut dict = json!({"rope_type": "yarn", "factor": 4.0,
                              "original_max_position_embeddings": 32768});
        for (k, v) in params.as_object().expect("an object") {
            dict[k] = v.clone();
        }
        read(&json!({"rope_parameters": dict}), 1e4, 131072)
    }

    fn pair(read: &Read) -> (Option<f64>, Option<f64>) {
        let s = read.scaling.expect("scaled");
        (s.mscale, s.mscale_all_dim)
    }

    /// transformers ignores `mscale` without `mscale_all_dim` (and zeros): its factor is then
    /// mscale(factor, 1), Megatron's pair (1, 0).
    #[test]
    fn yarn_attention_factors_map_to_the_megatron_pair_transformers_computes() {
        assert_eq!(pair(&yarn(json!({}))), (Some(1.0), Some(0.0)));
        assert_eq!(pair(&yarn(json!({"mscale": 0.7}))), (Some(1.0), Some(0.0)));
        assert_eq!(
            pair(&yarn(json!({"mscale": 0.7, "mscale_all_dim": 0.0}))),
            (Some(1.0), Some(0.0))
        );
        assert_eq!(
            pair(&yarn(json!({"mscale": 1.0, "mscale_all_dim": 1.0}))),
            (Some(1.0), Some(1.0))
        );
        let explicit = 0.1 * 0.7 * 4f64.ln() + 1.0;
        let given = yarn(json!({"mscale": 0.7, "attention_factor": explicit}));
        assert_eq!(pair(&given), (Some(0.7), Some(0.0)));
        assert!(given.problems.is_empty());
        let odd = yarn(json!({"attention_factor": 1.5}));
        assert_eq!(odd.problems[0].path, "model.rope_scaling.mscale");
        let untruncated = yarn(json!({"truncate": false}));
        assert_eq!(untruncated.problems[0].path, "model.rope_scaling");
    }

    /// transformers 5 reads `rope_scaling` ahead of `rope_parameters`, `rope_theta` inside the
    /// dict ahead of the one beside it, and defaults the original context to
    /// max_position_embeddings (a YaRN factor to their ratio).
    #[test]
    fn legacy_and_current_spellings_read_alike() {
        let legacy = json!({"rope_theta": 5e5, "rope_scaling": {"type": "llama3", "factor": 8.0,
                            "low_freq_factor": 1.0, "high_freq_factor": 4.0}});
        let read_legacy = read(&legacy, 1e4, 8192);
        assert_eq!(read_legacy.theta, json!(5e5));
        let scaling = read_legacy.scaling.expect("scaled");
        assert_eq!(scaling.scaling_type, RopeScalingType::Llama3);
        assert_eq!(scaling.original_max_position_embeddings, Some(8192));
        let current = json!({"rope_theta": 1.0, "rope_parameters": {"rope_type": "yarn",
                             "rope_theta": 1e6, "original_max_position_embeddings": 4096}});
        let read_current = read(&current, 1e4, 32768);
        assert_eq!(read_current.theta, json!(1e6));
        assert_eq!(read_current.scaling.expect("scaled").factor, 8.0);
        let plain = read(
            &json!({"rope_parameters": {"rope_type": "default"}}),
            1e4,
            8,
        );
        assert_eq!((plain.theta, plain.scaling), (json!(1e4), None));
        let dynamic = read(
            &json!({"rope_scaling": {"type": "dynamic", "factor": 2.0}}),
            1e4,
            8,
        );
        assert_eq!(dynamic.problems[0].path, "model.rope_scaling");
        let partial = read(&json!({"partial_rotary_factor": 0.5}), 1e4, 8);
        assert_eq!(partial.problems[0].path, "model.position_embedding");
    }
}
