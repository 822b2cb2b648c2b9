//! Expert loads travel from the forward pass to the trainer, which sums them over microbatches
//! (and later data-parallel ranks) before the expert-bias update; a plain host-side type keeps
//! that accumulation free of tensors and devices.
//!
//! A layer routed on the device leaves its counts there, and its loads are read only when the
//! trainer asks for the sum, after the step's backward is queued: reading them in the forward
//! made the host wait for the GPU in every MoE layer.

use std::fmt;
use std::sync::Arc;

use burn::tensor::backend::Backend;
use ferrotron_ops::GroupRows;

/// One MoE layer's kept tokens per expert, read when asked.
#[derive(Clone)]
pub struct LayerLoads(Arc<dyn Fn() -> Vec<u64> + Send + Sync>);

impl LayerLoads {
    /// The loads of `rows` (each expert's routed rows), host numbers or device counts.
    pub fn of<B: Backend>(rows: &GroupRows<B>) -> Self {
        let rows = rows.clone();
        LayerLoads(Arc::new(move || {
            rows.host().iter().map(|&count| count as u64).collect()
        }))
    }

    /// Loads the host already has.
    pub fn ready(loads: Vec<u64>) -> Self {
        LayerLoads(Arc::new(move || loads.clone()))
    }

    /// The loads, read from the device (waiting for it) where they are still there.
    pub fn read(&self) -> Vec<u64> {
        (self.0)()
    }
}

impl fmt::Debug for LayerLoads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LayerLoads")
    }
}

/// Tokens kept per expert, one row per MoE layer in layer order, summed over what was
/// accumulated.
#[derive(Debug, Clone, Default)]
pub struct ExpertLoads {
    /// The sum of what has been read.
    read: Vec<Vec<u64>>,
    /// Microbatches not read yet, one entry per MoE layer each.
    pending: Vec<Vec<LayerLoads>>,
}

impl ExpertLoads {
    /// One forward's loads, one entry per MoE layer, not read yet.
    pub fn pending(layers: Vec<LayerLoads>) -> Self {
        ExpertLoads {
            read: Vec::new(),
            pending: vec![layers],
        }
    }

    /// Loads the host has, one row per MoE layer.
    pub fn from_layers(layers: Vec<Vec<u64>>) -> Self {
        ExpertLoads {
            read: layers,
            pending: Vec::new(),
        }
    }

    /// Add `other` element-wise (its unread part stays unread).
    pub fn accumulate(&mut self, other: &ExpertLoads) {
        add(&mut self.read, &other.read);
        self.pending.extend(other.pending.iter().cloned());
    }

    /// The summed loads, one row per MoE layer (none for a dense model), after reading what is
    /// pending.
    pub fn layers(&mut self) -> &mut Vec<Vec<u64>> {
        if !self.pending.is_empty() {
            self.read = self.summed();
            self.pending.clear();
        }
        &mut self.read
    }

    /// The summed loads without keeping the read (what tests and reports look at).
    pub fn summed(&self) -> Vec<Vec<u64>> {
        let mut sum = self.read.clone();
        for microbatch in &self.pending {
            let layers: Vec<Vec<u64>> = microbatch.iter().map(LayerLoads::read).collect();
            add(&mut sum, &layers);
        }
        sum
    }
}

/// `sum += more` row by row; an empty `sum` takes `more` as it is.
fn add(sum: &mut Vec<Vec<u64>>, more: &[Vec<u64>]) {
    if sum.is_empty() {
        *sum = more.to_vec();
        return;
    }
    for (mine, theirs) in sum.iter_mut().zip(more) {
        for (a, b) in mine.iter_mut().zip(theirs) {
            *a += b;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn pending_loads_are_read_when_summed_and_add_to_the_read_ones() {
        let reads = Arc::new(AtomicUsize::new(0));
        let layer = |loads: Vec<u64>| {
            let reads = Arc::clone(&reads);
            LayerLoads(Arc::new(move || {
                reads.fetch_add(1, Ordering::SeqCst);
                loads.clone()
            }))
        };
        let mut sum = ExpertLoads::default();
        sum.accumulate(&ExpertLoads::pending(vec![
            layer(vec![1, 2]),
            layer(vec![0, 4]),
        ]));
        sum.accumulate(&ExpertLoads::from_layers(vec![vec![10, 0], vec![1, 1]]));
        sum.accumulate(&ExpertLoads::pending(vec![
            layer(vec![3, 3]),
            layer(vec![2, 0]),
        ]));
        assert_eq!(
            reads.load(Ordering::SeqCst),
            0,
            "nothing read while accumulating"
        );
        assert_eq!(sum.layers(), &vec![vec![14, 5], vec![3, 5]]);
        assert_eq!(reads.load(Ordering::SeqCst), 4);
        assert_eq!(sum.layers(), &vec![vec![14, 5], vec![3, 5]], "read once");
        assert_eq!(reads.load(Ordering::SeqCst), 4);
    }
}
