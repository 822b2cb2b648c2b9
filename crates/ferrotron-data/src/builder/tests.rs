use std::path::Path;

use ferrotron_recipe::{BlendEntry, Data};

use super::*;
use crate::test_support::{gpt2, recipes_data};
use crate::{IndexedDatasetWriter, TokenDtype};

/// `documents` documents of `length` tokens; every token is the dataset's `tag`.
fn uniform_dataset(prefix: &Path, documents: usize, length: usize, tag: u32) {
    let mut writer = IndexedDatasetWriter::create(prefix, TokenDtype::U16).unwrap();
    for _ in 0..documents {
        writer.add_document(&vec![tag; length]).unwrap();
    }
    writer.finish().unwrap();
}

fn data(dir: &Path, blend: &[(&Path, f64)], split: &str) -> Data {
    Data {
        blend: blend
            .iter()
            .map(|(path, weight)| BlendEntry {
                path: path.to_string_lossy().into_owned(),
                weight: *weight,
            })
            .collect(),
        split: split.to_owned(),
        cache_dir: Some(dir.join("cache").to_string_lossy().into_owned()),
        ..Data::default()
    }
}

#[test]
fn blend_proportions_follow_the_weights_within_one_percent() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a_text_document");
    let b = dir.path().join("b_text_document");
    let c = dir.path().join("c_text_document");
    uniform_dataset(&a, 100, 50, 1);
    uniform_dataset(&b, 40, 30, 2);
    uniform_dataset(&c, 10, 20, 3);
    let data = data(dir.path(), &[(&a, 6.0), (&b, 3.0), (&c, 1.0)], "100,0,0");
    let built = build_gpt_data(&data, 16, 1234, [10_000, 0, 0], &gpt2(), 50_257).unwrap();
    assert!(built.valid.is_none() && built.test.is_none());
    let train = &built.train;
    assert_eq!(train.len(), 10_000);
    let mut counts = [0u64; 3];
    for i in 0..train.len() {
        let sample = train.sample(i).unwrap();
        assert_eq!(sample.len(), 17);
        let tag = sample[0];
        assert!(sample.iter().all(|&t| t == tag));
        counts[tag as usize - 1] += 1;
    }
    for (count, weight) in counts.iter().zip([0.6, 0.3, 0.1]) {
        let share = *count as f64 / 10_000.0;
        assert!((share - weight).abs() <= 0.01 * weight, "{counts:?}");
    }
    // Each dataset was asked for Megatron's surplus: ceil(ceil(10000·w)·1.005).
    let lens: Vec<u64> = train.datasets().iter().map(|d| d.len()).collect();
    assert!(
        lens[0] >= 6030 && lens[1] >= 3015 && lens[2] >= 1005,
        "{lens:?}"
    );
}

#[test]
fn the_split_gives_each_part_its_own_documents() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("d");
    // Document d is filled with token d, so a sample's tokens name its documents.
    let mut writer = IndexedDatasetWriter::create(&prefix, TokenDtype::U16).unwrap();
    for d in 0..100u32 {
        writer.add_document(&[d; 10]).unwrap();
    }
    writer.finish().unwrap();
    let data = data(dir.path(), &[(&prefix, 1.0)], "80,10,10");
    let built = build_gpt_data(&data, 8, 7, [50, 20, 20], &gpt2(), 50_257).unwrap();
    let documents_of = |ds: &BlendedDataset| -> std::collections::BTreeSet<u32> {
        (0..ds.len()).flat_map(|i| ds.sample(i).unwrap()).collect()
    };
    let train = documents_of(&built.train);
    let valid = documents_of(built.valid.as_ref().unwrap());
    let test = documents_of(built.test.as_ref().unwrap());
    assert!(train.iter().all(|&d| d < 80));
    assert!(valid.iter().all(|&d| (80..90).contains(&d)));
    assert!(test.iter().all(|&d| (90..100).contains(&d)));
    assert!(built.train.len() >= 50);
}

#[test]
fn raw_jsonl_in_the_blend_is_preprocessed_and_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = recipes_data().join("shakespeare.jsonl");
    let mut data = data(dir.path(), &[(&corpus, 1.0)], "969,30,1");
    let tok = gpt2();
    let first = build_gpt_data(&data, 64, 1234, [200, 20, 0], &tok, 50_257).unwrap();
    assert!(first.test.is_none());
    let valid = first.valid.as_ref().unwrap();
    assert!(valid.len() >= 20);
    let text = tok.decode(&first.train.sample(0).unwrap()).unwrap();
    assert!(!text.is_empty());
    // Same recipe, same stream (from the cache this time).
    let again = build_gpt_data(&data, 64, 1234, [200, 20, 0], &tok, 50_257).unwrap();
    for i in [0, 17, 199] {
        assert_eq!(
            first.train.sample(i).unwrap(),
            again.train.sample(i).unwrap()
        );
    }
    // The manifest's provenance: one key per index read, stable across rebuilds.
    let keys = first.cache_keys();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(
        keys.iter().all(|key| key.ends_with("-GPTDataset")),
        "{keys:?}"
    );
    assert_eq!(keys, again.cache_keys());
    // Another seed, another order.
    data.split = "969,30,1".into();
    let reseeded = build_gpt_data(&data, 64, 99, [200, 20, 0], &tok, 50_257).unwrap();
    assert_ne!(keys, reseeded.cache_keys());
    assert_ne!(
        first.train.batch(0..8).unwrap(),
        reseeded.train.batch(0..8).unwrap()
    );
}

#[test]
fn configuration_problems_are_explained() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("d");
    uniform_dataset(&prefix, 10, 10, 1);
    let tok = gpt2();
    let empty = Data::default();
    let err = build_gpt_data(&empty, 8, 1, [1, 0, 0], &tok, 50_257).unwrap_err();
    assert!(err.to_string().contains("data.blend is empty"), "{err}");
    let no_train = data(dir.path(), &[(&prefix, 1.0)], "0,1,0");
    let err = build_gpt_data(&no_train, 8, 1, [1, 1, 0], &tok, 50_257).unwrap_err();
    assert!(err.to_string().contains("no training data"), "{err}");
    let missing = data(dir.path(), &[(&dir.path().join("nope"), 1.0)], "1");
    let err = build_gpt_data(&missing, 8, 1, [1, 0, 0], &tok, 50_257).unwrap_err();
    assert!(err.to_string().contains("nope.idx"), "{err}");
    // 100 documents and "969,30,1": the test split gets none of them.
    let hundred = dir.path().join("hundred");
    uniform_dataset(&hundred, 100, 10, 1);
    let tiny_test = data(dir.path(), &[(&hundred, 1.0)], "969,30,1");
    let err = build_gpt_data(&tiny_test, 8, 1, [1, 1, 1], &tok, 50_257).unwrap_err();
    assert!(err.to_string().contains("test split"), "{err}");
}

#[test]
fn datasets_can_be_shared_by_rank_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<GptData>();
    shareable::<Tokenizer>();
}
