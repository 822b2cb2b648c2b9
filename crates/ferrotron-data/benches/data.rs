//! Throughput of the two hot paths: tokenizing JSONL (MB/s on one core) and serving samples
//! from the memory-mapped data (tokens/s), on the repository's Shakespeare corpus.

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ferrotron_data::{
    BlendedDataset, GptDataset, GptDatasetConfig, IndexedDataset, PreprocessConfig, Progress,
    Tokenizer, output_prefix, preprocess_jsonl,
};

fn recipes_data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../recipes/data")
}

fn tokenizer() -> Tokenizer {
    let dir = recipes_data().join("gpt2");
    Tokenizer::gpt2(&dir.join("vocab.json"), &dir.join("merges.txt")).expect("gpt2 loads")
}

fn preprocess(c: &mut Criterion) {
    let tok = tokenizer();
    let corpus = recipes_data().join("shakespeare.jsonl");
    let bytes = std::fs::metadata(&corpus).expect("corpus exists").len();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut group = c.benchmark_group("preprocess");
    group.sample_size(10);
    group.throughput(Throughput::Bytes(bytes));
    for workers in [1, 2] {
        let config = PreprocessConfig {
            inputs: vec![corpus.clone()],
            output_prefix: dir.path().join(format!("w{workers}")),
            json_keys: vec!["text".into()],
            append_eod: true,
            workers,
            skip_bad_lines: false,
            progress: Progress::Hidden,
        };
        group.bench_function(format!("shakespeare_{workers}_workers"), |b| {
            b.iter(|| black_box(preprocess_jsonl(&config, &tok).expect("preprocess")))
        });
    }
    group.finish();
}

fn fetch(c: &mut Criterion) {
    let tok = tokenizer();
    let dir = tempfile::tempdir().expect("temp dir");
    let config = PreprocessConfig {
        inputs: vec![recipes_data().join("shakespeare.jsonl")],
        output_prefix: dir.path().join("shakespeare"),
        json_keys: vec!["text".into()],
        append_eod: true,
        workers: 0,
        skip_bad_lines: false,
        progress: Progress::Hidden,
    };
    preprocess_jsonl(&config, &tok).expect("preprocess");
    let indexed = Arc::new(
        IndexedDataset::open(output_prefix(&dir.path().join("shakespeare"), "text")).expect("open"),
    );
    let seq_length = 1024u32;
    let gpt = GptDataset::build(
        indexed,
        &GptDatasetConfig {
            split: 0,
            documents: 0..157,
            num_samples: 4096,
            seq_length,
            seed: 1234,
        },
        &dir.path().join("cache"),
    )
    .expect("build");
    let data = BlendedDataset::single(gpt);
    let per_batch = 64u64;
    let mut group = c.benchmark_group("fetch");
    group.throughput(Throughput::Elements(per_batch * u64::from(seq_length + 1)));
    let mut start = 0u64;
    let mut out = Vec::with_capacity((per_batch * u64::from(seq_length + 1)) as usize);
    group.bench_function("64_samples_of_1025_tokens", |b| {
        b.iter(|| {
            out.clear();
            for i in 0..per_batch {
                data.sample_into((start + i) % data.len(), &mut out)
                    .expect("sample");
            }
            start = (start + per_batch) % data.len();
            black_box(out.len())
        })
    });
    group.finish();
}

criterion_group!(benches, preprocess, fetch);
criterion_main!(benches);
