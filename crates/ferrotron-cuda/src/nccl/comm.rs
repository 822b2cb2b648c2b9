//! [`NcclComm`]: one NCCL communicator of one group on one GPU, its communication stream, the
//! events that order it against the device's compute stream, and failure handling.
//!
//! **Ordering.** Every collective is queued on one of the device's *communication* streams
//! (`lane.rs`: data-parallel groups on one, every other group on the other, so a group's
//! collectives run in program order exactly as on every other rank, and a deferred gradient
//! reduction never delays the model's collectives): an event recorded on the compute stream makes the
//! communication stream wait for the kernels that produced the inputs, and an event recorded
//! after the NCCL call makes the compute stream wait before anything queued later. No host
//! synchronisation. Buffers come from the stream-ordered pool on the compute stream; because the
//! compute stream waits for the collective before any later work, a buffer dropped after the
//! call is freed (stream-ordered, on the compute stream) only once NCCL is done with it, and an
//! output allocated before the call is ready before NCCL writes it.
//!
//! **Failures.** The host never blocks inside a CUDA or NCCL wait: where it must wait (the
//! host-slice collectives, which copy results back), it polls the completion event and
//! `ncclCommGetAsyncError` until a deadline. A NCCL error, a CUDA error or the deadline aborts
//! every communicator of the process (`ncclCommAbort`, which also releases NCCL kernels stuck
//! on a dead peer) and tells the bootstrap peers, and the call returns a [`CommError`] naming the
//! group and the collective; later calls on any communicator fail at once with the same reason.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_int};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaEvent, CudaStream, sys as driver_sys};
use cudarc::nccl::result::{NcclError, NcclStatus};
use cudarc::nccl::sys::{self, ncclComm_t, ncclResult_t, ncclUniqueId};
use ferrotron_dist::watchdog::{self, Health, Watched};
use ferrotron_dist::{
    CommError, Communicator, GroupLabel, Lane, OrderDigest, TcpComm, agree_on_digest,
};

use crate::engine::device::CudaDevice;
use crate::nccl::lane::comm_stream;
use crate::nccl::stats::{self, CollectiveKind};

/// How long the host waits for a collective it must see finished (it includes the compute work
/// queued before it), unless `FERROTRON_NCCL_TIMEOUT_S` says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// How a communicator creates its sub-communicators: over the TCP world that carried its own
/// unique id, or (a process alone) by itself.
#[derive(Debug)]
pub(crate) enum Bootstrap {
    Solo,
    Tcp(TcpComm),
}

/// The raw NCCL handle. NCCL calls on one communicator are serialised by [`Inner::calls`];
/// `ncclCommAbort` is the one call NCCL allows concurrently with a blocked one.
struct RawComm(ncclComm_t);

// SAFETY: a ncclComm_t is a heap object of the NCCL library, not tied to the creating thread;
// every use goes through the `calls` mutex except `ncclCommAbort`, which NCCL documents as the
// way to unblock another thread's call.
unsafe impl Send for RawComm {}
// SAFETY: as above.
unsafe impl Sync for RawComm {}

/// The two events that order one communicator's calls against the compute stream, reused.
pub(crate) struct Events {
    /// Recorded on the compute stream; the communication stream waits for it.
    ready: CudaEvent,
    /// Recorded on the communication stream after the NCCL call; the compute stream waits.
    done: CudaEvent,
    /// Every call queued so far, for [`NcclComm::agree_on_digest`].
    digest: OrderDigest,
}

/// A queued collective, its communicator's events still held.
pub(crate) struct Queued<'a> {
    guard: std::sync::MutexGuard<'a, Events>,
}

pub(crate) struct Inner {
    raw: RawComm,
    /// Why this communicator was aborted; set once (also by another communicator's failure).
    aborted: OnceLock<String>,
    calls: Mutex<Events>,
    /// Held while the handle is aborted or asked for its asynchronous error (the watchdog does
    /// the latter from its own thread).
    handle: Mutex<()>,
    device: Arc<CudaDevice>,
    stream: Arc<CudaStream>,
    pub(crate) label: GroupLabel,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    timeout_ms: AtomicU64,
    bootstrap: Bootstrap,
}

/// A NCCL communicator over one group's GPUs (one process per GPU), with the collectives of
/// `ferrotron_dist::Communicator` on host slices (staged through device buffers) and on device
/// tensors (see `tensor.rs`: no host copies).
#[derive(Clone)]
pub struct NcclComm {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NcclComm({} rank {} on GPU {})",
            self.inner.label,
            self.inner.rank,
            self.inner.device.ordinal()
        )
    }
}

/// Whether the NCCL library can be loaded here.
pub fn nccl_available() -> bool {
    // SAFETY: only tries to dlopen the library by cudarc's candidate names.
    unsafe { sys::is_culib_present() }
}

/// NCCL's version as `major·10000 + minor·100 + patch` (e.g. 22703), when the library loads.
pub fn nccl_version() -> Option<i32> {
    nccl_available()
        .then(cudarc::nccl::result::get_nccl_version)
        .and_then(Result::ok)
}

const MISSING: &str = "libnccl.so could not be loaded: put the folder holding it on \
    LD_LIBRARY_PATH (pip's nvidia-nccl package ships it in site-packages/nvidia/nccl/lib; cudarc \
    does not try the name libnccl.so.2, so where only that exists, give it a folder with a \
    libnccl.so symlink: tools/gpu-nccl.sh does)";

/// The 128 bytes of a unique id as 32 little-endian words (what the TCP bootstrap broadcasts).
pub fn id_to_words(id: &[std::ffi::c_char; 128]) -> [u32; 32] {
    let mut words = [0u32; 32];
    for (w, chunk) in words.iter_mut().zip(id.chunks_exact(4)) {
        *w = u32::from_le_bytes([
            chunk[0] as u8,
            chunk[1] as u8,
            chunk[2] as u8,
            chunk[3] as u8,
        ]);
    }
    words
}

/// The inverse of [`id_to_words`].
pub fn words_to_id(words: &[u32; 32]) -> [std::ffi::c_char; 128] {
    let mut id = [0 as std::ffi::c_char; 128];
    for (chunk, w) in id.chunks_exact_mut(4).zip(words) {
        for (c, b) in chunk.iter_mut().zip(w.to_le_bytes()) {
            *c = b as std::ffi::c_char;
        }
    }
    id
}

/// NCCL's name for a result, and the communicator's last error message when there is one.
pub(crate) fn describe(result: ncclResult_t, comm: Option<ncclComm_t>) -> String {
    // SAFETY: ncclGetErrorString returns a static string for any result value.
    let name = unsafe { CStr::from_ptr(sys::ncclGetErrorString(result)) }
        .to_string_lossy()
        .into_owned();
    let last = comm
        // SAFETY: the communicator is live (not destroyed); the string is owned by NCCL and
        // copied before the next NCCL call.
        .map(|c| unsafe { CStr::from_ptr(sys::ncclGetLastError(c)) })
        .map(|s| s.to_string_lossy().into_owned())
        .filter(|s| !s.is_empty());
    match last {
        Some(last) => format!("{name} ({result:?}): {last}"),
        None => format!("{name} ({result:?})"),
    }
}

/// Hands a live communicator to the process watchdog, which aborts it with every other one of
/// the process (and the TCP world) when any fails, and polls its asynchronous error.
fn register(inner: &Arc<Inner>) {
    let watched: Arc<dyn Watched> = inner.clone();
    watchdog::global().watch(Arc::downgrade(&watched));
}

/// Aborts every live communicator of this process with `reason` (their blocked and later calls
/// fail), NCCL's and the TCP world's, whose peers are told.
pub fn abort_all(reason: &str) {
    watchdog::global().abort_all(reason);
}

fn default_timeout() -> Duration {
    crate::switches::env_var(crate::switches::EnvVars::NCCL_TIMEOUT_S)
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(DEFAULT_TIMEOUT)
}

impl Watched for Inner {
    fn health(&self) -> Health {
        match self.async_error() {
            Some(err) => Health::Failed(format!("{}: NCCL reported {err}", self.label)),
            None => Health::Fine,
        }
    }

    fn abort(&self, reason: &str) {
        Inner::abort(self, reason);
    }
}

impl Inner {
    fn abort(&self, reason: &str) {
        // The watchdog's thread may be asking for the asynchronous error right now.
        let _handle = self.handle.lock().unwrap_or_else(|p| p.into_inner());
        if self.aborted.set(reason.to_owned()).is_ok() {
            tracing::error!(group = %self.label, reason, "aborting NCCL communicator");
            // SAFETY: the handle is live and aborted exactly once (guarded by the OnceLock);
            // after this nothing uses it (every call checks `aborted` first, under `calls`, and
            // the asynchronous error under `handle`). NCCL allows the abort while another
            // thread is blocked in a call on it.
            if let Err(err) = unsafe { cudarc::nccl::result::comm_abort(self.raw.0) } {
                tracing::warn!(error = ?err.0, "ncclCommAbort failed");
            }
            if let Bootstrap::Tcp(tcp) = &self.bootstrap {
                tcp.abort(reason);
            }
        }
    }

    /// The asynchronous error NCCL recorded for this communicator, if any.
    fn async_error(&self) -> Option<String> {
        let _handle = self.handle.lock().unwrap_or_else(|p| p.into_inner());
        if self.aborted.get().is_some() {
            return None;
        }
        let mut result = ncclResult_t::ncclSuccess;
        // SAFETY: the handle is live: not aborted (checked above, and `handle` keeps an abort
        // out until this returns) and destroyed only on drop.
        let status = unsafe { sys::ncclCommGetAsyncError(self.raw.0, &mut result) };
        if status != ncclResult_t::ncclSuccess {
            return Some(describe(status, None));
        }
        match result {
            ncclResult_t::ncclSuccess | ncclResult_t::ncclInProgress => None,
            err => Some(describe(err, Some(self.raw.0))),
        }
    }
}

impl Inner {
    /// Waits (polling, up to the timeout) until the communication stream ran everything queued
    /// so far; false when it did not, or NCCL reported an error.
    fn drain(&self) -> bool {
        if self.device.bind().is_err() {
            return false;
        }
        let Ok(event) = self.stream.record_event(None) else {
            return false;
        };
        let deadline =
            Instant::now() + Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed));
        loop {
            match event.try_is_complete() {
                Ok(true) => return true,
                Ok(false) if Instant::now() < deadline && self.async_error().is_none() => {
                    std::thread::sleep(Duration::from_micros(100));
                }
                _ => return false,
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.aborted.get().is_some() {
            return; // ncclCommAbort freed it
        }
        // `ncclCommDestroy` flushes and is an intra-node collective: a rank that drops its
        // communicators while a peer is gone (or drops them in another order) would hang in it.
        // So a communicator of several ranks first lets its queued work finish (polled, with
        // the deadline) and is then released by `ncclCommAbort`, which is local; a communicator
        // of one rank is destroyed normally.
        let drained = self.drain();
        let destroy = drained && self.size == 1 && self.async_error().is_none();
        // SAFETY: last use of the handle; the compute stream already waits for every queued
        // collective of this communicator, so no buffer it uses is freed before it finishes.
        let result = unsafe {
            if destroy {
                cudarc::nccl::result::comm_destroy(self.raw.0)
            } else {
                cudarc::nccl::result::comm_abort(self.raw.0)
            }
        };
        if let Err(err) = result {
            tracing::warn!(error = ?err.0, group = %self.label, "destroying a NCCL communicator failed");
        }
    }
}

impl NcclComm {
    /// A communicator of this process alone (`world[rank]`): a NCCL communicator of one rank, so
    /// a one-GPU run goes through NCCL exactly as one rank of a larger world would.
    pub fn solo(device: &Arc<CudaDevice>, global_rank: u32) -> Result<NcclComm, CommError> {
        let label = GroupLabel {
            name: "world".to_owned(),
            ranks: vec![global_rank],
        };
        let id = new_unique_id(&label)?;
        super::exporter::register(global_rank);
        Self::init(device, label, 0, id, Bootstrap::Solo, default_timeout())
    }

    /// The world communicator of a process world: rank 0 of `bootstrap` creates the unique id
    /// and broadcasts it over TCP; every process then joins the NCCL communicator on `device`.
    pub fn world(bootstrap: TcpComm, device: &Arc<CudaDevice>) -> Result<NcclComm, CommError> {
        let label = bootstrap.label().clone();
        let rank = bootstrap.rank();
        let id = shared_unique_id(&bootstrap, &label)?;
        super::exporter::register(bootstrap.global_rank());
        // The TCP world's deadline is the recipe's distributed timeout.
        let timeout = bootstrap.timeout();
        Self::init(device, label, rank, id, Bootstrap::Tcp(bootstrap), timeout)
    }

    fn init(
        device: &Arc<CudaDevice>,
        label: GroupLabel,
        rank: usize,
        id: ncclUniqueId,
        bootstrap: Bootstrap,
        timeout: Duration,
    ) -> Result<NcclComm, CommError> {
        let size = label.ranks.len();
        let fail = |reason: String| CommError::Aborted {
            op: "nccl_init",
            group: label.clone(),
            reason,
        };
        device.bind().map_err(|e| fail(e.to_string()))?;
        let stream = comm_stream(device, Lane::of_group(&label.name)).map_err(fail)?;
        let event = || {
            device
                .context()
                .new_event(None)
                .map_err(|e| fail(format!("creating an event: {e:?}")))
        };
        let events = Events {
            ready: event()?,
            done: event()?,
            digest: OrderDigest::default(),
        };
        let mut raw: ncclComm_t = std::ptr::null_mut();
        // SAFETY: `raw` is written by NCCL; the device's context is current on this thread, so
        // NCCL binds the communicator to this GPU. Blocking init: it returns once every member
        // joined (NCCL's own bootstrap times out on a missing member).
        let status = unsafe { sys::ncclCommInitRank(&mut raw, size as c_int, id, rank as c_int) };
        if status != ncclResult_t::ncclSuccess {
            return Err(fail(format!(
                "ncclCommInitRank (rank {rank} of {size}): {}",
                describe(status, None)
            )));
        }
        tracing::debug!(group = %label, rank, gpu = device.ordinal(), "NCCL communicator ready");
        let inner = Arc::new(Inner {
            raw: RawComm(raw),
            aborted: OnceLock::new(),
            calls: Mutex::new(events),
            handle: Mutex::new(()),
            device: device.clone(),
            stream,
            label,
            rank,
            size,
            timeout_ms: AtomicU64::new(timeout.as_millis().max(1) as u64),
            bootstrap,
        });
        register(&inner);
        Ok(NcclComm { inner })
    }

    /// How long the host waits for a collective it needs finished before aborting.
    pub fn set_timeout(&self, timeout: Duration) {
        self.inner
            .timeout_ms
            .store(timeout.as_millis().max(1) as u64, Ordering::Relaxed);
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.inner.timeout_ms.load(Ordering::Relaxed))
    }

    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.inner.device
    }

    /// The communication stream (shared by the device's communicators).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.inner.stream
    }

    /// Aborts this communicator and every other of the process (see [`abort_all`]).
    pub fn abort(&self, reason: &str) {
        abort_all(&format!("{}: {reason}", self.inner.label));
    }

    /// Why the communicator was aborted, if it was.
    pub fn aborted(&self) -> Option<&str> {
        self.inner.aborted.get().map(String::as_str)
    }

    /// A sub-communicator by `ncclCommSplit`: every member of this group calls it; those passing
    /// the same `color` form a group, ordered by `key`. The members' global ranks are gathered
    /// over the new communicator. Sub-communicators of the plan's groups use `new_group`
    /// instead (only members call it); this is NCCL's native way for callers who have all ranks.
    pub fn split(&self, name: &str, color: u32, key: u32) -> Result<NcclComm, CommError> {
        let op = "split";
        let guard = self.lock(op)?;
        let mut raw: ncclComm_t = std::ptr::null_mut();
        // SAFETY: the parent is live (checked by `lock`); a null config inherits the parent's.
        let status = unsafe {
            sys::ncclCommSplit(
                self.inner.raw.0,
                color as c_int,
                key as c_int,
                &mut raw,
                std::ptr::null_mut(),
            )
        };
        drop(guard);
        if status != ncclResult_t::ncclSuccess {
            return Err(self.fail(op, format!("ncclCommSplit: {}", describe(status, None))));
        }
        let raw = RawComm(raw);
        let (mut size, mut rank) = (0 as c_int, 0 as c_int);
        // SAFETY: `raw` was just created by NCCL.
        let status = unsafe {
            let s = sys::ncclCommCount(raw.0, &mut size);
            if s == ncclResult_t::ncclSuccess {
                sys::ncclCommUserRank(raw.0, &mut rank)
            } else {
                s
            }
        };
        if status != ncclResult_t::ncclSuccess {
            return Err(self.fail(op, describe(status, Some(raw.0))));
        }
        let device = self.inner.device.clone();
        let new_event = || {
            device
                .context()
                .new_event(None)
                .map_err(|e| self.fail(op, format!("creating an event: {e:?}")))
        };
        let events = Events {
            ready: new_event()?,
            done: new_event()?,
            digest: OrderDigest::default(),
        };
        let me = self.global_rank();
        let provisional = GroupLabel {
            name: name.to_owned(),
            ranks: vec![me; size as usize],
        };
        let inner = Arc::new(Inner {
            raw,
            aborted: OnceLock::new(),
            calls: Mutex::new(events),
            handle: Mutex::new(()),
            device: device.clone(),
            stream: comm_stream(&device, Lane::of_group(name)).map_err(|e| self.fail(op, e))?,
            label: provisional,
            rank: rank as usize,
            size: size as usize,
            timeout_ms: AtomicU64::new(self.inner.timeout_ms.load(Ordering::Relaxed)),
            bootstrap: Bootstrap::Solo,
        });
        register(&inner);
        let child = NcclComm { inner };
        let mut members = vec![0u32; size as usize];
        child.all_gather(&[me], &mut members)?;
        // The members are known now: give the child its real label and a TCP bootstrap of its
        // own (collective over exactly these members) so it can create groups in turn.
        let bootstrap = match &self.inner.bootstrap {
            Bootstrap::Tcp(tcp) if members.len() > 1 => {
                Bootstrap::Tcp(Communicator::new_group(tcp, name, &members)?)
            }
            _ => Bootstrap::Solo,
        };
        let mut inner = Arc::try_unwrap(child.inner)
            .map_err(|_| self.fail(op, "the split communicator is still shared".to_owned()))?;
        inner.label = GroupLabel {
            name: name.to_owned(),
            ranks: members,
        };
        inner.bootstrap = bootstrap;
        let inner = Arc::new(inner);
        register(&inner);
        Ok(NcclComm { inner })
    }

    /// A sub-communicator over `members` (global ranks), created by the members only: its unique
    /// id travels over the TCP bootstrap's group of the same members.
    pub(crate) fn new_group_impl(
        &self,
        name: &str,
        members: &[u32],
    ) -> Result<NcclComm, CommError> {
        let label = GroupLabel {
            name: name.to_owned(),
            ranks: members.to_vec(),
        };
        let me = self.global_rank();
        let Some(rank) = members.iter().position(|&r| r == me) else {
            return Err(CommError::NotAMember {
                group: label,
                rank: me,
            });
        };
        if let Some(&outside) = members.iter().find(|r| !self.members().contains(r)) {
            return Err(CommError::InvalidArgument {
                op: "new_group",
                group: label,
                detail: format!("rank {outside} is not in {}", self.label()),
            });
        }
        if members.len() == 1 {
            let id = new_unique_id(&label)?;
            return Self::init(
                &self.inner.device,
                label,
                0,
                id,
                Bootstrap::Solo,
                self.timeout(),
            );
        }
        let Bootstrap::Tcp(tcp) = &self.inner.bootstrap else {
            return Err(CommError::InvalidArgument {
                op: "new_group",
                group: label,
                detail: "a communicator made by `split` cannot create groups of several ranks"
                    .to_owned(),
            });
        };
        let sub = Communicator::new_group(tcp, name, members)?;
        let id = shared_unique_id(&sub, &label)?;
        Self::init(
            &self.inner.device,
            label,
            rank,
            id,
            Bootstrap::Tcp(sub),
            self.timeout(),
        )
    }

    /// Takes the call lock after checking that neither this communicator nor NCCL failed.
    pub(crate) fn lock(
        &self,
        op: &'static str,
    ) -> Result<std::sync::MutexGuard<'_, Events>, CommError> {
        let guard = self.inner.calls.lock().unwrap_or_else(|p| p.into_inner());
        self.check(op)?;
        Ok(guard)
    }

    /// Fails when the communicator was aborted or NCCL reports an asynchronous error.
    pub(crate) fn check(&self, op: &'static str) -> Result<(), CommError> {
        if let Some(reason) = self.inner.aborted.get() {
            return Err(CommError::Aborted {
                op,
                group: self.inner.label.clone(),
                reason: reason.clone(),
            });
        }
        if let Some(err) = self.inner.async_error() {
            return Err(self.fail(op, format!("NCCL reported {err}")));
        }
        Ok(())
    }

    /// Aborts every communicator of the process and returns the error naming `op` here.
    pub(crate) fn fail(&self, op: &'static str, reason: String) -> CommError {
        let err = CommError::Aborted {
            op,
            group: self.inner.label.clone(),
            reason,
        };
        abort_all(&err.to_string());
        err
    }

    /// Queues `call` (one or more NCCL calls on the communication stream) ordered after the
    /// compute stream's work so far, and makes the compute stream wait for it. With `wait`, the
    /// host then waits (polling, with the deadline) until it finished.
    ///
    /// # Safety
    /// Every device pointer `call` passes to NCCL must point into a buffer that stays allocated
    /// until this returns (its stream-ordered free then queues after the collective), allocated
    /// on the device's compute stream before this call, large enough for the counts passed.
    pub(crate) unsafe fn launch(
        &self,
        op: &'static str,
        kind: CollectiveKind,
        bytes: usize,
        wait: bool,
        call: impl FnOnce(ncclComm_t, sys::cudaStream_t) -> Result<(), NcclError>,
    ) -> Result<(), CommError> {
        // SAFETY: the caller's promise, passed on.
        let queued = unsafe { self.queue(op, kind, bytes, call) }?;
        let done = &queued.guard.done;
        self.inner.device.stream().wait(done).map_err(|e| {
            self.fail(
                op,
                format!("CUDA error while ordering the compute stream: {e:?}"),
            )
        })?;
        if wait {
            self.wait_for(op, done)?;
        }
        Ok(())
    }

    /// [`NcclComm::launch`] without ordering the compute stream after the collective: the
    /// returned event is recorded after it, and the compute stream must wait for that event
    /// before it reads the results (or frees what the collective reads or writes).
    ///
    /// # Safety
    /// As [`NcclComm::launch`], and every buffer `call` passes must stay allocated until the
    /// compute stream waits for the returned event.
    pub(crate) unsafe fn launch_deferred(
        &self,
        op: &'static str,
        kind: CollectiveKind,
        bytes: usize,
        call: impl FnOnce(ncclComm_t, sys::cudaStream_t) -> Result<(), NcclError>,
    ) -> Result<CudaEvent, CommError> {
        // SAFETY: the caller's promise, passed on. The events stay locked until `finished` is
        // recorded, so no other call queues in between.
        let _queued = unsafe { self.queue(op, kind, bytes, call) }?;
        let finished = self
            .inner
            .device
            .context()
            .new_event(None)
            .map_err(|e| self.fail(op, format!("CUDA error while creating an event: {e:?}")))?;
        finished
            .record(&self.inner.stream)
            .map_err(|e| self.fail(op, format!("CUDA error while recording an event: {e:?}")))?;
        Ok(finished)
    }

    /// `call` on the communication stream after the compute stream's work so far, timed, with
    /// the communicator's `done` event recorded after it (held by the returned guard).
    ///
    /// # Safety
    /// As [`NcclComm::launch`].
    unsafe fn queue(
        &self,
        op: &'static str,
        kind: CollectiveKind,
        bytes: usize,
        call: impl FnOnce(ncclComm_t, sys::cudaStream_t) -> Result<(), NcclError>,
    ) -> Result<Queued<'_>, CommError> {
        let mut guard = self.lock(op)?;
        guard.digest.add(op, bytes as u64);
        let inner = &self.inner;
        let device = &inner.device;
        let cuda = |what: &str, e: cudarc::driver::DriverError| {
            self.fail(op, format!("CUDA error while {what}: {e:?}"))
        };
        device.bind().map_err(|e| self.fail(op, e.to_string()))?;
        guard
            .ready
            .record(device.stream())
            .map_err(|e| cuda("recording the ready event", e))?;
        inner
            .stream
            .wait(&guard.ready)
            .map_err(|e| cuda("ordering the communication stream", e))?;
        let timing = || {
            device
                .context()
                .new_event(Some(driver_sys::CUevent_flags::CU_EVENT_DEFAULT))
        };
        let start = timing().map_err(|e| cuda("creating a timing event", e))?;
        start
            .record(&inner.stream)
            .map_err(|e| cuda("recording a timing event", e))?;
        let stream = inner.stream.cu_stream() as sys::cudaStream_t;
        if let Err(err) = call(inner.raw.0, stream) {
            return Err(self.fail(op, describe(err.0, Some(inner.raw.0))));
        }
        let end = timing().map_err(|e| cuda("creating a timing event", e))?;
        end.record(&inner.stream)
            .map_err(|e| cuda("recording a timing event", e))?;
        guard
            .done
            .record(&inner.stream)
            .map_err(|e| cuda("recording the done event", e))?;
        stats::record(kind, bytes, inner.size, start, end);
        Ok(Queued { guard })
    }

    /// The members compare their digests of every call queued so far over the TCP bootstrap
    /// (`ferrotron_dist::OrderDigest` says why); a communicator without one (a split, or a
    /// process alone) has no members to disagree with over it.
    pub(crate) fn agree_on_digest(&self) -> Result<(), CommError> {
        let Bootstrap::Tcp(tcp) = &self.inner.bootstrap else {
            return Ok(());
        };
        let digest = self.lock("agree_on_order")?.digest;
        agree_on_digest(tcp, &self.inner.label, digest)
            .inspect_err(|err| abort_all(&err.to_string()))
    }

    /// Polls `event` until it completed, NCCL reports an error, or the deadline passes.
    pub(crate) fn wait_for(&self, op: &'static str, event: &CudaEvent) -> Result<(), CommError> {
        let timeout = self.timeout();
        let started = Instant::now();
        let mut polls = 0u32;
        loop {
            if let Some(reason) = self.inner.aborted.get() {
                return Err(CommError::Aborted {
                    op,
                    group: self.inner.label.clone(),
                    reason: reason.clone(),
                });
            }
            match event.try_is_complete() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    return Err(self.fail(op, format!("CUDA error while waiting: {e:?}")));
                }
            }
            if let Some(err) = self.inner.async_error() {
                return Err(self.fail(op, format!("NCCL reported {err}")));
            }
            if started.elapsed() >= timeout {
                let me = self.global_rank();
                let err = CommError::Timeout {
                    op,
                    group: self.inner.label.clone(),
                    after: timeout,
                    missing: self
                        .members()
                        .iter()
                        .copied()
                        .filter(|&r| r != me)
                        .collect(),
                    verb: "complete it (NCCL cannot tell which member stalled)",
                };
                abort_all(&err.to_string());
                return Err(err);
            }
            polls += 1;
            if polls < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
}

/// A fresh unique id (this process creates the communicator alone or as rank 0).
fn new_unique_id(label: &GroupLabel) -> Result<ncclUniqueId, CommError> {
    let fail = |reason: String| CommError::Aborted {
        op: "nccl_init",
        group: label.clone(),
        reason,
    };
    if !nccl_available() {
        return Err(fail(MISSING.to_owned()));
    }
    cudarc::nccl::result::get_uniqueid()
        .map_err(|e| fail(format!("ncclGetUniqueId: {}", describe(e.0, None))))
}

/// Rank 0 of `tcp` creates the unique id; everyone receives it over TCP.
fn shared_unique_id(tcp: &TcpComm, label: &GroupLabel) -> Result<ncclUniqueId, CommError> {
    let mut words = [0u32; 32];
    // Every member checks the library first, so a missing one fails everywhere alike.
    if !nccl_available() {
        let reason = format!("rank {}: {MISSING}", tcp.global_rank());
        tcp.abort(&reason);
        return Err(CommError::Aborted {
            op: "nccl_init",
            group: label.clone(),
            reason,
        });
    }
    if tcp.rank() == 0 {
        match new_unique_id(label) {
            Ok(id) => words = id_to_words(&id.internal),
            Err(err) => {
                tcp.abort(&err.to_string());
                return Err(err);
            }
        }
    }
    tcp.broadcast(&mut words, 0)?;
    Ok(ncclUniqueId {
        internal: words_to_id(&words),
    })
}

/// `Ok` for NCCL's success (and in-progress, which blocking communicators never return).
pub(crate) fn ok(status: Result<NcclStatus, NcclError>) -> Result<(), NcclError> {
    status.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_ids_round_trip_through_words() {
        let mut id = [0 as std::ffi::c_char; 128];
        for (i, c) in id.iter_mut().enumerate() {
            *c = (i as u8).wrapping_mul(37).wrapping_add(200) as std::ffi::c_char;
        }
        let words = id_to_words(&id);
        assert_eq!(words[0], u32::from_le_bytes([200, 237, 18, 55]));
        assert_eq!(words_to_id(&words), id);
    }

    #[test]
    fn a_missing_library_is_an_error_naming_the_fix() {
        if nccl_available() {
            return; // only meaningful where NCCL is absent (this build machine, CI)
        }
        let err = new_unique_id(&GroupLabel {
            name: "world".into(),
            ranks: vec![0],
        })
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("nccl_init on group world[0] aborted: libnccl.so"),
            "{text}"
        );
        assert!(text.contains("LD_LIBRARY_PATH"), "{text}");
        assert_eq!(nccl_version(), None);
    }
}
