//! Checkpoint throughput: one rank saving 32 MiB of parameters (atomically, fsynced), and
//! opening that checkpoint to assemble every global tensor or to cut a tp2 layout's shards from
//! it (what a resumed rank of another layout does).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ferrotron_parallel::{ParallelContext, ShardSpec, Split};
use ferrotron_plan::{Plan, PlanOptions};
use ferrotron_recipe::Recipe;
use ferrotron_train::ResumeState;
use ferrotron_train::checkpoint::{
    CheckpointInfo, CheckpointStore, ModelShape, ShardKind, ShardTensor, ShardedCheckpoint,
    save_sharded,
};

const TENSORS: usize = 32;
const ROWS: usize = 256;
const COLS: usize = 1024;

fn plan() -> Plan {
    let recipe: Recipe = serde_json::from_value(serde_json::json!({
        "version": 2, "name": "bench",
        "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                  "seq_length": 64, "vocab_size": 1000},
        "training": {"micro_batch_size": 1, "global_batch_size": 1, "train_iters": 1}
    }))
    .expect("recipe parses");
    ferrotron_plan::plan(
        &recipe,
        &PlanOptions {
            cluster: None,
            vocab_size: 1000,
        },
    )
    .expect("plans")
}

fn tensors() -> Vec<ShardTensor> {
    (0..TENSORS)
        .map(|t| ShardTensor {
            spec: ShardSpec::full(format!("layers.{t}.weight"), vec![ROWS, COLS]),
            values: (0..ROWS * COLS)
                .map(|i| (i + t) as f32 * 1e-3)
                .collect::<Vec<_>>()
                .into(),
        })
        .collect()
}

fn checkpoints(c: &mut Criterion) {
    let plan = plan();
    let shape = ModelShape::of(&plan.recipe.model, plan.padded_vocab_size);
    let info = CheckpointInfo {
        state: ResumeState::fresh(),
        plan: &plan,
        recipe: &plan.recipe,
        shape: &shape,
    };
    let ctx = ParallelContext::single();
    let params = tensors();
    let root = tempfile::tempdir().expect("tempdir");
    let store = CheckpointStore::new(root.path(), Some(1));
    let bytes = (TENSORS * ROWS * COLS * 4) as u64;

    let mut group = c.benchmark_group("checkpoint 32 MiB");
    group.sample_size(10).throughput(Throughput::Bytes(bytes));
    group.bench_function("save (one rank, fsynced)", |b| {
        b.iter(|| save_sharded(&store, &ctx, &info, black_box(&params), &[]).expect("saves"))
    });
    let folder = save_sharded(&store, &ctx, &info, &params, &[]).expect("saves");
    group.bench_function("open + assemble globals", |b| {
        b.iter(|| {
            let checkpoint = ShardedCheckpoint::open(&folder).expect("opens");
            black_box(
                checkpoint
                    .global_tensors(ShardKind::Model)
                    .expect("assembles"),
            )
        })
    });
    group.bench_function("open + cut tp2 rank 1 shards", |b| {
        b.iter(|| {
            let checkpoint = ShardedCheckpoint::open(&folder).expect("opens");
            for tensor in &params {
                let spec = tensor.spec.clone().with_split(Split::new(1, 1, 2));
                black_box(checkpoint.shard(&spec).expect("cuts"));
            }
        })
    });
    group.finish();
}

criterion_group!(benches, checkpoints);
criterion_main!(benches);
