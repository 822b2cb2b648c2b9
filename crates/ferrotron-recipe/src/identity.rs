//! A recipe's identity: one hash, computed one way, wherever a run records which recipe it ran
//! (the run manifest, every checkpoint's manifest, a sweep member's name). The hash is of the
//! JSON with every object's keys sorted, so it depends on the values alone, not on field order
//! or on how the YAML was laid out.

use serde::Serialize;
use serde_json::Value;

use crate::Recipe;

impl Recipe {
    /// blake3 (hex) of the recipe's canonical JSON; see [`canonical_hash`].
    pub fn content_hash(&self) -> String {
        canonical_hash(self)
    }
}

/// blake3 (hex) of `value` as canonical JSON: any serializable value (a recipe, a plan, a
/// recipe already turned into JSON) hashes the same however its fields are ordered.
pub fn canonical_hash<T: Serialize + ?Sized>(value: &T) -> String {
    let value = serde_json::to_value(value).expect("recipes and plans serialize to JSON");
    blake3::hash(canonical_json(&value).as_bytes())
        .to_hex()
        .to_string()
}

/// `value` as compact JSON with object keys sorted at every level.
pub fn canonical_json(value: &Value) -> String {
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<_> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                Value::Object(
                    entries
                        .into_iter()
                        .map(|(k, v)| (k.clone(), sorted(v)))
                        .collect(),
                )
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(value).to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_hash_ignores_key_order_and_sees_every_value() {
        let a = json!({"a": 1, "b": {"c": [1, 2], "d": null}});
        let b = json!({"b": {"d": null, "c": [1, 2]}, "a": 1});
        assert_eq!(canonical_hash(&a), canonical_hash(&b));
        assert_ne!(canonical_hash(&a), canonical_hash(&json!({"a": 1})));
        assert_ne!(
            canonical_hash(&a),
            canonical_hash(&json!({"a": 1, "b": {"c": [2, 1], "d": null}}))
        );
        assert_eq!(canonical_json(&b), r#"{"a":1,"b":{"c":[1,2],"d":null}}"#);
    }

    /// A key added with a default is left out of the serialized recipe while it has that
    /// default: recipes written before it existed keep their hash.
    #[test]
    fn a_default_eval_batches_keeps_the_hash_of_a_recipe_without_it() {
        let recipe = crate::rules::fixture::recipe();
        assert_eq!(recipe.training.eval_batches, crate::EvalBatches::Advance);
        let json = serde_json::to_value(&recipe).expect("serializes");
        assert!(json["training"].get("eval_batches").is_none(), "{json}");
        let mut fixed = recipe.clone();
        fixed.training.eval_batches = crate::EvalBatches::Fixed;
        assert_ne!(fixed.content_hash(), recipe.content_hash());
        let json = serde_json::to_value(&fixed).expect("serializes");
        assert_eq!(json["training"]["eval_batches"], "fixed");
    }

    /// Keys added after recipes were hashed stay out of the serialized recipe at their
    /// defaults: the backend's paths, asynchronous saves, the optimizer states' dtypes.
    #[test]
    fn later_keys_at_their_defaults_keep_the_hash() {
        let recipe = crate::rules::fixture::recipe();
        let json = serde_json::to_value(&recipe).expect("serializes");
        assert_eq!(
            json["runtime"],
            serde_json::json!({"backend": "cpu"}),
            "{json}"
        );
        assert!(json["checkpoint"].get("async_save").is_none(), "{json}");
        let optimizer = &json["training"]["optimizer"];
        for key in [
            "use_precision_aware_optimizer",
            "main_grads_dtype",
            "exp_avg_dtype",
            "exp_avg_sq_dtype",
            "optimizer_cpu_offload",
            "optimizer_offload_fraction",
        ] {
            assert!(optimizer.get(key).is_none(), "{key}: {json}");
        }
        let mut composed = recipe.clone();
        composed.runtime.fused_attention = false;
        assert_ne!(composed.content_hash(), recipe.content_hash());
        let json = serde_json::to_value(&composed).expect("serializes");
        assert_eq!(json["runtime"]["fused_attention"], false);
    }
}
