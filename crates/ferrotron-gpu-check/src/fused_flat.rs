//! Rows for the flat optimizer buffers: gathering gradients into one flat f32 buffer (many
//! pieces per launch, across the launch's piece limit, a missing piece, a second dtype, summed
//! into an earlier buffer in place and into one that is shared) and `Σ x²` over the buffers (f32
//! and bf16, whose 3 M-element run takes the 16-byte-load kernel), each against the composed
//! version on the same GPU; and `Σ x²` of a 100 M-element buffer against the f64 sum on the
//! host (the norm decides clipping). Allocations are poisoned, so an element
//! the gather never wrote shows up as a NaN.

use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use ferrotron_cuda::{Cuda, GpuDevice};
use ferrotron_ops::{
    FlatPiece, FlatSegment, FusedOps, composed_gather_flat, composed_segment_sum_of_squares,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::compare;
use crate::fused::{dtype_label, host, round};
use crate::{Row, failed, first_line, guarded};

/// Piece lengths: more pieces than one launch takes (64), a 1 M one that takes many blocks,
/// and odd sizes.
fn lengths() -> Vec<usize> {
    let mut lens: Vec<usize> = (0..70).map(|i| 1 + i * 37).collect();
    lens[3] = 1_000_003;
    lens
}

fn tensor(p: FloatTensor<Cuda>) -> Tensor<Cuda, 1> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

fn upload(data: &TensorData, dtype: DType, device: &GpuDevice) -> FloatTensor<Cuda> {
    Tensor::<Cuda, 1>::from_data(data.clone(), (device, dtype))
        .into_primitive()
        .tensor()
}

/// The pieces of one microbatch: piece 5 missing, piece 7 in f32 (a second run of launches).
fn pieces(data: &[TensorData], dtype: DType, device: &GpuDevice) -> Vec<FlatPiece<Cuda>> {
    data.iter()
        .enumerate()
        .map(|(i, d)| FlatPiece {
            len: d.num_elements(),
            grad: (i != 5).then(|| upload(d, if i == 7 { DType::F32 } else { dtype }, device)),
        })
        .collect()
}

/// Two microbatches gathered, the second into the first (`shared`: while another handle holds
/// the first, so the sum goes to a new buffer), kernel (`FUSED`) or composed; the first
/// buffer and the sum, concatenated.
fn gather<const FUSED: bool>(
    data: &[Vec<TensorData>; 2],
    dtype: DType,
    shared: bool,
    device: &GpuDevice,
) -> TensorData {
    let run = |pieces, into| {
        if FUSED {
            Cuda::gather_flat(pieces, into, DType::F32)
        } else {
            composed_gather_flat::<Cuda>(pieces, into, DType::F32)
        }
    };
    let first = run(pieces(&data[0], dtype, device), None);
    let kept = tensor(first.clone()).into_data();
    let held = shared.then(|| first.clone());
    let sum = run(pieces(&data[1], dtype, device), Some(first));
    drop(held);
    Tensor::<Cuda, 1>::cat(
        vec![Tensor::from_data(kept, (device, DType::F32)), tensor(sum)],
        0,
    )
    .into_data()
}

fn gather_row(device: &GpuDevice, rng: &mut StdRng, dtype: DType, shared: bool) -> Row {
    let lens = lengths();
    let data = [0, 1].map(|_| {
        lens.iter()
            .map(|&n| host(&[n], rng, dtype))
            .collect::<Vec<_>>()
    });
    let got = guarded(|| Ok(gather::<true>(&data, dtype, shared, device)));
    let want = guarded(|| Ok(gather::<false>(&data, dtype, shared, device)));
    let (errors, note) = match (got, want) {
        (Ok(g), Ok(w)) => (
            compare::compare(&g, &w, 1.0),
            format!(
                "70 pieces (one missing, one f32), then summed into the first {}",
                if shared {
                    "(held elsewhere: new buffer)"
                } else {
                    "in place"
                }
            ),
        ),
        (Err(e), _) => (failed(), format!("kernel: {}", first_line(&e))),
        (_, Err(e)) => (failed(), format!("composed: {}", first_line(&e))),
    };
    Row {
        op: "gather_flat".into(),
        dtype: dtype_label(dtype),
        shape: format!("[{}]", lens.iter().sum::<usize>()),
        errors,
        note,
    }
}

/// One microbatch's pieces gathered in their own `dtype` (no widening: nothing to sum), kernel
/// against composed; the f32 piece is rounded to `dtype` on the way in by both.
fn narrow_row(device: &GpuDevice, rng: &mut StdRng, dtype: DType) -> Row {
    let lens = lengths();
    let data: Vec<TensorData> = lens.iter().map(|&n| host(&[n], rng, dtype)).collect();
    let run = |fused: bool| {
        let pieces = pieces(&data, dtype, device);
        let flat = if fused {
            Cuda::gather_flat(pieces, None, dtype)
        } else {
            composed_gather_flat::<Cuda>(pieces, None, dtype)
        };
        Ok(tensor(flat).into_data())
    };
    let (errors, note) = match (guarded(|| run(true)), guarded(|| run(false))) {
        (Ok(g), Ok(w)) => (
            compare::compare(&g, &w, 1.0),
            "70 pieces (one missing, one f32) into a buffer of the gradients' dtype".to_string(),
        ),
        (Err(e), _) => (failed(), format!("kernel: {}", first_line(&e))),
        (_, Err(e)) => (failed(), format!("composed: {}", first_line(&e))),
    };
    Row {
        op: "gather_flat(one microbatch)".into(),
        dtype: dtype_label(dtype),
        shape: format!("[{}]", lens.iter().sum::<usize>()),
        errors,
        note,
    }
}

/// Σx² over `segments` of two random buffers: every element (`segments` covering both), or
/// with stretches left out (a tensor-parallel rank skipping the parameters its group shares).
fn norm_row(
    device: &GpuDevice,
    rng: &mut StdRng,
    dtype: DType,
    segments: &[FlatSegment],
    what: &str,
) -> Row {
    let lens = [3_000_017usize, 4097];
    let data: Vec<TensorData> = lens.iter().map(|&n| host(&[n], rng, dtype)).collect();
    let run = |fused: bool| {
        let buffers: Vec<_> = data.iter().map(|d| upload(d, dtype, device)).collect();
        let total = if fused {
            Cuda::segment_sum_of_squares(&buffers, segments)
        } else {
            composed_segment_sum_of_squares::<Cuda>(&buffers, segments)
        };
        let total = total.ok_or_else(|| "no segments".to_string())?;
        Ok(tensor(total).into_data())
    };
    let (errors, note) = match (guarded(|| run(true)), guarded(|| run(false))) {
        // A sum of 3 M squares in f32, summed in two orders.
        (Ok(g), Ok(w)) => (
            compare::compare(&g, &w, 10.0),
            format!("{what}: runs of segments vs per segment in order"),
        ),
        (Err(e), _) => (failed(), format!("kernel: {}", first_line(&e))),
        (_, Err(e)) => (failed(), format!("composed: {}", first_line(&e))),
    };
    Row {
        op: "segment_sum_of_squares".into(),
        dtype: dtype_label(dtype),
        shape: format!("{lens:?}"),
        errors,
        note,
    }
}

/// `Σ x²` over two runs of a 100 M-element buffer (the second starting 3 elements past a
/// 16-byte boundary and ending between two) of rows of 2,048 values, one row in twenty a thousand
/// times larger than the rest (an embedding's frequent and rare tokens), against the f64 sum
/// of the same values on the host, within 2e-7. Accumulated in f32 per thread, the kernel's
/// order simulated on the CPU came out 6e-7 low on such a buffer, which a bound of 1e-6 would
/// pass (1e-5 on gpt-1.3b's 650 M); with f64 partials, 6e-9.
fn norm_accuracy_row(device: &GpuDevice, rng: &mut StdRng, dtype: DType) -> Row {
    const LEN: usize = 100_000_007;
    let segments = [(0, 0, 40_000_000), (0, 40_000_003, LEN - 40_000_003)];
    let mut scale = 0.0f32;
    let values: Vec<f32> = (0..LEN)
        .map(|i| {
            if i % 2048 == 0 {
                scale = if rng.random_range(0..20) == 0 {
                    1e-2
                } else {
                    1e-5
                };
            }
            rng.random_range(-1.0f32..1.0) * scale
        })
        .collect();
    let data = round(TensorData::new(values, [LEN]), dtype);
    let rounded: Vec<f64> = data.iter::<f64>().collect();
    let truth: f64 = segments
        .iter()
        .map(|&(_, offset, len)| {
            rounded[offset..offset + len]
                .iter()
                .map(|x| x * x)
                .sum::<f64>()
        })
        .sum();
    let got = guarded(|| {
        let buffer = upload(&data, dtype, device);
        let total = Cuda::segment_sum_of_squares(&[buffer], &segments)
            .ok_or_else(|| "no segments".to_string())?;
        Ok(tensor(total).into_data())
    });
    let (errors, note) = match got {
        // f32's tolerance (relative 1e-4) scaled to 2e-7.
        Ok(got) => (
            compare::compare(&got, &TensorData::new(vec![truth as f32], [1]), 2e-3),
            "against the f64 sum on the host, relative error at most 2e-7".to_string(),
        ),
        Err(e) => (failed(), format!("kernel: {}", first_line(&e))),
    };
    Row {
        op: "segment_sum_of_squares(accuracy)".into(),
        dtype: dtype_label(dtype),
        shape: format!("[{LEN}]"),
        errors,
        note,
    }
}

/// Every flat-buffer row.
pub(crate) fn rows(device: &GpuDevice) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(23);
    let mut rows = Vec::new();
    for dtype in [DType::BF16, DType::F32] {
        for shared in [false, true] {
            rows.push(gather_row(device, &mut rng, dtype, shared));
        }
    }
    rows.push(narrow_row(device, &mut rng, DType::BF16));
    let whole = [(1, 0, 4000), (0, 0, 3_000_017), (1, 4000, 97)];
    for dtype in [DType::F32, DType::BF16] {
        rows.push(norm_row(device, &mut rng, dtype, &whole, "every element"));
    }
    let some = [
        (1, 0, 1000),
        (0, 0, 2_000_000),
        (1, 4000, 97),
        (0, 2_500_000, 500_017),
    ];
    rows.push(norm_row(
        device,
        &mut rng,
        DType::F32,
        &some,
        "stretches left out",
    ));
    for dtype in [DType::BF16, DType::F32] {
        rows.push(norm_accuracy_row(device, &mut rng, dtype));
    }
    rows
}
