use std::path::Path;

use super::*;
use crate::DataError;

fn write(prefix: &Path, dtype: TokenDtype, docs: &[&[u32]]) {
    let mut writer = IndexedDatasetWriter::create(prefix, dtype).unwrap();
    for doc in docs {
        writer.add_document(doc).unwrap();
    }
    writer.finish().unwrap();
}

/// Lays down a `.bin/.idx` pair byte by byte from the format description alone (uint16 tokens,
/// one sequence per document), independently of our writer.
fn lay_down_by_spec(prefix: &Path, docs: &[&[u16]]) {
    let mut idx = Vec::new();
    idx.extend_from_slice(b"MMIDIDX\x00\x00");
    idx.extend_from_slice(&1u64.to_le_bytes());
    idx.push(8); // uint16
    idx.extend_from_slice(&(docs.len() as u64).to_le_bytes());
    idx.extend_from_slice(&(docs.len() as u64 + 1).to_le_bytes());
    for doc in docs {
        idx.extend_from_slice(&(doc.len() as i32).to_le_bytes());
    }
    let mut pointer = 0i64;
    for doc in docs {
        idx.extend_from_slice(&pointer.to_le_bytes());
        pointer += 2 * doc.len() as i64;
    }
    for d in 0..=docs.len() {
        idx.extend_from_slice(&(d as i64).to_le_bytes());
    }
    let bin: Vec<u8> = docs
        .iter()
        .flat_map(|doc| doc.iter().flat_map(|t| t.to_le_bytes()))
        .collect();
    std::fs::write(idx_path(prefix), idx).unwrap();
    std::fs::write(bin_path(prefix), bin).unwrap();
}

#[test]
fn reads_a_pair_laid_down_from_the_spec() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("spec_text_document");
    lay_down_by_spec(&prefix, &[&[15496, 995, 50256], &[], &[1, 2, 65535, 7]]);
    let ds = IndexedDataset::open(&prefix).unwrap();
    assert_eq!(ds.dtype(), TokenDtype::U16);
    assert_eq!(ds.len(), 3);
    assert_eq!(ds.documents(), 3);
    assert_eq!(ds.total_tokens(), 7);
    assert_eq!(ds.sequence(0).unwrap(), [15496, 995, 50256]);
    assert_eq!(ds.sequence(1).unwrap(), Vec::<u32>::new());
    assert_eq!(ds.sequence(2).unwrap(), [1, 2, 65535, 7]);
    let mut part = Vec::new();
    ds.read_into(2, 1, Some(2), &mut part).unwrap();
    assert_eq!(part, [2, 65535]);
}

#[test]
fn our_writer_produces_the_spec_bytes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let ours = dir.path().join("ours");
    let spec = dir.path().join("spec");
    write(
        &ours,
        TokenDtype::U16,
        &[&[15496, 995, 50256], &[], &[1, 2, 65535, 7]],
    );
    lay_down_by_spec(&spec, &[&[15496, 995, 50256], &[], &[1, 2, 65535, 7]]);
    for path in [idx_path, bin_path] {
        assert_eq!(
            std::fs::read(path(&ours)).unwrap(),
            std::fs::read(path(&spec)).unwrap()
        );
    }
    assert!(!dir.path().join("ours.bin.tmp").exists());
}

#[test]
fn int32_round_trip_for_large_vocabularies() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("big");
    write(&prefix, TokenDtype::I32, &[&[128_000, 5], &[127_999]]);
    let ds = IndexedDataset::open(&prefix).unwrap();
    assert_eq!(ds.dtype(), TokenDtype::I32);
    assert_eq!(ds.sequence(0).unwrap(), [128_000, 5]);
    assert_eq!(ds.sequence(1).unwrap(), [127_999]);
    assert_eq!(std::fs::metadata(bin_path(&prefix)).unwrap().len(), 12);
}

#[test]
fn token_too_large_for_the_dtype_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = IndexedDatasetWriter::create(&dir.path().join("x"), TokenDtype::U16).unwrap();
    let err = writer.add_document(&[70_000]).unwrap_err().to_string();
    assert!(err.contains("70000"), "{err}");
}

fn open_err(prefix: &Path) -> String {
    match IndexedDataset::open(prefix) {
        Err(e @ DataError::Format { .. }) => e.to_string(),
        other => panic!("expected a format error, got {other:?}"),
    }
}

#[test]
fn truncated_bin_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("d");
    write(&prefix, TokenDtype::U16, &[&[1, 2, 3], &[4, 5]]);
    let bin = std::fs::read(bin_path(&prefix)).unwrap();
    std::fs::write(bin_path(&prefix), &bin[..bin.len() - 2]).unwrap();
    let err = open_err(&prefix);
    assert!(err.contains("d.bin") && err.contains("truncated"), "{err}");
    assert!(err.contains("10 bytes") && err.contains("has 8"), "{err}");
}

#[test]
fn truncated_idx_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("d");
    write(&prefix, TokenDtype::U16, &[&[1, 2, 3], &[4, 5]]);
    let idx = std::fs::read(idx_path(&prefix)).unwrap();
    std::fs::write(idx_path(&prefix), &idx[..idx.len() - 8]).unwrap();
    let err = open_err(&prefix);
    assert!(err.contains("d.idx") && err.contains("truncated"), "{err}");
    std::fs::write(idx_path(&prefix), &idx[..20]).unwrap();
    let err = open_err(&prefix);
    assert!(err.contains("shorter than the 34-byte header"), "{err}");
}

#[test]
fn bin_from_another_dataset_is_a_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    write(&a, TokenDtype::U16, &[&[1, 2, 3]]);
    write(&b, TokenDtype::U16, &[&[1, 2, 3, 4, 5, 6]]);
    std::fs::copy(bin_path(&b), bin_path(&a)).unwrap();
    let err = open_err(&a);
    assert!(err.contains("does not match its index"), "{err}");
}

#[test]
fn bad_magic_version_and_dtype_are_explained() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("d");
    write(&prefix, TokenDtype::U16, &[&[1]]);
    let good = std::fs::read(idx_path(&prefix)).unwrap();
    let mut bad = good.clone();
    bad[0] = b'X';
    std::fs::write(idx_path(&prefix), &bad).unwrap();
    assert!(open_err(&prefix).contains("bad magic"));
    let mut bad = good.clone();
    bad[9] = 2;
    std::fs::write(idx_path(&prefix), &bad).unwrap();
    assert!(open_err(&prefix).contains("version 2"));
    let mut bad = good.clone();
    bad[17] = 6;
    std::fs::write(idx_path(&prefix), &bad).unwrap();
    assert!(open_err(&prefix).contains("float64"));
}

#[test]
fn inconsistent_pointers_and_document_index_are_caught() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("d");
    write(&prefix, TokenDtype::U16, &[&[1, 2], &[3]]);
    let good = std::fs::read(idx_path(&prefix)).unwrap();
    // Second pointer (header 34 + 2 lengths × 4 + 8) moved by one token.
    let mut bad = good.clone();
    bad[34 + 8 + 8] = 2;
    std::fs::write(idx_path(&prefix), &bad).unwrap();
    assert!(open_err(&prefix).contains("sequence 1 starts at byte 2"));
    // Last document index entry (must equal the sequence count 2).
    let mut bad = good.clone();
    let last = bad.len() - 8;
    bad[last] = 1;
    std::fs::write(idx_path(&prefix), &bad).unwrap();
    assert!(open_err(&prefix).contains("ends at sequence 1"));
}

#[test]
fn missing_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let err = open_err(&dir.path().join("nothing_text_document"));
    assert!(
        err.contains("nothing_text_document.idx") && err.contains("missing"),
        "{err}"
    );
}

#[test]
fn reads_past_a_sequence_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("d");
    write(&prefix, TokenDtype::U16, &[&[1, 2]]);
    let ds = IndexedDataset::open(&prefix).unwrap();
    let mut out = Vec::new();
    assert!(ds.read_into(0, 1, Some(2), &mut out).is_err());
    assert!(matches!(ds.sequence(1), Err(DataError::OutOfRange { .. })));
}
