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
use crate::recompute::{Replay, Rerun, RngMark, Run, Segment, record};

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
        replay: Replay::Rerun { mark, rerun },
    });
    outputs
}

/// [`Replay::Kept`]: `run` tracked on fresh leaves of `inputs`, its outputs handed on as fresh
/// leaves; the graph between stays alive on the tape until the backward driver reaches it.
pub(crate) fn cut_kept<B: ParallelOps, C: CheckpointStrategy>(
    inputs: Vec<FloatTensor<Autodiff<B, C>>>,
    run: Run<Autodiff<B, C>>,
) -> Vec<FloatTensor<Autodiff<B, C>>> {
    type Ad<B, C> = Autodiff<B, C>;
    let fresh: Vec<_> = inputs
        .iter()
        .map(|x| {
            let leaf = Ad::<B, C>::from_inner(x.primitive.clone());
            if x.is_tracked() {
                leaf.require_grad()
            } else {
                leaf
            }
        })
        .collect();
    let tracked_outputs = run(fresh.clone());
    let outputs: Vec<_> = tracked_outputs
        .iter()
        .map(|y| Ad::<B, C>::from_inner(y.primitive.clone()).require_grad())
        .collect();
    let inputs = inputs
        .into_iter()
        .map(|x| {
            let tracked = x.is_tracked();
            (x, tracked)
        })
        .collect();
    record(Segment::<Ad<B, C>> {
        inputs,
        outputs: outputs.clone(),
        replay: Replay::Kept {
            inputs: fresh,
            outputs: tracked_outputs,
        },
    });
    outputs
}
