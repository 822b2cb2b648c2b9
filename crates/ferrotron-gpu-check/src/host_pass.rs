//! A row for `FusedOps::host_pass` (`host_pass.rs` of the CUDA backend, the optimizer offload's
//! update): three buffers of other dtypes and lengths, one longer than several 32 MiB pieces
//! and one empty, streamed through the host behind ~50 ms of queued matmuls, each output element
//! a function of its input element and buffer; the outputs are read back on the compute stream
//! at once (so they must be there once the pass returns) and compared with the same function on
//! the host, bit for bit. The note gives the pass's rate on the long buffer, the link's two
//! directions and the host's work together.

use std::time::Instant;

use burn::tensor::{DType as BurnDType, TensorData, bf16, f16};
use ferrotron_cuda::{Cuda, CudaDevice, CudaTensor, DType, GpuDevice};
use ferrotron_ops::{FusedOps, HostPiece, HostValues, HostValuesMut};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{Row, compare, failed, first_line, guarded};

/// (elements, stored as, output as): 40M + 3 f32 elements are five 32 MiB pieces and a tail.
const BUFFERS: [(usize, DType, BurnDType); 3] = [
    ((40 << 20) + 3, DType::F32, BurnDType::BF16),
    (0, DType::BF16, BurnDType::F32),
    ((3 << 20) + 1, DType::BF16, BurnDType::F16),
];

pub(crate) fn rows(device: &GpuDevice) -> Vec<Row> {
    let (errors, note) = match guarded(|| host_pass(device.ordinal)) {
        Ok((got, want, seconds)) => {
            let bytes = (BUFFERS[0].0 * (4 + 2)) as f64;
            let errors = compare::compare(&got, &want, 1.0);
            let exact = got.as_bytes() == want.as_bytes();
            (
                errors,
                format!(
                    "behind queued matmuls, read back at once, {}; {:.1} GB/s over the {} MiB f32 → bf16 buffer",
                    if exact {
                        "bit for bit"
                    } else {
                        "NOT bit for bit"
                    },
                    bytes / seconds / 1e9,
                    (BUFFERS[0].0 * 4) >> 20
                ),
            )
        }
        Err(e) => (failed(), first_line(&e)),
    };
    vec![Row {
        op: "host_pass".into(),
        dtype: "f32/bf16",
        shape: format!("{:?}", BUFFERS.map(|(len, _, _)| len)),
        errors,
        note,
    }]
}

/// The pass: `y = 2x + index of the buffer`, in f32, narrowed to the output's dtype.
fn pass(piece: HostPiece<'_>) {
    let shift = piece.input as f32;
    let values: Vec<f32> = match piece.values {
        HostValues::F32(x) => x.to_vec(),
        HostValues::Bf16(x) => x.iter().map(|x| x.to_f32()).collect(),
        HostValues::F16(x) => x.iter().map(|x| x.to_f32()).collect(),
    };
    let y = values.iter().map(|&x| 2.0 * x + shift);
    match piece.out {
        HostValuesMut::F32(out) => out.iter_mut().zip(y).for_each(|(o, y)| *o = y),
        HostValuesMut::Bf16(out) => out
            .iter_mut()
            .zip(y)
            .for_each(|(o, y)| *o = bf16::from_f32(y)),
        HostValuesMut::F16(out) => out
            .iter_mut()
            .zip(y)
            .for_each(|(o, y)| *o = f16::from_f32(y)),
    }
}

/// Every output read back as f32 and concatenated, the host's answer, and the seconds of the
/// timed pass over the first buffer alone.
fn host_pass(ordinal: usize) -> Result<(TensorData, TensorData, f64), String> {
    let err = |e: ferrotron_cuda::CudaError| e.to_string();
    let engine = CudaDevice::get(ordinal).map_err(err)?;
    let mut rng = StdRng::seed_from_u64(11);
    let inputs: Vec<(Vec<f32>, DType, BurnDType)> = BUFFERS
        .iter()
        .map(|&(len, dtype, out)| {
            let values = (0..len).map(|_| rng.random_range(-4.0f32..4.0)).collect();
            (values, dtype, out)
        })
        .collect();
    let upload = |values: &[f32], dtype: DType| -> Result<CudaTensor, String> {
        let bytes: Vec<u8> = match dtype {
            DType::F32 => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
            _ => values
                .iter()
                .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
                .collect(),
        };
        CudaTensor::from_bytes(&engine, &bytes, &[values.len()], dtype).map_err(err)
    };
    // What the pass sees: the stored values, so bf16 inputs are rounded first.
    let want: Vec<f32> = inputs
        .iter()
        .enumerate()
        .flat_map(|(index, (values, dtype, out))| {
            values.iter().map(move |&x| {
                let x = if *dtype == DType::F32 {
                    x
                } else {
                    bf16::from_f32(x).to_f32()
                };
                let y = 2.0 * x + index as f32;
                match out {
                    BurnDType::BF16 => bf16::from_f32(y).to_f32(),
                    BurnDType::F16 => f16::from_f32(y).to_f32(),
                    _ => y,
                }
            })
        })
        .collect();
    // the first copies down wait behind queued kernels
    let queued = crate::uploads::busy_queue(&engine)?;
    let tensors = inputs
        .iter()
        .map(|(values, dtype, out)| Ok((upload(values, *dtype)?, *out)))
        .collect::<Result<Vec<_>, String>>()?;
    drop(queued);
    let outputs = Cuda::host_pass(tensors, &mut pass);
    let mut got = Vec::with_capacity(want.len());
    for output in &outputs {
        let f32s = output.cast(DType::F32).map_err(err)?;
        let bytes = f32s.to_bytes().map_err(err)?;
        got.extend(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
    }
    let first = vec![(upload(&inputs[0].0, inputs[0].1)?, inputs[0].2)];
    engine.synchronize().map_err(err)?;
    let started = Instant::now();
    let timed = Cuda::host_pass(first, &mut pass);
    engine.synchronize().map_err(err)?;
    let seconds = started.elapsed().as_secs_f64();
    drop(timed);
    let len = want.len();
    Ok((
        TensorData::new(got, [len]),
        TensorData::new(want, [len]),
        seconds,
    ))
}
