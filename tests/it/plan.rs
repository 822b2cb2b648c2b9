//! End-to-end tests of `recipe plan` (the real binary, real files).

use std::process::{Command, Output};

use serde_json::Value;

use crate::common::repo;

/// Runs `recipe plan ARGS` from the repository root, so recipe paths print relative.
fn plan(args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_recipe"));
    command.current_dir(repo()).arg("plan").args(args);
    for (key, _) in std::env::vars() {
        if key.starts_with("FERROTRON_") {
            command.env_remove(key);
        }
    }
    command.output().expect("the recipe binary runs")
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "recipe plan failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).expect("utf-8 output")
}

fn json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["--format", "json"]);
    serde_json::from_str(&stdout(&plan(&all))).expect("valid JSON")
}

fn presets() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(repo().join("recipes"))
        .expect("recipes/ exists")
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            name.ends_with(".yaml").then(|| format!("recipes/{name}"))
        })
        .collect();
    names.sort();
    names
}

#[test]
fn every_preset_plans() {
    let presets = presets();
    assert!(presets.len() >= 9, "{presets:?}");
    for preset in presets {
        let plan = json(&[&preset]);
        let world = plan["world_size"].as_u64().expect("world_size");
        let d = &plan["degrees"];
        let product: u64 = ["tp", "pp", "cp", "dp"]
            .iter()
            .map(|k| d[k].as_u64().expect("degree"))
            .product();
        assert_eq!(product, world, "{preset}");
        assert_eq!(plan["ranks"].as_array().map(Vec::len), Some(world as usize));
        let stages = plan["stages"].as_array().expect("stages");
        let layers: u64 = stages
            .iter()
            .map(|s| s["num_layers"].as_u64().unwrap_or(0))
            .sum();
        assert_eq!(
            Some(layers),
            plan["recipe"]["model"]["num_layers"].as_u64(),
            "{preset}"
        );
        for key in ["weights", "gradients", "optimizer", "activations", "total"] {
            assert!(
                plan["memory"]["per_gpu_bytes"][key].as_u64().is_some(),
                "{preset} {key}"
            );
        }
        for key in ["step_seconds", "tokens_per_second_per_gpu", "mfu"] {
            assert!(
                plan["predicted"][key].as_f64().is_some_and(|v| v > 0.0),
                "{preset} {key}"
            );
        }
        assert!(
            plan["flops_per_iteration"]
                .as_f64()
                .is_some_and(|f| f > 0.0)
        );
        assert_eq!(plan["plan_hash"].as_str().map(str::len), Some(64));
    }
}

#[test]
fn human_report_of_gpt2() {
    insta::assert_snapshot!(stdout(&plan(&["recipes/gpt2-124m.yaml"])));
}

#[test]
fn human_report_of_mixtral() {
    insta::assert_snapshot!(stdout(&plan(&["recipes/mixtral-8x7b.yaml"])));
}

#[test]
fn json_interface_of_llama3_8b() {
    let plan = json(&["recipes/llama3-8b.yaml"]);
    // The keys CI scripts rely on, without the bulky rank table and the embedded recipe.
    let stable = serde_json::json!({
        "world_size": plan["world_size"],
        "degrees": plan["degrees"],
        "num_microbatches": plan["num_microbatches"],
        "padded_vocab_size": plan["padded_vocab_size"],
        "flops_per_iteration": plan["flops_per_iteration"],
        "parameters": plan["parameters"],
        "memory": {"per_gpu_bytes": plan["memory"]["per_gpu_bytes"], "fits": plan["memory"]["fits"]},
        "predicted": {
            "step_seconds": plan["predicted"]["step_seconds"],
            "tokens_per_second_per_gpu": plan["predicted"]["tokens_per_second_per_gpu"],
            "mfu": plan["predicted"]["mfu"],
        },
        "stages": plan["stages"],
        "rank_3": plan["ranks"][3],
        "plan_hash": plan["plan_hash"],
    });
    insta::assert_json_snapshot!(stable);
}

#[test]
fn layout_errors_point_at_the_key_and_exit_1() {
    let output = plan(&["recipes/llama3-8b.yaml", "--set", "parallel.tensor=3"]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("tensor: 3 does not divide num_attention_heads: 32"),
        "{stderr}"
    );
    assert!(stderr.contains("valid: 1, 2, 4, 8, 16, 32"), "{stderr}");
    assert!(stderr.contains("layout::heads-divisible-by-tp"), "{stderr}");
}

#[test]
fn layout_errors_in_the_file_carry_line_and_column() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bad.yaml");
    let gpt2 = repo().join("recipes/data/gpt2");
    let text = format!(
        "version: 2\nname: bad\nmodel:\n  num_layers: 4\n  hidden_size: 128\n  num_attention_heads: 4\n  \
         vocab_size: 1000\n  seq_length: 64\nparallel:\n  tensor: 8\n  data: 2\ntraining:\n  \
         micro_batch_size: 1\n  global_batch_size: 8\n  train_iters: 1\ncluster:\n  nodes: 1\n  \
         gpus_per_node: 8\n  gpu: h100\ndata:\n  tokenizer:\n    vocab_file: {}\n    merge_file: {}\n  blend:\n    - path: {}\n",
        gpt2.join("vocab.json").display(),
        gpt2.join("merges.txt").display(),
        repo().join("recipes/data/shakespeare.jsonl").display()
    );
    std::fs::write(&path, text).expect("writes");
    let output = plan(&[path.to_str().expect("utf-8 path")]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("bad.yaml:10:"), "{stderr}");
    assert!(
        stderr.contains("tensor: 8 does not divide num_attention_heads: 4"),
        "{stderr}"
    );
    assert!(stderr.contains("data: 2 but world 8"), "{stderr}");
}

#[test]
fn cluster_flags_override_the_recipe() {
    let plan = json(&[
        "recipes/gpt2-124m.yaml",
        "--nodes",
        "2",
        "--gpus-per-node",
        "4",
        "--gpu",
        "h200",
    ]);
    assert_eq!(plan["world_size"], 8);
    assert_eq!(plan["cluster"]["gpu"], "h200");
    assert_eq!(plan["hardware"]["peak_flops"], 989e12);
}

#[test]
fn auto_degrees_are_searched_and_explained() {
    let plan = json(&[
        "recipes/llama3-70b.yaml",
        "--set",
        "parallel.tensor=auto",
        "--set",
        "parallel.pipeline=auto",
        "--set",
        "parallel.virtual_pipeline=auto",
        "--set",
        "parallel.context=auto",
        "--set",
        "parallel.data=auto",
    ]);
    let auto = &plan["auto"];
    let top = auto["top"].as_array().expect("top candidates");
    assert!(!top.is_empty());
    assert_eq!(top[0]["degrees"], plan["degrees"]);
    assert!(top[0]["why"].as_str().is_some_and(|w| w.contains("GiB")));
    assert_eq!(plan["memory"]["fits"], true);
    assert_eq!(plan["recipe"]["parallel"]["tensor"], plan["degrees"]["tp"]);
}

#[test]
fn explain_prints_every_term_with_its_formula() {
    let text = stdout(&plan(&["recipes/llama3.1-405b.yaml", "--explain"]));
    for needle in [
        "memory terms",
        "optimizer states",
        "[distributed optimizer]",
        "activations: checkpointed layer inputs",
        "time terms",
        "tensor-parallel collectives",
        "(m + (pp−1)/vpp) · t_microbatch",
        "hardware: H100",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
}

#[test]
fn yaml_output_is_the_same_plan() {
    let text = stdout(&plan(&[
        "recipes/shakespeare-tiny.yaml",
        "--format",
        "yaml",
    ]));
    let hash = json(&["recipes/shakespeare-tiny.yaml"])["plan_hash"].clone();
    let hash = hash.as_str().expect("hash");
    assert!(text.contains(&format!("plan_hash: {hash}")), "{text}");
    assert!(text.contains("world_size: 1"));
}
