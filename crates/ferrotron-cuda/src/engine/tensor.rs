//! The engine's tensor: a shared device buffer seen through a [`Layout`] with a [`DType`].
//!
//! Cloning a tensor clones an `Arc`, never data; view ops return new layouts over the same
//! buffer. Ops never write into an input's buffer, so sharing is always safe; a fresh output
//! buffer is allocated stream-ordered, which is cheap. Host transfers are the only places that
//! synchronise.
#![allow(unsafe_code)]

use std::sync::Arc;

use cudarc::driver::result;

use crate::engine::alloc::DeviceBuffer;
use crate::engine::device::CudaDevice;
use crate::engine::dtype::DType;
use crate::engine::layout::{Layout, MAX_RANK, SliceArg, numel};
use crate::error::{CudaError, DriverResultExt, OpContext, Result};

/// A strided view of device memory with an element type.
#[derive(Clone)]
pub struct CudaTensor {
    buffer: Arc<DeviceBuffer>,
    layout: Layout,
    dtype: DType,
}

impl std::fmt::Debug for CudaTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaTensor")
            .field("shape", &self.layout.shape)
            .field("strides", &self.layout.strides)
            .field("offset", &self.layout.offset)
            .field("dtype", &self.dtype)
            .field("device", &self.buffer.device().ordinal())
            .finish()
    }
}

pub(crate) fn check_rank(op: &str, shape: &[usize]) -> Result<()> {
    if shape.len() > MAX_RANK {
        return Err(CudaError::unsupported(
            OpContext::new(op).shape(shape),
            format!("rank {} exceeds the maximum of {MAX_RANK}", shape.len()),
        ));
    }
    Ok(())
}

impl CudaTensor {
    /// An uninitialised (or poisoned, see [`CudaDevice::set_poison_allocations`]) contiguous
    /// tensor.
    pub fn empty(device: &Arc<CudaDevice>, shape: &[usize], dtype: DType) -> Result<Self> {
        check_rank("empty", shape)?;
        let buffer = DeviceBuffer::alloc(device, numel(shape) * dtype.size_in_bytes())?;
        Ok(Self {
            buffer,
            layout: Layout::contiguous(shape),
            dtype,
        })
    }

    /// Uploads row-major little-endian element bytes (the layout of burn's `TensorData`).
    pub fn from_bytes(
        device: &Arc<CudaDevice>,
        bytes: &[u8],
        shape: &[usize],
        dtype: DType,
    ) -> Result<Self> {
        let expected = numel(shape) * dtype.size_in_bytes();
        let ctx = || OpContext::new("from_bytes").shape(shape).dtype(dtype);
        if bytes.len() != expected {
            return Err(CudaError::ByteLength {
                context: ctx(),
                expected,
                actual: bytes.len(),
            });
        }
        let tensor = Self::empty(device, shape, dtype)?;
        if !bytes.is_empty() {
            device.upload(tensor.buffer.ptr(), bytes)?;
        }
        Ok(tensor)
    }

    /// Downloads the elements of a row-major tensor as little-endian bytes. Synchronises.
    /// (`to_bytes`, in `kernels/prim/copies.rs`, makes any tensor row-major first.)
    pub(crate) fn download_row_major(&self) -> Result<Vec<u8>> {
        debug_assert!(self.is_contiguous(), "download_row_major of a strided view");
        let t = self;
        let len = t.numel() * t.dtype.size_in_bytes();
        let mut out = vec![0u8; len];
        if len == 0 {
            return Ok(out);
        }
        let device = t.device();
        device.bind()?;
        let ctx = || {
            OpContext::new("to_bytes")
                .shape(self.shape())
                .dtype(self.dtype)
        };
        // Behind the queued work may be a collective whose peer died; the process watchdog
        // aborts it (releasing this wait) or ends the process, never lets it hang. The copy
        // itself already waits (into pageable memory it returns only once done), so the watch
        // starts before it.
        let _waiting = ferrotron_dist::watchdog::global().waiting("copying a tensor to the host");
        // `t` is contiguous, so `len` bytes from its first element are its elements
        if device.download(t.data_ptr(), &mut out)? {
            return Ok(out);
        }
        // SAFETY: as above; the stream is synchronised before `out` is read or dropped.
        unsafe { result::memcpy_dtoh_async(&mut out, t.data_ptr(), device.cu_stream()) }
            .ctx(ctx)?;
        device.stream().synchronize().ctx(ctx)?;
        Ok(out)
    }

    pub(crate) fn with_layout(&self, layout: Layout) -> Self {
        Self {
            buffer: self.buffer.clone(),
            layout,
            dtype: self.dtype,
        }
    }

    pub fn device(&self) -> &Arc<CudaDevice> {
        self.buffer.device()
    }

    pub fn shape(&self) -> &[usize] {
        &self.layout.shape
    }

    pub fn strides(&self) -> &[isize] {
        &self.layout.strides
    }

    /// Element offset of the view's first element in its buffer.
    pub fn offset(&self) -> usize {
        self.layout.offset
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn rank(&self) -> usize {
        self.layout.rank()
    }

    pub fn numel(&self) -> usize {
        self.layout.numel()
    }

    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// Whether no other tensor shares this buffer (an in-place update would be invisible).
    pub fn is_exclusive(&self) -> bool {
        Arc::strong_count(&self.buffer) == 1
    }

    /// Device address of the buffer's first byte (offset not applied).
    pub fn buffer_ptr(&self) -> u64 {
        self.buffer.ptr()
    }

    /// Device address of the view's first element (offset applied).
    pub fn data_ptr(&self) -> u64 {
        self.buffer.ptr() + (self.layout.offset * self.dtype.size_in_bytes()) as u64
    }

    /// Reorders dims (view).
    pub fn permute(&self, axes: &[usize]) -> Result<Self> {
        Ok(self.with_layout(self.layout.permute(axes)?))
    }

    /// Swaps two dims (view).
    pub fn swap_dims(&self, a: usize, b: usize) -> Result<Self> {
        Ok(self.with_layout(self.layout.swap_dims(a, b)?))
    }

    /// Broadcasts to `shape` (view with zero strides).
    pub fn expand(&self, shape: &[usize]) -> Result<Self> {
        check_rank("expand", shape)?;
        Ok(self.with_layout(self.layout.expand(shape)?))
    }

    /// Slices with steps (view); negative steps walk backwards.
    pub fn slice(&self, ranges: &[SliceArg]) -> Result<Self> {
        Ok(self.with_layout(self.layout.slice(ranges)?))
    }

    /// Reverses dims (view with negative strides).
    pub fn flip(&self, axes: &[usize]) -> Result<Self> {
        Ok(self.with_layout(self.layout.flip(axes)?))
    }

    /// Inserts a size-1 dim (view).
    pub fn unsqueeze(&self, dim: usize) -> Result<Self> {
        if dim > self.rank() {
            return Err(CudaError::invalid(
                OpContext::new("unsqueeze").shape(self.shape()),
                format!("dim {dim} out of range"),
            ));
        }
        if self.rank() >= MAX_RANK {
            return Err(CudaError::unsupported(
                OpContext::new("unsqueeze").shape(self.shape()),
                format!("rank would exceed the maximum of {MAX_RANK}"),
            ));
        }
        Ok(self.with_layout(self.layout.unsqueeze(dim)))
    }

    pub(crate) fn op(&self, name: &str) -> OpContext {
        OpContext::new(name).shape(self.shape()).dtype(self.dtype)
    }
}
