use std::path::Path;
use std::sync::Arc;

use super::*;
use crate::{IndexedDatasetWriter, TokenDtype};

/// Documents of the given lengths whose tokens encode (document, position): 100·d + p.
fn dataset(dir: &Path, lengths: &[u32]) -> Arc<IndexedDataset> {
    let prefix = dir.join("d");
    let mut writer = IndexedDatasetWriter::create(&prefix, TokenDtype::U16).unwrap();
    for (d, &len) in lengths.iter().enumerate() {
        let doc: Vec<u32> = (0..len).map(|p| 100 * d as u32 + p).collect();
        writer.add_document(&doc).unwrap();
    }
    writer.finish().unwrap();
    Arc::new(IndexedDataset::open(&prefix).unwrap())
}

const LENGTHS: [u32; 8] = [5, 3, 8, 1, 0, 6, 4, 7];

fn config(
    documents: Range<usize>,
    seq_length: u32,
    num_samples: u64,
    seed: u64,
) -> GptDatasetConfig {
    GptDatasetConfig {
        split: 0,
        documents,
        num_samples,
        seq_length,
        seed,
    }
}

fn pairs(flat: &[u64]) -> Vec<[u64; 2]> {
    flat.chunks_exact(2).map(|p| [p[0], p[1]]).collect()
}

// Expected values below come from Megatron's own algorithm (gpt_dataset.py `_build_document_index`,
// `_build_shuffle_index`, helpers.cpp `build_sample_idx`) run with NumPy's RandomState.

#[test]
fn indices_equal_megatrons_with_a_separated_final_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path(), &LENGTHS);
    let built = build_indices(&ds, &config(0..8, 4, 20, 1234)).unwrap();
    assert_eq!(
        built.document_index,
        [
            5, 3, 0, 4, 6, 2, 2, 7, 1, 1, 0, 4, 5, 6, 3, 7, 5, 1, 3, 4, 0, 7, 6, 2
        ]
    );
    assert_eq!(
        pairs(&built.sample_index),
        [
            [0, 0],
            [0, 4],
            [2, 1],
            [4, 0],
            [5, 0],
            [5, 4],
            [6, 0],
            [6, 4],
            [7, 0],
            [7, 4],
            [8, 1],
            [9, 2],
            [10, 3],
            [12, 2],
            [13, 0],
            [14, 0],
            [15, 3],
            [16, 0],
            [16, 4],
            [17, 2],
            [20, 2],
            [21, 1],
            [21, 5],
            [22, 2],
            [23, 2],
            [23, 6]
        ]
    );
    assert_eq!(
        built.shuffle_index,
        [
            7, 10, 4, 1, 11, 8, 3, 14, 13, 12, 5, 15, 2, 6, 9, 0, 16, 21, 24, 22, 23, 17, 20, 19,
            18
        ]
    );
}

#[test]
fn indices_equal_megatrons_for_a_document_subrange() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path(), &LENGTHS);
    let built = build_indices(&ds, &config(2..7, 3, 9, 7)).unwrap();
    assert_eq!(built.document_index, [2, 5, 4, 3, 6, 4, 3, 2, 6, 5]);
    assert_eq!(
        pairs(&built.sample_index),
        [
            [0, 0],
            [0, 3],
            [0, 6],
            [1, 1],
            [1, 4],
            [4, 0],
            [4, 3],
            [7, 1],
            [7, 4],
            [7, 7],
            [8, 2],
            [9, 1],
            [9, 4]
        ]
    );
    assert_eq!(built.shuffle_index, [4, 5, 3, 2, 1, 0, 7, 8, 9, 11, 10, 6]);
}

#[test]
fn indices_equal_megatrons_when_the_final_epoch_is_kept_together() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path(), &LENGTHS);
    let built = build_indices(&ds, &config(0..8, 4, 16, 1234)).unwrap();
    assert_eq!(
        built.document_index,
        [5, 3, 0, 4, 6, 2, 2, 7, 1, 1, 0, 4, 5, 6, 3, 7]
    );
    assert_eq!(
        built.shuffle_index,
        [7, 4, 1, 13, 3, 9, 2, 12, 14, 11, 5, 0, 8, 15, 6, 10]
    );
}

#[test]
fn samples_cross_documents_and_overlap_by_one_token() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path(), &LENGTHS);
    let cfg = config(0..8, 4, 20, 1234);
    let gpt = GptDataset::build(ds.clone(), &cfg, dir.path()).unwrap();
    assert_eq!(gpt.len(), 25);
    // Sample 3 is row 1 of the sample index (shuffle[3] = 1): from (0, 4) to (2, 1) in the
    // document index [5, 3, 0, ...]: tokens 4..6 of document 5, all of document 3, tokens 0..=1
    // of document 0.
    assert_eq!(gpt.sample(3).unwrap(), [504, 505, 300, 0, 1]);
    // The stream in unshuffled order: consecutive rows share exactly one token.
    let built = build_indices(&ds, &cfg).unwrap();
    let row_of: Vec<u64> = (0..25)
        .map(|row| built.shuffle_index.iter().position(|&r| r == row).unwrap() as u64)
        .collect();
    let mut stream: Vec<u32> = Vec::new();
    for (row, &sample) in row_of.iter().enumerate() {
        let tokens = gpt.sample(sample).unwrap();
        assert_eq!(tokens.len(), 5);
        if row > 0 {
            assert_eq!(stream.last(), tokens.first(), "row {row}");
            stream.extend(&tokens[1..]);
        } else {
            stream.extend(&tokens);
        }
    }
    let expected: Vec<u32> = built
        .document_index
        .iter()
        .flat_map(|&d| (0..LENGTHS[d as usize]).map(move |p| 100 * d as u32 + p))
        .take(stream.len())
        .collect();
    assert_eq!(stream, expected);
    assert!(matches!(
        gpt.sample(25),
        Err(DataError::OutOfRange { index: 25, len: 25 })
    ));
}

#[test]
fn the_cache_is_reused_and_rebuilt_only_when_an_input_changes() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let ds = dataset(dir.path(), &LENGTHS);
    let cfg = config(0..8, 4, 20, 1234);
    GptDataset::build(ds.clone(), &cfg, &cache).unwrap();
    let files = |ext: &str| -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == ext))
            .collect();
        v.sort();
        v
    };
    let first = files("idxcache");
    assert_eq!(first.len(), 1);
    let modified = std::fs::metadata(&first[0]).unwrap().modified().unwrap();
    let again = GptDataset::build(ds.clone(), &cfg, &cache).unwrap();
    assert_eq!(files("idxcache"), first);
    assert_eq!(
        std::fs::metadata(&first[0]).unwrap().modified().unwrap(),
        modified
    );
    assert_eq!(
        again.sample(0).unwrap(),
        GptDataset::build(ds.clone(), &cfg, &cache)
            .unwrap()
            .sample(0)
            .unwrap()
    );
    for changed in [
        config(0..8, 4, 20, 1235),
        config(0..8, 4, 21, 1234),
        config(0..8, 5, 20, 1234),
        config(1..8, 4, 20, 1234),
    ] {
        GptDataset::build(ds.clone(), &changed, &cache).unwrap();
    }
    assert_eq!(files("idxcache").len(), 5);
    // Same shape, different lengths: different data, different key.
    let other_dir = tempfile::tempdir().unwrap();
    let other = dataset(other_dir.path(), &[5, 3, 8, 1, 0, 6, 4, 8]);
    GptDataset::build(other, &cfg, &cache).unwrap();
    assert_eq!(files("idxcache").len(), 6);
}

#[test]
fn a_split_without_tokens_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path(), &LENGTHS);
    let mut cfg = config(4..5, 4, 3, 1);
    cfg.split = 2;
    let err = GptDataset::build(ds, &cfg, dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("test split") && err.contains("data.split"),
        "{err}"
    );
}

#[test]
fn every_sample_of_a_large_build_has_the_right_length() {
    let dir = tempfile::tempdir().unwrap();
    let lengths: Vec<u32> = (0..200).map(|i| (i * 37 % 50) as u32).collect();
    let ds = dataset(dir.path(), &lengths);
    let gpt = GptDataset::build(ds, &config(0..200, 16, 1000, 99), dir.path()).unwrap();
    assert!(gpt.len() >= 1000);
    let mut out = Vec::new();
    for i in 0..gpt.len() {
        out.clear();
        gpt.sample_into(i, &mut out).unwrap();
        assert_eq!(out.len(), 17);
    }
}
