//! Host-to-device uploads through page-locked staging buffers.
//!
//! An upload from ordinary (pageable) host memory is asynchronous in name only: the driver
//! stages it through its own pinned memory and, for a copy beyond what it inlines into the
//! command stream, "may synchronize with the stream" to do so (the CUDA driver API's *API
//! synchronization behavior*). Each step's token batch — an i64 `[batch, seq]` pair of
//! 100–300 KiB — could then wait for the previous step's queued kernels, the device running dry
//! while the host came back and queued the next step: with the statistics read right after each
//! step (ferrotron-train's `run/training_loop.rs`), a candidate cause of the gap the stream's timeline showed before every
//! step's first GEMM (1–2 % of a step on one H200; tools/README.md). Copied into page-locked memory
//! first, an upload is queued like a kernel. PyTorch's `pin_memory` data loaders exist for the
//! same reason.
//!
//! A buffer is reused once the event recorded after its copy has completed, so a host that runs a
//! step ahead keeps a few buffers in flight. Small uploads, which the driver inlines, go as
//! before; past [`PINNED_LIMIT`] bytes of buffers the smallest busy buffer that fits is waited for,
//! and an upload of more than a quarter of that (a checkpoint's weights, once) is a plain pageable
//! copy.
//! `runtime.pinned_uploads: false` turns staging off.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::driver::{result, sys};

use crate::error::{DriverResultExt, OpContext, Result};

/// Uploads below this go straight from pageable memory (the driver copies them inline).
pub(crate) const MIN_STAGED: usize = 64 << 10;
/// The smallest staging buffer allocated, so that batches of similar size share one.
const MIN_CHUNK: usize = 1 << 20;
/// Page-locked bytes one device keeps at most.
pub(crate) const PINNED_LIMIT: usize = 256 << 20;
/// Uploads above this (a checkpoint's weights, once) go pageable: not worth pinning for.
const MAX_STAGED: usize = PINNED_LIMIT / 4;

/// What an upload of some size does with the buffers there are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice {
    /// Copy through this idle buffer.
    Reuse(usize),
    /// Allocate a buffer of this capacity.
    Allocate(usize),
    /// Wait for this busy buffer's copy, then reuse it.
    Wait(usize),
    /// Copy from pageable memory as the driver does.
    Direct,
}

/// The buffer for `len` bytes among `chunks` (capacity, busy): the smallest idle one that fits,
/// else a new one within [`PINNED_LIMIT`], else the smallest busy one that fits.
pub(crate) fn choose(chunks: &[(usize, bool)], len: usize) -> Choice {
    if !(MIN_STAGED..=MAX_STAGED).contains(&len) {
        return Choice::Direct;
    }
    let smallest = |busy: bool| {
        chunks
            .iter()
            .enumerate()
            .filter(|&(_, &(capacity, b))| b == busy && capacity >= len)
            .min_by_key(|&(_, &(capacity, _))| capacity)
            .map(|(index, _)| index)
    };
    if let Some(index) = smallest(false) {
        return Choice::Reuse(index);
    }
    let held: usize = chunks.iter().map(|&(capacity, _)| capacity).sum();
    let capacity = len.next_power_of_two().max(MIN_CHUNK);
    if held + capacity <= PINNED_LIMIT {
        return Choice::Allocate(capacity);
    }
    smallest(true).map_or(Choice::Direct, Choice::Wait)
}

/// One page-locked buffer and the event recorded after the copy that last read it.
struct Chunk {
    host: *mut u8,
    capacity: usize,
    copied: sys::CUevent,
    busy: bool,
}

// SAFETY: the buffer and the event are driver allocations usable from any thread; a chunk is
// only touched under its pool's mutex.
unsafe impl Send for Chunk {}

impl Chunk {
    /// Whether the copy that last read it may still be running (asks the driver).
    fn refresh(&mut self) -> Result<()> {
        if self.busy {
            // SAFETY: `copied` is a live event, recorded after the chunk's last copy.
            match unsafe { result::event::query(self.copied) } {
                Ok(()) => self.busy = false,
                Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => {}
                Err(e) => return Err(e).ctx(|| OpContext::new("staging buffer event")),
            }
        }
        Ok(())
    }
}

/// A device's staging buffers, held for the life of the process as the device is.
#[derive(Default)]
pub(crate) struct Staging {
    chunks: Mutex<Vec<Chunk>>,
}

impl Staging {
    /// Queues the copy of `bytes` to `dst` on `stream`; `bytes` may go when this returns. The
    /// device's context must be current.
    pub(crate) fn upload(
        &self,
        dst: sys::CUdeviceptr,
        bytes: &[u8],
        stream: sys::CUstream,
    ) -> Result<()> {
        let ctx = || OpContext::new("upload");
        let direct = || {
            // SAFETY: the caller's `dst` holds `bytes.len()` bytes; a pageable source is staged
            // by the driver before the call returns.
            unsafe { result::memcpy_htod_async(dst, bytes, stream) }.ctx(ctx)
        };
        if !on() {
            return direct();
        }
        let mut chunks = self
            .chunks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for chunk in chunks.iter_mut() {
            chunk.refresh()?;
        }
        let states: Vec<(usize, bool)> = chunks.iter().map(|c| (c.capacity, c.busy)).collect();
        let index = match choose(&states, bytes.len()) {
            Choice::Direct => return direct(),
            Choice::Reuse(index) => index,
            Choice::Wait(index) => {
                // SAFETY: a live event, recorded after the chunk's last copy.
                unsafe { result::event::synchronize(chunks[index].copied) }.ctx(ctx)?;
                index
            }
            Choice::Allocate(capacity) => match allocate(capacity) {
                Some(chunk) => {
                    chunks.push(chunk);
                    chunks.len() - 1
                }
                None => return direct(),
            },
        };
        let chunk = &mut chunks[index];
        // SAFETY: the chunk holds `capacity >= bytes.len()` page-locked bytes no copy reads any
        // more (its event completed, or was waited for).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), chunk.host, bytes.len()) };
        // SAFETY: `dst` holds `bytes.len()` bytes; the source stays untouched until `copied`
        // completes, which is recorded right behind the copy on the same stream.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, chunk.host as *const c_void, bytes.len(), stream)
                .result()
                .ctx(ctx)?;
            result::event::record(chunk.copied, stream).ctx(ctx)?;
        }
        chunk.busy = true;
        Ok(())
    }
}

/// A page-locked buffer of `capacity` bytes with its event; `None` (the upload then goes
/// pageable) where the driver refuses, e.g. under a locked-memory limit.
fn allocate(capacity: usize) -> Option<Chunk> {
    // SAFETY: a plain page-locked allocation, written before any copy reads it.
    let host = match unsafe { result::malloc_host(capacity, 0) } {
        Ok(host) => host.cast::<u8>(),
        Err(e) => {
            tracing::warn!(capacity, error = ?e, "no page-locked staging buffer; uploads stay pageable");
            return None;
        }
    };
    match result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING) {
        Ok(copied) => Some(Chunk {
            host,
            capacity,
            copied,
            busy: false,
        }),
        Err(e) => {
            tracing::warn!(error = ?e, "no event for a staging buffer; uploads stay pageable");
            // SAFETY: allocated just above and never used.
            let _ = unsafe { result::free_host(host.cast()) };
            None
        }
    }
}

/// Whether uploads are staged (the recipe's `runtime.pinned_uploads`).
fn on() -> bool {
    crate::switches::paths().pinned_uploads
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn small_and_huge_uploads_stay_pageable() {
        assert_eq!(choose(&[], MIN_STAGED - 1), Choice::Direct);
        assert_eq!(choose(&[(MIB, false)], 1000), Choice::Direct);
        assert_eq!(choose(&[], MAX_STAGED + 1), Choice::Direct);
        assert_eq!(choose(&[], MAX_STAGED), Choice::Allocate(MAX_STAGED));
    }

    #[test]
    fn the_smallest_idle_buffer_that_fits_is_reused() {
        let chunks = [
            (4 * MIB, false),
            (MIB, true),
            (2 * MIB, false),
            (MIB, false),
        ];
        assert_eq!(choose(&chunks, 200 << 10), Choice::Reuse(3));
        assert_eq!(choose(&chunks, MIB + 1), Choice::Reuse(2));
        assert_eq!(choose(&chunks, 3 * MIB), Choice::Reuse(0));
    }

    #[test]
    fn a_new_buffer_is_a_power_of_two_of_at_least_a_mebibyte() {
        assert_eq!(choose(&[(MIB, true)], 200 << 10), Choice::Allocate(MIB));
        assert_eq!(choose(&[], 3 * MIB), Choice::Allocate(4 * MIB));
        assert_eq!(choose(&[(MIB, false)], 3 * MIB), Choice::Allocate(4 * MIB));
    }

    #[test]
    fn at_the_limit_the_smallest_busy_buffer_that_fits_is_waited_for() {
        let full = [
            (PINNED_LIMIT / 2, true),
            (PINNED_LIMIT / 4, true),
            (PINNED_LIMIT / 4, true),
        ];
        assert_eq!(choose(&full, MIB), Choice::Wait(1));
        assert_eq!(choose(&full, MIB << 5), Choice::Wait(1));
        let halves = [(PINNED_LIMIT / 2, true), (PINNED_LIMIT / 2, true)];
        assert_eq!(choose(&halves, MAX_STAGED), Choice::Wait(0));
        // nothing fits: as the driver does it
        let small = [(PINNED_LIMIT / 8, true); 8];
        assert_eq!(choose(&small, MAX_STAGED), Choice::Direct);
    }
}
