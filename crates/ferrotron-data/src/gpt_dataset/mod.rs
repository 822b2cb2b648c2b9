//! Megatron's `GPTDataset`: fixed-length samples cut across document boundaries from one split
//! of one indexed dataset, in a seeded shuffled order.
//!
//! Three indices, built as `megatron/core/datasets/gpt_dataset.py` and `helpers.cpp`
//! (`build_sample_idx`) build them:
//! - document index: the split's documents repeated for as many epochs as the requested samples
//!   need, shuffled; when the last epoch is needed for less than 80% of its samples it is
//!   shuffled separately, so the early epochs stay uniform;
//! - sample index: where each sample starts (position in the document index, token offset).
//!   Samples overlap by one token, because a sample holds `seq_length + 1` tokens: inputs are
//!   tokens `0..seq_length`, labels `1..=seq_length`;
//! - shuffle index: a permutation of the samples (the separated last epoch again shuffled apart).
//!
//! The random state is NumPy's `RandomState(seed)` re-implemented, consumed in Megatron's order.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use crate::cache::{CacheEntry, IndexArrays};
use crate::random::RandomState;
use crate::split::SPLIT_NAMES;
use crate::{DataError, IndexedDataset};

/// The sample index adds one token so inputs and labels both have `seq_length` tokens.
const EXTRA_TOKEN: u64 = 1;
/// Megatron separates the last epoch when it is needed for less than this share of its samples.
const SEPARATE_FINAL_EPOCH_THRESHOLD: f64 = 0.80;
/// Bump when the index-building algorithm changes, so old caches are not reused.
const ALGORITHM_VERSION: u32 = 1;
const MAGIC: &[u8; 8] = b"FTGPTIX\0";
const DOCUMENT_INDEX: usize = 0;
const SAMPLE_INDEX: usize = 1;
const SHUFFLE_INDEX: usize = 2;

/// What a GPT dataset is built from.
#[derive(Debug, Clone)]
pub struct GptDatasetConfig {
    /// 0 train, 1 valid, 2 test (names the cache entry and seeds nothing by itself).
    pub split: usize,
    /// The sequences of the indexed dataset this split owns.
    pub documents: Range<usize>,
    /// Samples needed; the dataset holds at least this many.
    pub num_samples: u64,
    pub seq_length: u32,
    pub seed: u64,
}

/// Samples of `seq_length + 1` tokens from one split of one indexed dataset.
#[derive(Debug)]
pub struct GptDataset {
    indexed: Arc<IndexedDataset>,
    indices: IndexArrays,
    cache_key: String,
    seq_length: u32,
    len: u64,
}

impl GptDataset {
    /// Loads the indices from `cache_dir` when an entry with the same inputs exists, otherwise
    /// builds and stores them.
    pub fn build(
        indexed: Arc<IndexedDataset>,
        config: &GptDatasetConfig,
        cache_dir: &Path,
    ) -> Result<Self, DataError> {
        if config.seq_length < 2 {
            return Err(DataError::Config(format!(
                "seq_length {} is too short; GPT samples need at least 2 tokens",
                config.seq_length
            )));
        }
        if config.documents.end > indexed.len() || config.documents.start > config.documents.end {
            return Err(DataError::Config(format!(
                "documents {:?} are outside {} ({} sequences)",
                config.documents,
                indexed.prefix().display(),
                indexed.len()
            )));
        }
        let entry = CacheEntry::new(cache_dir, "GPTDataset", description(&indexed, config));
        let indices = match entry.load(MAGIC, 3) {
            Some(indices) => indices,
            None => {
                let built = build_indices(&indexed, config)?;
                entry.store(
                    MAGIC,
                    &[
                        &built.document_index,
                        &built.sample_index,
                        &built.shuffle_index,
                    ],
                )?
            }
        };
        let len = indices.len(SHUFFLE_INDEX) as u64;
        if indices.len(SAMPLE_INDEX) != 2 * (len as usize + 1) {
            return Err(DataError::format(
                &entry.data,
                "index cache is inconsistent",
            ));
        }
        Ok(GptDataset {
            indexed,
            indices,
            cache_key: entry.key,
            seq_length: config.seq_length,
            len,
        })
    }

    /// The `KEY-KIND` name of this dataset's cached indices.
    pub fn cache_key(&self) -> &str {
        &self.cache_key
    }

    /// Number of samples (at least the number requested).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the dataset has no samples.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Tokens per sample minus the label shift's extra token.
    pub fn seq_length(&self) -> u32 {
        self.seq_length
    }

    /// Appends sample `index` (`seq_length + 1` tokens) to `out`.
    pub fn sample_into(&self, index: u64, out: &mut Vec<u32>) -> Result<(), DataError> {
        if index >= self.len {
            return Err(DataError::OutOfRange {
                index,
                len: self.len,
            });
        }
        let row = self.indices.get(SHUFFLE_INDEX, index as usize) as usize;
        let (begin_pos, begin_offset) = self.boundary(row);
        let (end_pos, end_offset) = self.boundary(row + 1);
        let before = out.len();
        for pos in begin_pos..=end_pos {
            let sequence = self.indices.get(DOCUMENT_INDEX, pos) as usize;
            let offset = if pos == begin_pos { begin_offset } else { 0 };
            let length = (pos == end_pos).then(|| end_offset + EXTRA_TOKEN as usize - offset);
            self.indexed.read_into(sequence, offset, length, out)?;
        }
        let got = out.len() - before;
        if got != self.seq_length as usize + 1 {
            return Err(DataError::format(
                self.indexed.prefix(),
                format!(
                    "sample {index} has {got} tokens instead of {}; the index cache does not match the data",
                    self.seq_length + 1
                ),
            ));
        }
        Ok(())
    }

    /// Sample `index`: `seq_length + 1` tokens.
    pub fn sample(&self, index: u64) -> Result<Vec<u32>, DataError> {
        let mut out = Vec::with_capacity(self.seq_length as usize + 1);
        self.sample_into(index, &mut out)?;
        Ok(out)
    }

    fn boundary(&self, row: usize) -> (usize, usize) {
        (
            self.indices.get(SAMPLE_INDEX, 2 * row) as usize,
            self.indices.get(SAMPLE_INDEX, 2 * row + 1) as usize,
        )
    }
}

/// Every input that shapes the indices. The split's sequence lengths stand in for the data:
/// indices depend on nothing else about it.
fn description(indexed: &IndexedDataset, config: &GptDatasetConfig) -> serde_json::Value {
    let lengths = blake3::hash(indexed.sequence_length_bytes(config.documents.clone()));
    serde_json::json!({
        "class": "GPTDataset",
        "algorithm_version": ALGORITHM_VERSION,
        "index_split": SPLIT_NAMES[config.split],
        "documents": [config.documents.start, config.documents.end],
        "sequence_lengths_blake3": lengths.to_hex().as_str(),
        "num_samples": config.num_samples,
        "sequence_length": config.seq_length,
        "random_seed": config.seed,
        "add_extra_token_to_sequence": true,
        "drop_last_partial_sequence": true,
    })
}

/// The three indices, flattened for the cache (sample index as `[position, offset]` pairs).
#[derive(Debug)]
pub(crate) struct BuiltIndices {
    pub(crate) document_index: Vec<u64>,
    pub(crate) sample_index: Vec<u64>,
    pub(crate) shuffle_index: Vec<u64>,
}

pub(crate) fn build_indices(
    indexed: &IndexedDataset,
    config: &GptDatasetConfig,
) -> Result<BuiltIndices, DataError> {
    let seq_length = u64::from(config.seq_length);
    let documents: Vec<u64> = config.documents.clone().map(|d| d as u64).collect();
    let tokens_per_epoch: u64 = config
        .documents
        .clone()
        .map(|d| u64::from(indexed.sequence_length(d)))
        .sum();
    if tokens_per_epoch <= EXTRA_TOKEN {
        return Err(DataError::Config(format!(
            "the {} split of {} has {} documents and {tokens_per_epoch} tokens, too few to draw \
             samples from; give it more data or change data.split",
            SPLIT_NAMES[config.split],
            indexed.prefix().display(),
            documents.len(),
        )));
    }
    let requested_tokens = config.num_samples * seq_length + EXTRA_TOKEN;
    let num_epochs = requested_tokens.div_ceil(tokens_per_epoch).max(1);

    let (separate_final_epoch, samples_before_final_epoch) = if num_epochs == 1 {
        (false, 0)
    } else {
        let before = ((num_epochs - 1) * tokens_per_epoch - EXTRA_TOKEN) / seq_length;
        let from_final = config.num_samples - before;
        let per_epoch = (tokens_per_epoch - EXTRA_TOKEN) / seq_length;
        let threshold = (SEPARATE_FINAL_EPOCH_THRESHOLD * per_epoch as f64) as u64;
        (from_final < threshold, before)
    };

    let mut rng = RandomState::new(config.seed);
    let document_index = if separate_final_epoch {
        let mut index = repeated_shuffled(&documents, num_epochs - 1, &mut rng);
        index.extend(repeated_shuffled(&documents, 1, &mut rng));
        index
    } else {
        repeated_shuffled(&documents, num_epochs, &mut rng)
    };

    let sample_index = build_sample_index(
        indexed,
        &document_index,
        seq_length,
        num_epochs * tokens_per_epoch,
    )?;
    let total_samples = sample_index.len() as u64 / 2 - 1;

    let first_range = if separate_final_epoch {
        samples_before_final_epoch
    } else {
        total_samples
    };
    let mut shuffle_index: Vec<u64> = (0..first_range).collect();
    rng.shuffle(&mut shuffle_index);
    let mut last: Vec<u64> = (first_range..total_samples).collect();
    rng.shuffle(&mut last);
    shuffle_index.extend(last);

    Ok(BuiltIndices {
        document_index,
        sample_index,
        shuffle_index,
    })
}

/// `_build_document_index` for one block of epochs: the documents `epochs` times, shuffled.
fn repeated_shuffled(documents: &[u64], epochs: u64, rng: &mut RandomState) -> Vec<u64> {
    let mut index = Vec::with_capacity(documents.len() * epochs as usize);
    for _ in 0..epochs {
        index.extend_from_slice(documents);
    }
    rng.shuffle(&mut index);
    index
}

/// `build_sample_idx` with the extra token and dropped last partial sample.
fn build_sample_index(
    indexed: &IndexedDataset,
    document_index: &[u64],
    seq_length: u64,
    total_tokens: u64,
) -> Result<Vec<u64>, DataError> {
    let num_samples = (total_tokens - EXTRA_TOKEN) / seq_length;
    let mut index = Vec::with_capacity(2 * (num_samples as usize + 1));
    let mut position = 0usize;
    let mut offset = 0i64;
    index.extend([0, 0]);
    for _ in 0..num_samples {
        let mut remaining = (seq_length + EXTRA_TOKEN) as i64;
        while remaining != 0 {
            let length = i64::from(indexed.sequence_length(document_index[position] as usize));
            let available = length - offset;
            remaining -= available;
            if remaining <= 0 {
                offset += remaining + available - EXTRA_TOKEN as i64;
                remaining = 0;
            } else {
                position += 1;
                offset = 0;
                if position == document_index.len() {
                    return Err(DataError::Config(format!(
                        "{}: ran out of tokens while building the sample index",
                        indexed.prefix().display()
                    )));
                }
            }
        }
        index.extend([position as u64, offset as u64]);
    }
    Ok(index)
}

#[cfg(test)]
mod tests;
