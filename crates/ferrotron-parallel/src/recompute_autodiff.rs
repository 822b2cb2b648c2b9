//! [`ParallelOps::recompute`] for `Autodiff<B>`: the graph cut of `recompute.rs`.
//!
//! The untracked forward sees detached inputs and (the model's part of the bargain, `track`
//! false) parameters without gradients, so every op takes autodiff's untracked path: nothing is
//! registered and nothing saved, while `ad_enabled` stays true so dropout is live exactly as in
//! the tracked forward the backward re-runs.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;

use crate::ops::ParallelOps;
use crate::recompute::{Rerun, RngMark, Segment, record};

pub(crate) fn cut<B: ParallelOps, C: CheckpointStrategy>(
    inputs: Vec<FloatTensor<Autodiff<B, C>>>,
    mark: RngMark,
    rerun: Rerun<Autodiff<B, C>>,
) -> Vec<FloatTensor<Autodiff<B, C>>> {
    let detached = inputs
        .iter()
        .map(|x| Autodiff::<B, C>::from_inner(x.primitive.clone()))
        .collect();
    let outputs: Vec<_> = rerun(detached, false)
        .into_iter()
        .map(|y| Autodiff::<B, C>::from_inner(y.primitive).require_grad())
        .collect();
    let inputs = inputs
        .into_iter()
        .map(|x| {
            let tracked = x.is_tracked();
            (x, tracked)
        })
        .collect();
    record(Segment::<Autodiff<B, C>> {
        inputs,
        outputs: outputs.clone(),
        mark,
        rerun,
    });
    outputs
}
