//! Expanding a sweep into members: grid (row-major, first axis outermost) × zip × seeds
//! (innermost), so consecutive members differ in the last-named thing, like nested loops read
//! top to bottom.

use serde_json::Value;

use crate::spec::{SEED_KEY, SweepSpec};

/// One point of a sweep, before it is loaded.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberSpec {
    pub index: usize,
    /// `<sweep>-<index>-<short key><value>-...`: readable and unique within the sweep.
    pub name: String,
    /// The values that vary across the sweep, in axis order.
    pub varied: Vec<(String, Value)>,
    /// `dot.path=value` strings for the recipe loader: `set` first, then the varied values.
    pub overrides: Vec<String>,
}

/// All members of `spec`, in order.
pub fn expand(spec: &SweepSpec) -> Vec<MemberSpec> {
    let zip_len = spec.zip.first().map_or(1, |a| a.values.len());
    let seeds: Vec<Option<u64>> = if spec.seeds.is_empty() {
        vec![None]
    } else {
        spec.seeds.iter().copied().map(Some).collect()
    };
    let mut members = Vec::with_capacity(spec.member_count());
    for grid_point in grid_points(spec) {
        for z in 0..zip_len {
            for seed in &seeds {
                let mut varied = grid_point.clone();
                varied.extend(
                    spec.zip
                        .iter()
                        .map(|a| (a.key.clone(), a.values[z].clone())),
                );
                if let Some(seed) = seed {
                    varied.push((SEED_KEY.to_owned(), Value::from(*seed)));
                }
                let index = members.len();
                members.push(MemberSpec {
                    index,
                    name: member_name(&spec.name, index, &varied),
                    overrides: spec
                        .set
                        .iter()
                        .chain(&varied)
                        .map(|(k, v)| override_string(k, v))
                        .collect(),
                    varied,
                });
            }
        }
    }
    members
}

fn grid_points(spec: &SweepSpec) -> Vec<Vec<(String, Value)>> {
    let mut points = vec![Vec::new()];
    for axis in &spec.grid {
        points = points
            .into_iter()
            .flat_map(|point| {
                axis.values.iter().map(move |value| {
                    let mut next = point.clone();
                    next.push((axis.key.clone(), value.clone()));
                    next
                })
            })
            .collect();
    }
    points
}

/// `key=value` with the value as JSON, which the loader reads as YAML flow.
pub fn override_string(key: &str, value: &Value) -> String {
    format!("{key}={value}")
}

fn member_name(sweep: &str, index: usize, varied: &[(String, Value)]) -> String {
    let mut name = format!("{sweep}-{index:03}");
    for (key, value) in varied {
        name.push('-');
        name.push_str(short_key(key));
        name.push_str(&short_value(value));
    }
    name
}

/// A short label for a recipe key: Megatron's abbreviations where there is one, else the last
/// path segment.
pub fn short_key(key: &str) -> &str {
    let last = key.rsplit('.').next().unwrap_or(key);
    match key {
        "parallel.tensor" => "tp",
        "parallel.pipeline" => "pp",
        "parallel.virtual_pipeline" => "vpp",
        "parallel.context" => "cp",
        "parallel.expert" => "ep",
        "parallel.expert_tensor" => "etp",
        "parallel.data" => "dp",
        "training.micro_batch_size" => "mbs",
        "training.global_batch_size" => "gbs",
        "training.seed" => "s",
        "model.num_layers" => "L",
        "model.hidden_size" => "h",
        "model.num_attention_heads" => "heads",
        "model.seq_length" => "seq",
        _ => last,
    }
}

/// A recipe value as people write it: `3e-4`, `128`, `cosine`, JSON for the rest.
pub(crate) fn value_text(value: &Value) -> String {
    match value {
        Value::Number(n) if n.is_f64() => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            if x != 0.0 && (x.abs() < 1e-2 || x.abs() >= 1e5) {
                format!("{x:e}")
            } else {
                format!("{x}")
            }
        }
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A value as it reads in a name: `3e-4`, `128`, `cosine`, only `[A-Za-z0-9.+-]`.
pub fn short_value(value: &Value) -> String {
    value_text(value)
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn spec(text: &str) -> SweepSpec {
        SweepSpec::parse(Path::new("s.yaml"), text).unwrap()
    }

    #[test]
    fn grid_times_zip_times_seeds_in_nested_loop_order() {
        let spec = spec(
            "sweep:\n  name: lr-scan\n  base: b.yaml\n  set: { training.train_iters: 200 }\n  \
             grid: { training.optimizer.lr: [3.0e-4, 1.0e-3], parallel.tensor: [1, 2] }\n  \
             zip: { model.num_layers: [2, 4], model.hidden_size: [128, 256] }\n  seeds: [1, 2]\n",
        );
        let members = expand(&spec);
        assert_eq!(members.len(), 16);
        let names: Vec<_> = members.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names[0], "lr-scan-000-lr3e-4-tp1-L2-h128-s1");
        assert_eq!(names[1], "lr-scan-001-lr3e-4-tp1-L2-h128-s2");
        assert_eq!(names[2], "lr-scan-002-lr3e-4-tp1-L4-h256-s1");
        assert_eq!(names[4], "lr-scan-004-lr3e-4-tp2-L2-h128-s1");
        assert_eq!(names[8], "lr-scan-008-lr1e-3-tp1-L2-h128-s1");
        assert_eq!(names[15], "lr-scan-015-lr1e-3-tp2-L4-h256-s2");
        assert_eq!(
            members[15].overrides,
            vec![
                "training.train_iters=200",
                "training.optimizer.lr=0.001",
                "parallel.tensor=2",
                "model.num_layers=4",
                "model.hidden_size=256",
                "training.seed=2",
            ]
        );
        let mut unique = names.clone();
        unique.dedup();
        assert_eq!(unique.len(), names.len());
    }

    #[test]
    fn no_axes_gives_the_base_alone() {
        let members = expand(&spec(
            "sweep:\n  name: one\n  base: b.yaml\n  set: { a.b: x }\n",
        ));
        assert_eq!(members.len(), 1);
        assert_eq!(members[0].name, "one-000");
        assert_eq!(members[0].overrides, vec![r#"a.b="x""#]);
    }

    #[test]
    fn values_read_well_in_names() {
        assert_eq!(short_value(&serde_json::json!(0.5)), "0.5");
        assert_eq!(short_value(&serde_json::json!(1.0e-3)), "1e-3");
        assert_eq!(short_value(&serde_json::json!(256)), "256");
        assert_eq!(short_value(&serde_json::json!("a b/c")), "a_b_c");
        assert_eq!(short_value(&serde_json::json!(true)), "true");
    }
}
