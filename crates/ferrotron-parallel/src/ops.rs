//! [`ParallelOps`]: the region operators as a backend extension, burn's custom-op mechanism.
//!
//! The defaults are the forward computation through a host round trip and serve every plain
//! backend (they have no graph to record); `Autodiff<B>` overrides each with a tracked op whose
//! backward is the conjugate collective (see `autodiff.rs`). The CUDA backend overrides them with
//! device-side NCCL calls when the group's communicator is its `NcclComm` (found through
//! `DynComm::as_any`), without the model changing.
//!
//! Every op is the identity on a group of one, without touching the data, so the single-rank
//! model pays nothing for being written against groups.

use burn::tensor::ops::FloatTensor;
use burn::tensor::{Distribution, FloatDType, TensorMetadata};

use crate::comm::Comm;
use crate::host::{self, Host};
use crate::recompute::{Rerun, RngMark, Run};
use ferrotron_dist::{CommError, ReduceOp, deferred};
use ferrotron_ops::FusedOps;

/// What orders later work after a collective (and keeps its buffers allocated until then).
pub type Wait = Box<dyn FnOnce()>;

/// A collective's result that later work must not read before [`InFlight::finish`].
pub struct InFlight<B: burn::tensor::backend::Backend> {
    result: FloatTensor<B>,
    wait: Option<Wait>,
}

impl<B: burn::tensor::backend::Backend> InFlight<B> {
    /// A result already ordered before any later work.
    pub fn ready(result: FloatTensor<B>) -> Self {
        InFlight { result, wait: None }
    }

    /// A result that later work may read once `wait` (which orders it, and keeps what the
    /// collective reads alive until then) has run.
    pub fn pending(result: FloatTensor<B>, wait: Wait) -> Self {
        InFlight {
            result,
            wait: Some(wait),
        }
    }

    /// The result, ordered before everything queued from now on.
    pub fn finish(self) -> FloatTensor<B> {
        if let Some(wait) = self.wait {
            wait();
        }
        self.result
    }

    /// The result now, and what must run before anything reads it (none: nothing).
    pub fn split(self) -> (FloatTensor<B>, Option<Wait>) {
        (self.result, self.wait)
    }
}

/// `FusedOps` is a supertrait so every place generic over `ParallelOps` (the model, the
/// trainer) can call the fused ops without a second bound.
pub trait ParallelOps: FusedOps {
    /// Forward identity; backward all-reduces the gradient (Megatron's `f`).
    fn copy_to_region(x: FloatTensor<Self>, comm: &Comm) -> FloatTensor<Self> {
        let _ = comm;
        x
    }

    /// Forward all-reduce (sum); backward identity (Megatron's `g`).
    fn reduce_from_region(x: FloatTensor<Self>, comm: &Comm) -> FloatTensor<Self> {
        if comm.size() == 1 {
            return x;
        }
        host::all_reduce::<Self>(x, ReduceOp::Sum, comm)
    }

    /// Forward all-gather along `dim`; backward keeps this rank's chunk.
    fn gather_from_region(x: FloatTensor<Self>, dim: usize, comm: &Comm) -> FloatTensor<Self> {
        if comm.size() == 1 {
            return x;
        }
        host::all_gather::<Self>(x, dim, comm)
    }

    /// Forward keeps this rank's chunk along `dim`; backward all-gathers.
    fn scatter_to_region(x: FloatTensor<Self>, dim: usize, comm: &Comm) -> FloatTensor<Self> {
        if comm.size() == 1 {
            return x;
        }
        host::own_chunk::<Self>(x, dim, comm)
    }

    /// Forward all-gather along `dim`; backward reduce-scatters (sequence parallel, CP K/V).
    fn gather_from_sequence_region(
        x: FloatTensor<Self>,
        dim: usize,
        comm: &Comm,
    ) -> FloatTensor<Self> {
        if comm.size() == 1 {
            return x;
        }
        host::all_gather::<Self>(x, dim, comm)
    }

    /// Forward reduce-scatter (sum) along `dim`; backward all-gathers.
    fn reduce_scatter_to_sequence_region(
        x: FloatTensor<Self>,
        dim: usize,
        comm: &Comm,
    ) -> FloatTensor<Self> {
        if comm.size() == 1 {
            return x;
        }
        host::reduce_scatter::<Self>(x, dim, comm)
    }

    /// Rows of a 2-D tensor: the first `send_counts[0]` to rank 0, …; receives `recv_counts[j]`
    /// rows from rank `j`, in rank order. Backward is the reverse exchange.
    fn all_to_all_rows(
        x: FloatTensor<Self>,
        send_counts: &[usize],
        recv_counts: &[usize],
        comm: &Comm,
    ) -> FloatTensor<Self> {
        let rows = x.shape().first().copied();
        if comm.size() == 1 && send_counts == recv_counts && send_counts.first() == rows.as_ref() {
            return x;
        }
        host::all_to_all_rows::<Self>(x, send_counts, recv_counts, comm)
    }

    /// All-reduce with no gradient (vocab-parallel max, statistics).
    fn all_reduce_detached(x: FloatTensor<Self>, op: ReduceOp, comm: &Comm) -> FloatTensor<Self> {
        if comm.size() == 1 {
            return x;
        }
        host::all_reduce::<Self>(x, op, comm)
    }

    /// A sum all-reduce (no gradient) whose result later work waits for only when it is
    /// [`InFlight::finish`]ed, so the computation queued in between overlaps the transfer (the
    /// data-parallel gradient buckets). Default: [`ParallelOps::all_reduce_detached`], done at once
    /// (inside [`ferrotron_dist::deferred`], so a recorded call order marks it, as the other
    /// `*_started` defaults do).
    fn all_reduce_started(x: FloatTensor<Self>, comm: &Comm) -> InFlight<Self> {
        if comm.size() == 1 {
            return InFlight::ready(x);
        }
        InFlight::ready(deferred(|| {
            host::all_reduce::<Self>(x, ReduceOp::Sum, comm)
        }))
    }

    /// Sum over the group of `x` (1-D, length divisible by the group size), this rank keeping
    /// its chunk: a reduce-scatter ordered like [`ParallelOps::all_reduce_started`] (the
    /// distributed optimizer's gradient buckets).
    fn reduce_scatter_started(x: FloatTensor<Self>, comm: &Comm) -> InFlight<Self> {
        if comm.size() == 1 {
            return InFlight::ready(x);
        }
        InFlight::ready(deferred(|| host::reduce_scatter::<Self>(x, 0, comm)))
    }

    /// Every member's `x` (1-D) concatenated in rank order: an all-gather ordered like
    /// [`ParallelOps::all_reduce_started`] (the distributed optimizer's parameters, needed only
    /// when the next forward reaches them).
    fn all_gather_started(x: FloatTensor<Self>, comm: &Comm) -> InFlight<Self> {
        if comm.size() == 1 {
            return InFlight::ready(x);
        }
        InFlight::ready(deferred(|| host::all_gather::<Self>(x, 0, comm)))
    }

    /// Sends `x` to group rank `peer` of `comm` (a pipeline stage's activation or input
    /// gradient). Default: through the host as f32.
    fn send_to(x: FloatTensor<Self>, peer: usize, comm: &Comm) -> Result<(), CommError> {
        host::send_to::<Self>(x, peer, comm)
    }

    /// Receives a `shape` tensor from group rank `peer` of `comm` (what its [`Self::send_to`]
    /// sent), in the device's float dtype. Default: through the host as f32.
    fn recv_from(
        shape: &[usize],
        peer: usize,
        comm: &Comm,
        device: &Self::Device,
    ) -> Result<FloatTensor<Self>, CommError> {
        host::recv_from::<Self>(shape, peer, comm, device)
    }

    /// Where dropout's generator stands, for [`ParallelOps::rng_restore`] (see `recompute.rs`).
    ///
    /// Default, for generators whose state cannot be read (burn-flex keeps its generator in a
    /// private static): re-key the stream with a seed drawn from it and return that seed. The
    /// stream after a mark is then not the unmarked one, which is why the model marks at every
    /// layer start whether or not it recomputes: runs with and without recomputation draw the
    /// same masks.
    fn rng_mark(device: &Self::Device) -> RngMark {
        // Under the process lock: another thread rank's seeded initialisation must not see
        // its stream re-keyed halfway.
        crate::with_process_rng(|| {
            let draw =
                Self::float_random([2].into(), Distribution::Default, device, FloatDType::F32);
            let bits = Host::<Self>::read(draw).values;
            let seed = (u64::from(bits[0].to_bits()) << 32) | u64::from(bits[1].to_bits());
            Self::seed(device, seed);
            [seed, 0]
        })
    }

    /// Sends dropout's generator back to `mark`.
    fn rng_restore(device: &Self::Device, mark: RngMark) {
        crate::with_process_rng(|| Self::seed(device, mark[0]));
    }

    /// Runs the range `rerun` on `inputs`, recomputed in the backward pass where the backend
    /// records a graph (`Autodiff`; see `recompute.rs`), from the generator position `mark`.
    /// Default, without a graph: the plain forward.
    fn recompute(
        inputs: Vec<FloatTensor<Self>>,
        mark: RngMark,
        rerun: Rerun<Self>,
    ) -> Vec<FloatTensor<Self>> {
        let _ = mark;
        rerun(inputs, true)
    }

    /// Runs the range `run` on `inputs` as a cut of the graph whose backward the trainer's driver
    /// takes range by range, keeping its activations (see `recompute.rs`, [`Replay::Kept`]).
    /// Default, without a graph: the plain forward.
    ///
    /// [`Replay::Kept`]: crate::recompute::Replay::Kept
    fn cut_kept(inputs: Vec<FloatTensor<Self>>, run: Run<Self>) -> Vec<FloatTensor<Self>> {
        run(inputs)
    }
}

impl ParallelOps for burn::backend::Flex {}
