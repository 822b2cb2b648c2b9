//! A row for uploads through the page-locked staging buffers (`staging.rs`): 120 uploads of 70
//! KiB to 4 MiB, queued behind ~50 ms of matmuls, so staging buffers are allocated, reused once
//! their copy completed, and at the 256 MiB limit waited for while their copies are still
//! queued; then every tensor is read back and compared with its source byte for byte. A buffer
//! overwritten before its copy ran would show as another upload's bytes.

use std::sync::Arc;

use burn::tensor::TensorData;
use ferrotron_cuda::{CudaDevice, CudaTensor, DType, GpuDevice, matmul};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{Row, compare, failed, first_line, guarded};

/// Bytes of each upload in one round (the sizes straddle the staging buffers' 1, 2 and 4 MiB).
const SIZES: [usize; 5] = [70 << 10, 300 << 10, (1 << 20) + 8, 3 << 20, 4 << 20];
const ROUNDS: usize = 24;

pub(crate) fn rows(device: &GpuDevice) -> Vec<Row> {
    let (errors, note) = match guarded(|| uploads(device.ordinal)) {
        Ok((got, want)) => (
            compare::compare(&got, &want, 1.0),
            format!(
                "{} uploads behind queued matmuls, read back, exact",
                SIZES.len() * ROUNDS
            ),
        ),
        Err(e) => (failed(), first_line(&e)),
    };
    vec![Row {
        op: "upload(staged)".into(),
        dtype: "u8",
        shape: format!("{ROUNDS} × {SIZES:?} B"),
        errors,
        note,
    }]
}

/// A queue of kernels for copies to wait behind: 40 chained 8192² bf16 matmuls (~1.5 ms each,
/// ~50 ms in all); the result, to drop once the copies are queued.
pub(crate) fn busy_queue(engine: &Arc<CudaDevice>) -> Result<CudaTensor, String> {
    let err = |e: ferrotron_cuda::CudaError| e.to_string();
    let n = 8192;
    let square =
        CudaTensor::from_bytes(engine, &vec![0u8; n * n * 2], &[n, n], DType::BF16).map_err(err)?;
    let mut queued = square.clone();
    for _ in 0..40 {
        queued = matmul(&queued, &square).map_err(err)?;
    }
    Ok(queued)
}

/// Every upload's bytes as read back, and as sent.
fn uploads(ordinal: usize) -> Result<(TensorData, TensorData), String> {
    let err = |e: ferrotron_cuda::CudaError| e.to_string();
    let engine = CudaDevice::get(ordinal).map_err(err)?;
    let queued = busy_queue(&engine)?;
    let mut rng = StdRng::seed_from_u64(7);
    let mut sent = Vec::new();
    let mut tensors = Vec::new();
    for _ in 0..ROUNDS {
        for &len in &SIZES {
            let bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            tensors.push(CudaTensor::from_bytes(&engine, &bytes, &[len], DType::U8).map_err(err)?);
            sent.extend(bytes);
        }
    }
    drop(queued);
    let mut read = Vec::with_capacity(sent.len());
    for tensor in &tensors {
        read.extend(tensor.to_bytes().map_err(err)?);
    }
    let len = sent.len();
    Ok((TensorData::new(read, [len]), TensorData::new(sent, [len])))
}
