//! Export → import round trips, bit for bit, for every family (LLaMA also with scaled RoPE,
//! Qwen2 with its q/k/v biases, a window and YaRN, Qwen3 with q/k norms and a head size of its
//! own, Mistral with a window, Qwen3-MoE with dense layers between its MoE ones, DeepSeek-V3 with
//! multi-latent attention, DeepSeek's routing and a dense first layer) from a one-rank and a
//! tp2·pp2 checkpoint, the MoE families also from an ep2 one: a tiny model trained one step on
//! thread ranks, exported as transformers files,
//! imported back; every global tensor must come back with the same bits (the vocabulary rows
//! of the real vocabulary: padding rows are not part of a transformers model), and the import
//! must load into the run's layout with its vocabulary re-padded.

use std::path::{Path, PathBuf};

use ferrotron_hf::{ExportOptions, HfModel, INDEX_FILE, OutDtype, export};
use ferrotron_parallel::ShardSpec;
use ferrotron_plan::{Plan, PlanOptions};
use ferrotron_recipe::Recipe;
use ferrotron_train::checkpoint::{CheckpointStore, ModelShape, ShardKind, ShardedCheckpoint};
use ferrotron_train::{CpuTrainBackend, RunOptions, StopFlag, train_threads};
use serde_json::{Value, json};

const WORDS: u32 = 40;

fn write_data(dir: &Path) {
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
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).expect("write tokenizer");
    let lines: String = (0..40)
        .map(|line| {
            let text: Vec<String> = (0..40)
                .map(|i| format!("w{}", (line * 7 + i * 3) % WORDS))
                .collect();
            json!({ "text": text.join(" ") }).to_string() + "\n"
        })
        .collect();
    std::fs::write(dir.join("corpus.jsonl"), lines).expect("write corpus");
}

fn model(family: &str) -> Value {
    let base = json!({
        "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 16,
        "max_position_embeddings": 16, "hidden_dropout": 0.0, "attention_dropout": 0.0
    });
    let llama = json!({
        "ffn_hidden_size": 64, "num_query_groups": 2, "position_embedding": "rope",
        "normalization": "rmsnorm", "activation": "swiglu", "tie_embeddings": false,
        "add_bias_linear": false
    });
    let mut model = base;
    if family != "gpt2" {
        merge(&mut model, llama);
    }
    if family == "mixtral" {
        merge(
            &mut model,
            json!({"moe": {"num_experts": 4, "router_topk": 2, "ffn_hidden_size": 48}}),
        );
    }
    // today's dense families, each with what sets it apart on (sequences of 16 tokens:
    // longer than the window of 8 and the scaled RoPE's original context of 8)
    let scaled = |scaling: Value| json!({"rope_scaling": scaling});
    match family {
        "llama3" => merge(
            &mut model,
            scaled(json!({"type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8})),
        ),
        "qwen2" => merge(
            &mut model,
            json!({"add_qkv_bias": true, "window_size": [7, 0],
                   "rope_scaling": {"type": "yarn", "factor": 4.0,
                                    "original_max_position_embeddings": 8}}),
        ),
        "qwen3" => merge(
            &mut model,
            json!({"qk_layernorm": true, "kv_channels": 16,
                   "rope_scaling": {"type": "linear", "factor": 2.0}}),
        ),
        "qwen3-biased" => merge(
            &mut model,
            json!({"qk_layernorm": true, "add_bias_linear": true}),
        ),
        "mistral" => merge(&mut model, json!({"window_size": [7, 0]})),
        "gpt2-qkv-bias" => merge(
            &mut model,
            json!({"add_bias_linear": false, "add_qkv_bias": true}),
        ),
        _ => {}
    }
    if family == "deepseek" {
        let moe = json!({"num_experts": 4, "router_topk": 2, "shared_expert_ffn_hidden_size": 32});
        merge(&mut model, json!({ "moe": moe }));
    }
    match family {
        "qwen3-moe" => merge(
            &mut model,
            json!({"qk_layernorm": true, "kv_channels": 16,
                   "moe": {"num_experts": 4, "router_topk": 2, "ffn_hidden_size": 24,
                           "pre_softmax": true, "layer_freq": [0, 1]}}),
        ),
        "deepseek-v3" => merge(
            &mut model,
            json!({"qk_layernorm": true, "norm_epsilon": 1e-6, "num_query_groups": 4,
                   "mla": {"q_lora_rank": 24, "kv_lora_rank": 16, "qk_head_dim": 8,
                           "qk_pos_emb_head_dim": 4, "v_head_dim": 6},
                   "rope_scaling": {"type": "yarn", "factor": 4.0,
                                    "original_max_position_embeddings": 8,
                                    "mscale": 1.0, "mscale_all_dim": 0.8},
                   "moe": {"num_experts": 8, "router_topk": 2, "ffn_hidden_size": 12,
                           "score_function": "sigmoid", "expert_bias": true,
                           "num_groups": 2, "group_topk": 1,
                           "shared_expert_ffn_hidden_size": 24,
                           "router_topk_scaling_factor": 2.5, "layer_freq": [0, 1]}}),
        ),
        _ => {}
    }
    if family == "deepseek-v3-q-proj" {
        merge(&mut model, self::model("deepseek-v3"));
        model["mla"]
            .as_object_mut()
            .expect("mla")
            .remove("q_lora_rank");
    }
    model
}

fn merge(base: &mut Value, extra: Value) {
    if let (Value::Object(base), Value::Object(extra)) = (base, extra) {
        base.extend(extra);
    }
}

/// A plan of the tiny `family` model for tp × pp × ep ranks (expert parallelism over as many
/// data-parallel ranks), data and checkpoints under `dir`.
fn plan(dir: &Path, family: &str, tp: u32, pp: u32, ep: u32) -> Plan {
    let mut model = model(family);
    // the same padded vocabulary (128) at every tp
    merge(
        &mut model,
        json!({"make_vocab_size_divisible_by": 128 / tp}),
    );
    let recipe = json!({
        "version": 2, "name": format!("hf-{family}"), "model": model,
        "precision": {"dtype": "fp32"},
        "parallel": {"tensor": tp, "pipeline": pp, "data": ep, "expert": ep,
                     "sequence_parallel": tp > 1},
        "training": {
            "micro_batch_size": 2, "global_batch_size": 4 * ep, "train_iters": 1, "log_interval": 1,
            "eval_interval": 0, "seed": 7, "optimizer": {"lr": 0.01},
            "schedule": {"decay": "constant", "warmup_iters": 0}
        },
        "data": {
            "tokenizer": {"type": "hf", "file": dir.join("tokenizer.json")},
            "blend": [{"path": dir.join("corpus.jsonl")}],
            "split": "100,0,0", "cache_dir": dir.join("cache")
        },
        "checkpoint": {"dir": dir.join("checkpoints")},
        "cluster": {"nodes": 1, "gpus_per_node": tp * pp * ep, "gpu": "cpu"},
        "runtime": {"backend": "cpu"}
    });
    let recipe: Recipe = serde_json::from_value(recipe).expect("the test recipe parses");
    let options = PlanOptions {
        cluster: None,
        vocab_size: WORDS + 1,
    };
    ferrotron_plan::plan(&recipe, &options).unwrap_or_else(|f| panic!("plans: {f:?}"))
}

/// Train one step of `family` on tp × pp × ep thread ranks; the committed checkpoint.
fn trained(dir: &Path, family: &str, tp: u32, pp: u32, ep: u32) -> (Plan, PathBuf) {
    write_data(dir);
    let plan = plan(dir, family, tp, pp, ep);
    let options = RunOptions {
        run_dir: dir.join("run"),
        stop: StopFlag::default(),
        exit_interval: None,
        announce: |_| {},
        memory: ferrotron_telemetry::MemoryProbe::process(),
    };
    let tokenizer = ferrotron_data::Tokenizer::from_recipe(&plan.recipe.data.tokenizer)
        .expect("the test tokenizer loads");
    let summary =
        train_threads::<CpuTrainBackend>(&plan, &tokenizer, &options, &Default::default())
            .expect("trains");
    (plan, summary.checkpoint.expect("a checkpoint at the end"))
}

/// The values of `name` restricted to the real vocabulary where it is a vocabulary tensor.
fn real_rows(name: &str, shape: &[usize], values: &[f32], vocab: usize) -> Vec<u32> {
    let kept: Vec<f32> = match name {
        "embedding.weight" => values[..vocab * shape[1]].to_vec(),
        "output_layer.weight" => values
            .chunks(shape[1])
            .flat_map(|row| row[..vocab].to_vec())
            .collect(),
        _ => values.to_vec(),
    };
    kept.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn inexpressible_models_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, checkpoint) = trained(dir.path(), "deepseek", 1, 1, 1);
    let out = dir.path().join("hf");
    let options = ExportOptions {
        dtype: OutDtype::F32,
        max_shard_bytes: u64::MAX,
    };
    // shared experts are DeepSeek-V3's, which then names what else it lacks or computes otherwise
    let err = export(&checkpoint, &out, options).expect_err("refused");
    assert_eq!(
        err.to_string(),
        "DeepseekV3ForCausalLM cannot express this model:\n  \
         model.qk_layernorm: DeepseekV3ForCausalLM always normalises the query and key/value \
         latents\n  \
         model.mla: DeepseekV3ForCausalLM always has multi-latent attention\n  \
         model.moe.score_function: DeepseekV3ForCausalLM routes with sigmoid scores\n  \
         model.moe.expert_bias: DeepseekV3ForCausalLM always adds its selection bias \
         e_score_correction_bias (a zero bias selects as none does)\n  \
         model.moe.shared_expert_ffn_hidden_size: DeepseekV3ForCausalLM has n_shared_experts \
         shared experts of moe_intermediate_size (64) each, and 32 is no multiple of it"
    );
    assert!(!out.exists());
}

#[test]
fn q_k_norms_with_linear_biases_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, checkpoint) = trained(dir.path(), "qwen3-biased", 1, 1, 1);
    let out = dir.path().join("hf");
    let options = ExportOptions {
        dtype: OutDtype::F32,
        max_shard_bytes: u64::MAX,
    };
    let err = export(&checkpoint, &out, options).expect_err("Qwen3 has no MLP biases");
    assert_eq!(
        err.to_string(),
        "Qwen3ForCausalLM cannot express this model:\n  \
         model.add_bias_linear: Qwen3ForCausalLM has no biases in its linear layers"
    );
    assert!(!out.exists());
}

/// Train `family` on tp × pp ranks, export (in `dtype`, files of at most `max_shard_bytes`),
/// import; check every tensor and return the number of safetensors files written.
fn round_trip(family: &str, tp: u32, pp: u32, dtype: OutDtype, max_shard_bytes: u64) -> usize {
    round_trip_ep(family, (tp, pp, 1), dtype, max_shard_bytes)
}

/// [`round_trip`] on tp × pp × ep ranks.
fn round_trip_ep(
    family: &str,
    (tp, pp, ep): (u32, u32, u32),
    dtype: OutDtype,
    max_shard_bytes: u64,
) -> usize {
    let dir = tempfile::tempdir().expect("tempdir");
    let (plan, checkpoint) = trained(dir.path(), family, tp, pp, ep);
    let hf_dir = dir.path().join("hf");
    let options = ExportOptions {
        dtype,
        max_shard_bytes,
    };
    let exported = export(&checkpoint, &hf_dir, options).expect("exports");
    let files = exported
        .files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "safetensors"))
        .count();
    if files > 1 {
        let index: Value = serde_json::from_str(
            &std::fs::read_to_string(hf_dir.join(INDEX_FILE)).expect("an index"),
        )
        .expect("JSON");
        let map = index["weight_map"].as_object().expect("a map");
        assert_eq!(map.len(), exported.tensors);
        assert_eq!(index["metadata"]["total_size"], json!(exported.bytes));
    }
    let hf = HfModel::open(&hf_dir).expect("opens");
    let vocab = (WORDS + 1) as usize;
    assert_eq!(hf.config.vocab as usize, vocab);
    assert_eq!(hf.check(&plan.recipe.model, WORDS + 1), vec![]);
    let store = CheckpointStore::new(dir.path().join("imported"), None);
    let imported = hf.import(&plan, &store).expect("imports");

    let original = ShardedCheckpoint::open(&checkpoint).expect("opens");
    let back = ShardedCheckpoint::open(&imported).expect("opens");
    assert_eq!(
        original.names(ShardKind::Model),
        back.names(ShardKind::Model)
    );
    let rounded = |v: &[u32]| -> Vec<u32> {
        match dtype {
            OutDtype::F32 => v.to_vec(),
            OutDtype::Bf16 => v
                .iter()
                .map(|&b| half::bf16::from_f32(f32::from_bits(b)).to_f32().to_bits())
                .collect(),
        }
    };
    for name in original.names(ShardKind::Model) {
        let a = original.global(&name).expect("assembles");
        let b = back.global(&name).expect("assembles");
        assert_eq!(
            rounded(&real_rows(&name, &a.shape, &a.values, vocab)),
            real_rows(&name, &b.shape, &b.values, vocab),
            "{name} changed in the round trip"
        );
    }
    // the run resumes from the import: same model, its vocabulary re-padded to the plan's 128 rows
    let shape = ModelShape::of(&plan.recipe.model, plan.padded_vocab_size);
    back.check_compatible(&shape, plan.recipe.training.seed)
        .expect("the import fits the recipe");
    let hidden = plan.recipe.model.hidden_size as usize;
    let padded = back
        .shard(&ShardSpec::full("embedding.weight", vec![128, hidden]))
        .expect("re-padded");
    let rows = back.global("embedding.weight").expect("assembles");
    assert_eq!(padded[..vocab * hidden], rows.values[..]);
    assert!(padded[vocab * hidden..].iter().all(|&v| v == 0.0));
    files
}

#[test]
fn gpt2_one_rank() {
    assert_eq!(round_trip("gpt2", 1, 1, OutDtype::F32, u64::MAX), 1);
}

#[test]
fn gpt2_tp2_pp2_in_sharded_files() {
    assert!(round_trip("gpt2", 2, 2, OutDtype::F32, 20_000) > 1);
}

#[test]
fn gpt2_bf16_rounds_to_nearest_even() {
    round_trip("gpt2", 1, 1, OutDtype::Bf16, u64::MAX);
}

/// GPT-2 with q/k/v biases alone: the other biases are exported as zeros and left out again.
#[test]
fn gpt2_with_qkv_biases_alone_one_rank() {
    assert_eq!(
        round_trip("gpt2-qkv-bias", 1, 1, OutDtype::F32, u64::MAX),
        1
    );
}

#[test]
fn llama_one_rank() {
    assert_eq!(round_trip("llama", 1, 1, OutDtype::F32, u64::MAX), 1);
}

#[test]
fn llama_tp2_pp2_in_sharded_files() {
    assert!(round_trip("llama", 2, 2, OutDtype::F32, 30_000) > 1);
}

#[test]
fn mixtral_one_rank() {
    assert_eq!(round_trip("mixtral", 1, 1, OutDtype::F32, u64::MAX), 1);
}

#[test]
fn mixtral_tp2_pp2_in_sharded_files() {
    assert!(round_trip("mixtral", 2, 2, OutDtype::F32, 30_000) > 1);
}

#[test]
fn llama3_scaled_one_rank() {
    assert_eq!(round_trip("llama3", 1, 1, OutDtype::F32, u64::MAX), 1);
}

#[test]
fn qwen2_one_rank() {
    assert_eq!(round_trip("qwen2", 1, 1, OutDtype::F32, u64::MAX), 1);
}

#[test]
fn qwen2_tp2_pp2_in_sharded_files() {
    assert!(round_trip("qwen2", 2, 2, OutDtype::F32, 30_000) > 1);
}

#[test]
fn qwen3_one_rank() {
    assert_eq!(round_trip("qwen3", 1, 1, OutDtype::F32, u64::MAX), 1);
}

#[test]
fn qwen3_tp2_pp2_in_sharded_files() {
    assert!(round_trip("qwen3", 2, 2, OutDtype::F32, 30_000) > 1);
}

#[test]
fn mistral_tp2_pp2_in_sharded_files() {
    assert!(round_trip("mistral", 2, 2, OutDtype::F32, 30_000) > 1);
}

/// OpenAI's GPT-2 on the Hub stores the base model's names (`h.0.attn.c_attn.weight`); they
/// import as the `transformer.` names transformers gives them on load.
#[test]
fn gpt2_files_without_the_transformer_prefix_import() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (plan, checkpoint) = trained(dir.path(), "gpt2", 1, 1, 1);
    let hf_dir = dir.path().join("hf");
    let options = ExportOptions {
        dtype: OutDtype::F32,
        max_shard_bytes: u64::MAX,
    };
    export(&checkpoint, &hf_dir, options).expect("exports");
    let path = hf_dir.join("model.safetensors");
    let bytes = std::fs::read(&path).expect("read");
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let renamed: Vec<(String, safetensors::tensor::TensorView<'_>)> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| (name.trim_start_matches("transformer.").to_owned(), view))
        .collect();
    assert!(
        renamed
            .iter()
            .any(|(name, _)| name == "h.0.attn.c_attn.weight")
    );
    std::fs::write(
        &path,
        safetensors::serialize(renamed, None).expect("serialize"),
    )
    .expect("write");
    let hf = HfModel::open(&hf_dir).expect("opens");
    let store = CheckpointStore::new(dir.path().join("imported"), None);
    let imported = hf.import(&plan, &store).expect("imports");
    let back = ShardedCheckpoint::open(&imported).expect("opens");
    let original = ShardedCheckpoint::open(&checkpoint).expect("opens");
    let name = "layers.1.attention.qkv.weight";
    assert_eq!(
        original.global(name).expect("assembles").values,
        back.global(name).expect("assembles").values
    );
}

#[test]
fn qwen3_moe_one_rank() {
    assert_eq!(round_trip("qwen3-moe", 1, 1, OutDtype::F32, u64::MAX), 1);
}

#[test]
fn qwen3_moe_tp2_pp2_in_sharded_files() {
    assert!(round_trip("qwen3-moe", 2, 2, OutDtype::F32, 30_000) > 1);
}

#[test]
fn qwen3_moe_ep2() {
    assert_eq!(
        round_trip_ep("qwen3-moe", (1, 1, 2), OutDtype::F32, u64::MAX),
        1
    );
}

#[test]
fn deepseek_v3_one_rank() {
    assert_eq!(round_trip("deepseek-v3", 1, 1, OutDtype::F32, u64::MAX), 1);
}

#[test]
fn deepseek_v3_tp2_pp2_in_sharded_files() {
    assert!(round_trip("deepseek-v3", 2, 2, OutDtype::F32, 30_000) > 1);
}

/// A full-rank query projection (`q_proj`; DeepSeek-V2-Lite's).
#[test]
fn deepseek_v3_without_a_query_latent_tp2_pp2() {
    assert!(round_trip("deepseek-v3-q-proj", 2, 2, OutDtype::F32, 30_000) > 1);
}

/// Experts cut over 2 expert-tensor-parallel ranks (etp follows tp) as well as placed on 2
/// expert-parallel ones.
#[test]
fn deepseek_v3_tp2_ep2() {
    assert_eq!(
        round_trip_ep("deepseek-v3", (2, 1, 2), OutDtype::F32, u64::MAX),
        1
    );
}

#[test]
fn deepseek_v3_ep2() {
    assert_eq!(
        round_trip_ep("deepseek-v3", (1, 1, 2), OutDtype::F32, u64::MAX),
        1
    );
}
