//! [`FusedOps::read_later`](ferrotron_ops::FusedOps::read_later): a checkpoint snapshot's
//! reads of the optimizer's buffers, run on a stream of their own into page-locked memory.
//!
//! Read on the compute stream, a snapshot's copy queued by the save's writer thread after the
//! next step's kernels waits for all of them, and the step's update, which must not change the
//! buffers before they are read, then waits for the rest: the save stops training for the copies
//! after all. Here the save marks the compute stream (an event, recorded when the shard is
//! taken) and the writer's copy waits for that mark only, on a read stream, so the copies run
//! beside the next step's forward and backward.
//!
//! The copies land in page-locked buffers, at the link's rate: into pageable memory the driver
//! stages through its own small pinned buffer and the fresh pages fault in as it writes, and
//! gpt-1.3b's 18.4 GB of masters and moments came off an H100 at 2.5 GB/s, holding the next
//! update 7.2–7.8 s (tools/README.md). The host copy out of the page-locked buffer
//! ([`ferrotron_ops::HostCopy`]) runs after the update is let go. A save's shards have the same
//! sizes every time, so the buffers are kept for the next save (one snapshot's worth: at most one
//! save is in flight); where page-locked memory cannot be had, the copy goes pageable as before.
#![allow(unsafe_code)]

use std::sync::{Arc, Mutex};

use burn::tensor::TensorData;
use cudarc::driver::{result, sys};

use crate::engine::device::CudaDevice;
use crate::engine::dtype::burn_dtype;
use crate::engine::tensor::CudaTensor;
use crate::error::{DriverResultExt, OpContext, Result};

/// The point of the compute stream a read waits for: an event recorded there.
pub(crate) struct Mark(sys::CUevent);

// SAFETY: a driver event, usable from any thread.
unsafe impl Send for Mark {}

impl Drop for Mark {
    fn drop(&mut self) {
        // SAFETY: created by `mark` and destroyed once, here; a stream that waits on it keeps
        // what it needs (the driver defers the destruction of a pending event).
        let _ = unsafe { result::event::destroy(self.0) };
    }
}

/// A device's read stream, created on its first read, and the page-locked buffers its reads
/// land in.
#[derive(Default)]
pub(crate) struct ReadStream {
    stream: Mutex<Option<StreamHandle>>,
    buffers: Mutex<Vec<Pinned>>,
}

struct StreamHandle(sys::CUstream);

// SAFETY: a driver stream handle, used under the mutex.
unsafe impl Send for StreamHandle {}

/// A page-locked host buffer of `capacity` bytes.
struct Pinned {
    host: *mut u8,
    capacity: usize,
}

// SAFETY: a driver allocation usable from any thread; one owner at a time (the pool's mutex, or
// the read holding it).
unsafe impl Send for Pinned {}

impl ReadStream {
    /// The smallest kept buffer of at least `len` bytes, or a new one; `None` when page-locked
    /// memory cannot be had.
    fn take(&self, len: usize) -> Option<Pinned> {
        let mut kept = self
            .buffers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let best = kept
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity >= len)
            .min_by_key(|(_, b)| b.capacity)
            .map(|(index, _)| index);
        if let Some(index) = best {
            return Some(kept.swap_remove(index));
        }
        drop(kept);
        // SAFETY: a plain page-locked allocation of `len` bytes, owned by the `Pinned` made of it.
        match unsafe { result::malloc_host(len, 0) } {
            Ok(host) => Some(Pinned {
                host: host.cast(),
                capacity: len,
            }),
            Err(err) => {
                tracing::warn!(
                    ?err,
                    bytes = len,
                    "no page-locked memory for a snapshot read; copying pageable"
                );
                None
            }
        }
    }

    /// Keeps `buffer` for the next read.
    fn give(&self, buffer: Pinned) {
        self.buffers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(buffer);
    }
}

impl Drop for ReadStream {
    fn drop(&mut self) {
        let buffers = self
            .buffers
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for buffer in buffers.drain(..) {
            // SAFETY: allocated by `malloc_host` and freed once, here; no copy uses it (a read
            // gives its buffer back only after its stream was synchronised).
            let _ = unsafe { result::free_host(buffer.host.cast()) };
        }
    }
}

/// Marks the compute stream of `device` where the work queued so far ends.
pub(crate) fn mark(device: &CudaDevice) -> Result<Mark> {
    let ctx = || OpContext::new("read_later: mark");
    device.bind()?;
    let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).ctx(ctx)?;
    let mark = Mark(event);
    // SAFETY: a live event and the device's stream, its context bound above.
    unsafe { result::event::record(mark.0, device.cu_stream()) }.ctx(ctx)?;
    Ok(mark)
}

/// `x` (contiguous) as the work before `mark` left it, copied on the read stream into a
/// page-locked buffer; returns once the copy is done, with what makes it host data.
pub(crate) fn read(
    device: &Arc<CudaDevice>,
    x: &CudaTensor,
    mark: Mark,
) -> Result<Box<dyn FnOnce() -> TensorData + Send>> {
    let ctx = || {
        OpContext::new("read_later")
            .shape(x.shape())
            .dtype(x.dtype())
    };
    device.bind()?;
    let len = x.numel() * x.dtype().size_in_bytes();
    let (shape, dtype) = (x.shape().to_vec(), burn_dtype(x.dtype()));
    let reads = device.read_stream();
    let pinned = if len == 0 { None } else { reads.take(len) };
    let mut pageable = match pinned {
        Some(_) => Vec::new(),
        None => vec![0u8; len],
    };
    let mut guard = reads
        .stream
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if guard.is_none() {
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking).ctx(ctx)?;
        *guard = Some(StreamHandle(stream));
    }
    let stream = guard.as_ref().expect("created above").0;
    // Behind the mark may be a collective whose peer died: the process watchdog watches.
    let _waiting = ferrotron_dist::watchdog::global().waiting("reading a checkpoint's snapshot");
    if len > 0 {
        // SAFETY: the event and stream are live; `x` is contiguous and holds `len` bytes from its
        // first element, kept alive by the caller; the destination (the page-locked buffer of at
        // least `len` bytes this read owns, or `pageable`) is written only by this copy, and the
        // stream is synchronised before it is read.
        unsafe {
            result::stream::wait_event(
                stream,
                mark.0,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
            .ctx(ctx)?;
            match &pinned {
                Some(buffer) => {
                    let host = std::slice::from_raw_parts_mut(buffer.host, len);
                    result::memcpy_dtoh_async(host, x.data_ptr(), stream).ctx(ctx)?;
                }
                None => result::memcpy_dtoh_async(&mut pageable, x.data_ptr(), stream).ctx(ctx)?,
            }
            result::stream::synchronize(stream).ctx(ctx)?;
        }
    }
    drop(guard);
    let held = pinned.map(|buffer| Lent {
        buffer: Some(buffer),
        device: device.clone(),
    });
    Ok(Box::new(move || {
        let bytes = match held {
            // SAFETY: the buffer holds the `len` bytes the synchronised copy wrote, and `Lent`
            // keeps it out of the pool until it is dropped after this read.
            Some(lent) => unsafe { std::slice::from_raw_parts(lent.host(), len) }.to_vec(),
            None => pageable,
        };
        TensorData::from_bytes_vec(bytes, shape, dtype)
    }))
}

/// A kept buffer lent to one read, back in the device's pool when dropped (read or not).
struct Lent {
    buffer: Option<Pinned>,
    device: Arc<CudaDevice>,
}

impl Lent {
    fn host(&self) -> *const u8 {
        self.buffer.as_ref().expect("lent until dropped").host
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            self.device.read_stream().give(buffer);
        }
    }
}
