//! The recipe's semantic rules: everything that can be checked without knowing the cluster.
//! (The parallel-layout rules live in the planner and plug in through the same [`Finding`].)
//!
//! Each rule names the key to blame and a concrete fix. They run on the typed recipe, after the
//! schema check, so they can rely on types and ranges; they never stop at the first problem.

mod attention;
mod data;
mod mla;
mod model;
mod training;

use crate::{Finding, Recipe};

/// Every semantic problem of a (schema-valid) recipe.
pub fn check_rules(recipe: &Recipe) -> Vec<Finding> {
    let mut findings = Vec::new();
    model::check(recipe, &mut findings);
    attention::check(recipe, &mut findings);
    mla::check(recipe, &mut findings);
    training::check(recipe, &mut findings);
    data::check(recipe, &mut findings);
    findings
}

#[cfg(test)]
pub(crate) mod fixture {
    use crate::Recipe;

    /// A small valid recipe for rule tests to break one field at a time.
    pub(crate) fn recipe() -> Recipe {
        let json = serde_json::json!({
            "version": 2,
            "name": "t",
            "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32},
            "training": {"micro_batch_size": 2, "global_batch_size": 8, "train_iters": 100},
            "data": {
                "tokenizer": {"type": "gpt2-bpe", "vocab_file": "v.json", "merge_file": "m.txt"},
                "blend": [{"path": "d.jsonl"}]
            }
        });
        serde_json::from_value(json).expect("fixture recipe is valid")
    }

    /// The findings of one rule module's `check` on `recipe`.
    pub(crate) fn run(
        check: fn(&Recipe, &mut Vec<crate::Finding>),
        recipe: &Recipe,
    ) -> Vec<crate::Finding> {
        let mut out = Vec::new();
        check(recipe, &mut out);
        out
    }

    pub(crate) fn codes(findings: &[crate::Finding]) -> Vec<&str> {
        findings.iter().map(|f| f.code.as_str()).collect()
    }
}
