//! The row counts of a grouped matmul's groups, kept where they were made.
//!
//! Dropless MoE routing counts each expert's rows on the device. A grouped GEMM that reads its
//! problem sizes from device memory needs nothing more; one that takes them as host numbers
//! (cuBLAS's `cublasGemmGroupedBatchedEx`, the composed per-group arithmetic) reads them, once:
//! the clones a node keeps for its backward share that read. Reading the counts in the routing
//! instead, as the layer did before, stopped the host in every MoE layer whatever the kernel.

use std::sync::{Arc, OnceLock};

use burn::tensor::backend::Backend;
use burn::tensor::ops::IntTensor;
use burn::tensor::{Int, Tensor, TensorData, TensorMetadata};

/// How many consecutive rows each group of a grouped matmul holds.
#[derive(Debug, Clone)]
pub struct GroupRows<B: Backend> {
    /// `[groups]` integers on the device, when the counts were made there.
    counts: Option<IntTensor<B>>,
    /// The counts as host numbers: given, or read from `counts` the first time they are asked.
    host: Arc<OnceLock<Vec<usize>>>,
}

impl<B: Backend> GroupRows<B> {
    /// Counts the host already has (host routing, the expert-parallel dispatchers, tests).
    pub fn on_host(rows: Vec<usize>) -> Self {
        GroupRows {
            counts: None,
            host: Arc::new(OnceLock::from(rows)),
        }
    }

    /// Counts left on the device: `counts [groups]`, read only if a consumer needs host numbers.
    pub fn on_device(counts: IntTensor<B>) -> Self {
        GroupRows {
            counts: Some(counts),
            host: Arc::new(OnceLock::new()),
        }
    }

    pub fn groups(&self) -> usize {
        match &self.counts {
            Some(counts) => counts.shape().dims::<1>()[0],
            None => self.host().len(),
        }
    }

    /// The counts as host numbers, read from the device (waiting for it) the first time.
    pub fn host(&self) -> &[usize] {
        self.host.get_or_init(|| {
            let counts = self
                .counts
                .clone()
                .expect("group rows are on the host or the device");
            Tensor::<B, 1, Int>::from_primitive(counts)
                .into_data()
                .iter::<i64>()
                .map(|count| usize::try_from(count).expect("a row count is not negative"))
                .collect()
        })
    }

    /// Whether the host numbers exist (given, or read): a kernel that takes the device counts
    /// leaves them unread.
    #[cfg(test)]
    fn read(&self) -> bool {
        self.host.get().is_some()
    }

    /// The counts as a device tensor on `device` (uploaded when only the host has them).
    pub fn device(&self, device: &B::Device) -> IntTensor<B> {
        match &self.counts {
            Some(counts) => counts.clone(),
            None => {
                let rows: Vec<i64> = self.host().iter().map(|&rows| rows as i64).collect();
                let groups = rows.len();
                Tensor::<B, 1, Int>::from_data(TensorData::new(rows, [groups]), device)
                    .into_primitive()
            }
        }
    }

    /// The same counts for a backend with the same integer tensors (an autodiff backend's
    /// inner one): the host read stays shared.
    pub fn of<I: Backend<IntTensorPrimitive = B::IntTensorPrimitive>>(&self) -> GroupRows<I> {
        GroupRows {
            counts: self.counts.clone(),
            host: Arc::clone(&self.host),
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;

    use super::*;

    type B = Flex;

    #[test]
    fn device_counts_are_read_once_and_only_when_asked() {
        let device = Default::default();
        let counts =
            Tensor::<B, 1, Int>::from_data(TensorData::new(vec![3i64, 0, 2], [3]), &device);
        let rows = GroupRows::<B>::on_device(counts.into_primitive());
        assert_eq!(rows.groups(), 3);
        let shared = rows.clone();
        assert!(!rows.read(), "nothing read before a consumer asks");
        assert_eq!(rows.host(), &[3, 0, 2]);
        assert!(shared.read(), "a clone shares the read");
        let uploaded = GroupRows::<B>::on_host(vec![1, 4]).device(&device);
        let uploaded: Vec<i64> = Tensor::<B, 1, Int>::from_primitive(uploaded)
            .into_data()
            .iter::<i64>()
            .collect();
        assert_eq!(uploaded, vec![1, 4]);
    }
}
