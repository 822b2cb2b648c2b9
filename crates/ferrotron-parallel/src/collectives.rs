//! The region operators on burn tensors: what model code calls.
//!
//! Each is a thin typed wrapper over [`ParallelOps`], so a layer written with these runs
//! unchanged on one rank (every op an identity on a group of one) and on N ranks, with the
//! gradient of every op being the conjugate collective under `Autodiff`. Float tensors only;
//! the data travels as f32 and comes back in the tensor's dtype. A failed collective panics with
//! the communicator's error, which names the group and the ranks at fault.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};

use crate::comm::Comm;
use crate::ops::ParallelOps;
use ferrotron_dist::{CommError, ReduceOp};

fn lift<B: ParallelOps, const D: usize>(
    x: Tensor<B, D>,
    op: impl FnOnce(burn::tensor::ops::FloatTensor<B>) -> burn::tensor::ops::FloatTensor<B>,
) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(op(x.into_primitive().tensor())))
}

/// Forward identity, backward all-reduce: the input of a column-parallel layer (Megatron `f`).
pub fn copy_to_region<B: ParallelOps, const D: usize>(
    x: Tensor<B, D>,
    comm: &Comm,
) -> Tensor<B, D> {
    lift(x, |x| B::copy_to_region(x, comm))
}

/// Forward all-reduce (sum), backward identity: the output of a row-parallel layer (Megatron `g`).
pub fn reduce_from_region<B: ParallelOps, const D: usize>(
    x: Tensor<B, D>,
    comm: &Comm,
) -> Tensor<B, D> {
    lift(x, |x| B::reduce_from_region(x, comm))
}

/// Forward all-gather along `dim` (rank order), backward keeps this rank's chunk.
pub fn gather_from_region<B: ParallelOps, const D: usize>(
    x: Tensor<B, D>,
    dim: usize,
    comm: &Comm,
) -> Tensor<B, D> {
    lift(x, |x| B::gather_from_region(x, dim, comm))
}

/// Forward keeps this rank's chunk along `dim` (which must divide evenly), backward all-gathers.
pub fn scatter_to_region<B: ParallelOps, const D: usize>(
    x: Tensor<B, D>,
    dim: usize,
    comm: &Comm,
) -> Tensor<B, D> {
    lift(x, |x| B::scatter_to_region(x, dim, comm))
}

/// Forward all-gather along `dim`, backward reduce-scatter: sequence parallel before a
/// column-parallel layer, context-parallel K/V.
pub fn gather_from_sequence_region<B: ParallelOps, const D: usize>(
    x: Tensor<B, D>,
    dim: usize,
    comm: &Comm,
) -> Tensor<B, D> {
    lift(x, |x| B::gather_from_sequence_region(x, dim, comm))
}

/// Forward reduce-scatter (sum) along `dim`, backward all-gather: sequence parallel after a
/// row-parallel layer.
pub fn reduce_scatter_to_sequence_region<B: ParallelOps, const D: usize>(
    x: Tensor<B, D>,
    dim: usize,
    comm: &Comm,
) -> Tensor<B, D> {
    lift(x, |x| B::reduce_scatter_to_sequence_region(x, dim, comm))
}

/// Rows exchanged with uneven counts (MoE token dispatch): the first `send_counts[0]` rows go
/// to rank 0, …; the result holds `recv_counts[j]` rows from each rank `j` in rank order.
/// Backward sends the gradients back the reverse way. Get `recv_counts` with
/// [`all_to_all_counts`].
pub fn all_to_all_rows<B: ParallelOps>(
    x: Tensor<B, 2>,
    send_counts: &[usize],
    recv_counts: &[usize],
    comm: &Comm,
) -> Tensor<B, 2> {
    lift(x, |x| B::all_to_all_rows(x, send_counts, recv_counts, comm))
}

/// All-reduce with no gradient: the result is detached from the graph.
pub fn all_reduce_detached<B: ParallelOps, const D: usize>(
    x: Tensor<B, D>,
    op: ReduceOp,
    comm: &Comm,
) -> Tensor<B, D> {
    lift(x, |x| B::all_reduce_detached(x, op, comm))
}

/// The counts each rank will send to this one, given what this rank sends to each
/// (`send_counts.len() == comm.size()`): the exchange that precedes [`all_to_all_rows`].
pub fn all_to_all_counts(send_counts: &[usize], comm: &Comm) -> Result<Vec<usize>, CommError> {
    let size = comm.size();
    let send: Vec<u64> = send_counts.iter().map(|&c| c as u64).collect();
    let mut recv = vec![0u64; size];
    let ones = vec![1usize; size];
    comm.all_to_all_u64(&send, &ones, &mut recv, &ones)?;
    Ok(recv.into_iter().map(|c| c as usize).collect())
}

/// Sends `x`'s values (as f32) to group rank `peer`: pipeline activations and gradients.
/// Not differentiable; the pipeline schedule carries gradients back itself.
pub fn send_tensor<B: Backend, const D: usize>(
    x: &Tensor<B, D>,
    peer: usize,
    comm: &Comm,
) -> Result<(), CommError> {
    let values = x
        .to_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .unwrap_or_else(|err| panic!("a float tensor could not be read as f32: {err:?}"));
    comm.send_f32(&values, peer)
}

/// Receives a tensor of `shape` sent by [`send_tensor`] from group rank `peer`, created on
/// `device` in the default float dtype.
pub fn recv_tensor<B: Backend, const D: usize>(
    shape: [usize; D],
    peer: usize,
    comm: &Comm,
    device: &B::Device,
) -> Result<Tensor<B, D>, CommError> {
    let mut values = vec![0.0f32; shape.iter().product()];
    comm.recv_f32(&mut values, peer)?;
    Ok(Tensor::from_data(TensorData::new(values, shape), device))
}
