//! Megatron-Core's MMIDIDX indexed dataset: the on-disk format users already have terabytes of.

mod format;
mod reader;
mod writer;

pub(crate) use format::with_suffix;
pub use format::{INDEX_MAGIC, INDEX_VERSION, TokenDtype, UINT16_VOCAB_LIMIT, bin_path, idx_path};
pub use reader::IndexedDataset;
pub use writer::{IndexedDatasetWriter, WrittenDataset};

#[cfg(test)]
mod tests;
