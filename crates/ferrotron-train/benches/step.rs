//! Throughput of the training step on CPU for the quick-start model shape (4 layers, hidden 128,
//! GPT-2 vocabulary), and how much of it the vocabulary-sized output layer takes: the same model
//! with a 1,024-token vocabulary isolates the transformer body.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ferrotron_model::{GptModel, ModelConfig};
use ferrotron_recipe::Model;
use ferrotron_train::{
    AdamW, AdamWConfig, CpuBackend, CpuTrainBackend, Microbatch, StepContext, train_step,
};

const SEQ: usize = 64;
const BATCH: usize = 8;

fn model(vocab: u32, hidden: u32) -> ModelConfig {
    let model: Model = serde_json::from_value(serde_json::json!({
        "num_layers": 4, "hidden_size": hidden, "num_attention_heads": 4, "seq_length": SEQ,
        "vocab_size": vocab, "hidden_dropout": 0.0, "attention_dropout": 0.0
    }))
    .expect("model section parses");
    let padded = vocab.div_ceil(128) * 128;
    ModelConfig::from_model(&model, padded).expect("valid model")
}

fn batch(vocab: u32) -> Vec<Microbatch> {
    let samples: Vec<Vec<u32>> = (0..BATCH)
        .map(|s| {
            (0..=SEQ)
                .map(|t| ((s * 7919 + t * 104_729) % vocab as usize) as u32)
                .collect()
        })
        .collect();
    vec![Microbatch::from_samples(&samples, SEQ).expect("well-formed")]
}

fn bench_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("train_step");
    group.sample_size(10);
    group.throughput(Throughput::Elements((BATCH * SEQ) as u64));
    for (name, vocab, hidden) in [
        ("gpt2_vocab_h128", 50_257, 128),
        ("gpt2_vocab_h64", 50_257, 64),
        ("vocab1024_h128", 1_024, 128),
    ] {
        let device = Default::default();
        let config = model(vocab, hidden);
        let data = batch(vocab);
        group.bench_function(name, |b| {
            let mut state: Option<GptModel<CpuTrainBackend>> = Some(config.init(&device));
            let mut optimizer = AdamW::<CpuBackend>::new(
                AdamWConfig {
                    beta1: 0.9,
                    beta2: 0.95,
                    eps: 1e-8,
                    weight_decay: 0.1,
                    moment_dtypes: ferrotron_ops::F32_MOMENTS,
                    main_grads_dtype: burn::tensor::DType::F32,
                    offload_fraction: None,
                },
                Default::default(),
            );
            let mut iteration = 0;
            b.iter(|| {
                iteration += 1;
                let context = StepContext {
                    iteration,
                    seed: 1,
                    lr: 1e-3,
                    clip_grad: 1.0,
                };
                let model = state.take().expect("model present");
                let (model, stats) =
                    train_step(model, &mut optimizer, &data, context, &device).expect("finite");
                state = Some(model);
                black_box(stats.loss)
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench_step);
criterion_main!(benches);
