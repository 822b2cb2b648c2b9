//! What thread ranks cost and buy on CPU: the same 8-step run of the parallel-test GPT (8 layers,
//! hidden 16, seq 16, 8 microbatches of 1) on one rank and on 2–8 thread ranks of several layouts.
//! Each run includes building the model and opening the (cached) data. On a machine with fewer
//! cores than ranks the parallel layouts can only be slower: read it as the runtime's overhead
//! (collectives, pipeline bubbles, host round trips), not a speed-up.

use std::path::{Path, PathBuf};

use criterion::{Criterion, criterion_group, criterion_main};
use ferrotron_data::Tokenizer;
use ferrotron_parallel::ParallelContext;
use ferrotron_plan::{Plan, PlanOptions};
use ferrotron_recipe::Recipe;
use ferrotron_train::{CpuTrainBackend, RunOptions, StopFlag, train_rank, train_threads};
use serde_json::json;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parallel")
}

fn plan(cache: &Path, tokenizer: &Tokenizer, layout: (u32, u32, u32, u32), zero: bool) -> Plan {
    let (tp, pp, vpp, dp) = layout;
    let recipe: Recipe = serde_json::from_value(json!({
        "version": 2, "name": "parallel-bench",
        "model": {"num_layers": 8, "hidden_size": 16, "num_attention_heads": 4,
                  "num_query_groups": 2, "seq_length": 16, "make_vocab_size_divisible_by": 32,
                  "hidden_dropout": 0.0, "attention_dropout": 0.0},
        "precision": {"dtype": "fp32"},
        "parallel": {"tensor": tp, "pipeline": pp, "virtual_pipeline": vpp, "context": 1,
                     "expert": 1, "data": dp, "distributed_optimizer": zero},
        "training": {"micro_batch_size": 1, "global_batch_size": 8, "train_iters": 8,
                     "log_interval": 8, "eval_interval": 0, "seed": 1234,
                     "optimizer": {"lr": 0.01}},
        "data": {"tokenizer": {"type": "hf", "file": fixtures().join("tokenizer.json")},
                 "blend": [{"path": fixtures().join("corpus.jsonl")}],
                 "split": "100,0,0", "cache_dir": cache},
        "cluster": {"nodes": 1, "gpus_per_node": tp * pp * dp, "gpu": "cpu"},
        "runtime": {"backend": "cpu"}
    }))
    .expect("the bench recipe parses");
    ferrotron_plan::plan(
        &recipe,
        &PlanOptions {
            cluster: None,
            vocab_size: tokenizer.vocab_size(),
        },
    )
    .expect("the bench layout plans")
}

fn bench_layouts(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = RunOptions {
        run_dir: dir.path().join("run"),
        stop: StopFlag::default(),
        exit_interval: None,
        announce: |_| {},
        memory: ferrotron_telemetry::MemoryProbe::process(),
    };
    let device = Default::default();
    let tokenizer = Tokenizer::from_tokenizer_json(&fixtures().join("tokenizer.json"))
        .expect("the fixture tokenizer loads");
    let cache = dir.path().join("cache");
    let mut group = c.benchmark_group("eight_steps");
    group.sample_size(10);
    let one = plan(&cache, &tokenizer, (1, 1, 1, 1), false);
    group.bench_function("one_rank", |b| {
        b.iter(|| {
            let alone = ParallelContext::single();
            train_rank::<CpuTrainBackend>(&one, alone, &tokenizer, &options, &device)
                .expect("trains")
        })
    });
    let layouts = [
        ("dp2", (1, 1, 1, 2), false),
        ("dp2_zero1", (1, 1, 1, 2), true),
        ("tp2", (2, 1, 1, 1), false),
        ("pp2_1f1b", (1, 2, 1, 1), false),
        ("pp4_vpp2", (1, 4, 2, 1), false),
        ("tp2_pp2_dp2", (2, 2, 1, 2), true),
    ];
    for (name, layout, zero) in layouts {
        let plan = plan(&cache, &tokenizer, layout, zero);
        group.bench_function(name, |b| {
            b.iter(|| {
                train_threads::<CpuTrainBackend>(&plan, &tokenizer, &options, &device)
                    .expect("trains")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_layouts);
criterion_main!(benches);
