//! Weighted blends of GPT datasets, as Megatron's `BlendedDataset` and
//! `BlendedMegatronDatasetBuilder` make them.
//!
//! Each dataset is asked for `ceil(ceil(size·w)·1.005)` samples (the small surplus keeps the
//! greedy interleaving from running a dataset dry) and the blend holds `Σ ceil(size·w)` samples.
//! Sample `i` of the blend comes from the dataset whose share is furthest behind its weight,
//! `argmax_j (w_j·max(i, 1) − count_j)` (helpers.cpp `build_blending_indices`); that keeps every
//! prefix of the stream within one sample per dataset of the exact proportions.

use std::ops::Range;
use std::path::Path;

use crate::cache::{CacheEntry, IndexArrays};
use crate::{DataError, GptDataset};

/// Megatron's `mid_level_dataset_surplus` default.
pub const MID_LEVEL_DATASET_SURPLUS: f64 = 0.005;
const MAGIC: &[u8; 8] = b"FTBLDIX\0";
const DATASET_INDEX: usize = 0;
const DATASET_SAMPLE_INDEX: usize = 1;

/// The samples of one split (train, valid or test): one GPT dataset or a weighted blend.
#[derive(Debug)]
pub struct BlendedDataset {
    datasets: Vec<GptDataset>,
    /// `None` for a single dataset, whose samples are used as they are.
    indices: Option<IndexArrays>,
    /// The blending index's cache key; `None` for a single dataset.
    cache_key: Option<String>,
    len: u64,
    seq_length: u32,
}

impl BlendedDataset {
    /// A "blend" of one dataset: Megatron's single-prefix path, no blending index.
    pub fn single(dataset: GptDataset) -> Self {
        BlendedDataset {
            len: dataset.len(),
            seq_length: dataset.seq_length(),
            datasets: vec![dataset],
            indices: None,
            cache_key: None,
        }
    }

    /// Blends `datasets` by normalised `weights` into `size` samples; the blending index is
    /// cached in `cache_dir`.
    pub fn weighted(
        datasets: Vec<GptDataset>,
        weights: &[f64],
        size: u64,
        cache_dir: &Path,
    ) -> Result<Self, DataError> {
        if datasets.is_empty() || datasets.len() != weights.len() {
            return Err(DataError::Config(format!(
                "a blend needs one weight per dataset ({} datasets, {} weights)",
                datasets.len(),
                weights.len()
            )));
        }
        let seq_length = datasets[0].seq_length();
        let entry = CacheEntry::new(
            cache_dir,
            "BlendedDataset",
            serde_json::json!({
                "class": "BlendedDataset",
                "weights": weights,
                "size": size,
            }),
        );
        let indices = match entry.load(MAGIC, 2) {
            Some(indices) => indices,
            None => {
                let (dataset_index, sample_index) = blending_indices(weights, size);
                entry.store(MAGIC, &[&dataset_index, &sample_index])?
            }
        };
        if indices.len(DATASET_INDEX) as u64 != size {
            return Err(DataError::format(
                &entry.data,
                "index cache is inconsistent",
            ));
        }
        let mut drawn = vec![0u64; datasets.len()];
        for i in 0..size as usize {
            let d = indices.get(DATASET_INDEX, i) as usize;
            drawn[d] = drawn[d].max(indices.get(DATASET_SAMPLE_INDEX, i) + 1);
        }
        for (d, (dataset, &needed)) in datasets.iter().zip(&drawn).enumerate() {
            if needed > dataset.len() {
                return Err(DataError::Config(format!(
                    "blend dataset {d} has {} samples but the blend draws {needed}",
                    dataset.len()
                )));
            }
        }
        Ok(BlendedDataset {
            datasets,
            indices: Some(indices),
            cache_key: Some(entry.key),
            len: size,
            seq_length,
        })
    }

    /// Number of samples.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Tokens per sample minus one (samples hold `seq_length + 1` tokens).
    pub fn seq_length(&self) -> u32 {
        self.seq_length
    }

    /// The blended datasets, in blend order.
    /// The cache keys of every index this split reads (its datasets', then the blend's).
    pub fn cache_keys(&self) -> Vec<String> {
        self.datasets
            .iter()
            .map(|dataset| dataset.cache_key().to_owned())
            .chain(self.cache_key.clone())
            .collect()
    }

    pub fn datasets(&self) -> &[GptDataset] {
        &self.datasets
    }

    /// Which dataset sample `index` comes from, and its index there.
    pub fn source(&self, index: u64) -> Result<(usize, u64), DataError> {
        if index >= self.len {
            return Err(DataError::OutOfRange {
                index,
                len: self.len,
            });
        }
        Ok(match &self.indices {
            None => (0, index),
            Some(indices) => (
                indices.get(DATASET_INDEX, index as usize) as usize,
                indices.get(DATASET_SAMPLE_INDEX, index as usize),
            ),
        })
    }

    /// Appends sample `index` (`seq_length + 1` tokens) to `out`.
    pub fn sample_into(&self, index: u64, out: &mut Vec<u32>) -> Result<(), DataError> {
        let (dataset, sample) = self.source(index)?;
        self.datasets[dataset].sample_into(sample, out)
    }

    /// Sample `index`: `seq_length + 1` tokens.
    pub fn sample(&self, index: u64) -> Result<Vec<u32>, DataError> {
        let mut out = Vec::with_capacity(self.seq_length as usize + 1);
        self.sample_into(index, &mut out)?;
        Ok(out)
    }

    /// Samples `indices` back to back: a row-major `[indices.len(), seq_length + 1]` batch.
    pub fn batch(&self, indices: Range<u64>) -> Result<Vec<u32>, DataError> {
        let rows = (indices.end.saturating_sub(indices.start)) as usize;
        let mut out = Vec::with_capacity(rows * (self.seq_length as usize + 1));
        for index in indices {
            self.sample_into(index, &mut out)?;
        }
        Ok(out)
    }
}

/// Weights scaled to sum to one; negative, non-finite or all-zero weights are refused.
pub fn normalize_weights(weights: &[f64]) -> Result<Vec<f64>, DataError> {
    if let Some(bad) = weights.iter().find(|w| !w.is_finite() || **w < 0.0) {
        return Err(DataError::Config(format!(
            "blend weight {bad} is not a finite non-negative number"
        )));
    }
    let total: f64 = weights.iter().sum();
    if total <= 0.0 {
        return Err(DataError::Config(
            "the blend weights add up to zero".to_owned(),
        ));
    }
    Ok(weights.iter().map(|w| w / total).collect())
}

/// Samples to draw from each dataset for a blend of `size` samples (Megatron's
/// `_get_size_per_split_per_dataset`): `ceil(ceil(size·w)·(1 + surplus))`.
pub fn samples_per_dataset(weights: &[f64], size: u64, surplus: f64) -> Vec<u64> {
    weights
        .iter()
        .map(|w| ((size as f64 * w).ceil() * (1.0 + surplus)).ceil() as u64)
        .collect()
}

/// Megatron's greedy blending index: for each sample, the dataset and its sample number there.
pub fn blending_indices(weights: &[f64], size: u64) -> (Vec<u64>, Vec<u64>) {
    let mut counts = vec![0u64; weights.len()];
    let mut dataset_index = Vec::with_capacity(size as usize);
    let mut sample_index = Vec::with_capacity(size as usize);
    for i in 0..size {
        let at = (i as f64).max(1.0);
        let mut best = 0;
        let mut best_error = weights[0] * at - counts[0] as f64;
        for (d, w) in weights.iter().enumerate().skip(1) {
            let error = w * at - counts[d] as f64;
            if error > best_error {
                best_error = error;
                best = d;
            }
        }
        dataset_index.push(best as u64);
        sample_index.push(counts[best]);
        counts[best] += 1;
    }
    (dataset_index, sample_index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_index_on_a_hand_checked_case() {
        // weights 0.5/0.3/0.2; at i (max 1) pick argmax w·i − count, ties to the lowest index.
        // i=0: errors .5 .3 .2 → 0.  i=1: -.5 .3 .2 → 1.  i=2: 0 -.4 .4 → 2.
        // i=3: .5 -.1 -.4 → 0.  i=4: 0 .2 -.2 → 1.  i=5: .5 -.5 0 → 0.
        let (datasets, samples) = blending_indices(&[0.5, 0.3, 0.2], 6);
        assert_eq!(datasets, [0, 1, 2, 0, 1, 0]);
        assert_eq!(samples, [0, 0, 0, 1, 1, 2]);
    }

    #[test]
    fn proportions_stay_within_one_percent_over_ten_thousand_samples() {
        let weights = normalize_weights(&[3.0, 1.0, 0.5, 0.25]).unwrap();
        let (datasets, _) = blending_indices(&weights, 10_000);
        for (d, w) in weights.iter().enumerate() {
            let share = datasets.iter().filter(|&&x| x == d as u64).count() as f64 / 10_000.0;
            assert!((share - w).abs() < 0.01 * w, "dataset {d}: {share} vs {w}");
        }
    }

    #[test]
    fn per_dataset_sizes_include_megatrons_surplus() {
        assert_eq!(samples_per_dataset(&[0.3, 0.7], 1000, 0.0), [300, 700]);
        assert_eq!(
            samples_per_dataset(&[0.3, 0.7], 1000, MID_LEVEL_DATASET_SURPLUS),
            [302, 704]
        );
        // ceil(ceil(10·⅓)·1.005) = ceil(4·1.005) = 5
        assert_eq!(
            samples_per_dataset(&[1.0 / 3.0], 10, MID_LEVEL_DATASET_SURPLUS),
            [5]
        );
    }

    #[test]
    fn bad_weights_are_refused() {
        assert!(normalize_weights(&[1.0, -1.0]).is_err());
        assert!(normalize_weights(&[0.0, 0.0]).is_err());
        assert!(normalize_weights(&[f64::NAN]).is_err());
        assert_eq!(normalize_weights(&[2.0, 6.0]).unwrap(), [0.25, 0.75]);
    }
}
