//! Large device-to-host copies through two page-locked buffers.
//!
//! A copy into ordinary (pageable) memory is staged by the driver through its own pinned memory,
//! and a fresh destination (a tensor's new host buffer) also takes its first-touch page faults
//! inside the copy, one thread deep: the optimizer offload's gradients came down at about a sixth
//! of the link's rate that way (`tools/README.md`, issue 49's offload rows). Here a large copy is
//! cut into chunks: while the device copies chunk i + 1 into one page-locked buffer, the host
//! copies chunk i out of the other into the destination on several threads, so the link stays
//! busy and the page faults are spread over cores. `runtime.pinned_uploads: false` (the recipe's
//! switch for page-locked transfers) turns it off.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::driver::{result, sys};

use crate::error::{DriverResultExt, OpContext, Result};

/// Copies at least this large go through the chunks; smaller ones are not worth the round trips.
pub(crate) const MIN_STAGED: usize = 32 << 20;
/// Bytes per chunk (two are held per device).
const CHUNK: usize = 64 << 20;
/// Threads copying a chunk out of page-locked memory.
const COPY_THREADS: usize = 8;

/// A page-locked buffer and the event recorded after the copy into it.
struct Chunk {
    host: *mut u8,
    copied: sys::CUevent,
}

// SAFETY: a driver allocation and an event, usable from any thread; a chunk is only touched
// under its device's mutex.
unsafe impl Send for Chunk {}

/// A device's two download chunks, allocated on the first large download and kept for the life
/// of the process as the device is.
#[derive(Default)]
pub(crate) struct Downloads {
    chunks: Mutex<Option<[Chunk; 2]>>,
}

impl Downloads {
    /// Copies `out.len()` bytes from `src` into `out`, waiting for the work queued on `stream`
    /// before it; `None` when no page-locked memory could be had (the caller copies as the
    /// driver does). The device's context must be current.
    pub(crate) fn download(
        &self,
        src: sys::CUdeviceptr,
        out: &mut [u8],
        stream: sys::CUstream,
    ) -> Option<Result<()>> {
        let mut guard = self
            .chunks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if guard.is_none() {
            let first = allocate()?;
            let Some(second) = allocate() else {
                release(first);
                return None;
            };
            *guard = Some([first, second]);
        }
        let chunks = guard.as_ref().expect("allocated above");
        Some(copy_through(chunks, src, out, stream))
    }
}

fn copy_through(
    chunks: &[Chunk; 2],
    src: sys::CUdeviceptr,
    out: &mut [u8],
    stream: sys::CUstream,
) -> Result<()> {
    let ctx = || OpContext::new("download");
    let pieces: Vec<&mut [u8]> = out.chunks_mut(CHUNK).collect();
    let mut offset = 0usize;
    let mut previous: Option<(usize, &mut [u8])> = None;
    for (index, piece) in pieces.into_iter().enumerate() {
        let chunk = &chunks[index % 2];
        // SAFETY: the chunk holds CHUNK ≥ piece.len() page-locked bytes whose last contents were
        // copied out in the previous iteration but one (synchronously); `src + offset` holds
        // piece.len() bytes of the caller's buffer.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                chunk.host.cast::<c_void>(),
                src + offset as u64,
                piece.len(),
                stream,
            )
            .result()
            .ctx(ctx)?;
            result::event::record(chunk.copied, stream).ctx(ctx)?;
        }
        offset += piece.len();
        if let Some((at, out)) = previous.take() {
            copy_out(&chunks[at % 2], out)?;
        }
        previous = Some((index, piece));
    }
    if let Some((at, out)) = previous {
        copy_out(&chunks[at % 2], out)?;
    }
    Ok(())
}

/// Waits for `chunk`'s copy and copies its first `out.len()` bytes into `out` on several threads.
fn copy_out(chunk: &Chunk, out: &mut [u8]) -> Result<()> {
    // SAFETY: a live event, recorded after the chunk's copy.
    unsafe { result::event::synchronize(chunk.copied) }.ctx(|| OpContext::new("download"))?;
    // SAFETY: the chunk holds CHUNK ≥ out.len() page-locked bytes, written by the copy just
    // waited for and not written again until the next copy into it, which this thread queues.
    let from = unsafe { std::slice::from_raw_parts(chunk.host.cast_const(), out.len()) };
    let part = out.len().div_ceil(COPY_THREADS).max(1);
    std::thread::scope(|scope| {
        for (to, from) in out.chunks_mut(part).zip(from.chunks(part)) {
            scope.spawn(move || to.copy_from_slice(from));
        }
    });
    Ok(())
}

/// A page-locked chunk with its event; `None` where the driver refuses (a locked-memory limit).
fn allocate() -> Option<Chunk> {
    // SAFETY: a plain page-locked allocation, written by a copy before it is read.
    let host = match unsafe { result::malloc_host(CHUNK, 0) } {
        Ok(host) => host.cast::<u8>(),
        Err(e) => {
            tracing::warn!(error = ?e, "no page-locked download buffer; downloads stay pageable");
            return None;
        }
    };
    match result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING) {
        Ok(copied) => Some(Chunk { host, copied }),
        Err(e) => {
            tracing::warn!(error = ?e, "no event for a download buffer; downloads stay pageable");
            // SAFETY: allocated just above and never used.
            let _ = unsafe { result::free_host(host.cast()) };
            None
        }
    }
}

/// Frees a chunk no copy has used.
fn release(chunk: Chunk) {
    // SAFETY: the event and the buffer were created by `allocate` and nothing queued uses them.
    unsafe {
        let _ = result::event::destroy(chunk.copied);
        let _ = result::free_host(chunk.host.cast());
    }
}
