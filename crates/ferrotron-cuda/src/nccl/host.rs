//! `ferrotron_dist::Communicator` for [`NcclComm`]: host slices staged through device buffers.
//!
//! The training runtime still moves host vectors for gradient sync and small reductions (loss,
//! flags, norms, expert loads), so the NCCL communicator serves the same trait as the thread and
//! TCP ones: copy in (stream-ordered, on the compute stream), the collective on the
//! communication stream, a polled wait with the deadline, copy out. The same argument checks as
//! the host transports, with the same words (`ferrotron_dist::arguments`).
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::result as driver;
use cudarc::nccl::result as nccl;
use ferrotron_dist::{CommError, Communicator, Element, GroupLabel, ReduceOp, arguments};

use crate::engine::alloc::DeviceBuffer;
use crate::nccl::args;
use crate::nccl::comm::{NcclComm, ok};
use crate::nccl::stats::CollectiveKind;
use crate::nccl::types::{reduce_op, wire_type};

/// A device copy of a host slice (or room for one), freed stream-ordered when dropped.
struct Staged {
    buffer: Arc<DeviceBuffer>,
    bytes: usize,
}

impl Staged {
    fn ptr(&self) -> u64 {
        self.buffer.ptr()
    }
}

impl NcclComm {
    fn invalid(&self, op: &'static str, detail: String) -> CommError {
        CommError::InvalidArgument {
            op,
            group: self.inner_label().clone(),
            detail,
        }
    }

    fn inner_label(&self) -> &GroupLabel {
        Communicator::label(self)
    }

    /// Room for `len` elements of `T` on the device (compute stream).
    fn stage_empty<T: Element>(&self, op: &'static str, len: usize) -> Result<Staged, CommError> {
        let bytes = len * wire_type(T::DTYPE).1;
        let buffer = DeviceBuffer::alloc(self.device(), bytes)
            .map_err(|e| self.fail(op, format!("staging {bytes} bytes: {e}")))?;
        Ok(Staged { buffer, bytes })
    }

    /// A device copy of `values` (queued on the compute stream).
    fn stage<T: Element>(&self, op: &'static str, values: &[T]) -> Result<Staged, CommError> {
        let staged = self.stage_empty::<T>(op, values.len())?;
        if staged.bytes > 0 {
            // SAFETY: the buffer holds `bytes` = size_of_val(values); the source is pageable
            // host memory, so the call returns after staging it and `values` may go.
            unsafe {
                driver::memcpy_htod_async(staged.ptr(), values, self.device().stream().cu_stream())
            }
            .map_err(|e| self.fail(op, format!("copying to the device: {e:?}")))?;
        }
        Ok(staged)
    }

    /// Copies `staged` back into `out` once the collective finished (the caller waited).
    fn unstage<T: Element>(
        &self,
        op: &'static str,
        staged: &Staged,
        out: &mut [T],
    ) -> Result<(), CommError> {
        if staged.bytes == 0 {
            return Ok(());
        }
        let stream = self.stream();
        // SAFETY: `out` is exactly the staged elements; the communication stream is idle (the
        // caller waited for the collective) and is synchronised before `out` is read.
        unsafe { driver::memcpy_dtoh_async(out, staged.ptr(), stream.cu_stream()) }
            .map_err(|e| self.fail(op, format!("copying to the host: {e:?}")))?;
        stream
            .synchronize()
            .map_err(|e| self.fail(op, format!("copying to the host: {e:?}")))
    }
}

fn vptr(p: u64) -> *mut c_void {
    p as *mut c_void
}

impl Communicator for NcclComm {
    fn agree_on_order(&self) -> Result<(), CommError> {
        self.agree_on_digest()
    }

    fn rank(&self) -> usize {
        self.inner.rank
    }

    fn size(&self) -> usize {
        self.inner.size
    }

    fn label(&self) -> &GroupLabel {
        &self.inner.label
    }

    fn new_group(&self, name: &str, members: &[u32]) -> Result<NcclComm, CommError> {
        self.new_group_impl(name, members)
    }

    fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<(), CommError> {
        let name = "all_reduce";
        let (dtype, _) = wire_type(T::DTYPE);
        let staged = self.stage(name, buf)?;
        let (ptr, len) = (staged.ptr(), buf.len());
        // SAFETY: `staged` holds `len` elements and lives until after the wait.
        unsafe {
            self.launch(
                name,
                CollectiveKind::AllReduce,
                staged.bytes,
                true,
                |comm, s| {
                    ok(nccl::all_reduce(
                        vptr(ptr),
                        vptr(ptr),
                        len,
                        dtype,
                        reduce_op(op),
                        comm,
                        s,
                    ))
                },
            )
        }?;
        self.unstage(name, &staged, buf)
    }

    fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<(), CommError> {
        let name = "all_gather";
        arguments::gathered(self.size(), input.len(), output.len())
            .map_err(|d| self.invalid(name, d))?;
        let (dtype, _) = wire_type(T::DTYPE);
        let sent = self.stage(name, input)?;
        let got = self.stage_empty::<T>(name, output.len())?;
        let (src, dst, len) = (sent.ptr(), got.ptr(), input.len());
        // SAFETY: `sent` holds `len` elements, `got` `size × len`; both live past the wait.
        unsafe {
            self.launch(
                name,
                CollectiveKind::AllGather,
                got.bytes,
                true,
                |comm, s| ok(nccl::all_gather(vptr(src), vptr(dst), len, dtype, comm, s)),
            )
        }?;
        self.unstage(name, &got, output)
    }

    fn reduce_scatter<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let name = "reduce_scatter";
        arguments::scattered(self.size(), input.len(), output.len())
            .map_err(|d| self.invalid(name, d))?;
        let (dtype, _) = wire_type(T::DTYPE);
        let sent = self.stage(name, input)?;
        let got = self.stage_empty::<T>(name, output.len())?;
        let (src, dst, len) = (sent.ptr(), got.ptr(), output.len());
        // SAFETY: `sent` holds `size × len` elements, `got` `len`; both live past the wait.
        unsafe {
            self.launch(
                name,
                CollectiveKind::ReduceScatter,
                sent.bytes,
                true,
                |comm, s| {
                    ok(nccl::reduce_scatter(
                        vptr(src),
                        vptr(dst),
                        len,
                        dtype,
                        reduce_op(op),
                        comm,
                        s,
                    ))
                },
            )
        }?;
        self.unstage(name, &got, output)
    }

    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<(), CommError> {
        let name = "broadcast";
        arguments::peer(root, self.size()).map_err(|d| self.invalid(name, d))?;
        let (dtype, _) = wire_type(T::DTYPE);
        let staged = self.stage(name, buf)?;
        let (ptr, len) = (staged.ptr(), buf.len());
        // SAFETY: `staged` holds `len` elements and lives past the wait.
        unsafe {
            self.launch(
                name,
                CollectiveKind::Broadcast,
                staged.bytes,
                true,
                |comm, s| {
                    ok(nccl::broadcast(
                        vptr(ptr),
                        vptr(ptr),
                        len,
                        dtype,
                        root as i32,
                        comm,
                        s,
                    ))
                },
            )
        }?;
        self.unstage(name, &staged, buf)
    }

    fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<(), CommError> {
        let name = "send";
        arguments::peer(peer, self.size()).map_err(|d| self.invalid(name, d))?;
        args::not_self(peer, self.rank()).map_err(|d| self.invalid(name, d))?;
        let (dtype, _) = wire_type(T::DTYPE);
        let staged = self.stage(name, buf)?;
        let (ptr, len) = (staged.ptr(), buf.len());
        // Buffered, as the thread transport's send: the host does not wait for the receiver.
        // SAFETY: `staged` holds `len` elements; it is dropped after `launch` returned, and its
        // stream-ordered free then queues on the compute stream behind the wait for the send.
        unsafe {
            self.launch(
                name,
                CollectiveKind::SendRecv,
                staged.bytes,
                false,
                |comm, s| ok(nccl::send(vptr(ptr), len, dtype, peer as i32, comm, s)),
            )
        }
    }

    fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<(), CommError> {
        let name = "recv";
        arguments::peer(peer, self.size()).map_err(|d| self.invalid(name, d))?;
        args::not_self(peer, self.rank()).map_err(|d| self.invalid(name, d))?;
        let (dtype, _) = wire_type(T::DTYPE);
        let staged = self.stage_empty::<T>(name, buf.len())?;
        let (ptr, len) = (staged.ptr(), buf.len());
        // SAFETY: `staged` holds `len` elements and lives past the wait.
        unsafe {
            self.launch(
                name,
                CollectiveKind::SendRecv,
                staged.bytes,
                true,
                |comm, s| ok(nccl::recv(vptr(ptr), len, dtype, peer as i32, comm, s)),
            )
        }?;
        self.unstage(name, &staged, buf)
    }

    fn all_to_all<T: Element>(
        &self,
        input: &[T],
        send_counts: &[usize],
        output: &mut [T],
        recv_counts: &[usize],
    ) -> Result<(), CommError> {
        let name = "all_to_all";
        let size = self.size();
        arguments::all_to_all(size, send_counts, input.len(), recv_counts, output.len())
            .map_err(|d| self.invalid(name, d))?;
        if check_counts() && size > 1 {
            self.check_pairwise(name, send_counts, recv_counts)?;
        }
        let (dtype, width) = wire_type(T::DTYPE);
        let sent = self.stage(name, input)?;
        let got = self.stage_empty::<T>(name, output.len())?;
        let plan = exchange_plan(send_counts, recv_counts, width);
        let (src, dst) = (sent.ptr(), got.ptr());
        // SAFETY: the offsets and counts stay inside `sent` and `got` (their sizes are the
        // count sums, checked above); both live past the wait.
        unsafe {
            self.launch(
                name,
                CollectiveKind::AllToAll,
                sent.bytes.max(got.bytes),
                true,
                |comm, s| grouped_exchange(&plan, src, dst, dtype, comm, s),
            )
        }?;
        self.unstage(name, &got, output)
    }

    fn barrier(&self) -> Result<(), CommError> {
        let mut token = [1i32];
        self.all_reduce(&mut token, ReduceOp::Sum)
    }
}

/// `FERROTRON_NCCL_CHECK_COUNTS=1`: exchange the counts of every host all-to-all first and fail
/// on a pairwise disagreement (NCCL would otherwise move the wrong bytes or hang).
fn check_counts() -> bool {
    crate::switches::env_var(crate::switches::EnvVars::NCCL_CHECK_COUNTS).is_some_and(|v| v != "0")
}

impl NcclComm {
    fn check_pairwise(
        &self,
        op: &'static str,
        send_counts: &[usize],
        recv_counts: &[usize],
    ) -> Result<(), CommError> {
        let size = self.size();
        let mine: Vec<i64> = send_counts.iter().map(|&c| c as i64).collect();
        let mut all = vec![0i64; size * size];
        self.all_gather(&mine, &mut all)?;
        let sent: Vec<Vec<usize>> = all
            .chunks(size)
            .map(|row| row.iter().map(|&c| c as usize).collect())
            .collect();
        args::pairwise_counts(&sent, self.rank(), recv_counts).map_err(|detail| {
            CommError::Mismatch {
                group: self.inner.label.clone(),
                detail: format!("{op}: {detail}"),
            }
        })
    }
}

/// Byte offsets and element counts of an uneven exchange: per peer `(send offset, send count,
/// recv offset, recv count)`, offsets in bytes.
pub(crate) fn exchange_plan(
    send_counts: &[usize],
    recv_counts: &[usize],
    width: usize,
) -> Vec<(usize, usize, usize, usize)> {
    let mut plan = Vec::with_capacity(send_counts.len());
    let (mut so, mut ro) = (0, 0);
    for (&s, &r) in send_counts.iter().zip(recv_counts) {
        plan.push((so * width, s, ro * width, r));
        so += s;
        ro += r;
    }
    plan
}

/// One NCCL group of a send and a receive per peer with a non-zero count, this rank included
/// (NCCL completes a send to oneself inside a group, as PyTorch's all-to-all relies on).
///
/// # Safety
/// `src`/`dst` must hold the bytes `plan` addresses (the caller checked the count sums).
pub(crate) unsafe fn grouped_exchange(
    plan: &[(usize, usize, usize, usize)],
    src: u64,
    dst: u64,
    dtype: cudarc::nccl::sys::ncclDataType_t,
    comm: cudarc::nccl::sys::ncclComm_t,
    stream: cudarc::nccl::sys::cudaStream_t,
) -> Result<(), cudarc::nccl::result::NcclError> {
    ok(nccl::group_start())?;
    let mut result = Ok(());
    for (peer, &(so, sc, ro, rc)) in plan.iter().enumerate() {
        // SAFETY: as the function's contract says.
        unsafe {
            if sc > 0 {
                result = result.and(ok(nccl::send(
                    vptr(src + so as u64),
                    sc,
                    dtype,
                    peer as i32,
                    comm,
                    stream,
                )));
            }
            if rc > 0 {
                result = result.and(ok(nccl::recv(
                    vptr(dst + ro as u64),
                    rc,
                    dtype,
                    peer as i32,
                    comm,
                    stream,
                )));
            }
        }
    }
    // The group is always closed, even after a failed call inside it.
    let ended = ok(nccl::group_end());
    result.and(ended)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exchange_offsets_follow_the_counts() {
        let plan = exchange_plan(&[2, 0, 3], &[1, 4, 0], 4);
        assert_eq!(plan, vec![(0, 2, 0, 1), (8, 0, 4, 4), (8, 3, 20, 0)]);
    }
}
