//! A row for the allocator's answer to fragmentation (`engine/alloc.rs`): the pool is filled
//! with 1 GiB buffers until the driver has little left, every other one is freed (the pool
//! keeps them, none adjacent to another), and a buffer larger than the driver's free memory and
//! than any cached hole is asked for. It can only be given by returning the cached blocks to
//! the driver first, which an out-of-memory answer now does; the 128k-token LLaMA-style row
//! failed this way on 2026-12-07 with a 4 GiB request at 79.2 GiB held.

use std::sync::Arc;

use ferrotron_cuda::CudaDevice;
use ferrotron_cuda::engine::alloc::DeviceBuffer;

use crate::compare::Errors;
use crate::{Row, failed, first_line, guarded};

const GIB: usize = 1 << 30;

pub(crate) fn rows(ordinal: usize) -> Vec<Row> {
    let (errors, note) = match guarded(|| fragmented_alloc(ordinal)) {
        Ok(note) => (
            Errors {
                max_abs: 0.0,
                max_rel: 0.0,
                bad: 0,
                mismatch: None,
            },
            note,
        ),
        Err(e) => (failed(), first_line(&e)),
    };
    vec![Row {
        op: "alloc_after_fragmentation".into(),
        dtype: "u8",
        shape: "1 GiB holes".into(),
        errors,
        note,
    }]
}

/// What the fill left and what the large request got, or why it failed.
fn fragmented_alloc(ordinal: usize) -> Result<String, String> {
    let err = |e: ferrotron_cuda::CudaError| e.to_string();
    let engine = CudaDevice::get(ordinal).map_err(err)?;
    engine.empty_cache().map_err(err)?;
    let mut held: Vec<Arc<DeviceBuffer>> = Vec::new();
    while engine.memory_info().map_err(err)?.0 > 3 * GIB {
        held.push(DeviceBuffer::alloc(&engine, GIB).map_err(err)?);
    }
    let holes = held.len() / 2;
    let mut index = 0;
    held.retain(|_| {
        index += 1;
        index % 2 == 0
    });
    engine.synchronize().map_err(err)?;
    let free = engine.memory_info().map_err(err)?.0;
    let want = (free / GIB + 2).min(holes) * GIB;
    if want <= free || holes < 2 {
        return Err(format!(
            "the fill left {holes} holes and {free} bytes free: no request tests the retry"
        ));
    }
    let big = DeviceBuffer::alloc(&engine, want).map_err(err)?;
    let note = format!(
        "{} GiB given with {:.2} GiB free on the driver and {holes} cached 1 GiB holes",
        want / GIB,
        free as f64 / GIB as f64
    );
    drop(big);
    drop(held);
    engine.empty_cache().map_err(err)?;
    Ok(note)
}
