//! One error type for the crate, so callers match on what went wrong (a file, a line, a
//! setting) rather than on strings; every variant names the file or setting at fault because the
//! person reading it is usually looking at a training run that refused to start.

use std::path::{Path, PathBuf};

/// Everything that can go wrong while tokenizing, writing, reading or indexing data.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The operating system refused a read, write, rename or map.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An indexed dataset (`.bin`/`.idx`) or an index cache file is malformed.
    #[error("{}: {problem}", path.display())]
    Format { path: PathBuf, problem: String },
    /// One line of a JSONL input cannot be used (1-based line number).
    #[error("{}:{line}: {problem}", path.display())]
    BadLine {
        path: PathBuf,
        line: u64,
        problem: String,
    },
    /// The tokenizer could not be loaded or failed on some text.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// `data.split` is not a Megatron split string.
    #[error("data.split {split:?}: {problem}")]
    Split { split: String, problem: String },
    /// The data settings (blend, sample counts, sequence length) cannot produce samples.
    #[error("{0}")]
    Config(String),
    /// A token id that is not a row of the model's embedding.
    #[error(
        "{}: token id {id} is outside the model's vocabulary of {vocab_size} (the file's ids run from {min} to {max}); it was tokenized with another tokenizer, or model.vocab_size is too small",
        path.display()
    )]
    Vocabulary {
        path: PathBuf,
        id: i64,
        min: i64,
        max: i64,
        vocab_size: u32,
    },
    /// A sample index past the end of a dataset.
    #[error("sample {index} is out of range: the dataset has {len} samples")]
    OutOfRange { index: u64, len: u64 },
}

impl DataError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        DataError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn format(path: &Path, problem: impl Into<String>) -> Self {
        DataError::Format {
            path: path.to_path_buf(),
            problem: problem.into(),
        }
    }
}
