//! Device buffers from the stream-ordered allocator, and the memory statistics behind them.
//!
//! Buffers come from `cuMemAllocAsync` on the device's one compute stream, out of the device's
//! default memory pool whose release threshold is raised so freed blocks stay cached in the
//! pool: allocation and free are then stream-ordered and cost no synchronisation, which is what
//! a caching allocator would buy us, without writing one. The price is fragmentation: a large
//! request the cached blocks cannot hold fails while they hold memory the driver could give
//! it, so an out-of-memory answer first returns the cached blocks and retries. The bookkeeping (bytes live, peak,
//! counts) is plain atomics, so it is tested without a GPU; `reserved` comes from the pool.
#![allow(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::{result, sys};

use crate::engine::device::CudaDevice;
use crate::error::{DriverResultExt, OpContext, Result};

/// Allocation granularity: every request is rounded up to this many bytes, which keeps every
/// buffer aligned for any element type and vectorised access.
pub const ALLOC_GRANULARITY: usize = 256;

/// Bytes actually requested from the pool for a buffer of `bytes` bytes.
pub fn rounded_size(bytes: usize) -> usize {
    bytes.max(1).div_ceil(ALLOC_GRANULARITY) * ALLOC_GRANULARITY
}

/// Live counters of one device's allocations.
#[derive(Debug, Default)]
pub struct MemoryStats {
    allocated: AtomicU64,
    peak: AtomicU64,
    live_buffers: AtomicU64,
    total_allocations: AtomicU64,
}

/// A point-in-time copy of a device's memory statistics (what the metrics exporter reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemorySnapshot {
    /// Bytes in live tensors' buffers (rounded sizes).
    pub allocated_bytes: u64,
    /// Highest `allocated_bytes` since start or the last [`MemoryStats::reset_peak`].
    pub peak_bytes: u64,
    /// Bytes the memory pool holds from the driver (live plus cached); 0 when unknown.
    pub reserved_bytes: u64,
    pub live_buffers: u64,
    pub total_allocations: u64,
}

impl MemoryStats {
    pub fn record_alloc(&self, bytes: usize) {
        let now = self.allocated.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
        self.peak.fetch_max(now, Ordering::Relaxed);
        self.live_buffers.fetch_add(1, Ordering::Relaxed);
        self.total_allocations.fetch_add(1, Ordering::Relaxed);
    }

    pub fn record_free(&self, bytes: usize) {
        self.allocated.fetch_sub(bytes as u64, Ordering::Relaxed);
        self.live_buffers.fetch_sub(1, Ordering::Relaxed);
    }

    /// Restarts peak tracking from the bytes live now.
    pub fn reset_peak(&self) {
        self.peak
            .store(self.allocated.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    pub fn snapshot(&self, reserved_bytes: u64) -> MemorySnapshot {
        MemorySnapshot {
            allocated_bytes: self.allocated.load(Ordering::Relaxed),
            peak_bytes: self.peak.load(Ordering::Relaxed),
            reserved_bytes,
            live_buffers: self.live_buffers.load(Ordering::Relaxed),
            total_allocations: self.total_allocations.load(Ordering::Relaxed),
        }
    }
}

/// An owned device allocation, freed (stream-ordered) when the last tensor using it drops.
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    device: Arc<CudaDevice>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("bytes", &self.bytes)
            .field("device", &self.device.ordinal())
            .finish()
    }
}

impl DeviceBuffer {
    /// Allocates `bytes` (rounded up) on the device's compute stream. Contents are undefined
    /// unless the device's poison mode is on, in which case every byte is 0xFF.
    pub fn alloc(device: &Arc<CudaDevice>, bytes: usize) -> Result<Arc<DeviceBuffer>> {
        let size = rounded_size(bytes);
        device.bind()?;
        let ctx = || OpContext::new(format!("alloc {bytes} bytes"));
        // SAFETY: the stream belongs to the device's context, bound to this thread above; the
        // memory is only used on that same stream.
        let first = unsafe { result::malloc_async(device.cu_stream(), size) };
        let ptr = match first {
            Err(result::DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)) => {
                // The pool keeps freed blocks; when none of them is large enough and the
                // driver has no more memory, give the cached ones back and ask once more (as
                // PyTorch's cudaMallocAsync allocator does).
                let cached = device.memory_stats();
                tracing::warn!(
                    bytes = size,
                    reserved = cached.reserved_bytes,
                    live = cached.allocated_bytes,
                    "out of device memory: returning the pool's cached blocks and retrying"
                );
                device.empty_cache()?;
                // SAFETY: as above.
                unsafe { result::malloc_async(device.cu_stream(), size) }.ctx(ctx)?
            }
            other => other.ctx(ctx)?,
        };
        device.stats().record_alloc(size);
        let buffer = Arc::new(DeviceBuffer {
            ptr,
            bytes: size,
            device: device.clone(),
        });
        if device.poison_allocations() {
            // SAFETY: `ptr` points to `size` bytes just allocated on this stream.
            unsafe { result::memset_d8_async(ptr, 0xFF, size, device.cu_stream()) }.ctx(ctx)?;
        }
        Ok(buffer)
    }

    /// Raw device address of the first byte.
    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// Size in bytes (rounded to [`ALLOC_GRANULARITY`]).
    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        self.device.stats().record_free(self.bytes);
        if let Err(err) = self.device.bind() {
            tracing::warn!(%err, "cannot bind CUDA context to free a buffer");
            return;
        }
        // SAFETY: `ptr` was allocated by `malloc_async` on this stream and is freed once, here;
        // every kernel that used it was queued on the same stream before this free.
        if let Err(err) = unsafe { result::free_async(self.ptr, self.device.cu_stream()) } {
            tracing::warn!(?err, bytes = self.bytes, "cuMemFreeAsync failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_up_to_granularity() {
        assert_eq!(rounded_size(0), 256);
        assert_eq!(rounded_size(1), 256);
        assert_eq!(rounded_size(256), 256);
        assert_eq!(rounded_size(257), 512);
    }

    #[test]
    fn stats_track_live_bytes_and_peak() {
        let stats = MemoryStats::default();
        stats.record_alloc(1024);
        stats.record_alloc(512);
        stats.record_free(1024);
        let s = stats.snapshot(4096);
        assert_eq!(
            s,
            MemorySnapshot {
                allocated_bytes: 512,
                peak_bytes: 1536,
                reserved_bytes: 4096,
                live_buffers: 1,
                total_allocations: 2,
            }
        );
        stats.reset_peak();
        assert_eq!(stats.snapshot(0).peak_bytes, 512);
    }
}
