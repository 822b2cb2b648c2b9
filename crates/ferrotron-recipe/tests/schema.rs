//! The committed schema and the shipped recipes, checked the way editors and users meet them.
//!
//! The schema file is what yaml-language-server reads from each recipe's `$schema` line, so it
//! must equal what the types generate; every recipe must pass it both as written (by the
//! independent `jsonschema` validator) and through the loader (types and semantic rules).

use std::path::{Path, PathBuf};

use ferrotron_recipe::{LoadOptions, json_schema_pretty, load};
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn committed_schema() -> Value {
    let text = std::fs::read_to_string(repo().join("schema/recipe.schema.json"))
        .expect("schema/recipe.schema.json is committed");
    serde_json::from_str(&text).expect("committed schema is JSON")
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("recipes directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// A base recipe is a fragment: check types, enums, ranges and keys but not required keys.
fn without_required(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            map.remove("required");
            map.values_mut().for_each(without_required);
        }
        Value::Array(items) => items.iter_mut().for_each(without_required),
        _ => {}
    }
}

fn schema_errors(schema: &Value, file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).expect("readable recipe");
    let instance: Value = serde_saphyr::from_str(&text).expect("recipe parses as YAML");
    let validator = jsonschema::validator_for(schema).expect("schema compiles");
    validator
        .iter_errors(&instance)
        .map(|e| format!("{}: {} at {}", file.display(), e, e.instance_path()))
        .collect()
}

#[test]
fn committed_schema_is_up_to_date() {
    let committed = std::fs::read_to_string(repo().join("schema/recipe.schema.json"))
        .expect("schema/recipe.schema.json is committed");
    assert!(
        committed == json_schema_pretty(),
        "schema/recipe.schema.json is stale: run `recipe schema > schema/recipe.schema.json`"
    );
}

#[test]
fn every_recipe_declares_the_schema_for_editors() {
    let recipes = repo().join("recipes");
    for (dir, reference) in [
        (recipes.clone(), "../schema/recipe.schema.json"),
        (recipes.join("base"), "../../schema/recipe.schema.json"),
    ] {
        for file in yaml_files(&dir) {
            let text = std::fs::read_to_string(&file).expect("readable");
            let line = format!("# yaml-language-server: $schema={reference}");
            assert!(text.contains(&line), "{} lacks `{line}`", file.display());
            assert!(dir.join(reference).exists());
        }
    }
}

#[test]
fn recipes_as_written_pass_the_committed_schema() {
    let schema = committed_schema();
    let mut errors = Vec::new();
    let top = yaml_files(&repo().join("recipes"));
    assert!(top.len() >= 9, "the presets are missing: {top:?}");
    for file in &top {
        errors.extend(schema_errors(&schema, file));
    }
    let mut fragment = schema.clone();
    without_required(&mut fragment);
    for file in yaml_files(&repo().join("recipes/base")) {
        errors.extend(schema_errors(&fragment, &file));
    }
    assert!(errors.is_empty(), "{errors:#?}");
}

#[test]
fn recipes_load_through_the_types_and_resolve_to_schema_valid_recipes() {
    let schema = committed_schema();
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    for file in yaml_files(&repo().join("recipes")) {
        let loaded = match load(&file, &LoadOptions::default()) {
            Ok(loaded) => loaded,
            Err(errors) => panic!("{}: {errors:?}", file.display()),
        };
        let resolved = serde_json::to_value(loaded.recipe.with_derived_defaults()).expect("json");
        let problems: Vec<String> = validator
            .iter_errors(&resolved)
            .map(|e| e.to_string())
            .collect();
        assert!(problems.is_empty(), "{}: {problems:?}", file.display());
    }
}

#[test]
fn presets_carry_the_published_shapes() {
    let get = |name: &str| {
        load(&repo().join("recipes").join(name), &LoadOptions::default())
            .unwrap_or_else(|e| panic!("{name}: {e:?}"))
            .recipe
    };
    let tiny = get("shakespeare-tiny.yaml");
    assert_eq!(
        (
            tiny.model.num_layers,
            tiny.model.hidden_size,
            tiny.model.num_attention_heads,
            tiny.model.seq_length
        ),
        (4, 64, 4, 64)
    );
    assert!(
        tiny.data.blend[0]
            .path
            .ends_with("recipes/data/shakespeare.jsonl")
    );
    assert!(
        Path::new(&tiny.data.blend[0].path).exists(),
        "the shipped corpus resolves"
    );
    let vocab = tiny.data.tokenizer.vocab_file.expect("vocab");
    assert!(
        Path::new(&vocab).exists(),
        "{vocab} resolves from the base file's directory"
    );

    let llama = get("llama3-8b.yaml");
    assert_eq!(
        (
            llama.model.num_layers,
            llama.model.hidden_size,
            llama.model.ffn_hidden_size,
            llama.model.num_query_groups
        ),
        (32, 4096, Some(14336), Some(8))
    );
    let big = get("llama3.1-405b.yaml");
    assert_eq!((big.model.num_layers, big.model.hidden_size), (126, 16384));
    let mixtral = get("mixtral-8x7b.yaml");
    let moe = mixtral.model.moe.expect("mixtral is MoE");
    assert_eq!((moe.num_experts, moe.router_topk), (8, 2));

    // DeepSeek-V3: multi-latent attention, three dense layers (Megatron's pattern string),
    // 256 sigmoid-routed experts in 8 groups with the bias, scaling 2.5 and a shared expert.
    let deepseek = get("deepseek-v3.yaml").model;
    let mla = deepseek.mla.expect("multi-latent attention");
    assert_eq!(
        (
            mla.q_lora_rank,
            mla.kv_lora_rank,
            mla.qk_head_dim,
            mla.qk_pos_emb_head_dim,
            mla.v_head_dim
        ),
        (Some(1536), 512, 128, 64, 128)
    );
    let moe_layers = deepseek.moe_layers();
    assert_eq!(moe_layers.len(), 61);
    assert_eq!(moe_layers.iter().position(|&moe| moe), Some(3));
    assert_eq!(deepseek.num_moe_layers(), 58);
    let moe = deepseek.moe.as_ref().expect("DeepSeek-V3 is MoE");
    assert_eq!(
        (
            moe.num_experts,
            moe.router_topk,
            moe.num_groups,
            moe.group_topk,
            moe.router_topk_scaling_factor,
            moe.shared_expert_ffn_hidden_size,
            moe.ffn_hidden_size,
            moe.expert_bias,
            moe.score_function,
        ),
        (
            256,
            8,
            Some(8),
            Some(4),
            Some(2.5),
            Some(2048),
            Some(2048),
            true,
            ferrotron_recipe::ScoreFunction::Sigmoid
        )
    );
    assert_eq!(
        (
            deepseek.ffn_hidden_size,
            deepseek.vocab_size,
            deepseek.qk_layernorm
        ),
        (Some(18432), Some(129280), true)
    );

    // Qwen3-MoE: every layer MoE, 128 softmax experts, top-8 renormalised (norm_topk_prob).
    for (name, layers, hidden, expert_ffn) in [
        ("qwen3-30b-a3b.yaml", 48, 2048, 768),
        ("qwen3-235b-a22b.yaml", 94, 4096, 1536),
    ] {
        let qwen = get(name).model;
        let moe = qwen.moe.as_ref().expect("Qwen3-MoE is MoE");
        assert_eq!(
            (
                qwen.num_layers,
                qwen.hidden_size,
                qwen.num_query_groups,
                qwen.num_moe_layers(),
                moe.num_experts,
                moe.router_topk,
                moe.ffn_hidden_size,
                moe.pre_softmax,
                qwen.qk_layernorm
            ),
            (
                layers,
                hidden,
                Some(4),
                layers,
                128,
                8,
                Some(expert_ffn),
                false,
                true
            ),
            "{name}"
        );
    }
}
