//! One CUDA device: its primary context, its one compute stream, its memory pool, its kernel
//! cache and its random-number state. (Its cuBLASLt handle lives in `blas/gemm.rs`, keyed by
//! ordinal like cuDNN's and cuBLAS's, so the engine knows nothing of the libraries above it.)
//!
//! Devices are created lazily on first use and shared (`Arc`) by every tensor on them, so a
//! whole training step queues onto one stream in program order: no events, no host
//! synchronisation until data goes to the host. The registry is global because burn's device
//! type is a plain value (an ordinal) that must map back to the same stream every time.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaStream, result, sys};

use crate::engine::alloc::{MemorySnapshot, MemoryStats};
use crate::engine::download::Downloads;
use crate::engine::host_pass::HostPassBuffers;
use crate::engine::kernel_cache::KernelCache;
use crate::engine::read_later::ReadStream;
use crate::engine::staging::Staging;
use crate::error::{CudaError, DriverResultExt, OpContext, Result};

/// Pool memory kept cached after frees (bytes): effectively "keep everything" so the pool acts
/// as a caching allocator; [`CudaDevice::empty_cache`] gives it back.
const POOL_RELEASE_THRESHOLD: u64 = u64::MAX;

/// A CUDA device with its compute stream. Obtain it with [`CudaDevice::get`].
pub struct CudaDevice {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    pool: PoolHandle,
    arch: String,
    multiprocessors: usize,
    stats: MemoryStats,
    kernels: KernelCache,
    staging: Staging,
    downloads: Downloads,
    host_pass: HostPassBuffers,
    read_stream: ReadStream,
    rng_seed: AtomicU64,
    rng_offset: AtomicU64,
    tf32: AtomicBool,
    poison: AtomicBool,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.ordinal)
            .field("arch", &self.arch)
            .finish()
    }
}

/// The device's default memory pool. The handle is a plain driver pointer, valid for the life
/// of the process, usable from any thread.
struct PoolHandle(sys::CUmemoryPool);

// SAFETY: a CUmemoryPool is a process-wide driver handle; the driver API is thread-safe.
unsafe impl Send for PoolHandle {}
// SAFETY: as above; we only pass the handle to thread-safe driver calls.
unsafe impl Sync for PoolHandle {}

fn registry() -> &'static Mutex<HashMap<usize, Arc<CudaDevice>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<usize, Arc<CudaDevice>>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Whether the CUDA driver library can be loaded here (false on CI machines without a GPU).
pub fn driver_available() -> bool {
    // SAFETY: only tries to dlopen the driver library by its usual names.
    unsafe { sys::is_culib_present() }
}

/// Number of CUDA devices, or an error when no driver is present.
pub fn device_count() -> Result<usize> {
    ensure_driver()?;
    let ctx = || OpContext::new("device_count");
    result::init().ctx(ctx)?;
    Ok(result::device::get_count().ctx(ctx)? as usize)
}

fn ensure_driver() -> Result<()> {
    if driver_available() {
        Ok(())
    } else {
        Err(CudaError::LibraryMissing {
            library: "the CUDA driver (libcuda)",
            hint: "no NVIDIA driver on this machine; use the CPU backend",
        })
    }
}

impl CudaDevice {
    /// The device with this ordinal, created on first call and shared afterwards.
    pub fn get(ordinal: usize) -> Result<Arc<CudaDevice>> {
        let mut devices = registry()
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(device) = devices.get(&ordinal) {
            return Ok(device.clone());
        }
        let device = Arc::new(Self::create(ordinal)?);
        devices.insert(ordinal, device.clone());
        Ok(device)
    }

    fn create(ordinal: usize) -> Result<Self> {
        ensure_driver()?;
        let ctx_op = || OpContext::new(format!("create CUDA device {ordinal}"));
        let count = device_count()?;
        if ordinal >= count {
            return Err(CudaError::invalid(
                ctx_op(),
                format!("device {ordinal} requested but {count} present"),
            ));
        }
        let ctx = CudaContext::new(ordinal).ctx(ctx_op)?;
        // One stream, used by everything: cudarc's multi-stream event tracking would only add
        // an event per buffer access.
        // SAFETY: we never use cudarc's CudaSlice across streams.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().ctx(ctx_op)?;
        let (major, minor) = ctx.compute_capability().ctx(ctx_op)?;
        // SAFETY: `cu_device` comes from a live context.
        let pool = unsafe { result::device::get_default_mem_pool(ctx.cu_device()) }.ctx(ctx_op)?;
        let mut threshold = POOL_RELEASE_THRESHOLD;
        // SAFETY: RELEASE_THRESHOLD takes a cuuint64_t, which `threshold` is.
        unsafe {
            result::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            )
        }
        .ctx(ctx_op)?;
        let arch = format!("sm_{major}{minor}");
        let multiprocessors = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .ctx(ctx_op)?;
        tracing::debug!(ordinal, %arch, "CUDA device ready");
        Ok(Self {
            ordinal,
            ctx,
            stream,
            pool: PoolHandle(pool),
            kernels: KernelCache::new(arch.clone()),
            arch,
            multiprocessors: usize::try_from(multiprocessors).unwrap_or(1),
            stats: MemoryStats::default(),
            staging: Staging::default(),
            downloads: Downloads::default(),
            host_pass: HostPassBuffers::default(),
            read_stream: ReadStream::default(),
            rng_seed: AtomicU64::new(0),
            rng_offset: AtomicU64::new(0),
            tf32: AtomicBool::new(false),
            poison: AtomicBool::new(
                crate::switches::env_var(crate::switches::EnvVars::CUDA_POISON).is_some(),
            ),
        })
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The NVRTC architecture name, e.g. `sm_90` on an H200.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Streaming multiprocessors (132 on an H200): how wide a grid of persistent blocks is.
    pub(crate) fn multiprocessors(&self) -> usize {
        self.multiprocessors
    }

    /// The device's name as the driver reports it.
    pub fn name(&self) -> Result<String> {
        self.ctx.name().ctx(|| OpContext::new("device name"))
    }

    /// Makes this device's context current on the calling thread (cheap when it already is).
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .ctx(|| OpContext::new("bind CUDA context"))
    }

    pub(crate) fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    /// The compute stream (for NCCL glue and events).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub(crate) fn stats(&self) -> &MemoryStats {
        &self.stats
    }

    pub(crate) fn kernels(&self) -> &KernelCache {
        &self.kernels
    }

    pub(crate) fn host_pass_buffers(&self) -> &HostPassBuffers {
        &self.host_pass
    }

    pub(crate) fn read_stream(&self) -> &ReadStream {
        &self.read_stream
    }

    /// Queues the upload of `bytes` to `dst` on the compute stream (through a page-locked
    /// buffer, `staging.rs`); `bytes` may go when this returns.
    pub(crate) fn upload(&self, dst: sys::CUdeviceptr, bytes: &[u8]) -> Result<()> {
        self.bind()?;
        self.staging.upload(dst, bytes, self.cu_stream())
    }

    /// Copies `out.len()` bytes from `src` into `out` behind the compute stream's queued work,
    /// through page-locked chunks (`download.rs`) when the copy is large and page-locked
    /// transfers are on; `false` when it did not (the caller copies as the driver does).
    pub(crate) fn download(&self, src: sys::CUdeviceptr, out: &mut [u8]) -> Result<bool> {
        if out.len() < crate::engine::download::MIN_STAGED
            || !crate::switches::paths().pinned_uploads
        {
            return Ok(false);
        }
        self.bind()?;
        match self.downloads.download(src, out, self.cu_stream()) {
            Some(done) => done.map(|()| true),
            None => Ok(false),
        }
    }

    /// Current memory statistics (reserved bytes read from the pool).
    pub fn memory_stats(&self) -> MemorySnapshot {
        let mut reserved: u64 = 0;
        // SAFETY: RESERVED_MEM_CURRENT writes a cuuint64_t into `reserved`.
        let ok = unsafe {
            result::mem_pool::get_attribute(
                self.pool.0,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                (&mut reserved as *mut u64).cast(),
            )
        };
        self.stats.snapshot(if ok.is_ok() { reserved } else { 0 })
    }

    /// Free and total bytes of the GPU as the driver sees them (`cuMemGetInfo`): what every
    /// user of the device left, this process's pool and NCCL's buffers included. Does not wait
    /// for the stream.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        result::mem_get_info().ctx(|| OpContext::new("memory_info"))
    }

    /// Restarts peak-memory tracking (e.g. at the start of a step).
    pub fn reset_peak_memory(&self) {
        self.stats.reset_peak();
    }

    /// Waits for the stream, then returns cached pool memory to the driver.
    pub fn empty_cache(&self) -> Result<()> {
        self.synchronize()?;
        // SAFETY: the pool is the device's default pool, valid for the process.
        unsafe { result::mem_pool::trim_to(self.pool.0, 0) }.ctx(|| OpContext::new("empty_cache"))
    }

    /// Blocks until every queued kernel and copy on the compute stream finished; reports any
    /// asynchronous error a kernel raised.
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // As in `CudaTensor::to_bytes`: a wait the process watchdog watches.
        let _waiting =
            ferrotron_dist::watchdog::global().waiting("waiting for the GPU's queued work");
        self.stream
            .synchronize()
            .ctx(|| OpContext::new("synchronize"))
    }

    /// Seeds the device's counter-based generator and restarts its counter.
    pub fn seed(&self, seed: u64) {
        self.rng_seed.store(seed, Ordering::SeqCst);
        self.rng_offset.store(0, Ordering::SeqCst);
    }

    /// Where the generator stands: (seed, next counter). Setting it back with
    /// [`Self::set_rng_state`] replays the same draws (a recomputed layer's dropout masks).
    pub fn rng_state(&self) -> [u64; 2] {
        [
            self.rng_seed.load(Ordering::SeqCst),
            self.rng_offset.load(Ordering::SeqCst),
        ]
    }

    pub fn set_rng_state(&self, [seed, offset]: [u64; 2]) {
        self.rng_seed.store(seed, Ordering::SeqCst);
        self.rng_offset.store(offset, Ordering::SeqCst);
    }

    /// Reserves `count` random draws: returns (seed, first counter). Each call gets a fresh
    /// counter range, so successive random tensors differ and the sequence is reproducible.
    pub(crate) fn next_rng_offset(&self, count: u64) -> (u64, u64) {
        let offset = self.rng_offset.fetch_add(count, Ordering::SeqCst);
        (self.rng_seed.load(Ordering::SeqCst), offset)
    }

    /// Allows TF32 tensor cores for f32 matmuls (off by default: exact f32).
    pub fn set_tf32(&self, enabled: bool) {
        self.tf32.store(enabled, Ordering::Relaxed);
    }

    pub fn tf32(&self) -> bool {
        self.tf32.load(Ordering::Relaxed)
    }

    /// When on, every new buffer is filled with 0xFF bytes (NaN floats, -1 ints) so tests see
    /// elements a kernel failed to write. Also enabled by env `FERROTRON_CUDA_POISON`.
    pub fn set_poison_allocations(&self, on: bool) {
        self.poison.store(on, Ordering::Relaxed);
    }

    pub fn poison_allocations(&self) -> bool {
        self.poison.load(Ordering::Relaxed)
    }

    /// Number of kernels compiled or loaded so far (cache statistics for tests and logs).
    pub fn compiled_kernels(&self) -> usize {
        self.kernels.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_driver_is_an_error_not_a_panic() {
        if driver_available() {
            return; // Only meaningful on GPU-less machines (CI).
        }
        let err = CudaDevice::get(0).unwrap_err();
        assert!(matches!(err, CudaError::LibraryMissing { .. }), "{err}");
    }
}
