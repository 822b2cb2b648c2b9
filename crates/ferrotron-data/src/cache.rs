//! The on-disk cache of built indices (GPT document/sample/shuffle indices, blend indices).
//!
//! Megatron saves these as `.npy` files named by an MD5 of a JSON description and reuses them
//! when the description matches. Same idea here, with two changes: the key is a blake3 hash of a
//! description that includes the *content* that shaped the indices (the sequence lengths, not
//! just a path), so changed data can never reuse stale indices; and the arrays are memory-mapped
//! from one file, so a billion-sample index costs page cache, not heap.
//!
//! File layout (little-endian): magic (8 bytes) | array count u64 | per array: element width u64,
//! element count u64 | each array's elements, padded to 8 bytes. Widths are 2, 4 or 8 bytes,
//! chosen per array from its largest value.

use std::io::Write;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::DataError;
use crate::mmap::map_file;

/// Arrays of unsigned integers, memory-mapped from a cache file.
#[derive(Debug)]
pub(crate) struct IndexArrays {
    map: Mmap,
    arrays: Vec<ArrayView>,
}

#[derive(Debug, Clone, Copy)]
struct ArrayView {
    offset: usize,
    len: usize,
    width: usize,
}

/// Where a cached index lives: `DIR/KEY-KIND.idxcache` plus a readable `DIR/KEY-KIND.json`.
#[derive(Debug, Clone)]
pub(crate) struct CacheEntry {
    pub(crate) data: PathBuf,
    /// The `KEY-KIND` stem: what a run manifest records to name the indices it trained on.
    pub(crate) key: String,
    description_file: PathBuf,
    description: String,
}

impl CacheEntry {
    /// The entry for `description` (a JSON text listing every input of the build).
    pub(crate) fn new(dir: &Path, kind: &str, description: serde_json::Value) -> Self {
        let description =
            serde_json::to_string_pretty(&description).unwrap_or_else(|_| description.to_string());
        let key = blake3::hash(description.as_bytes()).to_hex();
        let stem = format!("{}-{kind}", &key[..32]);
        CacheEntry {
            key: stem.clone(),
            data: dir.join(format!("{stem}.idxcache")),
            description_file: dir.join(format!("{stem}.json")),
            description,
        }
    }

    /// The cached arrays if present and intact; `None` means build them.
    pub(crate) fn load(&self, magic: &[u8; 8], arrays: usize) -> Option<IndexArrays> {
        if !self.data.is_file() {
            return None;
        }
        IndexArrays::open(&self.data, magic)
            .ok()
            .filter(|a| a.arrays.len() == arrays)
    }

    /// Writes the arrays (atomically) and maps them back.
    pub(crate) fn store(
        &self,
        magic: &[u8; 8],
        arrays: &[&[u64]],
    ) -> Result<IndexArrays, DataError> {
        let dir = self.data.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| DataError::io(dir, e))?;
        write_atomically(&self.description_file, self.description.as_bytes())?;
        let mut bytes = Vec::new();
        bytes.extend_from_slice(magic);
        bytes.extend_from_slice(&(arrays.len() as u64).to_le_bytes());
        let widths: Vec<usize> = arrays.iter().map(|a| width_for(a)).collect();
        for (array, width) in arrays.iter().zip(&widths) {
            bytes.extend_from_slice(&(*width as u64).to_le_bytes());
            bytes.extend_from_slice(&(array.len() as u64).to_le_bytes());
        }
        for (array, &width) in arrays.iter().zip(&widths) {
            for &value in array.iter() {
                bytes.extend_from_slice(&value.to_le_bytes()[..width]);
            }
            bytes.resize(bytes.len().next_multiple_of(8), 0);
        }
        write_atomically(&self.data, &bytes)?;
        IndexArrays::open(&self.data, magic)
    }
}

fn width_for(values: &[u64]) -> usize {
    match values.iter().copied().max().unwrap_or(0) {
        m if m <= u64::from(u16::MAX) => 2,
        m if m <= u64::from(u32::MAX) => 4,
        _ => 8,
    }
}

/// Writes through a uniquely named temporary file and renames it into place, so concurrent
/// builders (several ranks on one machine) and interrupted runs never expose a partial file.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), DataError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| DataError::io(dir, e))?;
    tmp.write_all(bytes)
        .map_err(|e| DataError::io(tmp.path(), e))?;
    tmp.persist(path)
        .map_err(|e| DataError::io(path, e.error))?;
    Ok(())
}

impl IndexArrays {
    fn open(path: &Path, magic: &[u8; 8]) -> Result<Self, DataError> {
        let map = map_file(path)?;
        let bad = |problem: &str| DataError::format(path, format!("index cache {problem}"));
        if map.len() < 16 || &map[..8] != magic {
            return Err(bad("has the wrong magic bytes"));
        }
        let count = read_u64(&map, 8) as usize;
        let mut offset = 16usize
            .checked_add(count.checked_mul(16).ok_or_else(|| bad("is corrupt"))?)
            .ok_or_else(|| bad("is corrupt"))?;
        if offset > map.len() {
            return Err(bad("is truncated"));
        }
        let mut arrays = Vec::with_capacity(count);
        for a in 0..count {
            let width = read_u64(&map, 16 + 16 * a) as usize;
            let len = read_u64(&map, 24 + 16 * a) as usize;
            if ![2, 4, 8].contains(&width) {
                return Err(bad("has an unknown element width"));
            }
            arrays.push(ArrayView { offset, len, width });
            offset = len
                .checked_mul(width)
                .and_then(|bytes| offset.checked_add(bytes))
                .map(|end| end.next_multiple_of(8))
                .ok_or_else(|| bad("is corrupt"))?;
        }
        if offset != map.len() {
            return Err(bad("is truncated or has trailing bytes"));
        }
        Ok(IndexArrays { map, arrays })
    }

    /// Elements in array `a`.
    pub(crate) fn len(&self, a: usize) -> usize {
        self.arrays[a].len
    }

    /// Element `i` of array `a` (panics past the end, like slice indexing).
    pub(crate) fn get(&self, a: usize, i: usize) -> u64 {
        let view = self.arrays[a];
        assert!(
            i < view.len,
            "index {i} past the end of a {}-element index",
            view.len
        );
        let at = view.offset + i * view.width;
        let mut word = [0u8; 8];
        word[..view.width].copy_from_slice(&self.map[at..at + view.width]);
        u64::from_le_bytes(word)
    }
}

fn read_u64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAGIC: &[u8; 8] = b"TESTIDX\0";

    #[test]
    fn arrays_round_trip_with_per_array_widths() {
        let dir = tempfile::tempdir().unwrap();
        let entry = CacheEntry::new(dir.path(), "Test", serde_json::json!({"a": 1}));
        let small = [1u64, 2, 65_535];
        let medium = [70_000u64, 0];
        let large = [u64::MAX, 3, 5];
        let empty: [u64; 0] = [];
        let arrays = entry
            .store(MAGIC, &[&small, &medium, &large, &empty])
            .unwrap();
        for (a, values) in [&small[..], &medium, &large, &empty].iter().enumerate() {
            assert_eq!(arrays.len(a), values.len());
            for (i, v) in values.iter().enumerate() {
                assert_eq!(arrays.get(a, i), *v);
            }
        }
        assert!(entry.load(MAGIC, 4).is_some());
        assert!(entry.load(MAGIC, 3).is_none());
        assert!(entry.load(b"OTHERIX\0", 4).is_none());
    }

    #[test]
    fn the_key_follows_the_description() {
        let dir = Path::new("cache");
        let a = CacheEntry::new(dir, "K", serde_json::json!({"seed": 1}));
        let b = CacheEntry::new(dir, "K", serde_json::json!({"seed": 2}));
        let c = CacheEntry::new(dir, "K", serde_json::json!({"seed": 1}));
        assert_ne!(a.data, b.data);
        assert_eq!(a.data, c.data);
    }

    #[test]
    fn truncated_cache_files_are_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let entry = CacheEntry::new(dir.path(), "Test", serde_json::json!({}));
        entry.store(MAGIC, &[&[1, 2, 3]]).unwrap();
        let bytes = std::fs::read(&entry.data).unwrap();
        std::fs::write(&entry.data, &bytes[..bytes.len() - 8]).unwrap();
        assert!(entry.load(MAGIC, 1).is_none());
    }
}
