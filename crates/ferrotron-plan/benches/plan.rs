//! How long planning takes: the `auto` search must stay interactive even for the largest
//! clusters (Llama 3.1 405B on 16,384 GPUs with every degree `auto`), and a fixed layout must be
//! cheap enough to plan on every `recipe run`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use ferrotron_plan::{PlanOptions, plan};
use ferrotron_recipe::{Cluster, GpuKind, Recipe};
use serde_json::json;

fn llama_405b(parallel: serde_json::Value, micro_batch_size: serde_json::Value) -> Recipe {
    serde_json::from_value(json!({
        "version": 2,
        "name": "llama3.1-405b",
        "model": {
            "num_layers": 126, "hidden_size": 16384, "ffn_hidden_size": 53248,
            "num_attention_heads": 128, "num_query_groups": 8, "vocab_size": 128256,
            "seq_length": 8192, "position_embedding": "rope", "normalization": "rmsnorm",
            "activation": "swiglu", "tie_embeddings": false, "add_bias_linear": false
        },
        "parallel": parallel,
        "training": {"micro_batch_size": micro_batch_size, "global_batch_size": 2048, "train_iters": 1000},
        "recompute": {"granularity": "selective"}
    }))
    .expect("benchmark recipe deserializes")
}

fn planning(c: &mut Criterion) {
    let cluster = Cluster {
        nodes: 2048,
        gpus_per_node: 8,
        gpu: GpuKind::H100,
    };
    let opts = PlanOptions {
        cluster: Some(cluster),
        vocab_size: 128256,
    };
    let all_auto = llama_405b(
        json!({"tensor": "auto", "pipeline": "auto", "virtual_pipeline": "auto",
               "context": "auto", "data": "auto", "sequence_parallel": true,
               "distributed_optimizer": true,
               "account_for_embedding_in_pipeline_split": true,
               "account_for_loss_in_pipeline_split": true}),
        json!("auto"),
    );
    c.bench_function("auto_405b_on_16384_gpus", |b| {
        b.iter(|| plan(black_box(&all_auto), black_box(&opts)).expect("plans"))
    });
    let fixed = llama_405b(
        json!({"tensor": 8, "pipeline": 16, "virtual_pipeline": 2, "context": 1,
               "sequence_parallel": true, "distributed_optimizer": true,
               "account_for_embedding_in_pipeline_split": true,
               "account_for_loss_in_pipeline_split": true}),
        json!(1),
    );
    c.bench_function("fixed_405b_on_16384_gpus", |b| {
        b.iter(|| plan(black_box(&fixed), black_box(&opts)).expect("plans"))
    });
}

criterion_group!(benches, planning);
criterion_main!(benches);
