//! Property tests of the loader (issue 19): whatever the text, the `extends:` chain or the
//! overrides, loading returns a recipe or located problems — it never panics — and what it
//! returns keeps the rules it promises (the top layer wins, an override sets the value).
//!
//! CI runs a few dozen cases per property; `PROPTEST_CASES=1000000 tools/fuzz.sh` runs a million.

use ferrotron_recipe::{LoadOptions, load, load_str};
use proptest::prelude::*;

const MINIMAL: &str = "version: 2\nname: t\nmodel: {num_layers: 2, hidden_size: 64, num_attention_heads: 4, seq_length: 32}\ntraining: {micro_batch_size: 2, global_batch_size: 8, train_iters: 10}\ndata:\n  tokenizer: {type: gpt2-bpe, vocab_file: v.json, merge_file: m.txt}\n  blend: [{path: d.jsonl}]\n";

/// Cases per property: `PROPTEST_CASES` when set, else a number the 2-core CI affords.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Keys the loader and the rules look at, to aim overrides where they matter.
const KEYS: &[&str] = &[
    "model.num_layers",
    "model.hidden_size",
    "model.num_attention_heads",
    "model.num_query_groups",
    "model.vocab_size",
    "model.seq_length",
    "model.ffn_hidden_size",
    "model.num_experts",
    "training.micro_batch_size",
    "training.global_batch_size",
    "training.train_iters",
    "training.optimizer.lr",
    "parallel.tensor",
    "parallel.pipeline",
    "parallel.context",
    "parallel.expert",
    "data.blend.0.weight",
    "data.split",
    "extends",
    "version",
];

fn yaml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|v| v.to_string()),
        any::<u64>().prop_map(|v| v.to_string()),
        Just("4294967295".to_owned()),
        Just("18446744073709551616".to_owned()),
        any::<f64>().prop_map(|v| v.to_string()),
        prop::sample::select(vec![
            ".nan",
            ".inf",
            "1e400",
            "~",
            "true",
            "[]",
            "{}",
            "auto",
            "!!str 4",
            "*x",
            "&a 1",
            "'",
            "[1, [2, [3]]]",
            "{a: 1}",
            "-0",
            "0x10",
        ])
        .prop_map(str::to_owned),
        "[ -~]{0,12}",
    ]
}

/// One edit of a recipe's text: replace, insert or delete a short run of characters.
fn mutated() -> impl Strategy<Value = String> {
    let alphabet = "[a-z0-9:{}\\[\\],&*!|>#'\" \\n.-]{0,6}";
    (any::<prop::sample::Index>(), 0usize..8, alphabet).prop_map(|(at, cut, insert)| {
        let at = at.index(MINIMAL.len());
        let end = (at + cut).min(MINIMAL.len());
        let (at, end) = (floor(at), floor(end));
        format!("{}{insert}{}", &MINIMAL[..at], &MINIMAL[end..])
    })
}

fn floor(i: usize) -> usize {
    (0..=i)
        .rev()
        .find(|&i| MINIMAL.is_char_boundary(i))
        .unwrap_or(0)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_text_loads_or_is_refused(text in "\\PC{0,300}") {
        let _ = load_str("fuzz.yaml", &text, &LoadOptions::default());
    }

    #[test]
    fn yaml_shaped_text_loads_or_is_refused(text in "[a-z:&*!\\[\\]{}\\- \\n,'\"|>.#0-9]{0,300}") {
        let _ = load_str("fuzz.yaml", &text, &LoadOptions::default());
    }

    #[test]
    fn a_mutated_recipe_loads_or_is_refused(text in mutated()) {
        if let Err(errors) = load_str("fuzz.yaml", &text, &LoadOptions::default()) {
            prop_assert!(!errors.problems().is_empty());
        }
    }

    #[test]
    fn overrides_set_what_they_say_or_are_refused(
        sets in prop::collection::vec((prop::sample::select(KEYS), yaml_value()), 0..4),
    ) {
        let sets: Vec<String> = sets.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let opts = LoadOptions { overrides: &sets, use_env: false };
        match load_str("fuzz.yaml", MINIMAL, &opts) {
            Ok(loaded) => {
                // the last override of num_layers wins
                let last = sets.iter().rev().find_map(|s| s.strip_prefix("model.num_layers="));
                if let Some(value) = last.and_then(|v| v.parse::<u32>().ok()) {
                    prop_assert_eq!(loaded.recipe.model.num_layers, value);
                }
            }
            Err(errors) => prop_assert!(!errors.problems().is_empty()),
        }
    }

    #[test]
    fn the_top_of_an_extends_chain_wins(layers in prop::collection::vec(1u32..1000, 1..6)) {
        let dir = tempfile::tempdir().expect("tempdir");
        let last = layers.len() - 1;
        for (i, layers_value) in layers.iter().enumerate() {
            let text = if i == last {
                MINIMAL.replace("num_layers: 2", &format!("num_layers: {layers_value}"))
            } else {
                format!("extends: l{}.yaml\nmodel:\n  num_layers: {layers_value}\n", i + 1)
            };
            std::fs::write(dir.path().join(format!("l{i}.yaml")), text).expect("write");
        }
        let loaded = load(&dir.path().join("l0.yaml"), &LoadOptions::default());
        match loaded {
            Ok(loaded) => prop_assert_eq!(loaded.recipe.model.num_layers, layers[0]),
            // a layer count the rules refuse (e.g. not divisible by the pipeline) is fine
            Err(errors) => prop_assert!(errors.problems().iter().all(|p| p.code() != "recipe::extends")),
        }
    }
}
