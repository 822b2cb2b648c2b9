//! The residual add with hidden dropout after an fp8 linear or MLP, inside the same node.
//!
//! A block's attention output projection and MLP each end in `residual + dropout(y)`. Apart,
//! the dropout-add's backward writes `y`'s gradient (the kept elements scaled) in 16 bits and
//! the fp8 node's cast reads it back; together, the node's backward casts that gradient straight
//! from the output's, regenerating the keep bits as it reads (`Fp8Source::DropoutGrad`), and
//! hands the residual its gradient unchanged.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

use crate::FusedOps;
use crate::op::dropout::DropoutMask;

/// The residual an fp8 node's output is added to, after dropout with probability `prob`
/// (live: a training step with `prob > 0`).
#[derive(Debug, Clone)]
pub struct Fp8Residual<B: Backend> {
    pub residual: FloatTensor<B>,
    pub prob: f64,
}

impl<B: Backend, C: CheckpointStrategy> Fp8Residual<Autodiff<B, C>> {
    /// The residual on the inner backend, after handing it (a parent of the node it joins) to
    /// `parent`.
    pub(crate) fn untracked(
        self,
        mut parent: impl FnMut(&FloatTensor<Autodiff<B, C>>),
    ) -> Fp8Residual<B> {
        parent(&self.residual);
        Fp8Residual {
            residual: self.residual.primitive,
            prob: self.prob,
        }
    }
}

/// `residual + dropout(output)` by the backend's dropout-add kernel, and its keep mask.
pub(crate) fn add_residual<B: FusedOps>(
    output: FloatTensor<B>,
    residual: FloatTensor<B>,
    prob: f64,
) -> (FloatTensor<B>, DropoutMask<B>) {
    let saved = B::dropout_add_kernel_forward(output, residual, prob);
    (saved.output, saved.mask)
}
