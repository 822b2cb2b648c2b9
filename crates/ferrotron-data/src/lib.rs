//! Data for training: tokenizers, Megatron-compatible indexed datasets (`.bin/.idx`), the GPT
//! sample/shuffle indices, weighted blends, and the JSONL preprocessing that produces them.
//!
//! Compatibility with Megatron-Core is the point: files written here load in Megatron, files
//! Megatron wrote load here, and the index-building algorithms are Megatron's, so a recipe
//! ported from a Megatron command line sees the same kind of sample stream.

mod batch_indices;
mod blend;
mod builder;
mod cache;
mod error;
mod gpt_dataset;
mod indexed;
mod mmap;
mod preprocess;
mod random;
mod split;
mod tokenizer;
mod vocabulary;

pub use batch_indices::rank_batch_indices;
pub use blend::{
    BlendedDataset, MID_LEVEL_DATASET_SURPLUS, blending_indices, normalize_weights,
    samples_per_dataset,
};
pub use builder::{DEFAULT_CACHE_DIR, GptData, build_gpt_data};
pub use error::DataError;
pub use gpt_dataset::{GptDataset, GptDatasetConfig};
pub use indexed::{
    INDEX_MAGIC, INDEX_VERSION, IndexedDataset, IndexedDatasetWriter, TokenDtype,
    UINT16_VOCAB_LIMIT, WrittenDataset, bin_path, idx_path,
};
pub use preprocess::{
    PreprocessConfig, PreprocessReport, Progress, SkippedLine, output_prefix, preprocess_jsonl,
    preprocess_jsonl_cached,
};
pub use split::{SPLIT_NAMES, SplitMatrix};
pub use tokenizer::{Tokenizer, tokenizer_vocab_size};
pub use vocabulary::{TokenRange, check_vocabulary, token_range};

#[cfg(test)]
mod test_support;
