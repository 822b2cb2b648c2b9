//! The backward pass of a forward that cut recomputed ranges out of its graph
//! (`ferrotron_parallel::recompute`): the graph's own backward first, then each range in reverse
//! order re-run with autodiff and differentiated against its output leaves' gradients, then the
//! graph piece in front of it against the range's input gradient. burn cannot start a backward
//! from inside another, so the pieces are driven from here one after the other, and their
//! gradients are moved into one container: a parameter's from each piece it appears in (added,
//! so a tied embedding sums its two uses as one backward would), and the gradients of the
//! leaves the caller or an earlier range still needs.
//!
//! Without ranges this is the plain backward. With dropout the generator is marked before and
//! restored after, in either case, so the draws that follow do not depend on recomputation.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use ferrotron_parallel::Comm;
use ferrotron_parallel::recompute::{Replay, Segment, Tape};

use crate::TrainError;
use crate::error::comm_error;

/// A `fence` for a backward that communicates with `peers` (the tensor, context and expert
/// groups): waits until every thread rank among them has finished its previous backward.
/// burn-autodiff ends each backward by locking every graph of the process in turn to prune
/// orphans; a thread rank still in that cleanup would wait for the graph lock of a peer that
/// already started its next backward and sits in a collective waiting for it, a deadlock no
/// schedule order avoids. Starting each backward together removes the cycle. Ranks of their
/// own processes share no graphs, so they skip the barrier (on NCCL it would stall the host).
pub(crate) fn fence_peers(peers: &[&Comm]) -> Result<(), TrainError> {
    for comm in peers {
        if comm.size() > 1 && comm.members_are_threads() {
            comm.barrier()
                .map_err(|e| comm_error("barrier before a backward pass", e))?;
        }
    }
    Ok(())
}

/// Gradients of `root` (a scalar) through its graph and `tape`'s ranges, for every parameter of
/// `module` and for `leaves` (tensors whose gradients the caller reads: a pipeline stage's
/// input), calling `done` after each range (every parameter used only after that range's start
/// then has its final gradient in the container `done` is given). `fence` runs before every
/// backward (see `crate::rank::pipeline`).
pub(crate) fn backward_by_range<B, M>(
    root: Tensor<B, 1>,
    tape: Tape<B>,
    module: &M,
    leaves: &[Tensor<B, 3>],
    dropout: bool,
    fence: &mut dyn FnMut() -> Result<(), TrainError>,
    done: &mut dyn FnMut(&mut B::Gradients) -> Result<(), TrainError>,
) -> Result<B::Gradients, TrainError>
where
    B: crate::TrainBackend,
    M: Module<B>,
{
    let device = root.device();
    let end = dropout.then(|| B::rng_mark(&device));
    fence()?;
    let mut grads = root.backward();
    let mut segments = tape.segments;
    while let Some(Segment {
        inputs,
        outputs,
        replay,
    }) = segments.pop()
    {
        let seeds: Vec<_> = outputs
            .iter()
            .map(|output| B::grad_remove(output, &mut grads))
            .collect();
        if seeds.iter().all(Option::is_none) {
            done(&mut grads)?;
            continue;
        }
        let (fresh, tracked_outputs) = match replay {
            Replay::Rerun { mark, rerun } => {
                if dropout {
                    B::rng_restore(&device, mark);
                }
                let fresh: Vec<_> = inputs
                    .iter()
                    .map(|(x, tracked)| {
                        B::float_set_require_grad(B::from_inner(B::inner(x.clone())), *tracked)
                    })
                    .collect();
                let outputs = rerun(fresh.clone(), true);
                (fresh, outputs)
            }
            Replay::Kept { inputs, outputs } => (inputs, outputs),
        };
        fence()?;
        let mut part = B::backward(surrogate::<B>(tracked_outputs.into_iter().zip(seeds)));
        transfer_params(module, &mut part, &mut grads);
        let upstream: Vec<_> = inputs
            .into_iter()
            .zip(&fresh)
            .filter(|((_, tracked), _)| *tracked)
            .map(|((x, _), leaf)| (x, B::grad_remove(leaf, &mut part)))
            .collect();
        if upstream.iter().all(|(_, grad)| grad.is_none()) {
            done(&mut grads)?;
            continue;
        }
        fence()?;
        let mut up = B::backward(surrogate::<B>(upstream.into_iter()));
        transfer_params(module, &mut up, &mut grads);
        for earlier in &segments {
            for output in &earlier.outputs {
                transfer::<B>(output, &mut up, &mut grads);
            }
        }
        for leaf in leaves {
            transfer::<B>(&leaf.clone().into_primitive().tensor(), &mut up, &mut grads);
        }
        done(&mut grads)?;
    }
    if let Some(end) = end {
        B::rng_restore(&device, end);
    }
    Ok(grads)
}

/// `Σ sum(y · g)` over the pairs with a gradient: its gradient with respect to each `y` is
/// exactly `g` (the pipeline's surrogate, `crate::rank::pipeline`).
fn surrogate<B: AutodiffBackend>(
    pairs: impl Iterator<Item = (FloatTensor<B>, Option<FloatTensor<B::InnerBackend>>)>,
) -> FloatTensor<B> {
    pairs
        .filter_map(|(y, grad)| grad.map(|grad| B::float_sum(B::float_mul(y, B::from_inner(grad)))))
        .reduce(B::float_add)
        .expect("a surrogate over at least one gradient")
}

/// Moves `tensor`'s gradient from `from` into `into`, added to any already there.
fn transfer<B: AutodiffBackend>(
    tensor: &FloatTensor<B>,
    from: &mut B::Gradients,
    into: &mut B::Gradients,
) {
    if let Some(grad) = B::grad_remove(tensor, from) {
        let sum = match B::grad_remove(tensor, into) {
            Some(before) => B::InnerBackend::float_add(before, grad),
            None => grad,
        };
        B::grad_replace(tensor, into, sum);
    }
}

fn transfer_params<B: AutodiffBackend, M: Module<B>>(
    module: &M,
    from: &mut B::Gradients,
    into: &mut B::Gradients,
) {
    struct Transfer<'a, B: AutodiffBackend> {
        from: &'a mut B::Gradients,
        into: &'a mut B::Gradients,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Transfer<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let tensor = param.val().into_primitive().tensor();
            transfer::<B>(&tensor, self.from, self.into);
        }
    }
    module.visit(&mut Transfer::<B> { from, into });
}

#[cfg(test)]
#[path = "backward_tests.rs"]
mod tests;
