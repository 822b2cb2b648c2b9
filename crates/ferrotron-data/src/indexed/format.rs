//! The MMIDIDX layout, written down once so the reader and the writer cannot drift apart.
//! Source: Megatron-Core `megatron/core/datasets/indexed_dataset.py` (`_INDEX_HEADER`, `DType`,
//! `_IndexWriter.write`, `_IndexReader.__init__`).
//!
//! `.idx`: magic (9 bytes) | version u64 = 1 | dtype code u8 | sequence count u64 |
//! document count u64 | int32 lengths[sequences] | int64 byte pointers[sequences] |
//! int64 document indices[documents]. All little-endian. The document indices are sequence
//! indices that open each document plus a final entry equal to the sequence count, so
//! `document count = documents + 1` and the first entry is 0.
//! `.bin`: the tokens of every sequence back to back in the dtype named by the code.

use std::path::{Path, PathBuf};

/// The first nine bytes of every `.idx` file.
pub const INDEX_MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";
/// The only index version Megatron writes.
pub const INDEX_VERSION: u64 = 1;
/// Bytes before the lengths array: magic, version, dtype code, two counts.
pub(super) const INDEX_HEADER_LEN: usize = 9 + 8 + 1 + 8 + 8;
/// Megatron stores tokens as uint16 when the vocabulary is smaller than this, else int32.
pub const UINT16_VOCAB_LIMIT: u32 = 65_500;

/// The element type of a `.bin` file, with Megatron's numeric codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenDtype {
    U8,
    I8,
    I16,
    I32,
    I64,
    U16,
}

impl TokenDtype {
    /// Megatron's choice for a vocabulary of `vocab_size` tokens (`DType.optimal_dtype`).
    pub fn for_vocab_size(vocab_size: u32) -> Self {
        if vocab_size < UINT16_VOCAB_LIMIT {
            TokenDtype::U16
        } else {
            TokenDtype::I32
        }
    }

    /// The code stored in the `.idx` header.
    pub fn code(self) -> u8 {
        match self {
            TokenDtype::U8 => 1,
            TokenDtype::I8 => 2,
            TokenDtype::I16 => 3,
            TokenDtype::I32 => 4,
            TokenDtype::I64 => 5,
            TokenDtype::U16 => 8,
        }
    }

    /// The dtype for a header code; `Err` explains codes that are not token types.
    pub fn from_code(code: u8) -> Result<Self, String> {
        Ok(match code {
            1 => TokenDtype::U8,
            2 => TokenDtype::I8,
            3 => TokenDtype::I16,
            4 => TokenDtype::I32,
            5 => TokenDtype::I64,
            8 => TokenDtype::U16,
            6 => return Err("dtype code 6 (float64) is not a token type".into()),
            7 => return Err("dtype code 7 (float32) is not a token type".into()),
            other => return Err(format!("unknown dtype code {other}")),
        })
    }

    /// Bytes per token.
    pub fn size(self) -> usize {
        match self {
            TokenDtype::U8 | TokenDtype::I8 => 1,
            TokenDtype::I16 | TokenDtype::U16 => 2,
            TokenDtype::I32 => 4,
            TokenDtype::I64 => 8,
        }
    }

    /// The largest token id this dtype can hold.
    pub fn max_token(self) -> u64 {
        match self {
            TokenDtype::U8 => u8::MAX.into(),
            TokenDtype::I8 => i8::MAX as u64,
            TokenDtype::I16 => i16::MAX as u64,
            TokenDtype::U16 => u16::MAX.into(),
            TokenDtype::I32 => i32::MAX as u64,
            TokenDtype::I64 => u32::MAX.into(),
        }
    }
}

/// `PREFIX.bin`.
pub fn bin_path(prefix: &Path) -> PathBuf {
    with_suffix(prefix, ".bin")
}

/// `PREFIX.idx`.
pub fn idx_path(prefix: &Path) -> PathBuf {
    with_suffix(prefix, ".idx")
}

/// Appends rather than replaces: Megatron prefixes often contain dots (`data/v1.2_text_document`).
pub(crate) fn with_suffix(prefix: &Path, suffix: &str) -> PathBuf {
    let mut name = prefix.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_floats_are_refused() {
        for dtype in [
            TokenDtype::U8,
            TokenDtype::I8,
            TokenDtype::I16,
            TokenDtype::I32,
            TokenDtype::I64,
            TokenDtype::U16,
        ] {
            assert_eq!(TokenDtype::from_code(dtype.code()), Ok(dtype));
        }
        assert!(TokenDtype::from_code(6).unwrap_err().contains("float64"));
        assert!(TokenDtype::from_code(9).unwrap_err().contains("unknown"));
    }

    #[test]
    fn vocabulary_size_picks_megatrons_dtype() {
        assert_eq!(TokenDtype::for_vocab_size(50_257), TokenDtype::U16);
        assert_eq!(TokenDtype::for_vocab_size(65_499), TokenDtype::U16);
        assert_eq!(TokenDtype::for_vocab_size(65_500), TokenDtype::I32);
        assert_eq!(TokenDtype::for_vocab_size(128_256), TokenDtype::I32);
    }

    #[test]
    fn prefixes_with_dots_keep_them() {
        assert_eq!(
            bin_path(Path::new("d/v1.2_text_document")),
            PathBuf::from("d/v1.2_text_document.bin")
        );
    }
}
