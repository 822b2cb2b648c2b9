//! Expert loads travel from the forward pass to the trainer, which sums them over microbatches
//! (and later data-parallel ranks) before the expert-bias update; a plain host-side type keeps
//! that accumulation free of tensors and devices.

/// Tokens kept per expert, one row per MoE layer in layer order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpertLoads {
    pub layers: Vec<Vec<u64>>,
}

impl ExpertLoads {
    /// Add `other` element-wise (the first call on an empty value copies it).
    pub fn accumulate(&mut self, other: &ExpertLoads) {
        if self.layers.is_empty() {
            self.layers = other.layers.clone();
            return;
        }
        for (mine, theirs) in self.layers.iter_mut().zip(&other.layers) {
            for (a, b) in mine.iter_mut().zip(theirs) {
                *a += b;
            }
        }
    }
}
