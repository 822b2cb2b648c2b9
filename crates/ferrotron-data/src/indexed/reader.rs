//! Reads Megatron `.bin/.idx` pairs through memory maps. Everything the index claims is checked
//! against the real file sizes when the pair is opened, so a truncated copy or a `.bin` from
//! another run fails at start-up with the file and the mismatch named, not hours later with a
//! garbage sample.

use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::format::{INDEX_HEADER_LEN, INDEX_MAGIC, INDEX_VERSION, TokenDtype, bin_path, idx_path};
use crate::DataError;
use crate::mmap::map_file;

/// A memory-mapped Megatron indexed dataset.
#[derive(Debug)]
pub struct IndexedDataset {
    prefix: PathBuf,
    dtype: TokenDtype,
    idx: Mmap,
    bin: Mmap,
    sequence_count: usize,
    document_count: usize,
}

impl IndexedDataset {
    /// Opens and validates `PREFIX.idx` and `PREFIX.bin`.
    pub fn open(prefix: impl AsRef<Path>) -> Result<Self, DataError> {
        let prefix = prefix.as_ref();
        let idx_file = idx_path(prefix);
        let bin_file = bin_path(prefix);
        for file in [&idx_file, &bin_file] {
            if !file.is_file() {
                return Err(DataError::format(
                    file,
                    "missing: an indexed dataset needs both PREFIX.bin and PREFIX.idx",
                ));
            }
        }
        let idx = map_file(&idx_file)?;
        let bin = map_file(&bin_file)?;
        let header = parse_header(&idx, &idx_file)?;
        let dataset = IndexedDataset {
            prefix: prefix.to_path_buf(),
            dtype: header.dtype,
            idx,
            bin,
            sequence_count: header.sequence_count,
            document_count: header.document_count,
        };
        dataset.validate(&idx_file, &bin_file)?;
        Ok(dataset)
    }

    fn validate(&self, idx_file: &Path, bin_file: &Path) -> Result<(), DataError> {
        let item = self.dtype.size() as u64;
        let mut expected_pointer = 0u64;
        for i in 0..self.sequence_count {
            let length = self.sequence_length_signed(i);
            if length < 0 {
                return Err(DataError::format(
                    idx_file,
                    format!("sequence {i} has negative length {length}"),
                ));
            }
            let pointer = self.sequence_pointer_signed(i);
            if pointer != expected_pointer as i64 {
                return Err(DataError::format(
                    idx_file,
                    format!(
                        "sequence {i} starts at byte {pointer}, but the lengths before it end at byte {expected_pointer}"
                    ),
                ));
            }
            expected_pointer += length as u64 * item;
        }
        let bin_len = self.bin.len() as u64;
        if bin_len != expected_pointer {
            let problem = if bin_len < expected_pointer {
                format!(
                    "truncated: the index describes {expected_pointer} bytes of tokens, the file has {bin_len}"
                )
            } else {
                format!(
                    "does not match its index: the index describes {expected_pointer} bytes of tokens, the file has {bin_len}"
                )
            };
            return Err(DataError::format(bin_file, problem));
        }
        if self.document_count == 0 {
            return Err(DataError::format(
                idx_file,
                "document index is empty (it must hold at least the leading 0)",
            ));
        }
        if self.document_index(0) != 0 {
            return Err(DataError::format(
                idx_file,
                format!("document index starts at {}, not 0", self.document_index(0)),
            ));
        }
        for d in 1..self.document_count {
            if self.document_index(d) < self.document_index(d - 1) {
                return Err(DataError::format(
                    idx_file,
                    format!("document index decreases at entry {d}"),
                ));
            }
        }
        let last = self.document_index(self.document_count - 1);
        if last != self.sequence_count as u64 {
            return Err(DataError::format(
                idx_file,
                format!(
                    "document index ends at sequence {last}, but there are {} sequences",
                    self.sequence_count
                ),
            ));
        }
        Ok(())
    }

    /// The prefix the pair was opened from.
    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    /// The token dtype of the `.bin` file.
    pub fn dtype(&self) -> TokenDtype {
        self.dtype
    }

    /// The `.bin` file's bytes: every token, in the dataset's dtype.
    pub(crate) fn bin_bytes(&self) -> &[u8] {
        &self.bin
    }

    /// Number of sequences (what the GPT dataset splits and samples from).
    pub fn len(&self) -> usize {
        self.sequence_count
    }

    /// Whether the dataset holds no sequences.
    pub fn is_empty(&self) -> bool {
        self.sequence_count == 0
    }

    /// Number of documents (entries of the document index minus one).
    pub fn documents(&self) -> usize {
        self.document_count - 1
    }

    /// Total tokens in the `.bin` file.
    pub fn total_tokens(&self) -> u64 {
        self.bin.len() as u64 / self.dtype.size() as u64
    }

    /// Tokens in sequence `i` (panics past the end, like slice indexing).
    pub fn sequence_length(&self, i: usize) -> u32 {
        self.sequence_length_signed(i) as u32
    }

    /// Entry `d` of the document index: the first sequence of document `d`.
    pub fn document_index(&self, d: usize) -> u64 {
        let at = self.documents_offset() + 8 * d;
        read_i64(&self.idx, at) as u64
    }

    /// The bytes of the sequence-length array for sequences `range` (hashing them identifies the
    /// data an index was built from without reading the tokens).
    pub(crate) fn sequence_length_bytes(&self, range: std::ops::Range<usize>) -> &[u8] {
        &self.idx[INDEX_HEADER_LEN + 4 * range.start..INDEX_HEADER_LEN + 4 * range.end]
    }

    /// Appends `length` tokens of sequence `i` starting at token `offset` to `out`
    /// (`None`: to the end of the sequence).
    pub fn read_into(
        &self,
        i: usize,
        offset: usize,
        length: Option<usize>,
        out: &mut Vec<u32>,
    ) -> Result<(), DataError> {
        if i >= self.sequence_count {
            return Err(DataError::OutOfRange {
                index: i as u64,
                len: self.sequence_count as u64,
            });
        }
        let sequence_length = self.sequence_length(i) as usize;
        let length = length.unwrap_or(sequence_length.saturating_sub(offset));
        if offset + length > sequence_length {
            return Err(DataError::format(
                &bin_path(&self.prefix),
                format!(
                    "read of tokens {offset}..{} past the end of sequence {i} ({sequence_length} tokens)",
                    offset + length
                ),
            ));
        }
        let item = self.dtype.size();
        let start = self.sequence_pointer_signed(i) as usize + offset * item;
        let bytes = &self.bin[start..start + length * item];
        out.reserve(length);
        match self.dtype {
            TokenDtype::U16 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]]))),
            ),
            TokenDtype::I32 => out.extend(
                bytes
                    .chunks_exact(4)
                    .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u32),
            ),
            TokenDtype::U8 => out.extend(bytes.iter().map(|&b| u32::from(b))),
            TokenDtype::I8 => out.extend(bytes.iter().map(|&b| b as i8 as u32)),
            TokenDtype::I16 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| i16::from_le_bytes([b[0], b[1]]) as u32),
            ),
            TokenDtype::I64 => out.extend(bytes.chunks_exact(8).map(|b| {
                i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as u32
            })),
        }
        Ok(())
    }

    /// All tokens of sequence `i`.
    pub fn sequence(&self, i: usize) -> Result<Vec<u32>, DataError> {
        let mut out = Vec::new();
        self.read_into(i, 0, None, &mut out)?;
        Ok(out)
    }

    fn sequence_length_signed(&self, i: usize) -> i32 {
        let at = INDEX_HEADER_LEN + 4 * i;
        i32::from_le_bytes([
            self.idx[at],
            self.idx[at + 1],
            self.idx[at + 2],
            self.idx[at + 3],
        ])
    }

    fn sequence_pointer_signed(&self, i: usize) -> i64 {
        read_i64(
            &self.idx,
            INDEX_HEADER_LEN + 4 * self.sequence_count + 8 * i,
        )
    }

    fn documents_offset(&self) -> usize {
        INDEX_HEADER_LEN + 12 * self.sequence_count
    }
}

struct Header {
    dtype: TokenDtype,
    sequence_count: usize,
    document_count: usize,
}

fn parse_header(idx: &[u8], path: &Path) -> Result<Header, DataError> {
    if idx.len() < INDEX_HEADER_LEN {
        return Err(DataError::format(
            path,
            format!(
                "truncated: {} bytes, shorter than the {INDEX_HEADER_LEN}-byte header",
                idx.len()
            ),
        ));
    }
    if &idx[..9] != INDEX_MAGIC {
        return Err(DataError::format(
            path,
            "not a Megatron MMIDIDX index (bad magic bytes)",
        ));
    }
    let version = read_i64(idx, 9) as u64;
    if version != INDEX_VERSION {
        return Err(DataError::format(
            path,
            format!("index version {version}, only version {INDEX_VERSION} exists"),
        ));
    }
    let dtype = TokenDtype::from_code(idx[17]).map_err(|p| DataError::format(path, p))?;
    let sequence_count = read_i64(idx, 18) as u64;
    let document_count = read_i64(idx, 26) as u64;
    let expected = (INDEX_HEADER_LEN as u128)
        + 12 * u128::from(sequence_count)
        + 8 * u128::from(document_count);
    let actual = idx.len() as u128;
    if actual != expected {
        let problem = if actual == expected + u128::from(sequence_count) {
            "holds per-sequence modes (a multimodal index), which GPT training does not read"
                .to_owned()
        } else if actual < expected {
            format!(
                "truncated: the header announces {sequence_count} sequences and {document_count} document entries ({expected} bytes), the file has {actual} bytes"
            )
        } else {
            format!(
                "{actual} bytes, but {sequence_count} sequences and {document_count} document entries take {expected}"
            )
        };
        return Err(DataError::format(path, problem));
    }
    Ok(Header {
        dtype,
        sequence_count: sequence_count as usize,
        document_count: document_count as usize,
    })
}

fn read_i64(bytes: &[u8], at: usize) -> i64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    i64::from_le_bytes(word)
}
