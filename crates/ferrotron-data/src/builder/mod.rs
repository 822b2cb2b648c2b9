//! From a recipe's `data` section to the three sample streams training reads: resolves each
//! blend entry (an indexed-dataset prefix, or raw JSONL preprocessed into the cache), splits
//! every dataset's documents by `data.split`, and blends them, Megatron's
//! `BlendedMegatronDatasetBuilder` step by step.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::blend::{MID_LEVEL_DATASET_SURPLUS, normalize_weights, samples_per_dataset};
use crate::preprocess::{Progress, preprocess_jsonl_cached};
use crate::split::SplitMatrix;
use crate::{BlendedDataset, DataError, GptDataset, GptDatasetConfig, IndexedDataset, Tokenizer};

/// Where caches go when `data.cache_dir` is not set (relative to the working directory).
pub const DEFAULT_CACHE_DIR: &str = ".ferrotron/cache";

/// Everything training needs: the blended train/valid/test datasets for a recipe.
#[derive(Debug)]
pub struct GptData {
    pub train: BlendedDataset,
    pub valid: Option<BlendedDataset>,
    pub test: Option<BlendedDataset>,
}

impl GptData {
    /// The cache keys of every index the run reads, train then valid then test: the
    /// provenance a run manifest records (same keys, same samples in the same order).
    pub fn cache_keys(&self) -> Vec<String> {
        [Some(&self.train), self.valid.as_ref(), self.test.as_ref()]
            .into_iter()
            .flatten()
            .flat_map(BlendedDataset::cache_keys)
            .collect()
    }
}

/// Builds (or loads from the cache) the train/valid/test datasets of `data`.
///
/// `samples` are the samples needed per split (Megatron's `train_valid_test_num_samples`); a
/// split with 0 samples, or with no share in `data.split`, is `None`. Raw `.jsonl`/`.json` blend
/// entries are preprocessed into `data.cache_dir` (default [`DEFAULT_CACHE_DIR`]) first. Every
/// dataset's token ids must be rows of a `vocab_size` vocabulary ([`crate::check_vocabulary`]).
pub fn build_gpt_data(
    data: &ferrotron_recipe::Data,
    seq_length: u32,
    seed: u64,
    samples: [u64; 3],
    tokenizer: &Tokenizer,
    vocab_size: u32,
) -> Result<GptData, DataError> {
    if data.blend.is_empty() {
        return Err(DataError::Config(
            "data.blend is empty: name at least one dataset".to_owned(),
        ));
    }
    let cache_dir = PathBuf::from(data.cache_dir.as_deref().unwrap_or(DEFAULT_CACHE_DIR));
    let split = SplitMatrix::parse(&data.split)?;
    let weights: Vec<f64> = data.blend.iter().map(|entry| entry.weight).collect();
    let weights = normalize_weights(&weights)?;
    let datasets = data
        .blend
        .iter()
        .map(|entry| open_entry(&entry.path, &data.json_key, tokenizer, &cache_dir))
        .collect::<Result<Vec<_>, _>>()?;
    for dataset in &datasets {
        crate::check_vocabulary(dataset, &cache_dir, vocab_size)?;
    }
    let index_dir = cache_dir.join("indices");
    let own = [None, data.valid_blend.as_ref(), data.test_blend.as_ref()];
    let mut splits = (0..3).map(|which| {
        if samples[which] == 0 {
            return Ok(None);
        }
        if let Some(blend) = own[which] {
            // A blend of its own is all this split's: every document, whatever `split` says.
            let weights: Vec<f64> = blend.iter().map(|entry| entry.weight).collect();
            let weights = normalize_weights(&weights)?;
            let datasets = blend
                .iter()
                .map(|entry| open_entry(&entry.path, &data.json_key, tokenizer, &cache_dir))
                .collect::<Result<Vec<_>, _>>()?;
            let all = SplitMatrix::parse(["1,0,0", "0,1,0", "0,0,1"][which])?;
            return build_split(
                &datasets,
                &weights,
                &all,
                which,
                samples[which],
                seq_length,
                seed,
                &index_dir,
            )
            .map(Some);
        }
        if split.0[which].is_none() {
            return Ok(None);
        }
        build_split(
            &datasets,
            &weights,
            &split,
            which,
            samples[which],
            seq_length,
            seed,
            &index_dir,
        )
        .map(Some)
    });
    let train = splits.next().transpose()?.flatten().ok_or_else(|| {
        DataError::Config(format!(
            "no training data: data.split {:?} gives train no share, or 0 train samples were asked for",
            data.split
        ))
    })?;
    let valid = splits.next().transpose()?.flatten();
    let test = splits.next().transpose()?.flatten();
    Ok(GptData { train, valid, test })
}

/// Opens a blend entry: `.jsonl`/`.json` files are preprocessed (once) into the cache, anything
/// else is an indexed-dataset prefix (a trailing `.bin`/`.idx` is tolerated).
fn open_entry(
    path: &str,
    json_key: &str,
    tokenizer: &Tokenizer,
    cache_dir: &Path,
) -> Result<Arc<IndexedDataset>, DataError> {
    let as_path = Path::new(path);
    let prefix = match as_path.extension().and_then(|e| e.to_str()) {
        Some("jsonl" | "json") => {
            preprocess_jsonl_cached(as_path, json_key, tokenizer, cache_dir, Progress::Auto)?
        }
        Some("bin" | "idx") => as_path.with_extension(""),
        _ => as_path.to_path_buf(),
    };
    IndexedDataset::open(prefix).map(Arc::new)
}

#[allow(clippy::too_many_arguments)]
fn build_split(
    datasets: &[Arc<IndexedDataset>],
    weights: &[f64],
    split: &SplitMatrix,
    which: usize,
    samples: u64,
    seq_length: u32,
    seed: u64,
    index_dir: &Path,
) -> Result<BlendedDataset, DataError> {
    let per_dataset = if datasets.len() == 1 {
        vec![samples]
    } else {
        samples_per_dataset(weights, samples, MID_LEVEL_DATASET_SURPLUS)
    };
    let mut built = datasets
        .iter()
        .zip(&per_dataset)
        .map(|(dataset, &num_samples)| {
            let documents = split.documents(which, dataset.len()).unwrap_or(0..0);
            let config = GptDatasetConfig {
                split: which,
                documents,
                num_samples,
                seq_length,
                seed,
            };
            GptDataset::build(dataset.clone(), &config, index_dir)
        })
        .collect::<Result<Vec<_>, _>>()?;
    if built.len() == 1 {
        let only = built.remove(0);
        return Ok(BlendedDataset::single(only));
    }
    let size: u64 = samples_per_dataset(weights, samples, 0.0).iter().sum();
    BlendedDataset::weighted(built, weights, size, index_dir)
}

#[cfg(test)]
mod tests;
