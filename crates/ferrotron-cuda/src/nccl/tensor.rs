//! Collectives on device tensors: what the model's region operators run on a GPU. No host copy
//! of a tensor is ever made; inputs are read in place when contiguous (else copied once on the
//! device), outputs are fresh buffers of the stream-ordered pool.
//!
//! Every function here returns a new tensor and never writes its input (the engine's rule: ops
//! never write an input's buffer, so sharing stays safe).
#![allow(unsafe_code)]

use std::ffi::c_void;

use cudarc::nccl::result as nccl;
use ferrotron_dist::{CommError, Communicator, ReduceOp, arguments};

use crate::engine::dtype::DType;
use crate::engine::tensor::CudaTensor;
use crate::nccl::args;
use crate::nccl::comm::{NcclComm, ok};
use crate::nccl::host::{exchange_plan, grouped_exchange};
use crate::nccl::stats::CollectiveKind;
use crate::nccl::types::{reduce_op, reducible_type, tensor_type};

/// What a grouped receive expects: shape, dtype and the peer it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvSpec {
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub peer: usize,
}

/// A collective queued on the communication stream that the compute stream has not been
/// ordered after yet (see [`NcclComm::all_reduce_tensor_started`]). Dropped without
/// [`StartedCollective::wait`] (an error path, a panic unwinding), it still orders the compute
/// stream after the collective, so neither its input nor its output is freed while NCCL reads
/// or writes them.
pub struct StartedCollective {
    comm: NcclComm,
    finished: cudarc::driver::CudaEvent,
    ordered: bool,
    _input: CudaTensor,
}

impl StartedCollective {
    /// Orders the compute stream after the collective; what it read may then be freed.
    pub fn wait(mut self) -> Result<(), CommError> {
        self.ordered = true;
        self.order()
    }

    fn order(&self) -> Result<(), CommError> {
        self.comm
            .device()
            .stream()
            .wait(&self.finished)
            .map_err(|e| {
                self.comm.fail(
                    "a started collective's wait",
                    format!("CUDA error while ordering the compute stream: {e:?}"),
                )
            })
    }
}

impl Drop for StartedCollective {
    fn drop(&mut self) {
        if !self.ordered
            && let Err(err) = self.order()
        {
            tracing::warn!(%err, "a started collective dropped unwaited");
        }
    }
}

/// When the compute stream is ordered after a tensor collective.
#[derive(Debug, Clone, Copy)]
enum Order {
    /// Before anything queued after the call.
    Now,
    /// At the returned [`StartedCollective`]'s `wait`.
    Later,
}

/// The output and handle of a collective submitted with [`Order::Later`].
fn started(
    result: Result<(CudaTensor, Option<StartedCollective>), CommError>,
) -> Result<(CudaTensor, StartedCollective), CommError> {
    let (out, handle) = result?;
    Ok((
        out,
        handle.expect("a deferred collective returns its handle"),
    ))
}

fn vptr(p: u64) -> *mut c_void {
    p as *mut c_void
}

fn bytes_of(t: &CudaTensor) -> usize {
    t.numel() * t.dtype().size_in_bytes()
}

/// Elements per leading-dim row.
fn row_elems(shape: &[usize]) -> usize {
    shape[1..].iter().product()
}

/// `perm` moving `dim` to the front, and its inverse.
fn to_front(rank: usize, dim: usize) -> (Vec<usize>, Vec<usize>) {
    let mut perm = vec![dim];
    perm.extend((0..rank).filter(|&d| d != dim));
    let mut inverse = vec![0; rank];
    for (i, &p) in perm.iter().enumerate() {
        inverse[p] = i;
    }
    (perm, inverse)
}

impl NcclComm {
    fn invalid_arg(&self, op: &'static str, detail: String) -> CommError {
        CommError::InvalidArgument {
            op,
            group: self.label().clone(),
            detail,
        }
    }

    /// `x` contiguous and on this communicator's GPU.
    fn input(&self, op: &'static str, x: &CudaTensor) -> Result<CudaTensor, CommError> {
        if x.device().ordinal() != self.device().ordinal() {
            return Err(self.invalid_arg(
                op,
                format!(
                    "the tensor is on GPU {} but the communicator on GPU {}",
                    x.device().ordinal(),
                    self.device().ordinal()
                ),
            ));
        }
        x.contiguous().map_err(|e| self.fail(op, e.to_string()))
    }

    fn output(
        &self,
        op: &'static str,
        shape: &[usize],
        dtype: DType,
    ) -> Result<CudaTensor, CommError> {
        CudaTensor::empty(self.device(), shape, dtype).map_err(|e| self.fail(op, e.to_string()))
    }

    /// Element-wise reduction across the group; every member gets the result.
    pub fn all_reduce_tensor(&self, x: &CudaTensor, op: ReduceOp) -> Result<CudaTensor, CommError> {
        self.all_reduce_ordered(x, op, Order::Now)
            .map(|(out, _)| out)
    }

    /// [`NcclComm::all_reduce_tensor`] whose result the compute stream does not wait for yet:
    /// work queued before [`StartedCollective::wait`] overlaps the transfer. The input is
    /// kept (allocated) by the returned handle until then.
    pub fn all_reduce_tensor_started(
        &self,
        x: &CudaTensor,
        op: ReduceOp,
    ) -> Result<(CudaTensor, StartedCollective), CommError> {
        started(self.all_reduce_ordered(x, op, Order::Later))
    }

    fn all_reduce_ordered(
        &self,
        x: &CudaTensor,
        op: ReduceOp,
        order: Order,
    ) -> Result<(CudaTensor, Option<StartedCollective>), CommError> {
        let name = "all_reduce";
        let dtype = reducible_type(x.dtype()).map_err(|d| self.invalid_arg(name, d))?;
        let x = self.input(name, x)?;
        let out = self.output(name, x.shape(), x.dtype())?;
        let (src, dst, len) = (x.data_ptr(), out.data_ptr(), x.numel());
        let bytes = bytes_of(&x);
        // SAFETY: `x` and `out` hold `len` elements; `submit` keeps `x` and the caller `out`
        // allocated until the compute stream is ordered after the collective.
        let started = unsafe {
            self.submit(name, CollectiveKind::AllReduce, bytes, x, order, |c, s| {
                ok(nccl::all_reduce(
                    vptr(src),
                    vptr(dst),
                    len,
                    dtype,
                    reduce_op(op),
                    c,
                    s,
                ))
            })
        }?;
        Ok((out, started))
    }

    /// Queues `call` reading `input`, ordered against the compute stream now or, with
    /// [`Order::Later`], by the returned handle (which keeps `input` allocated until then).
    ///
    /// # Safety
    /// As [`NcclComm::launch`]; with [`Order::Later`] the caller keeps every other buffer `call`
    /// passes allocated until the handle's `wait`.
    unsafe fn submit(
        &self,
        name: &'static str,
        kind: CollectiveKind,
        bytes: usize,
        input: CudaTensor,
        order: Order,
        call: impl FnOnce(
            cudarc::nccl::sys::ncclComm_t,
            cudarc::nccl::sys::cudaStream_t,
        ) -> Result<(), cudarc::nccl::result::NcclError>,
    ) -> Result<Option<StartedCollective>, CommError> {
        match order {
            Order::Now => {
                // SAFETY: the caller's promise; `input` lives past `launch`.
                unsafe { self.launch(name, kind, bytes, false, call) }?;
                Ok(None)
            }
            Order::Later => {
                // SAFETY: the caller's promise; the handle keeps `input`.
                let finished = unsafe { self.launch_deferred(name, kind, bytes, call) }?;
                Ok(Some(StartedCollective {
                    comm: self.clone(),
                    finished,
                    ordered: false,
                    _input: input,
                }))
            }
        }
    }

    /// The members' tensors concatenated along the leading dim, in rank order.
    pub fn all_gather_tensor(&self, x: &CudaTensor) -> Result<CudaTensor, CommError> {
        self.all_gather_ordered(x, Order::Now).map(|(out, _)| out)
    }

    /// [`NcclComm::all_gather_tensor`], ordered at [`StartedCollective::wait`] (see
    /// [`NcclComm::all_reduce_tensor_started`]).
    pub fn all_gather_tensor_started(
        &self,
        x: &CudaTensor,
    ) -> Result<(CudaTensor, StartedCollective), CommError> {
        started(self.all_gather_ordered(x, Order::Later))
    }

    fn all_gather_ordered(
        &self,
        x: &CudaTensor,
        order: Order,
    ) -> Result<(CudaTensor, Option<StartedCollective>), CommError> {
        let name = "all_gather";
        args::has_leading_dim(x.shape()).map_err(|d| self.invalid_arg(name, d))?;
        let x = self.input(name, x)?;
        let mut shape = x.shape().to_vec();
        shape[0] *= self.size();
        let out = self.output(name, &shape, x.dtype())?;
        let dtype = tensor_type(x.dtype());
        let (src, dst, len) = (x.data_ptr(), out.data_ptr(), x.numel());
        let bytes = bytes_of(&out);
        // SAFETY: `x` holds `len` elements, `out` `size × len`; see `all_reduce_ordered`.
        let started = unsafe {
            self.submit(name, CollectiveKind::AllGather, bytes, x, order, |c, s| {
                ok(nccl::all_gather(vptr(src), vptr(dst), len, dtype, c, s))
            })
        }?;
        Ok((out, started))
    }

    /// All-gather along the leading dim where member `r` holds `rows[r]` rows (every member
    /// passes the same `rows`): one NCCL group of a broadcast per member.
    pub fn all_gather_uneven_tensor(
        &self,
        x: &CudaTensor,
        rows: &[usize],
    ) -> Result<CudaTensor, CommError> {
        let name = "all_gather_uneven";
        args::has_leading_dim(x.shape()).map_err(|d| self.invalid_arg(name, d))?;
        args::uneven_rows(self.size(), self.rank(), rows, x.shape()[0])
            .map_err(|d| self.invalid_arg(name, d))?;
        let x = self.input(name, x)?;
        let mut shape = x.shape().to_vec();
        shape[0] = rows.iter().sum();
        let out = self.output(name, &shape, x.dtype())?;
        let dtype = tensor_type(x.dtype());
        let per_row = row_elems(x.shape());
        let width = x.dtype().size_in_bytes();
        let (src, dst) = (x.data_ptr(), out.data_ptr());
        // SAFETY: root `r` broadcasts its `rows[r]` rows from `x` (read on the root only) into
        // `out` at the sum of the earlier counts; `out` holds the sum of all. Both live past
        // `launch`.
        unsafe {
            self.launch(
                name,
                CollectiveKind::AllGather,
                bytes_of(&out),
                false,
                |c, s| {
                    ok(nccl::group_start())?;
                    let mut offset = 0usize;
                    let mut result = Ok(());
                    for (root, &n) in rows.iter().enumerate() {
                        if n > 0 {
                            let at = dst + (offset * per_row * width) as u64;
                            result = result.and(ok(nccl::broadcast(
                                vptr(src),
                                vptr(at),
                                n * per_row,
                                dtype,
                                root as i32,
                                c,
                                s,
                            )));
                        }
                        offset += n;
                    }
                    result.and(ok(nccl::group_end()))
                },
            )
        }?;
        Ok(out)
    }

    /// Reduces across the group and leaves member `r` the `r`-th slice along the leading dim.
    pub fn reduce_scatter_tensor(
        &self,
        x: &CudaTensor,
        op: ReduceOp,
    ) -> Result<CudaTensor, CommError> {
        self.reduce_scatter_ordered(x, op, Order::Now)
            .map(|(out, _)| out)
    }

    /// [`NcclComm::reduce_scatter_tensor`], ordered at [`StartedCollective::wait`] (see
    /// [`NcclComm::all_reduce_tensor_started`]).
    pub fn reduce_scatter_tensor_started(
        &self,
        x: &CudaTensor,
        op: ReduceOp,
    ) -> Result<(CudaTensor, StartedCollective), CommError> {
        started(self.reduce_scatter_ordered(x, op, Order::Later))
    }

    fn reduce_scatter_ordered(
        &self,
        x: &CudaTensor,
        op: ReduceOp,
        order: Order,
    ) -> Result<(CudaTensor, Option<StartedCollective>), CommError> {
        let name = "reduce_scatter";
        let dtype = reducible_type(x.dtype()).map_err(|d| self.invalid_arg(name, d))?;
        args::has_leading_dim(x.shape()).map_err(|d| self.invalid_arg(name, d))?;
        args::divisible_rows(x.shape()[0], self.size()).map_err(|d| self.invalid_arg(name, d))?;
        let x = self.input(name, x)?;
        let mut shape = x.shape().to_vec();
        shape[0] /= self.size();
        let out = self.output(name, &shape, x.dtype())?;
        let (src, dst, len) = (x.data_ptr(), out.data_ptr(), out.numel());
        let bytes = bytes_of(&x);
        // SAFETY: `x` holds `size × len` elements, `out` `len`; see `all_reduce_ordered`.
        let started = unsafe {
            self.submit(
                name,
                CollectiveKind::ReduceScatter,
                bytes,
                x,
                order,
                |c, s| {
                    ok(nccl::reduce_scatter(
                        vptr(src),
                        vptr(dst),
                        len,
                        dtype,
                        reduce_op(op),
                        c,
                        s,
                    ))
                },
            )
        }?;
        Ok((out, started))
    }

    /// `root`'s tensor on every member (`x` gives the shape and dtype elsewhere).
    pub fn broadcast_tensor(&self, x: &CudaTensor, root: usize) -> Result<CudaTensor, CommError> {
        let name = "broadcast";
        arguments::peer(root, self.size()).map_err(|d| self.invalid_arg(name, d))?;
        let x = self.input(name, x)?;
        let out = self.output(name, x.shape(), x.dtype())?;
        let dtype = tensor_type(x.dtype());
        let (src, dst, len) = (x.data_ptr(), out.data_ptr(), x.numel());
        // SAFETY: `x` and `out` hold `len` elements and live past `launch`.
        unsafe {
            self.launch(
                name,
                CollectiveKind::Broadcast,
                bytes_of(&x),
                false,
                |c, s| {
                    ok(nccl::broadcast(
                        vptr(src),
                        vptr(dst),
                        len,
                        dtype,
                        root as i32,
                        c,
                        s,
                    ))
                },
            )
        }?;
        Ok(out)
    }

    /// Sends and receives as one NCCL group (a pipeline stage's pair, or several): returns the
    /// received tensors in the order of `recvs`. Grouping lets both directions of a pair progress
    /// together instead of deadlocking on NCCL's blocking sends; inside the group a rank may
    /// also send to itself.
    pub fn send_recv_tensors(
        &self,
        sends: &[(&CudaTensor, usize)],
        recvs: &[RecvSpec],
    ) -> Result<Vec<CudaTensor>, CommError> {
        let name = "send_recv";
        for peer in sends
            .iter()
            .map(|s| s.1)
            .chain(recvs.iter().map(|r| r.peer))
        {
            arguments::peer(peer, self.size()).map_err(|d| self.invalid_arg(name, d))?;
        }
        let inputs = sends
            .iter()
            .map(|(t, peer)| Ok((self.input(name, t)?, *peer)))
            .collect::<Result<Vec<_>, CommError>>()?;
        let outputs = recvs
            .iter()
            .map(|r| self.output(name, &r.shape, r.dtype))
            .collect::<Result<Vec<_>, CommError>>()?;
        let bytes = inputs.iter().map(|(t, _)| bytes_of(t)).sum::<usize>()
            + outputs.iter().map(bytes_of).sum::<usize>();
        let send_args: Vec<_> = inputs
            .iter()
            .map(|(t, p)| (t.data_ptr(), t.numel(), tensor_type(t.dtype()), *p))
            .collect();
        let recv_args: Vec<_> = outputs
            .iter()
            .zip(recvs)
            .map(|(t, r)| (t.data_ptr(), t.numel(), tensor_type(t.dtype()), r.peer))
            .collect();
        // SAFETY: every pointer is a live tensor of `inputs`/`outputs` with its own element
        // count; they live past `launch`.
        unsafe {
            self.launch(name, CollectiveKind::SendRecv, bytes, false, |c, s| {
                ok(nccl::group_start())?;
                let mut result = Ok(());
                for &(ptr, len, dtype, peer) in &send_args {
                    result = result.and(ok(nccl::send(vptr(ptr), len, dtype, peer as i32, c, s)));
                }
                for &(ptr, len, dtype, peer) in &recv_args {
                    result = result.and(ok(nccl::recv(vptr(ptr), len, dtype, peer as i32, c, s)));
                }
                result.and(ok(nccl::group_end()))
            })
        }?;
        Ok(outputs)
    }

    /// Rows of a tensor exchanged with uneven counts: the first `send_rows[0]` rows to rank 0,
    /// …; receives `recv_rows[j]` rows from rank `j`, in rank order (grouped send/recv).
    pub fn all_to_all_rows_tensor(
        &self,
        x: &CudaTensor,
        send_rows: &[usize],
        recv_rows: &[usize],
    ) -> Result<CudaTensor, CommError> {
        let name = "all_to_all";
        args::has_leading_dim(x.shape()).map_err(|d| self.invalid_arg(name, d))?;
        let received: usize = recv_rows.iter().sum();
        arguments::all_to_all(self.size(), send_rows, x.shape()[0], recv_rows, received)
            .map_err(|d| self.invalid_arg(name, d))?;
        let x = self.input(name, x)?;
        let per_row = row_elems(x.shape());
        let mut shape = x.shape().to_vec();
        shape[0] = received;
        let out = self.output(name, &shape, x.dtype())?;
        let send: Vec<usize> = send_rows.iter().map(|r| r * per_row).collect();
        let recv: Vec<usize> = recv_rows.iter().map(|r| r * per_row).collect();
        let plan = exchange_plan(&send, &recv, x.dtype().size_in_bytes());
        let dtype = tensor_type(x.dtype());
        let (src, dst) = (x.data_ptr(), out.data_ptr());
        let bytes = bytes_of(&x).max(bytes_of(&out));
        // SAFETY: the plan's offsets and counts sum to the rows of `x` and `out` (checked
        // above); both live past `launch`.
        unsafe {
            self.launch(name, CollectiveKind::AllToAll, bytes, false, |c, s| {
                grouped_exchange(&plan, src, dst, dtype, c, s)
            })
        }?;
        Ok(out)
    }

    /// All-gather along `dim`: the dim moves to the front (one device copy unless it already
    /// leads), the gather runs on the leading dim, and the result is viewed back.
    pub fn all_gather_along(&self, x: &CudaTensor, dim: usize) -> Result<CudaTensor, CommError> {
        self.along("all_gather", x, dim, |front| self.all_gather_tensor(front))
    }

    /// Reduce-scatter (sum or max) along `dim`, the same way.
    pub fn reduce_scatter_along(
        &self,
        x: &CudaTensor,
        dim: usize,
        op: ReduceOp,
    ) -> Result<CudaTensor, CommError> {
        self.along("reduce_scatter", x, dim, |front| {
            self.reduce_scatter_tensor(front, op)
        })
    }

    fn along(
        &self,
        name: &'static str,
        x: &CudaTensor,
        dim: usize,
        run: impl FnOnce(&CudaTensor) -> Result<CudaTensor, CommError>,
    ) -> Result<CudaTensor, CommError> {
        if dim >= x.rank() {
            return Err(self.invalid_arg(
                name,
                format!("dim {dim} is out of range for shape {:?}", x.shape()),
            ));
        }
        if dim == 0 {
            return run(x);
        }
        let (perm, inverse) = to_front(x.rank(), dim);
        let front = x
            .permute(&perm)
            .map_err(|e| self.fail(name, e.to_string()))?;
        let result = run(&front)?;
        result
            .permute(&inverse)
            .map_err(|e| self.fail(name, e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moving_a_dim_to_the_front_and_back() {
        let (perm, inverse) = to_front(4, 2);
        assert_eq!(perm, [2, 0, 1, 3]);
        assert_eq!(inverse, [1, 2, 0, 3]);
        for (i, &p) in perm.iter().enumerate() {
            assert_eq!(inverse[p], i);
        }
        assert_eq!(to_front(3, 0), (vec![0, 1, 2], vec![0, 1, 2]));
        assert_eq!(row_elems(&[0, 3, 4]), 12);
        assert_eq!(row_elems(&[5]), 1);
    }
}
