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
//! ([`ferrotron_ops::HostCopy`]) runs after the update is let go. The page-locked memory is kept
//! for the next save as arenas that reads take consecutive pieces of, an arena starting over once
//! every piece is back (one snapshot's worth: at most one save is in flight); a read that finds no
//! room gets an arena of its own size. Page-locking gigabytes takes seconds, which the first
//! save's next update would wait for, so a run with asynchronous saves reserves one arena of its
//! state's size after its first step ([`ReadStream::reserve`]); where page-locked memory cannot be
//! had, the copy goes pageable as before.
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

/// A device's read stream, created on its first read, and the page-locked arenas its reads
/// land in.
#[derive(Default)]
pub(crate) struct ReadStream {
    stream: Mutex<Option<StreamHandle>>,
    arenas: Mutex<Vec<Arena>>,
}

struct StreamHandle(sys::CUstream);

// SAFETY: a driver stream handle, used under the mutex.
unsafe impl Send for StreamHandle {}

/// Pieces start at multiples of this many bytes (the copy engines' preferred alignment).
const ALIGN: usize = 256;

/// A page-locked host allocation of `capacity` bytes, handed out in consecutive pieces: `used`
/// bytes are taken, by `lent` pieces not yet given back.
struct Arena {
    host: *mut u8,
    capacity: usize,
    used: usize,
    lent: usize,
}

// SAFETY: a driver allocation usable from any thread; its pieces have one owner each (the pool's
// mutex hands them out).
unsafe impl Send for Arena {}

/// A piece of arena `arena`, starting at `host`.
struct Piece {
    arena: usize,
    host: *mut u8,
}

// SAFETY: see `Arena`.
unsafe impl Send for Piece {}

/// A page-locked allocation of `len` bytes, `None` (logged) when the driver refuses one.
fn page_locked(len: usize) -> Option<*mut u8> {
    // SAFETY: a plain page-locked allocation of `len` bytes, owned by the arena made of it.
    match unsafe { result::malloc_host(len, 0) } {
        Ok(host) => Some(host.cast()),
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

impl ReadStream {
    /// The pool, recovered from a poisoned lock (its bookkeeping is a few integers).
    fn pool(&self) -> std::sync::MutexGuard<'_, Vec<Arena>> {
        self.arenas
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A piece of `len` bytes from the first arena with room, or from a new arena of its own;
    /// `None` when page-locked memory cannot be had.
    fn take(&self, len: usize) -> Option<Piece> {
        let mut arenas = self.pool();
        let room = arenas
            .iter()
            .position(|a| a.capacity - a.used >= len)
            .or_else(|| {
                let host = page_locked(len)?;
                arenas.push(Arena {
                    host,
                    capacity: len,
                    used: 0,
                    lent: 0,
                });
                Some(arenas.len() - 1)
            })?;
        let arena = &mut arenas[room];
        // SAFETY: `used + len <= capacity`, within the allocation.
        let host = unsafe { arena.host.add(arena.used) };
        arena.used = (arena.used + len.next_multiple_of(ALIGN)).min(arena.capacity);
        arena.lent += 1;
        Some(Piece { arena: room, host })
    }

    /// Gives `piece` back; its arena starts over once all of its pieces are back.
    fn give(&self, piece: Piece) {
        let mut arenas = self.pool();
        let arena = &mut arenas[piece.arena];
        arena.lent -= 1;
        if arena.lent == 0 {
            arena.used = 0;
        }
    }

    /// Makes the arenas hold at least `bytes` (one new arena for what is missing): what a
    /// snapshot of that many bytes reads into, page-locked now rather than during its save.
    /// Returns the bytes newly page-locked.
    pub(crate) fn reserve(&self, bytes: usize) -> usize {
        let mut arenas = self.pool();
        let held: usize = arenas.iter().map(|a| a.capacity).sum();
        // the pieces' alignment: at most one `ALIGN` each, a piece per ~MiB is generous
        let wanted = bytes + bytes.div_ceil(1 << 20) * ALIGN;
        let missing = wanted.saturating_sub(held);
        if missing == 0 {
            return 0;
        }
        match page_locked(missing) {
            Some(host) => {
                arenas.push(Arena {
                    host,
                    capacity: missing,
                    used: 0,
                    lent: 0,
                });
                missing
            }
            None => 0,
        }
    }
}

impl Drop for ReadStream {
    fn drop(&mut self) {
        let arenas = self
            .arenas
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for arena in arenas.drain(..) {
            // SAFETY: allocated by `malloc_host` and freed once, here; no copy uses it (a read
            // gives its piece back only after its stream was synchronised).
            let _ = unsafe { result::free_host(arena.host.cast()) };
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
                Some(piece) => {
                    let host = std::slice::from_raw_parts_mut(piece.host, len);
                    result::memcpy_dtoh_async(host, x.data_ptr(), stream).ctx(ctx)?;
                }
                None => result::memcpy_dtoh_async(&mut pageable, x.data_ptr(), stream).ctx(ctx)?,
            }
            result::stream::synchronize(stream).ctx(ctx)?;
        }
    }
    drop(guard);
    let held = pinned.map(|piece| Lent {
        piece: Some(piece),
        device: device.clone(),
    });
    Ok(Box::new(move || match held {
        Some(lent) => {
            // SAFETY: the piece holds the `len` bytes the synchronised copy wrote, and `Lent`
            // keeps it out of the pool until it is dropped after this read.
            let bytes = unsafe { std::slice::from_raw_parts(lent.host(), len) };
            host_data(bytes, shape, dtype)
        }
        None => TensorData::from_bytes_vec(pageable, shape, dtype),
    }))
}

/// A piece's bytes as host data in one copy: f32 values (the optimizer's masters and moments)
/// into a vector of f32, which a reader then takes as it is; a vector of bytes, aligned for
/// nothing wider, would be copied once more by every reader that asks for the values.
fn host_data(bytes: &[u8], shape: Vec<usize>, dtype: burn::tensor::DType) -> TensorData {
    match bytemuck::try_cast_slice::<u8, f32>(bytes) {
        Ok(values) if dtype == burn::tensor::DType::F32 => TensorData::new(values.to_vec(), shape),
        _ => TensorData::from_bytes_vec(bytes.to_vec(), shape, dtype),
    }
}

/// A piece lent to one read, back in the device's pool when dropped (read or not).
struct Lent {
    piece: Option<Piece>,
    device: Arc<CudaDevice>,
}

impl Lent {
    fn host(&self) -> *const u8 {
        self.piece.as_ref().expect("lent until dropped").host
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(piece) = self.piece.take() {
            self.device.read_stream().give(piece);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// f32 bytes become f32 values (read back without another copy); other dtypes and
    /// unaligned bytes stay bytes of their dtype. The values are the same either way.
    #[test]
    fn a_piece_becomes_host_data_of_its_dtype() {
        let values = [1.5f32, -0.25, f32::MIN_POSITIVE, 3.0];
        let aligned: &[u8] = bytemuck::cast_slice(&values);
        let data = host_data(aligned, vec![2, 2], burn::tensor::DType::F32);
        assert_eq!(data.shape.dims::<2>(), [2, 2]);
        assert_eq!(data.to_vec::<f32>().expect("f32"), values);
        let mut shifted = vec![0u8; aligned.len() + 1];
        shifted[1..].copy_from_slice(aligned);
        let unaligned = host_data(&shifted[1..], vec![4], burn::tensor::DType::F32);
        assert_eq!(unaligned.to_vec::<f32>().expect("f32"), values);
        let halves = [0x3f80u16, 0xc000];
        let bf16 = host_data(
            bytemuck::cast_slice(&halves),
            vec![2],
            burn::tensor::DType::BF16,
        );
        assert_eq!(
            bf16.convert::<f32>().to_vec::<f32>().expect("f32"),
            [1.0, -2.0]
        );
    }
}
