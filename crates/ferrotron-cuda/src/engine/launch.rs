//! Launching a generated kernel: the contract every kernel family above the engine builds on.
//!
//! All run-time values (shapes, strides, offsets, pointers, scalars) travel in one by-value
//! struct of 8-byte words ([`Params`]), so one compiled kernel serves every shape it was
//! specialised for; a [`KernelSpec`] is what the source depends on, so the device's kernel cache
//! (`kernel_cache.rs`) finds a compiled kernel without generating its source. It lives in the
//! engine, not beside the generators, because the device owns that cache.
#![allow(unsafe_code)]

use std::ffi::c_void;

use cudarc::driver::result;

use crate::engine::device::CudaDevice;
use crate::error::{DriverResultExt, OpContext, Result};

/// Threads per block of the element-wise families.
pub const BLOCK: u32 = 256;
/// Upper bound on blocks of grid-stride loops (enough to fill any current GPU many times).
pub const MAX_GRID: u64 = 65_535;

/// The kernel parameter struct as 8-byte words, built in the order the generated C declares.
#[derive(Debug, Default, Clone)]
pub struct Params(Vec<u64>);

impl Params {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn int(&mut self, v: i64) -> &mut Self {
        self.0.push(v as u64);
        self
    }

    pub fn ints(&mut self, vs: impl IntoIterator<Item = i64>) -> &mut Self {
        for v in vs {
            self.int(v);
        }
        self
    }

    /// A fixed-size array field: the values then zeros up to `len`.
    pub fn padded(&mut self, vs: &[i64], len: usize) -> &mut Self {
        for i in 0..len {
            self.int(vs.get(i).copied().unwrap_or(0));
        }
        self
    }

    pub fn float(&mut self, v: f64) -> &mut Self {
        self.0.push(v.to_bits());
        self
    }

    pub fn ptr(&mut self, p: u64) -> &mut Self {
        self.0.push(p);
        self
    }

    pub fn words(&self) -> &[u64] {
        &self.0
    }
}

/// Grid size for a grid-stride loop over `n` items with `block` threads per block.
pub fn grid_for(n: u64, block: u32) -> u32 {
    n.div_ceil(u64::from(block)).clamp(1, MAX_GRID) as u32
}

/// `#include`s a source needs: the half headers only when a half type appears, since they
/// slow NVRTC down and need the toolkit's include directory.
pub fn includes(uses_half: bool) -> &'static str {
    if uses_half {
        "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n"
    } else {
        ""
    }
}

/// A kernel specification: everything its generated source depends on. The cache looks a
/// launch up by a hash of the spec, so no source is generated or hashed on a hit.
pub(crate) trait KernelSpec: std::hash::Hash + 'static {
    fn source(&self) -> String;

    /// Whether the source uses features of the device's architecture alone (Hopper's wgmma):
    /// it is then compiled for the architecture-specific target (`sm_90a`), whose code runs on
    /// that architecture only.
    fn arch_specific(&self) -> bool {
        false
    }

    /// Dynamic shared memory a block takes (`extern __shared__`); the kernel cache raises the
    /// function's limit once, where it passes the static 48 KiB, as the driver requires.
    fn shared_bytes(&self) -> u32 {
        0
    }
}

/// Compiles (once per spec) and launches a kernel on the device's stream, timed under its
/// name when op timing is on.
pub(crate) fn launch<S: KernelSpec>(
    device: &CudaDevice,
    spec: &S,
    grid: u32,
    block: u32,
    params: &Params,
    op: &dyn Fn() -> OpContext,
) -> Result<()> {
    device.bind()?;
    let (function, name) = device
        .kernels()
        .function_for_spec(device.context(), spec, op)?;
    let _timer = crate::engine::timing::scope(device, &name);
    let mut words = params.words().to_vec();
    let mut args: [*mut c_void; 1] = [words.as_mut_ptr().cast()];
    // SAFETY: the generated kernel takes exactly one by-value struct whose fields are the
    // 8-byte words of `params` in order (each family builds both sides together); every pointer
    // inside refers to a live buffer on this device, kept alive by the calling op until the
    // launch is queued (buffers are freed stream-ordered, after the kernel).
    unsafe {
        result::launch_kernel(
            function.cu_function(),
            (grid, 1, 1),
            (block, 1, 1),
            spec.shared_bytes(),
            device.cu_stream(),
            &mut args,
        )
    }
    .ctx(op)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_pack_words_in_order() {
        let mut p = Params::new();
        p.int(-1).padded(&[2, 3], 4).float(1.5).ptr(0xdead);
        assert_eq!(p.words(), &[u64::MAX, 2, 3, 0, 0, 1.5f64.to_bits(), 0xdead]);
    }

    #[test]
    fn grids_are_clamped() {
        assert_eq!(grid_for(0, 256), 1);
        assert_eq!(grid_for(257, 256), 2);
        assert_eq!(grid_for(u64::MAX / 2, 256), MAX_GRID as u32);
    }
}
