//! `recipe validate` runs in CI on every push: loading and checking 100 recipes (extends chains,
//! schema, semantic rules) must take well under a second.

use std::path::{Path, PathBuf};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ferrotron_recipe::{LoadOptions, load};

fn presets() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../recipes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("recipes directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

fn validate_100(c: &mut Criterion) {
    let files = presets();
    let batch: Vec<&PathBuf> = files.iter().cycle().take(100).collect();
    let mut group = c.benchmark_group("validate");
    group.throughput(Throughput::Elements(batch.len() as u64));
    group.bench_function("100 preset recipes", |b| {
        b.iter(|| {
            for file in &batch {
                let loaded = load(file, &LoadOptions::default()).expect("presets are valid");
                std::hint::black_box(loaded.recipe.model.hidden_size);
            }
        });
    });
    group.finish();
}

criterion_group!(benches, validate_100);
criterion_main!(benches);
