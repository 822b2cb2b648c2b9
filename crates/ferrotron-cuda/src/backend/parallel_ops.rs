//! `Autodiff<Cuda>` trains the models, whose layers call the region collectives of
//! `ferrotron-parallel`. When a group's communicator is an [`NcclComm`], each region op runs on
//! the device through NCCL (no host copy; ordered against the compute stream by events, see
//! `nccl/comm.rs`); any other communicator (thread ranks, TCP) takes the trait's default host
//! round trip. A group of one is the identity either way. `scatter_to_region` keeps this rank's
//! slice on the device and needs no communication at all.
//!
//! Failures panic with the `CommError` message (group, collective, ranks), as the defaults do:
//! burn's op traits and autodiff backward cannot return errors. A failed NCCL collective has
//! already aborted every communicator of the process, so the peers fail too instead of hanging.
//!
//! Reductions in bf16 are NCCL's (summed in bf16 along its ring or tree), where the host default
//! sums in f32 in rank order and rounds once: bit-identical results across transports are not a
//! promise at bf16, only at a group of one.
//!
//! `rng_mark`/`rng_restore` read and set the device's counter-based generator, so recomputed
//! layers (`ferrotron_parallel::recompute`) draw their dropout again exactly.
//!
//! The impl sits in this crate (the trait's crate cannot name our backend without a cycle).

use ferrotron_dist::CommError;
use ferrotron_parallel::recompute::RngMark;
use ferrotron_parallel::{Comm, InFlight, ReduceOp, host};

use crate::backend::{Cuda, GpuDevice};
use burn::tensor::get_device_settings;
use burn::tensor::ops::FloatTensorOps;

use crate::backend::convert::float_dtype;
use crate::engine::tensor::CudaTensor;
use crate::nccl::{NcclComm, RecvSpec, StartedCollective};

/// The NCCL communicator behind `comm`, if that is what it is.
fn nccl(comm: &Comm) -> Option<&NcclComm> {
    comm.as_any().downcast_ref::<NcclComm>()
}

fn expect<T>(result: Result<T, CommError>) -> T {
    result.unwrap_or_else(|err| panic!("{err}"))
}

/// A collective of `comm` on `x`: through NCCL ordered at `finish` (`device`), else through the
/// host (`host`, done at once, inside `ferrotron_dist::deferred` so a recorded call order marks
/// it as the caller means it); the identity on a group of one.
fn started(
    x: CudaTensor,
    comm: &Comm,
    device: impl FnOnce(&NcclComm, &CudaTensor) -> Result<(CudaTensor, StartedCollective), CommError>,
    host: impl FnOnce(CudaTensor) -> CudaTensor,
) -> InFlight<Cuda> {
    if comm.size() == 1 {
        return InFlight::ready(x);
    }
    match nccl(comm) {
        Some(nccl) => {
            let (out, started) = expect(device(nccl, &x));
            InFlight::pending(out, Box::new(move || expect(started.wait())))
        }
        None => InFlight::ready(ferrotron_dist::deferred(|| host(x))),
    }
}

impl ferrotron_parallel::ParallelOps for Cuda {
    /// The counter-based generator's (seed, counter): reading it changes nothing, so marks cost
    /// a run without recomputation nothing either.
    fn rng_mark(device: &GpuDevice) -> RngMark {
        device.engine().rng_state()
    }

    fn rng_restore(device: &GpuDevice, mark: RngMark) {
        device.engine().set_rng_state(mark);
    }

    fn reduce_from_region(x: CudaTensor, comm: &Comm) -> CudaTensor {
        if comm.size() == 1 {
            return x;
        }
        match nccl(comm) {
            Some(nccl) => expect(nccl.all_reduce_tensor(&x, ReduceOp::Sum)),
            None => host::all_reduce::<Cuda>(x, ReduceOp::Sum, comm),
        }
    }

    fn gather_from_region(x: CudaTensor, dim: usize, comm: &Comm) -> CudaTensor {
        if comm.size() == 1 {
            return x;
        }
        match nccl(comm) {
            Some(nccl) => expect(nccl.all_gather_along(&x, dim)),
            None => host::all_gather::<Cuda>(x, dim, comm),
        }
    }

    fn scatter_to_region(x: CudaTensor, dim: usize, comm: &Comm) -> CudaTensor {
        if comm.size() == 1 {
            return x;
        }
        // A slice view on the device for every transport: no communication.
        host::own_chunk::<Cuda>(x, dim, comm)
    }

    fn gather_from_sequence_region(x: CudaTensor, dim: usize, comm: &Comm) -> CudaTensor {
        if comm.size() == 1 {
            return x;
        }
        match nccl(comm) {
            Some(nccl) => expect(nccl.all_gather_along(&x, dim)),
            None => host::all_gather::<Cuda>(x, dim, comm),
        }
    }

    fn reduce_scatter_to_sequence_region(x: CudaTensor, dim: usize, comm: &Comm) -> CudaTensor {
        if comm.size() == 1 {
            return x;
        }
        match nccl(comm) {
            Some(nccl) => expect(nccl.reduce_scatter_along(&x, dim, ReduceOp::Sum)),
            None => host::reduce_scatter::<Cuda>(x, dim, comm),
        }
    }

    fn all_to_all_rows(
        x: CudaTensor,
        send_counts: &[usize],
        recv_counts: &[usize],
        comm: &Comm,
    ) -> CudaTensor {
        let rows = x.shape().first().copied();
        if comm.size() == 1 && send_counts == recv_counts && send_counts.first() == rows.as_ref() {
            return x;
        }
        match nccl(comm) {
            Some(nccl) => {
                assert!(
                    x.rank() == 2,
                    "all_to_all_rows on group {}: needs a 2-D tensor, got shape {:?}",
                    comm.label(),
                    x.shape()
                );
                expect(nccl.all_to_all_rows_tensor(&x, send_counts, recv_counts))
            }
            None => host::all_to_all_rows::<Cuda>(x, send_counts, recv_counts, comm),
        }
    }

    /// On a NCCL communicator the compute stream is ordered after the all-reduce only at
    /// `finish`, so the kernels queued in between (the rest of a backward) overlap it.
    fn all_reduce_started(x: CudaTensor, comm: &Comm) -> InFlight<Cuda> {
        started(
            x,
            comm,
            |nccl, x| nccl.all_reduce_tensor_started(x, ReduceOp::Sum),
            |x| host::all_reduce::<Cuda>(x, ReduceOp::Sum, comm),
        )
    }

    fn reduce_scatter_started(x: CudaTensor, comm: &Comm) -> InFlight<Cuda> {
        started(
            x,
            comm,
            |nccl, x| nccl.reduce_scatter_tensor_started(x, ReduceOp::Sum),
            |x| host::reduce_scatter::<Cuda>(x, 0, comm),
        )
    }

    fn all_gather_started(x: CudaTensor, comm: &Comm) -> InFlight<Cuda> {
        started(
            x,
            comm,
            |nccl, x| nccl.all_gather_tensor_started(x),
            |x| host::all_gather::<Cuda>(x, 0, comm),
        )
    }

    /// Through NCCL the tensor keeps its device and the run's float dtype (bf16 in a bf16 run,
    /// half the bytes of the host path's f32); the compute stream waits for the send.
    fn send_to(x: CudaTensor, peer: usize, comm: &Comm) -> Result<(), CommError> {
        match nccl(comm) {
            Some(nccl) => {
                let dtype = get_device_settings::<Cuda>(&Cuda::float_device(&x)).float_dtype;
                let x = Cuda::float_cast(x, dtype);
                nccl.send_recv_tensors(&[(&x, peer)], &[]).map(drop)
            }
            None => host::send_to::<Cuda>(x, peer, comm),
        }
    }

    fn recv_from(
        shape: &[usize],
        peer: usize,
        comm: &Comm,
        device: &GpuDevice,
    ) -> Result<CudaTensor, CommError> {
        match nccl(comm) {
            Some(nccl) => {
                let dtype = get_device_settings::<Cuda>(device).float_dtype;
                let spec = RecvSpec {
                    shape: shape.to_vec(),
                    dtype: float_dtype(dtype),
                    peer,
                };
                let mut received = nccl.send_recv_tensors(&[], &[spec])?;
                Ok(received.remove(0))
            }
            None => host::recv_from::<Cuda>(shape, peer, comm, device),
        }
    }

    fn all_reduce_detached(x: CudaTensor, op: ReduceOp, comm: &Comm) -> CudaTensor {
        if comm.size() == 1 {
            return x;
        }
        match nccl(comm) {
            Some(nccl) => expect(nccl.all_reduce_tensor(&x, op)),
            None => host::all_reduce::<Cuda>(x, op, comm),
        }
    }
}
// `FusedOps` (the supertrait) is in `fused_ops/`.
