//! End-to-end tests of the Hugging Face commands (the real binary): a recipe whose model is not
//! the HF model it starts from is refused with every difference at its line, and a folder whose
//! window no recipe expresses before anything is written; and a trained checkpoint (GPT-2, and a
//! Qwen3 with a window and YaRN) exported, then started from with `checkpoint.init_from` under
//! another tensor parallelism (so the vocabulary is re-padded) and imported with `recipe
//! import`, gives the same logits as the checkpoint it came from (`recipe logits`).

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::common::{recipe, stderr};

#[test]
fn model_sections_that_differ_from_config_json_are_refused_at_their_lines() {
    let output = recipe(&["run", "tests/fixtures/hf/mismatch.yaml"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    insta::assert_snapshot!("init-from-mismatch", stderr(&output));
}

/// A Qwen2 folder whose window is on its second layer only: `recipe import` names what the
/// recipe cannot express (a window is every layer's) and writes nothing.
#[test]
fn a_window_on_some_layers_only_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hf = dir.path().join("qwen2");
    std::fs::create_dir(&hf).expect("mkdir");
    let config = json!({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 41,
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 16,
        "use_sliding_window": true, "sliding_window": 8, "max_window_layers": 1
    });
    std::fs::write(hf.join("config.json"), config.to_string()).expect("write");
    let empty = crate::common::repo().join("tests/fixtures/hf/llama-tiny/model.safetensors");
    std::fs::copy(empty, hf.join("model.safetensors")).expect("copy");
    let out = dir.path().join("imported");
    let path = |p: &Path| p.display().to_string();
    let output = recipe(&["import", &path(&hf), "--out", &path(&out)]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let log = stderr(&output);
    assert!(
        log.contains("error[hf::inexpressible]")
            && log.contains("sliding window of 8 on layers 1 of 2 only; window_size applies"),
        "{log}"
    );
    assert!(!out.exists());
}

const WORDS: u32 = 40;

/// A tiny GPT model section.
fn gpt() -> serde_json::Value {
    json!({"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
           "seq_length": 16, "max_position_embeddings": 16,
           "hidden_dropout": 0.0, "attention_dropout": 0.0})
}

/// A tiny Qwen3-style model section: q/k norms, a head size of its own, YaRN and a window, on
/// sequences longer than the window and the original context.
fn qwen3() -> serde_json::Value {
    json!({"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "num_query_groups": 2,
           "kv_channels": 16, "ffn_hidden_size": 64, "seq_length": 16,
           "position_embedding": "rope", "normalization": "rmsnorm", "activation": "swiglu",
           "tie_embeddings": false, "add_bias_linear": false, "qk_layernorm": true,
           "window_size": [5, 0],
           "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4},
           "hidden_dropout": 0.0, "attention_dropout": 0.0})
}

/// Tokenizer, corpus and a tiny recipe of `model` (as JSON, which is YAML) in `dir`.
fn write_recipe(
    dir: &Path,
    name: &str,
    model: &serde_json::Value,
    tp: u32,
    extra_checkpoint: serde_json::Value,
) -> PathBuf {
    let mut vocab = serde_json::Map::new();
    vocab.insert("<|endoftext|>".into(), json!(0));
    for w in 0..WORDS {
        vocab.insert(format!("w{w}"), json!(w + 1));
    }
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"}
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).expect("write");
    let corpus: String = (0..40)
        .map(|line| {
            let words: Vec<String> = (0..40)
                .map(|i| format!("w{}", (line * 5 + i * 3) % WORDS))
                .collect();
            json!({"text": words.join(" ")}).to_string() + "\n"
        })
        .collect();
    std::fs::write(dir.join("corpus.jsonl"), corpus).expect("write");
    let mut checkpoint = json!({"dir": dir.join(name).join("checkpoints")});
    if let (Some(base), Some(extra)) = (checkpoint.as_object_mut(), extra_checkpoint.as_object()) {
        base.extend(extra.clone());
    }
    let recipe = json!({
        "version": 2, "name": name,
        "model": model,
        "precision": {"dtype": "fp32"},
        "parallel": {"tensor": tp, "pipeline": 1, "data": 1},
        "training": {"micro_batch_size": 2, "global_batch_size": 2, "train_iters": 2,
                     "log_interval": 1, "eval_interval": 0,
                     "optimizer": {"lr": 0.01}, "schedule": {"decay": "constant", "warmup_iters": 0}},
        "data": {"tokenizer": {"type": "hf", "file": dir.join("tokenizer.json")},
                 "blend": [{"path": dir.join("corpus.jsonl")}], "split": "100,0,0",
                 "cache_dir": dir.join("cache")},
        "checkpoint": checkpoint,
        "cluster": {"nodes": 1, "gpus_per_node": tp, "gpu": "cpu"},
        "runtime": {"backend": "cpu"}
    });
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, recipe.to_string()).expect("write");
    path
}

fn ok(args: &[&str]) -> String {
    let output = recipe(args);
    assert_eq!(
        output.status.code(),
        Some(0),
        "recipe {args:?}:\n{}",
        stderr(&output)
    );
    stderr(&output)
}

/// The real-vocabulary logits of a checkpoint on a fixed batch.
fn logits(dir: &Path, checkpoint: &Path, tag: &str) -> Vec<f32> {
    let tokens = dir.join("tokens.json");
    std::fs::write(
        &tokens,
        json!([[1, 5, 9, 13, 2, 40, 7, 3], [0, 1, 2, 3, 4, 5, 6, 7]]).to_string(),
    )
    .expect("write");
    let out = dir.join(format!("{tag}.safetensors"));
    let path = |p: &Path| p.display().to_string();
    ok(&[
        "logits",
        &path(checkpoint),
        "--tokens",
        &path(&tokens),
        "--out",
        &path(&out),
    ]);
    let bytes = std::fs::read(&out).expect("logits written");
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let view = file.tensor("logits").expect("a logits tensor");
    let shape = view.shape().to_vec();
    assert_eq!(shape[..2], [2, 8]);
    let values: Vec<f32> = view
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    values
        .chunks(shape[2])
        .flat_map(|row| row[..=WORDS as usize].to_vec())
        .collect()
}

fn assert_close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    assert!(worst < 1e-5, "logits differ by {worst}");
}

#[test]
fn exported_weights_start_a_tp2_run_and_import_with_the_same_logits() {
    let dir = tempfile::tempdir().expect("tempdir");
    exported_and_back(dir.path(), &gpt(), "GPT2LMHeadModel");
}

#[test]
fn a_qwen3_with_a_window_and_yarn_exports_and_imports_with_the_same_logits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hf = exported_and_back(dir.path(), &qwen3(), "Qwen3ForCausalLM");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(hf.join("config.json")).expect("read"))
            .expect("JSON");
    assert_eq!(
        (&config["sliding_window"], &config["head_dim"]),
        (&json!(6), &json!(16))
    );
    assert_eq!(config["rope_scaling"]["rope_type"], "yarn");
}

/// In `dir`, train `model` on one rank, export it as `class`, start a tp2 run from the export
/// and import it: both give the trained checkpoint's logits. Returns the exported folder.
fn exported_and_back(dir: &Path, model: &serde_json::Value, class: &str) -> PathBuf {
    let path = |p: &Path| p.display().to_string();
    let trained = write_recipe(dir, "trained", model, 1, json!({}));
    ok(&["run", &path(&trained)]);
    let checkpoints = dir.join("trained/checkpoints");
    let hf = dir.join("hf");
    ok(&[
        "export",
        &path(&checkpoints),
        "--format",
        "hf",
        "--out",
        &path(&hf),
    ]);
    assert!(hf.join("tokenizer.json").is_file() && hf.join("config.json").is_file());
    let reference = logits(dir, &checkpoints, "trained");

    let init = json!({"init_from": {"hf": hf}});
    let continued = write_recipe(dir, "continued", model, 2, init);
    let log = ok(&["run", &path(&continued), "--world-size", "2"]);
    assert!(log.contains(&format!("({class})")), "{log}");
    assert!(log.contains("initialised from"), "{log}");
    assert!(
        log.contains("resumed from") && log.contains("at iteration 0"),
        "{log}"
    );
    let first = dir.join("continued/checkpoints/iter_0000000");
    assert_close(&logits(dir, &first, "continued"), &reference);

    let imported = dir.join("imported");
    ok(&["import", &path(&hf), "--out", &path(&imported)]);
    assert_close(&logits(dir, &imported, "imported"), &reference);
    hf
}
