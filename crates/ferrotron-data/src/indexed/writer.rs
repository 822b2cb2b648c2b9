//! Writes Megatron `.bin/.idx` pairs. Tokens stream to disk as documents arrive; only the
//! per-sequence lengths (4 bytes each) stay in memory until the index is written at the end.
//! Both files are written under temporary names and renamed on [`IndexedDatasetWriter::finish`],
//! so an interrupted run never leaves a pair that looks complete.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::format::{INDEX_MAGIC, INDEX_VERSION, TokenDtype, bin_path, idx_path, with_suffix};
use crate::DataError;

/// Streams documents into `PREFIX.bin` and writes `PREFIX.idx` at the end.
#[derive(Debug)]
pub struct IndexedDatasetWriter {
    prefix: PathBuf,
    dtype: TokenDtype,
    bin: BufWriter<File>,
    bin_tmp: PathBuf,
    sequence_lengths: Vec<i32>,
    /// Sequence index opening each document, plus the running end (starts as `[0]`).
    document_indices: Vec<i64>,
    tokens: u64,
    encoded: Vec<u8>,
}

/// What [`IndexedDatasetWriter::finish`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenDataset {
    pub prefix: PathBuf,
    pub documents: u64,
    pub tokens: u64,
}

impl IndexedDatasetWriter {
    /// Starts `PREFIX.bin/.idx` (parent directories are created).
    pub fn create(prefix: &Path, dtype: TokenDtype) -> Result<Self, DataError> {
        if let Some(parent) = prefix.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| DataError::io(parent, e))?;
        }
        let bin_tmp = with_suffix(&bin_path(prefix), ".tmp");
        let file = File::create(&bin_tmp).map_err(|e| DataError::io(&bin_tmp, e))?;
        Ok(IndexedDatasetWriter {
            prefix: prefix.to_path_buf(),
            dtype,
            bin: BufWriter::with_capacity(1 << 20, file),
            bin_tmp,
            sequence_lengths: Vec::new(),
            document_indices: vec![0],
            tokens: 0,
            encoded: Vec::new(),
        })
    }

    /// Appends one document made of one sequence (what `preprocess_data.py` writes without
    /// sentence splitting).
    pub fn add_document(&mut self, tokens: &[u32]) -> Result<(), DataError> {
        let length = i32::try_from(tokens.len()).map_err(|_| {
            DataError::format(
                &self.bin_tmp,
                format!("a document of {} tokens exceeds int32", tokens.len()),
            )
        })?;
        self.encoded.clear();
        self.encoded.reserve(tokens.len() * self.dtype.size());
        let max = self.dtype.max_token();
        for &token in tokens {
            if u64::from(token) > max {
                return Err(DataError::format(
                    &self.bin_tmp,
                    format!("token id {token} does not fit dtype {:?}", self.dtype),
                ));
            }
            match self.dtype {
                TokenDtype::U8 => self.encoded.push(token as u8),
                TokenDtype::I8 => self.encoded.push(token as i8 as u8),
                TokenDtype::I16 => self.encoded.extend((token as i16).to_le_bytes()),
                TokenDtype::U16 => self.encoded.extend((token as u16).to_le_bytes()),
                TokenDtype::I32 => self.encoded.extend((token as i32).to_le_bytes()),
                TokenDtype::I64 => self.encoded.extend(i64::from(token).to_le_bytes()),
            }
        }
        self.bin
            .write_all(&self.encoded)
            .map_err(|e| DataError::io(&self.bin_tmp, e))?;
        self.sequence_lengths.push(length);
        self.document_indices
            .push(self.sequence_lengths.len() as i64);
        self.tokens += tokens.len() as u64;
        Ok(())
    }

    /// Documents added so far.
    pub fn documents(&self) -> u64 {
        self.document_indices.len() as u64 - 1
    }

    /// Flushes the tokens, writes the index, and renames both files into place.
    pub fn finish(mut self) -> Result<WrittenDataset, DataError> {
        self.bin
            .flush()
            .map_err(|e| DataError::io(&self.bin_tmp, e))?;
        let idx_final = idx_path(&self.prefix);
        let idx_tmp = with_suffix(&idx_final, ".tmp");
        let mut idx =
            BufWriter::new(File::create(&idx_tmp).map_err(|e| DataError::io(&idx_tmp, e))?);
        let write = |idx: &mut BufWriter<File>, bytes: &[u8]| {
            idx.write_all(bytes).map_err(|e| DataError::io(&idx_tmp, e))
        };
        write(&mut idx, INDEX_MAGIC)?;
        write(&mut idx, &INDEX_VERSION.to_le_bytes())?;
        write(&mut idx, &[self.dtype.code()])?;
        write(
            &mut idx,
            &(self.sequence_lengths.len() as u64).to_le_bytes(),
        )?;
        write(
            &mut idx,
            &(self.document_indices.len() as u64).to_le_bytes(),
        )?;
        for length in &self.sequence_lengths {
            write(&mut idx, &length.to_le_bytes())?;
        }
        let item = self.dtype.size() as i64;
        let mut pointer = 0i64;
        for &length in &self.sequence_lengths {
            write(&mut idx, &pointer.to_le_bytes())?;
            pointer += i64::from(length) * item;
        }
        for index in &self.document_indices {
            write(&mut idx, &index.to_le_bytes())?;
        }
        idx.flush().map_err(|e| DataError::io(&idx_tmp, e))?;
        drop(idx);
        drop(self.bin);
        let bin_final = bin_path(&self.prefix);
        std::fs::rename(&self.bin_tmp, &bin_final).map_err(|e| DataError::io(&bin_final, e))?;
        std::fs::rename(&idx_tmp, &idx_final).map_err(|e| DataError::io(&idx_final, e))?;
        Ok(WrittenDataset {
            prefix: self.prefix,
            documents: self.document_indices.len() as u64 - 1,
            tokens: self.tokens,
        })
    }
}
