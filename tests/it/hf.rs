//! End-to-end tests of the Hugging Face commands (the real binary): a recipe whose model is not
//! the HF model it starts from is refused with every difference at its line, and a folder whose
//! window no recipe expresses before anything is written; and a trained checkpoint (GPT-2, and a
//! Qwen3 with a window and YaRN) exported, then started from with `checkpoint.init_from` under
//! another tensor parallelism (so the vocabulary is re-padded) and imported with `recipe
//! import`, gives the same logits as the checkpoint it came from (`recipe logits`). And
//! transformers' own tiny Qwen3-MoE and DeepSeek-V3 (crates/ferrotron-hf/tests/fixtures/*-tiny,
//! written by its make_tiny_moe.py with the logits transformers computes) give transformers'
//! logits imported on one rank and started from on tp2·pp2 and on ep2, and the ep2 checkpoint
//! exports as the fixture's own tensors.

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

/// Tensor, pipeline and expert parallel degrees (expert parallelism over as many data-parallel
/// ranks).
type Layout = (u32, u32, u32);

/// Tokenizer, corpus and a tiny recipe of `model` (as JSON, which is YAML) in `dir`, trained at
/// `lr` on `layout`.
fn write_recipe(
    dir: &Path,
    name: &str,
    model: &serde_json::Value,
    (tp, pp, ep): Layout,
    lr: f64,
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
        "parallel": {"tensor": tp, "pipeline": pp, "data": ep, "expert": ep,
                     "sequence_parallel": tp > 1},
        "training": {"micro_batch_size": 2, "global_batch_size": 2 * ep, "train_iters": 2,
                     "log_interval": 1, "eval_interval": 0,
                     "optimizer": {"lr": lr, "weight_decay": 0.0},
                     "schedule": {"decay": "constant", "warmup_iters": 0}},
        "data": {"tokenizer": {"type": "hf", "file": dir.join("tokenizer.json")},
                 "blend": [{"path": dir.join("corpus.jsonl")}], "split": "100,0,0",
                 "cache_dir": dir.join("cache")},
        "checkpoint": checkpoint,
        "cluster": {"nodes": 1, "gpus_per_node": tp * pp * ep, "gpu": "cpu"},
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
    assert_within(a, b, 1e-5);
}

fn assert_within(a: &[f32], b: &[f32], tolerance: f32) {
    assert_eq!(a.len(), b.len());
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    assert!(worst < tolerance, "logits differ by {worst}");
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
    let trained = write_recipe(dir, "trained", model, (1, 1, 1), 0.01, json!({}));
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
    let continued = write_recipe(dir, "continued", model, (2, 1, 1), 0.01, init);
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

/// transformers' tiny Qwen3MoeForCausalLM: q/k norms, 8 experts top-2 with normalised
/// probabilities, layers 1 and 3 dense (`mlp_only_layers`, Megatron's `layer_freq: 2`).
fn qwen3_moe_tiny() -> serde_json::Value {
    json!({"num_layers": 4, "hidden_size": 16, "num_attention_heads": 4, "num_query_groups": 2,
           "kv_channels": 8, "ffn_hidden_size": 32, "seq_length": 16,
           "max_position_embeddings": 16, "position_embedding": "rope", "rotary_base": 1e6,
           "normalization": "rmsnorm", "norm_epsilon": 1e-6, "activation": "swiglu",
           "tie_embeddings": false, "add_bias_linear": false, "qk_layernorm": true,
           "moe": {"num_experts": 8, "router_topk": 2, "ffn_hidden_size": 8, "layer_freq": 2},
           "hidden_dropout": 0.0, "attention_dropout": 0.0})
}

/// transformers' tiny DeepseekV3ForCausalLM: MLA with a query latent and q/k head 6 + 4 rotary
/// against value head 4, YaRN with mscale_all_dim, sigmoid routing over 2 groups of 4 experts
/// with a selection bias, a shared expert, routed_scaling_factor 2.5, one dense first layer.
fn deepseek_v3_tiny() -> serde_json::Value {
    json!({"num_layers": 4, "hidden_size": 16, "num_attention_heads": 2, "ffn_hidden_size": 32,
           "seq_length": 16, "max_position_embeddings": 16, "position_embedding": "rope",
           "rotary_base": 1e4, "normalization": "rmsnorm", "norm_epsilon": 1e-6,
           "activation": "swiglu", "tie_embeddings": false, "add_bias_linear": false,
           "qk_layernorm": true,
           "mla": {"q_lora_rank": 12, "kv_lora_rank": 8, "qk_head_dim": 6,
                   "qk_pos_emb_head_dim": 4, "v_head_dim": 4},
           "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4,
                            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                            "mscale_all_dim": 0.8},
           "moe": {"num_experts": 8, "router_topk": 2, "ffn_hidden_size": 8,
                   "score_function": "sigmoid", "expert_bias": true,
                   "expert_bias_update_rate": 0.0, "num_groups": 2, "group_topk": 1,
                   "shared_expert_ffn_hidden_size": 8, "router_topk_scaling_factor": 2.5,
                   "layer_freq": [0, 1, 1, 1], "load_balancing": "seq_aux_loss"},
           "hidden_dropout": 0.0, "attention_dropout": 0.0})
}

#[test]
fn transformers_qwen3_moe_imports_from_any_layout_with_its_logits() {
    transformers_fixture("qwen3-moe-tiny", &qwen3_moe_tiny(), "Qwen3MoeForCausalLM");
}

#[test]
fn transformers_deepseek_v3_imports_from_any_layout_with_its_logits() {
    let log = transformers_fixture(
        "deepseek-v3-tiny",
        &deepseek_v3_tiny(),
        "DeepseekV3ForCausalLM",
    );
    assert!(
        log.contains("warning[hf::mtp-skipped]")
            && log.contains("1 multi-token prediction layer(s) (6 tensors"),
        "{log}"
    );
}

/// `fixture` (a transformers folder with transformers' logits) imported with `recipe import`,
/// and started from (`checkpoint.init_from`, one step at lr 0, so the checkpoint saved went
/// through the layout's loader and saver) on tp2·pp2 and on ep2: each gives transformers'
/// logits within 1e-4. The ep2 checkpoint exports as the fixture's tensors bit for bit (less
/// any MTP layer) and imports back with the same logits. Returns the import's log.
fn transformers_fixture(fixture: &str, model: &serde_json::Value, class: &str) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path();
    let path = |p: &Path| p.display().to_string();
    let hf = crate::common::repo()
        .join("crates/ferrotron-hf/tests/fixtures")
        .join(fixture);
    let reference = reference_logits(&hf.join("reference_logits.safetensors"));

    let imported = dir.join("imported");
    let log = ok(&["import", &path(&hf), "--out", &path(&imported)]);
    assert!(log.contains(&format!("({class})")), "{log}");
    assert_within(&logits(dir, &imported, "imported"), &reference, 1e-4);

    let mut last = PathBuf::new();
    for (name, layout) in [("tp2pp2", (2, 2, 1)), ("ep2", (1, 1, 2))] {
        let init = json!({"init_from": {"hf": hf}});
        let recipe = write_recipe(dir, name, model, layout, 0.0, init);
        let world = (layout.0 * layout.1 * layout.2).to_string();
        ok(&[
            "run",
            &path(&recipe),
            "--world-size",
            &world,
            "--set",
            "training.train_iters=1",
        ]);
        last = dir.join(name).join("checkpoints/iter_0000001");
        assert_within(&logits(dir, &last, name), &reference, 1e-4);
    }

    let exported = dir.join("exported");
    ok(&[
        "export",
        &path(&last),
        "--format",
        "hf",
        "--out",
        &path(&exported),
    ]);
    let ours = tensors(&exported.join("model.safetensors"));
    let theirs = tensors(&hf.join("model.safetensors"));
    let layers = model["num_layers"].as_u64().expect("num_layers");
    let mtp = format!("model.layers.{layers}.");
    let expected: Vec<_> = theirs
        .iter()
        .filter(|(name, _)| !name.starts_with(&mtp))
        .collect();
    assert_eq!(ours.iter().collect::<Vec<_>>(), expected);
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(exported.join("config.json")).expect("read"))
            .expect("JSON");
    assert_eq!(config["architectures"], json!([class]));
    let back = dir.join("back");
    ok(&["import", &path(&exported), "--out", &path(&back)]);
    assert_within(&logits(dir, &back, "back"), &reference, 1e-4);
    log
}

/// Every tensor of a safetensors file: name → (shape, the bits of its f32 values).
fn tensors(file: &Path) -> std::collections::BTreeMap<String, (Vec<usize>, Vec<u32>)> {
    let bytes = std::fs::read(file).expect("read");
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    file.tensors()
        .into_iter()
        .map(|(name, view)| {
            let bits = view
                .data()
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (name, (view.shape().to_vec(), bits))
        })
        .collect()
}

/// transformers' logits `[2, 8, 41]`, flattened as [`logits`] returns ours.
fn reference_logits(file: &Path) -> Vec<f32> {
    let bytes = std::fs::read(file).expect("read");
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let view = file.tensor("logits").expect("a logits tensor");
    assert_eq!(view.shape(), [2, 8, WORDS as usize + 1]);
    view.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}
