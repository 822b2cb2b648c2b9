//! Megatron's conjugate operators around a column-parallel → row-parallel pair, in one place.
//!
//! A column-parallel layer needs its input whole on every tp rank and a row-parallel layer leaves
//! partial sums; which collective joins them depends only on whether sequence parallelism is on
//! (all-gather / reduce-scatter along the sequence instead of identity / all-reduce). Keeping
//! that choice here means attention, the MLP, the shared expert and the vocabulary layers all
//! make it the same way, and on one rank every operator is the identity.

use burn::tensor::Tensor;
use burn::tensor::module::linear;
use ferrotron_parallel::collectives::{
    copy_to_region, gather_from_sequence_region, reduce_from_region,
    reduce_scatter_to_sequence_region,
};
use ferrotron_parallel::{Comm, ParallelContext, ParallelOps, solo};

/// A tensor-parallel group and whether activations outside it are split along the sequence.
#[derive(Clone, Debug)]
pub struct TensorParallel {
    pub comm: Comm,
    /// Only ever true when the group has more than one rank.
    pub sequence_parallel: bool,
}

impl TensorParallel {
    pub fn new(comm: Comm, sequence_parallel: bool) -> Self {
        let sequence_parallel = sequence_parallel && comm.size() > 1;
        TensorParallel {
            comm,
            sequence_parallel,
        }
    }

    /// One rank: every operator is the identity.
    pub fn single() -> Self {
        TensorParallel::new(solo(), false)
    }

    /// The dense layers' group: `ctx.tp`, sequence parallel as the context says.
    pub fn of(ctx: &ParallelContext) -> Self {
        TensorParallel::new(ctx.tp.clone(), ctx.sequence_parallel)
    }

    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    pub fn size(&self) -> usize {
        self.comm.size()
    }

    /// The input of a column-parallel layer: `[.., seq/tp, h]` gathered along the sequence
    /// (dim `D − 2`) with sequence parallelism, otherwise the replicated input whose gradient is
    /// all-reduced.
    pub fn enter<B: ParallelOps, const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        if self.sequence_parallel {
            gather_from_sequence_region(x, D - 2, &self.comm)
        } else {
            copy_to_region(x, &self.comm)
        }
    }

    /// The output of a row-parallel layer (partial sums): reduce-scattered along the sequence
    /// with sequence parallelism, otherwise all-reduced. Biases are added after this.
    pub fn exit<B: ParallelOps, const D: usize>(&self, y: Tensor<B, D>) -> Tensor<B, D> {
        if self.sequence_parallel {
            reduce_scatter_to_sequence_region(y, D - 2, &self.comm)
        } else {
            reduce_from_region(y, &self.comm)
        }
    }

    /// A row-parallel layer: `x · weight` joined over the group by [`exit`](Self::exit), then
    /// the bias, once. On one rank there is nothing to join, so the bias goes into the linear
    /// op itself: the same sum on the CPU, and on the GPU the GEMM's epilogue and a GEMV for
    /// its gradient instead of an add over the output and a reduction in backward.
    pub fn row_parallel<B: ParallelOps, const D: usize>(
        &self,
        x: Tensor<B, D>,
        weight: Tensor<B, 2>,
        bias: Option<Tensor<B, 1>>,
    ) -> Tensor<B, D> {
        if self.size() == 1 {
            return linear(x, weight, bias);
        }
        let output = self.exit(linear(x, weight, None));
        match bias {
            Some(bias) => output + bias.unsqueeze(),
            None => output,
        }
    }
}
