//! A tiny, fast, real training setup for thread-rank tests: a word-level tokenizer of 41 tokens
//! (so the padded vocabulary is 128 and the loss head is cheap), a deterministic pseudo-random
//! corpus in JSONL, and a recipe planned for the requested layout.

use std::collections::HashMap;
use std::path::Path;

use ferrotron_data::Tokenizer;
use ferrotron_dist::{Call, CallLogs, replay};
use ferrotron_parallel::{ParallelContext, ShardSpec};
use ferrotron_plan::{Plan, PlanOptions};
use ferrotron_recipe::Recipe;
use serde_json::{Value, json};

use crate::run::entry::{RankOutcome, train_prepared_rank};
use crate::run::setup::RunSetup;
use crate::{CpuTrainBackend, RunOptions, StopFlag, TrainError, train_threads_detailed};

pub(super) const WORDS: u32 = 40;

/// Tokenizer and corpus in `dir`.
pub(super) fn write_data(dir: &Path) {
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
    // A corpus with structure to learn: each word is mostly followed by (3·w + 1) mod 40.
    let mut state: u64 = 12345;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as u32
    };
    let mut lines = String::new();
    for _ in 0..80 {
        let mut word = next() % WORDS;
        let mut text = Vec::new();
        for _ in 0..40 {
            text.push(format!("w{word}"));
            word = if next() % 4 == 0 {
                next() % WORDS
            } else {
                (3 * word + 1) % WORDS
            };
        }
        lines.push_str(&json!({ "text": text.join(" ") }).to_string());
        lines.push('\n');
    }
    std::fs::write(dir.join("corpus.jsonl"), lines).expect("write corpus");
}

/// The layout of a test run.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Layout {
    pub tp: u32,
    pub cp: u32,
    pub ep: u32,
    pub pp: u32,
    pub vpp: u32,
    pub dp: u32,
    pub distributed_optimizer: bool,
}

impl Layout {
    /// One rank: no parallelism at all.
    pub(super) fn alone() -> Layout {
        Layout {
            tp: 1,
            pp: 1,
            vpp: 1,
            dp: 1,
            ..Layout::default()
        }
    }

    pub(super) fn world(&self) -> u32 {
        self.tp * self.cp.max(1) * self.pp * self.dp
    }
}

/// A plan of the tiny GPT for `layout` with data under `dir`.
pub(super) fn plan(dir: &Path, layout: Layout, layers: u32, iterations: u64, extra: Value) -> Plan {
    let mut recipe = json!({
        "version": 2,
        "name": "parallel-equivalence",
        "model": {
            "num_layers": layers, "hidden_size": 32, "num_attention_heads": 4,
            "seq_length": 16, "max_position_embeddings": 16,
            "hidden_dropout": 0.0, "attention_dropout": 0.0,
            // Megatron pads the vocabulary to a multiple of this × tp: keep 128 for every tp so
            // the one-rank model and the sharded one are the same model
            "make_vocab_size_divisible_by": 128 / layout.tp
        },
        "precision": {"dtype": "fp32"},
        "parallel": {
            "tensor": layout.tp, "pipeline": layout.pp, "virtual_pipeline": layout.vpp,
            "context": layout.cp.max(1), "expert": layout.ep.max(1), "data": layout.dp,
            "distributed_optimizer": layout.distributed_optimizer
        },
        "training": {
            "micro_batch_size": 2, "global_batch_size": 8, "train_iters": iterations,
            "log_interval": 1, "eval_interval": 0, "seed": 1234, "clip_grad": 1.0,
            "optimizer": {"lr": 0.01, "weight_decay": 0.1},
            "schedule": {"decay": "constant", "warmup_iters": 0}
        },
        "data": {
            "tokenizer": {"type": "hf", "file": dir.join("tokenizer.json")},
            "blend": [{"path": dir.join("corpus.jsonl")}],
            "split": "100,0,0",
            "cache_dir": dir.join("cache")
        },
        "cluster": {"nodes": 1, "gpus_per_node": layout.world(), "gpu": "cpu"},
        "runtime": {"backend": "cpu"}
    });
    merge(&mut recipe, extra);
    let recipe: Recipe = serde_json::from_value(recipe).expect("the test recipe parses");
    ferrotron_plan::plan(
        &recipe,
        &PlanOptions {
            cluster: None,
            vocab_size: WORDS + 1,
        },
    )
    .unwrap_or_else(|findings| panic!("the test layout plans: {findings:?}"))
}

pub(super) fn merge(base: &mut Value, extra: Value) {
    match (base, extra) {
        (Value::Object(base), Value::Object(extra)) => {
            for (key, value) in extra {
                merge(base.entry(key).or_insert(Value::Null), value);
            }
        }
        (slot, value) => *slot = value,
    }
}

pub(super) fn options(dir: &Path) -> RunOptions {
    RunOptions {
        run_dir: dir.join("run"),
        stop: StopFlag::default(),
        exit_interval: None,
        announce: |_| {},
        memory: ferrotron_telemetry::MemoryProbe::process(),
    }
}

/// Every rank of `plan` as a thread, in rank order; and, when the run succeeds, the ranks'
/// calls replayed under NCCL's rules (`ferrotron_dist::replay`), so every layout a test trains
/// is also checked to issue one collective order on every rank (no mismatch, no deadlock).
pub(super) fn train_world(
    plan: &Plan,
    options: &RunOptions,
) -> Result<Vec<RankOutcome>, TrainError> {
    let (outcomes, calls) = train_world_recorded(plan, options)?;
    let layout = &plan.recipe.parallel;
    let replayed = replay(&calls).unwrap_or_else(|err| panic!("{layout:?}: {err}"));
    eprintln!(
        "call order replayed: {} calls ({} deferred) on {} ranks",
        replayed.calls, replayed.deferred, plan.world_size
    );
    Ok(outcomes)
}

/// Every rank of `plan` as a thread, with each rank's calls in issue order.
pub(super) fn train_world_recorded(
    plan: &Plan,
    options: &RunOptions,
) -> Result<(Vec<RankOutcome>, Vec<Vec<Call>>), TrainError> {
    let tokenizer = tokenizer(plan);
    let logs = CallLogs::new(plan.world_size as usize);
    let outcomes = train_threads_detailed::<CpuTrainBackend>(
        plan,
        &tokenizer,
        options,
        &Default::default(),
        Some(&logs),
    )?;
    Ok((outcomes, logs.calls()))
}

/// A one-rank `plan` as `recipe run` trains it: one rank alone, no thread world.
pub(super) fn train_alone(plan: &Plan, options: &RunOptions) -> Result<RankOutcome, TrainError> {
    let setup = RunSetup::new(plan, &tokenizer(plan))?;
    let device = Default::default();
    train_prepared_rank::<CpuTrainBackend>(
        plan,
        ParallelContext::single(),
        options,
        &setup,
        &device,
    )
}

fn tokenizer(plan: &Plan) -> Tokenizer {
    Tokenizer::from_recipe(&plan.recipe.data.tokenizer).expect("the test tokenizer loads")
}

/// Global tensors assembled from every rank's shards.
pub(super) fn assemble(
    shards: impl IntoIterator<Item = (ShardSpec, Vec<f32>)>,
) -> HashMap<String, Vec<f32>> {
    let mut global: HashMap<String, Vec<f32>> = HashMap::new();
    for (spec, values) in shards {
        let len = spec.global_shape.iter().product();
        let buffer = global
            .entry(spec.global_name.clone())
            .or_insert_with(|| vec![0.0; len]);
        spec.place_f32(&values, buffer)
            .expect("a shard fits its tensor");
    }
    global
}

/// The largest absolute difference between two sets of global tensors (which must match).
pub(super) fn max_weight_difference(
    reference: &HashMap<String, Vec<f32>>,
    other: &HashMap<String, Vec<f32>>,
) -> f32 {
    assert_eq!(
        reference.len(),
        other.len(),
        "parameter sets differ: {:?} vs {:?}",
        reference.keys().collect::<Vec<_>>(),
        other.keys().collect::<Vec<_>>()
    );
    reference
        .iter()
        .map(|(name, reference)| {
            let values = other
                .get(name)
                .unwrap_or_else(|| panic!("{name} is missing from the parallel run"));
            reference
                .iter()
                .zip(values)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max)
        })
        .fold(0.0, f32::max)
}

/// Rank 0's losses (every rank must report the same) and the assembled final weights, sorted by
/// name: what two runs that must agree bit for bit are compared on.
pub(super) fn losses_and_weights(
    outcomes: Vec<RankOutcome>,
) -> (Vec<f64>, Vec<(String, Vec<f32>)>) {
    let losses = outcomes[0].summary.losses.clone();
    for outcome in &outcomes {
        assert_eq!(outcome.summary.losses, losses, "rank {}", outcome.rank);
    }
    let mut weights: Vec<_> = assemble(outcomes.into_iter().flat_map(|o| o.params))
        .into_iter()
        .collect();
    weights.sort_by(|a, b| a.0.cmp(&b.0));
    (losses, weights)
}

/// A 4-step run of the 2-layer model in `layout` with `extra`, saving into `dir/name` at its
/// end: its losses and the folder of that checkpoint.
pub(super) fn train_and_save(
    dir: &Path,
    name: &str,
    layout: Layout,
    extra: Value,
) -> (Vec<f64>, std::path::PathBuf) {
    let mut recipe = json!({"checkpoint": {"dir": dir.join(name), "resume": "never"}});
    merge(&mut recipe, extra);
    let plan = plan(dir, layout, 2, 4, recipe);
    let outcomes = train_world(&plan, &options(&dir.join(format!("{name}-run"))))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let folder = outcomes[0]
        .summary
        .checkpoint
        .clone()
        .expect("saved at the end");
    (outcomes[0].summary.losses.clone(), folder)
}
