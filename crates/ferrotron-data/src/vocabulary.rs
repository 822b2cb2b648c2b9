//! Token ids against the model's vocabulary, before training.
//!
//! An id at or past the vocabulary (a `.bin` from another tokenizer, `model.vocab_size` set too
//! small) made burn's embedding gather panic on the CPU; on a GPU an out-of-range gather reads
//! or writes memory it does not own, silently. The smallest and largest id of a `.bin` are found
//! by one pass over the file and kept in the index cache (keyed by the file's path, size and
//! modification time, so a rewritten file is scanned again), so later runs and `recipe validate`
//! pay nothing.

use std::path::Path;

use crate::cache::CacheEntry;
use crate::indexed::TokenDtype;
use crate::{DataError, IndexedDataset, bin_path};

const MAGIC: &[u8; 8] = b"FTTOKRNG";

/// The smallest and largest token id of a dataset (0..=0 for an empty one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenRange {
    pub min: i64,
    pub max: i64,
}

/// The token range of `dataset`, from the cache in `cache_dir` or by scanning (then cached).
pub fn token_range(dataset: &IndexedDataset, cache_dir: &Path) -> Result<TokenRange, DataError> {
    let bin = bin_path(dataset.prefix());
    let meta = std::fs::metadata(&bin).map_err(|e| DataError::io(&bin, e))?;
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let absolute = std::fs::canonicalize(&bin).unwrap_or_else(|_| bin.clone());
    let entry = CacheEntry::new(
        &cache_dir.join("indices"),
        "token-range",
        serde_json::json!({
            "bin": absolute.display().to_string(),
            "bytes": meta.len(),
            "modified_ns": modified.to_string(),
        }),
    );
    if let Some(cached) = entry.load(MAGIC, 1) {
        return Ok(TokenRange {
            min: cached.get(0, 0) as i64,
            max: cached.get(0, 1) as i64,
        });
    }
    let range = scan(dataset.dtype(), dataset.bin_bytes());
    entry.store(MAGIC, &[&[range.min as u64, range.max as u64]])?;
    Ok(range)
}

/// Refuses `dataset` when one of its ids is not a row of a `vocab_size` vocabulary.
pub fn check_vocabulary(
    dataset: &IndexedDataset,
    cache_dir: &Path,
    vocab_size: u32,
) -> Result<(), DataError> {
    let range = token_range(dataset, cache_dir)?;
    let outside = if range.min < 0 {
        Some(range.min)
    } else if range.max >= i64::from(vocab_size) {
        Some(range.max)
    } else {
        None
    };
    match outside {
        None => Ok(()),
        Some(id) => Err(DataError::Vocabulary {
            path: bin_path(dataset.prefix()),
            id,
            min: range.min,
            max: range.max,
            vocab_size,
        }),
    }
}

fn scan(dtype: TokenDtype, bytes: &[u8]) -> TokenRange {
    let ids: Box<dyn Iterator<Item = i64> + '_> = match dtype {
        TokenDtype::U8 => Box::new(bytes.iter().map(|&b| i64::from(b))),
        TokenDtype::I8 => Box::new(bytes.iter().map(|&b| i64::from(b as i8))),
        TokenDtype::U16 => Box::new(
            bytes
                .chunks_exact(2)
                .map(|b| i64::from(u16::from_le_bytes([b[0], b[1]]))),
        ),
        TokenDtype::I16 => Box::new(
            bytes
                .chunks_exact(2)
                .map(|b| i64::from(i16::from_le_bytes([b[0], b[1]]))),
        ),
        TokenDtype::I32 => Box::new(
            bytes
                .chunks_exact(4)
                .map(|b| i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        ),
        TokenDtype::I64 => Box::new(
            bytes
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])),
        ),
    };
    ids.fold(None, |range: Option<TokenRange>, id| {
        Some(match range {
            None => TokenRange { min: id, max: id },
            Some(r) => TokenRange {
                min: r.min.min(id),
                max: r.max.max(id),
            },
        })
    })
    .unwrap_or(TokenRange { min: 0, max: 0 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::indexed::IndexedDatasetWriter;

    fn dataset(dir: &Path, documents: &[&[u32]]) -> IndexedDataset {
        let prefix = dir.join("d");
        let mut writer = IndexedDatasetWriter::create(&prefix, TokenDtype::U16).expect("create");
        for document in documents {
            writer.add_document(document).expect("add");
        }
        writer.finish().expect("finish");
        IndexedDataset::open(&prefix).expect("open")
    }

    #[test]
    fn ids_past_the_vocabulary_are_named_with_the_file_and_sizes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dataset(dir.path(), &[&[5, 17, 3], &[50_256, 9]]);
        let cache = dir.path().join("cache");
        check_vocabulary(&data, &cache, 50_257).expect("GPT-2 ids fit GPT-2's vocabulary");
        let err = check_vocabulary(&data, &cache, 1000).expect_err("past 1000");
        let text = err.to_string();
        assert!(text.contains("d.bin: token id 50256"), "{text}");
        assert!(text.contains("vocabulary of 1000"), "{text}");
    }

    #[test]
    fn the_range_is_cached_and_rescanned_when_the_file_changes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = dir.path().join("cache");
        let data = dataset(dir.path(), &[&[1, 2, 3]]);
        assert_eq!(
            token_range(&data, &cache).expect("scan"),
            TokenRange { min: 1, max: 3 }
        );
        let cached = std::fs::read_dir(cache.join("indices"))
            .expect("cache dir")
            .count();
        assert_eq!(cached, 2, "the range and its description");
        assert_eq!(token_range(&data, &cache).expect("cached").max, 3);
        drop(data);
        let data = dataset(dir.path(), &[&[1, 2, 3, 4000]]);
        assert_eq!(token_range(&data, &cache).expect("rescan").max, 4000);
    }
}
