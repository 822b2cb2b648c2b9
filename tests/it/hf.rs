//! End-to-end tests of the Hugging Face commands (the real binary): a recipe whose model is not
//! the HF model it starts from is refused with every difference at its line; and a trained
//! checkpoint exported, then started from with `checkpoint.init_from` under another tensor
//! parallelism (so the vocabulary is re-padded) and imported with `recipe import`, gives the
//! same logits as the checkpoint it came from (`recipe logits`).

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::common::{recipe, stderr};

#[test]
fn model_sections_that_differ_from_config_json_are_refused_at_their_lines() {
    let output = recipe(&["run", "tests/fixtures/hf/mismatch.yaml"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    insta::assert_snapshot!("init-from-mismatch", stderr(&output));
}

const WORDS: u32 = 40;

/// Tokenizer, corpus and a tiny GPT recipe (as JSON, which is YAML) in `dir`.
fn write_recipe(dir: &Path, name: &str, tp: u32, extra_checkpoint: serde_json::Value) -> PathBuf {
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
        "model": {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
                  "seq_length": 16, "max_position_embeddings": 16,
                  "hidden_dropout": 0.0, "attention_dropout": 0.0},
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
    let dir = dir.path();
    let path = |p: &Path| p.display().to_string();
    let trained = write_recipe(dir, "trained", 1, json!({}));
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
    let continued = write_recipe(dir, "continued", 2, init);
    let log = ok(&["run", &path(&continued), "--world-size", "2"]);
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
}
