//! [`ParallelOps`] for `Autodiff<B>`: each region operator is one tracked op whose backward is
//! its conjugate collective, run on the inner backend.
//!
//! The pairs are Megatron's: copy-to ↔ all-reduce, gather ↔ keep-own-chunk, sequence all-gather
//! ↔ reduce-scatter, all-to-all ↔ the reverse all-to-all. Ops are marked compute-bound so a
//! checkpointing strategy never recomputes a collective in the backward pass (that would issue
//! an unmatched collective on this rank alone).

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;

use crate::comm::Comm;
use crate::ops::ParallelOps;
use crate::recompute::{Rerun, RngMark, Run};
use crate::recompute_autodiff;
use ferrotron_dist::{CommError, ReduceOp};

/// What the backward of a region operator does with the incoming gradient.
#[derive(Debug, Clone)]
enum Conjugate {
    AllReduce,
    Identity,
    OwnChunk { dim: usize },
    AllGather { dim: usize },
    ReduceScatter { dim: usize },
    AllToAllRows { send: Vec<usize>, recv: Vec<usize> },
}

#[derive(Debug)]
struct RegionOp;

impl<B: ParallelOps> Backward<B, 1> for RegionOp {
    type State = (Conjugate, Comm);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (conjugate, comm) = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad| match conjugate {
            Conjugate::AllReduce => B::reduce_from_region(grad, &comm),
            Conjugate::Identity => grad,
            Conjugate::OwnChunk { dim } => B::scatter_to_region(grad, dim, &comm),
            Conjugate::AllGather { dim } => B::gather_from_region(grad, dim, &comm),
            Conjugate::ReduceScatter { dim } => {
                B::reduce_scatter_to_sequence_region(grad, dim, &comm)
            }
            // Rows came in as `recv` from each rank; their gradients go back the same way.
            Conjugate::AllToAllRows { send, recv } => B::all_to_all_rows(grad, &recv, &send, &comm),
        });
    }
}

/// Records `output = forward(x)` with `conjugate` as its backward.
fn region<B: ParallelOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    comm: &Comm,
    conjugate: Conjugate,
    forward: impl FnOnce(FloatTensor<B>) -> FloatTensor<B>,
) -> FloatTensor<Autodiff<B, C>> {
    let prepared = RegionOp
        .prepare::<C>([x.node.clone()])
        .compute_bound()
        .stateful();
    let output = forward(x.primitive);
    match prepared {
        OpsKind::Tracked(prep) => prep.finish((conjugate, comm.clone()), output),
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}

impl<B: ParallelOps, C: CheckpointStrategy> ParallelOps for Autodiff<B, C> {
    fn copy_to_region(x: FloatTensor<Self>, comm: &Comm) -> FloatTensor<Self> {
        if comm.size() == 1 {
            return x;
        }
        region::<B, C>(x, comm, Conjugate::AllReduce, |x| {
            B::copy_to_region(x, comm)
        })
    }

    fn reduce_from_region(x: FloatTensor<Self>, comm: &Comm) -> FloatTensor<Self> {
        if comm.size() == 1 {
            return x;
        }
        region::<B, C>(x, comm, Conjugate::Identity, |x| {
            B::reduce_from_region(x, comm)
        })
    }

    fn gather_from_region(x: FloatTensor<Self>, dim: usize, comm: &Comm) -> FloatTensor<Self> {
        if comm.size() == 1 {
            return x;
        }
        region::<B, C>(x, comm, Conjugate::OwnChunk { dim }, |x| {
            B::gather_from_region(x, dim, comm)
        })
    }

    fn scatter_to_region(x: FloatTensor<Self>, dim: usize, comm: &Comm) -> FloatTensor<Self> {
        if comm.size() == 1 {
            return x;
        }
        region::<B, C>(x, comm, Conjugate::AllGather { dim }, |x| {
            B::scatter_to_region(x, dim, comm)
        })
    }

    fn gather_from_sequence_region(
        x: FloatTensor<Self>,
        dim: usize,
        comm: &Comm,
    ) -> FloatTensor<Self> {
        if comm.size() == 1 {
            return x;
        }
        region::<B, C>(x, comm, Conjugate::ReduceScatter { dim }, |x| {
            B::gather_from_sequence_region(x, dim, comm)
        })
    }

    fn reduce_scatter_to_sequence_region(
        x: FloatTensor<Self>,
        dim: usize,
        comm: &Comm,
    ) -> FloatTensor<Self> {
        if comm.size() == 1 {
            return x;
        }
        region::<B, C>(x, comm, Conjugate::AllGather { dim }, |x| {
            B::reduce_scatter_to_sequence_region(x, dim, comm)
        })
    }

    fn all_to_all_rows(
        x: FloatTensor<Self>,
        send_counts: &[usize],
        recv_counts: &[usize],
        comm: &Comm,
    ) -> FloatTensor<Self> {
        let conjugate = Conjugate::AllToAllRows {
            send: send_counts.to_vec(),
            recv: recv_counts.to_vec(),
        };
        region::<B, C>(x, comm, conjugate, |x| {
            B::all_to_all_rows(x, send_counts, recv_counts, comm)
        })
    }

    fn all_reduce_detached(x: FloatTensor<Self>, op: ReduceOp, comm: &Comm) -> FloatTensor<Self> {
        let inner = <Self as AutodiffBackend>::inner(x);
        <Self as AutodiffBackend>::from_inner(B::all_reduce_detached(inner, op, comm))
    }

    fn rng_mark(device: &Self::Device) -> RngMark {
        B::rng_mark(device)
    }

    fn rng_restore(device: &Self::Device, mark: RngMark) {
        B::rng_restore(device, mark);
    }

    fn recompute(
        inputs: Vec<FloatTensor<Self>>,
        mark: RngMark,
        rerun: Rerun<Self>,
    ) -> Vec<FloatTensor<Self>> {
        recompute_autodiff::cut::<B, C>(inputs, mark, rerun)
    }

    /// Sends the values (no gradient flows back through a pipeline send; the schedule sends
    /// the gradient itself).
    fn send_to(x: FloatTensor<Self>, peer: usize, comm: &Comm) -> Result<(), CommError> {
        B::send_to(x.primitive, peer, comm)
    }

    /// A fresh leaf (the stage makes it require a gradient where it needs one).
    fn recv_from(
        shape: &[usize],
        peer: usize,
        comm: &Comm,
        device: &Self::Device,
    ) -> Result<FloatTensor<Self>, CommError> {
        Ok(Self::from_inner(B::recv_from(shape, peer, comm, device)?))
    }

    fn cut_kept(inputs: Vec<FloatTensor<Self>>, run: Run<Self>) -> Vec<FloatTensor<Self>> {
        recompute_autodiff::cut_kept::<B, C>(inputs, run)
    }
}
