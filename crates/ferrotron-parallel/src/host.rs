//! The host round trip every default collective takes: tensor → f32 buffer → communicator →
//! tensor, and the reorderings that make "along dim `d`" collectives out of flat ones.
//!
//! Communicators gather and scatter contiguous chunks, i.e. along dim 0 of a flat buffer. Along
//! any other dim, rank `r`'s piece is `outer` strided blocks of `chunk` elements (`outer` = the
//! product of the dims before `d`); these helpers move those blocks so the flat collective does
//! the right thing. Errors panic with the communicator's message: a collective fails inside an
//! autodiff op, whose backward cannot return one, and the thread world reports the panicking rank.
//!
//! Public so that a backend overriding [`crate::ParallelOps`] for one transport (the CUDA
//! backend for NCCL communicators) can fall back to exactly these for every other.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Slice, TensorData, TensorMetadata};

use crate::comm::Comm;
use ferrotron_dist::{CommError, ReduceOp};

/// A float tensor on the host as f32, with what it takes to rebuild it.
pub(crate) struct Host<B: Backend> {
    pub values: Vec<f32>,
    pub shape: Vec<usize>,
    dtype: DType,
    device: B::Device,
}

impl<B: Backend> Host<B> {
    pub(crate) fn read(tensor: FloatTensor<B>) -> Host<B> {
        let device = B::float_device(&tensor);
        let data = burn::tensor::try_read_sync(B::float_into_data(tensor))
            .expect("collectives need a backend that can read tensors synchronously")
            .unwrap_or_else(|err| panic!("reading a tensor for a collective failed: {err:?}"));
        let dtype = data.dtype;
        let shape = data.shape.to_vec();
        let values = data
            .convert::<f32>()
            .into_vec::<f32>()
            .unwrap_or_else(|err| panic!("a float tensor could not be read as f32: {err:?}"));
        Host {
            values,
            shape,
            dtype,
            device,
        }
    }

    /// The same dtype and device with new values and shape.
    pub(crate) fn write(self, values: Vec<f32>, shape: Vec<usize>) -> FloatTensor<B> {
        let data = TensorData::new(values, shape).convert_dtype(self.dtype);
        B::float_from_data(data, &self.device)
    }
}

/// Panics with the failed collective's message (see the module docs for why).
pub(crate) fn expect_comm(result: Result<(), CommError>) {
    if let Err(err) = result {
        panic!("{err}");
    }
}

/// `(outer, chunk)`: the blocks rank pieces are made of when `shape` is split along `dim` into
/// `parts` (`chunk` = one piece's extent along `dim` × the product of the dims after it).
fn blocks(shape: &[usize], dim: usize, parts: usize, what: &str, comm: &Comm) -> (usize, usize) {
    assert!(
        dim < shape.len(),
        "{what} on group {}: dim {dim} is out of range for shape {shape:?}",
        comm.label()
    );
    assert!(
        shape[dim].is_multiple_of(parts),
        "{what} on group {}: dim {dim} of shape {shape:?} is not divisible by {parts}",
        comm.label()
    );
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product();
    (outer, shape[dim] / parts * inner)
}

/// `[rank][outer][chunk]` (what an all-gather returns) → `[outer][rank][chunk]` (the tensor).
pub(crate) fn rank_major_to_tensor(
    flat: &[f32],
    ranks: usize,
    outer: usize,
    chunk: usize,
) -> Vec<f32> {
    if outer == 1 {
        return flat.to_vec();
    }
    let mut out = Vec::with_capacity(flat.len());
    for o in 0..outer {
        for r in 0..ranks {
            let start = (r * outer + o) * chunk;
            out.extend_from_slice(&flat[start..start + chunk]);
        }
    }
    out
}

/// `[outer][rank][chunk]` (the tensor) → `[rank][outer][chunk]` (what a reduce-scatter takes).
pub(crate) fn tensor_to_rank_major(
    flat: &[f32],
    ranks: usize,
    outer: usize,
    chunk: usize,
) -> Vec<f32> {
    if outer == 1 {
        return flat.to_vec();
    }
    let mut out = Vec::with_capacity(flat.len());
    for r in 0..ranks {
        for o in 0..outer {
            let start = (o * ranks + r) * chunk;
            out.extend_from_slice(&flat[start..start + chunk]);
        }
    }
    out
}

pub fn all_reduce<B: Backend>(x: FloatTensor<B>, op: ReduceOp, comm: &Comm) -> FloatTensor<B> {
    let mut host = Host::<B>::read(x);
    let mut values = std::mem::take(&mut host.values);
    expect_comm(comm.all_reduce_f32(&mut values, op));
    let shape = host.shape.clone();
    host.write(values, shape)
}

pub fn all_gather<B: Backend>(x: FloatTensor<B>, dim: usize, comm: &Comm) -> FloatTensor<B> {
    let host = Host::<B>::read(x);
    let size = comm.size();
    let (outer, chunk) = blocks(&host.shape, dim, 1, "all_gather", comm);
    let mut gathered = vec![0.0f32; host.values.len() * size];
    expect_comm(comm.all_gather_f32(&host.values, &mut gathered));
    let values = rank_major_to_tensor(&gathered, size, outer, chunk);
    let mut shape = host.shape.clone();
    shape[dim] *= size;
    host.write(values, shape)
}

pub fn reduce_scatter<B: Backend>(x: FloatTensor<B>, dim: usize, comm: &Comm) -> FloatTensor<B> {
    let host = Host::<B>::read(x);
    let size = comm.size();
    let (outer, chunk) = blocks(&host.shape, dim, size, "reduce_scatter", comm);
    let input = tensor_to_rank_major(&host.values, size, outer, chunk);
    let mut values = vec![0.0f32; outer * chunk];
    expect_comm(comm.reduce_scatter_f32(&input, &mut values, ReduceOp::Sum));
    let mut shape = host.shape.clone();
    shape[dim] /= size;
    host.write(values, shape)
}

/// This rank's piece along `dim`, on the device (no communication).
pub fn own_chunk<B: Backend>(x: FloatTensor<B>, dim: usize, comm: &Comm) -> FloatTensor<B> {
    let shape = x.shape().to_vec();
    let size = comm.size();
    blocks(&shape, dim, size, "scatter", comm);
    let piece = shape[dim] / size;
    let start = comm.rank() * piece;
    let slices: Vec<Slice> = (0..shape.len())
        .map(|d| {
            if d == dim {
                Slice::new(start as isize, Some((start + piece) as isize), 1)
            } else {
                Slice::full()
            }
        })
        .collect();
    B::float_slice(x, &slices)
}

/// Rows of a 2-D tensor exchanged with uneven counts (in rows).
pub fn all_to_all_rows<B: Backend>(
    x: FloatTensor<B>,
    send_counts: &[usize],
    recv_counts: &[usize],
    comm: &Comm,
) -> FloatTensor<B> {
    let host = Host::<B>::read(x);
    assert!(
        host.shape.len() == 2,
        "all_to_all_rows on group {}: needs a 2-D tensor, got shape {:?}",
        comm.label(),
        host.shape
    );
    let (rows, cols) = (host.shape[0], host.shape[1]);
    let sent: usize = send_counts.iter().sum();
    assert!(
        sent == rows,
        "all_to_all_rows on group {}: send counts {send_counts:?} sum to {sent}, the tensor has {rows} rows",
        comm.label()
    );
    let received: usize = recv_counts.iter().sum();
    let send: Vec<usize> = send_counts.iter().map(|c| c * cols).collect();
    let recv: Vec<usize> = recv_counts.iter().map(|c| c * cols).collect();
    let mut values = vec![0.0f32; received * cols];
    expect_comm(comm.all_to_all_f32(&host.values, &send, &mut values, &recv));
    host.write(values, vec![received, cols])
}

/// Sends `x` to group rank `peer` through the host, as f32 (pipeline activations and gradients).
pub fn send_to<B: Backend>(x: FloatTensor<B>, peer: usize, comm: &Comm) -> Result<(), CommError> {
    comm.send_f32(&Host::<B>::read(x).values, peer)
}

/// Receives a `shape` tensor from group rank `peer` through the host (f32 on the wire), in the
/// device's float dtype.
pub fn recv_from<B: Backend>(
    shape: &[usize],
    peer: usize,
    comm: &Comm,
    device: &B::Device,
) -> Result<FloatTensor<B>, CommError> {
    let len = shape.iter().product();
    let mut buffer = vec![0.0; len];
    comm.recv_f32(&mut buffer, peer)?;
    let flat = burn::tensor::Tensor::<B, 1>::from_data(TensorData::new(buffer, [len]), device);
    Ok(B::float_reshape(
        flat.into_primitive().tensor(),
        shape.to_vec().into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_major_reordering_round_trips() {
        // outer 2, 3 ranks, chunk 2: tensor [o][r][c].
        let tensor: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let ranked = tensor_to_rank_major(&tensor, 3, 2, 2);
        assert_eq!(ranked, [0., 1., 6., 7., 2., 3., 8., 9., 4., 5., 10., 11.]);
        assert_eq!(rank_major_to_tensor(&ranked, 3, 2, 2), tensor);
    }
}
