//! [`FusedOps::read_later`](ferrotron_ops::FusedOps::read_later): a checkpoint snapshot's
//! reads of the optimizer's buffers, run on a stream of their own.
//!
//! Read on the compute stream, a snapshot's copy queued by the save's writer thread after the
//! next step's kernels waits for all of them, and the step's update, which must not change the
//! buffers before they are read, then waits for the rest: the save stops training for the copies
//! after all. Here the save marks the compute stream (an event, recorded when the shard is
//! taken) and the writer's copy waits for that mark only, on a read stream, so the copies run
//! beside the next step's forward and backward.
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

/// A device's read stream, created on its first read.
#[derive(Default)]
pub(crate) struct ReadStream(Mutex<Option<StreamHandle>>);

struct StreamHandle(sys::CUstream);

// SAFETY: a driver stream handle, used under the mutex.
unsafe impl Send for StreamHandle {}

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

/// `x` (contiguous) as the work before `mark` left it, copied on the read stream.
pub(crate) fn read(device: &Arc<CudaDevice>, x: &CudaTensor, mark: Mark) -> Result<TensorData> {
    let ctx = || {
        OpContext::new("read_later")
            .shape(x.shape())
            .dtype(x.dtype())
    };
    device.bind()?;
    let mut out = vec![0u8; x.numel() * x.dtype().size_in_bytes()];
    let mut guard = device
        .read_stream()
        .0
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if guard.is_none() {
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking).ctx(ctx)?;
        *guard = Some(StreamHandle(stream));
    }
    let stream = guard.as_ref().expect("created above").0;
    // Behind the mark may be a collective whose peer died: the process watchdog watches.
    let _waiting = ferrotron_dist::watchdog::global().waiting("reading a checkpoint's snapshot");
    if !out.is_empty() {
        // SAFETY: the event and stream are live; `x` is contiguous and holds `out.len()` bytes
        // from its first element, kept alive by the caller; the copy into pageable memory
        // returns once done, and the stream is synchronised before `out` is read.
        unsafe {
            result::stream::wait_event(
                stream,
                mark.0,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
            .ctx(ctx)?;
            result::memcpy_dtoh_async(&mut out, x.data_ptr(), stream).ctx(ctx)?;
            result::stream::synchronize(stream).ctx(ctx)?;
        }
    }
    Ok(TensorData::from_bytes_vec(
        out,
        x.shape().to_vec(),
        burn_dtype(x.dtype()),
    ))
}
