//! A row for `FusedOps::read_later` (the CUDA backend's `read_later.rs`, a checkpoint snapshot's
//! reads): a buffer is marked, ~50 ms of matmuls are queued after the mark, and the read, on the
//! read stream, must give the buffer's values bit for bit without waiting for them; the note
//! says how long the read took beside the queue.

use std::time::Instant;

use burn::tensor::TensorData;
use ferrotron_cuda::{Cuda, CudaDevice, CudaTensor, DType, GpuDevice};
use ferrotron_ops::FusedOps;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{Row, compare, failed, first_line, guarded};

/// f32 elements read (64 MiB).
const LEN: usize = 16 << 20;

pub(crate) fn rows(device: &GpuDevice) -> Vec<Row> {
    let (errors, note) = match guarded(|| read_later(device.ordinal)) {
        Ok((got, want, read_ms, queue_ms)) => (
            compare::compare(&got, &want, 1.0),
            format!(
                "{}; read in {read_ms:.1} ms beside {queue_ms:.1} ms of matmuls queued after the mark",
                if got.as_bytes() == want.as_bytes() {
                    "bit for bit"
                } else {
                    "NOT bit for bit"
                }
            ),
        ),
        Err(e) => (failed(), first_line(&e)),
    };
    vec![Row {
        op: "read_later".into(),
        dtype: "f32",
        shape: format!("[{LEN}]"),
        errors,
        note,
    }]
}

/// What the read gave, what the buffer holds, and the read's and the queue's milliseconds.
fn read_later(ordinal: usize) -> Result<(TensorData, TensorData, f64, f64), String> {
    let err = |e: ferrotron_cuda::CudaError| e.to_string();
    let engine = CudaDevice::get(ordinal).map_err(err)?;
    let mut rng = StdRng::seed_from_u64(13);
    let values: Vec<f32> = (0..LEN).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
    let x = CudaTensor::from_bytes(&engine, &bytes, &[LEN], DType::F32).map_err(err)?;
    engine.synchronize().map_err(err)?;
    let read = Cuda::read_later(x);
    let started = Instant::now();
    let queued = crate::uploads::busy_queue(&engine)?;
    let copy = read();
    let read_ms = started.elapsed().as_secs_f64() * 1e3;
    drop(queued);
    engine.synchronize().map_err(err)?;
    let queue_ms = started.elapsed().as_secs_f64() * 1e3;
    Ok((copy(), TensorData::new(values, [LEN]), read_ms, queue_ms))
}

/// The rate a snapshot's reads come off the device (GB/s): a 1 GiB buffer read twice, the
/// first read allocating its page-locked buffer, the second reusing it (every save after the
/// first), and the host copy out of it.
pub(crate) fn timings(device: &GpuDevice) -> String {
    let mut out = String::from(
        "| read_later, 1 GiB f32 | off the device GB/s | host copy GB/s |\n|---|---:|---:|\n",
    );
    let rates = guarded(|| {
        let err = |e: ferrotron_cuda::CudaError| e.to_string();
        let engine = CudaDevice::get(device.ordinal).map_err(err)?;
        let len = 1usize << 28;
        let bytes = vec![0u8; 4 * len];
        let x = CudaTensor::from_bytes(&engine, &bytes, &[len], DType::F32).map_err(err)?;
        engine.synchronize().map_err(err)?;
        let mut lines = String::new();
        for which in ["first read", "second read"] {
            let read = Cuda::read_later(x.clone());
            let started = Instant::now();
            let copy = read();
            let off = started.elapsed().as_secs_f64();
            let started = Instant::now();
            let data = copy();
            let host = started.elapsed().as_secs_f64();
            let gb = data.as_bytes().len() as f64 / 1e9;
            lines.push_str(&format!(
                "| {which} | {:.1} | {:.1} |\n",
                gb / off,
                gb / host
            ));
        }
        Ok(lines)
    });
    out.push_str(&rates.unwrap_or_else(|e| format!("| failed: {} | | |\n", first_line(&e))));
    out
}
