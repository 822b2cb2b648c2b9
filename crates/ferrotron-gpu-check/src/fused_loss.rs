//! Rows for the cross-entropy kernels against the composed loss on the same GPU.
//!
//! The fused node (bf16 or f32 logits) and burn's composition in f32 (the model's loss without
//! a kernel: max, exp, sum, log, gather) from the same rounded logits: the per-row losses and
//! the logits' gradient for a weighted sum of the losses. And the linear cross-entropy fusion
//! (the output layer and the loss over chunks of rows, an uneven last chunk included) against
//! the output layer's GEMM then the fused loss: losses, d rows and d weight.

use burn::tensor::{DType, Int, Tensor, TensorData, TensorPrimitive};
use ferrotron_cuda::{Cuda, GpuDevice};
use ferrotron_ops::reference::cross_entropy_forward_reference;
use ferrotron_ops::{FusedOps, LinearLossSpec, OutputWeight, cross_entropy, linear_cross_entropy};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::compare;
use crate::fused::{A, dtype_label, host, median_ms, round, upload};
use crate::{Row, failed, first_line, guarded};

/// Losses and d logits of `Σ w_r · loss_r`, fused node (`FUSED`) or composed.
fn loss_grads<const FUSED: bool>(
    logits: &TensorData,
    labels: &[i64],
    weights: &TensorData,
    dtype: DType,
    device: &GpuDevice,
) -> TensorData {
    let x: Tensor<A, 2> = upload(logits, dtype, device);
    let rows = labels.len();
    let labels = Tensor::<A, 1, Int>::from_data(TensorData::new(labels.to_vec(), [rows]), device);
    let w = Tensor::<A, 1>::from_data(round(weights.clone(), DType::F32), (device, DType::F32));
    let losses = if FUSED {
        cross_entropy(x.clone(), labels).expect("the CUDA backend has a cross-entropy kernel")
    } else {
        let saved = cross_entropy_forward_reference::<A>(
            x.clone().into_primitive().tensor(),
            labels.into_primitive(),
        );
        Tensor::from_primitive(TensorPrimitive::Float(saved.losses))
    };
    let grads = (losses.clone() * w).sum().backward();
    let dx = x
        .grad(&grads)
        .expect("d logits")
        .cast(DType::F32)
        .reshape([-1]);
    Tensor::cat(vec![losses.inner().cast(DType::F32), dx], 0).into_data()
}

fn inputs(rng: &mut StdRng, rows: usize, vocab: usize) -> (TensorData, Vec<i64>, TensorData) {
    // Logits spread like a trained model's (a few large ones per row), labels anywhere.
    let logits = host(&[rows, vocab], rng, DType::F32)
        .to_vec::<f32>()
        .expect("f32")
        .into_iter()
        .map(|v| v * 4.0)
        .collect::<Vec<_>>();
    let labels = (0..rows)
        .map(|_| rng.random_range(0..vocab as i64))
        .collect();
    (
        TensorData::new(logits, vec![rows, vocab]),
        labels,
        host(&[rows], rng, DType::F32),
    )
}

fn loss_row(device: &GpuDevice, rng: &mut StdRng, [rows, vocab]: [usize; 2], dtype: DType) -> Row {
    let (logits, labels, weights) = inputs(rng, rows, vocab);
    let logits = round(logits, dtype);
    let kernel = guarded(|| {
        Ok(Cuda::has_cross_entropy_kernel(
            &Tensor::<Cuda, 2>::zeros([rows, vocab], (device, dtype))
                .into_primitive()
                .tensor(),
        ))
    })
    .unwrap_or(false);
    let got = guarded(|| {
        Ok(loss_grads::<true>(
            &logits, &labels, &weights, dtype, device,
        ))
    });
    let want = guarded(|| {
        Ok(loss_grads::<false>(
            &logits,
            &labels,
            &weights,
            DType::F32,
            device,
        ))
    });
    let (errors, note) = match (got, want) {
        (Ok(g), Ok(w)) => (
            compare::compare(&round(g, dtype), &round(w, dtype), 8.0),
            format!(
                "{} vs composed f32; losses + d logits",
                if kernel { "fused kernel" } else { "composed" }
            ),
        ),
        (Err(e), _) => (failed(), format!("fused: {}", first_line(&e))),
        (_, Err(e)) => (failed(), format!("composed: {}", first_line(&e))),
    };
    Row {
        op: "fused_cross_entropy".into(),
        dtype: dtype_label(dtype),
        shape: format!("logits [{rows}, {vocab}]"),
        errors,
        note,
    }
}

/// Losses, d rows and d weight of `Σ w_r · loss_r` for the output layer `weight` on `rows`:
/// chunked (`chunk_rows`) or the whole logits then the fused loss.
fn linear_loss_grads(
    (rows, weight, weights): (&TensorData, &TensorData, &TensorData),
    labels: &[i64],
    layout: OutputWeight,
    chunk_rows: Option<usize>,
    device: &GpuDevice,
) -> TensorData {
    let x: Tensor<A, 2> = upload(rows, DType::BF16, device).require_grad();
    let w: Tensor<A, 2> = upload(weight, DType::BF16, device).require_grad();
    let n = labels.len();
    let labels = Tensor::<A, 1, Int>::from_data(TensorData::new(labels.to_vec(), [n]), device);
    let row_weights =
        Tensor::<A, 1>::from_data(round(weights.clone(), DType::F32), (device, DType::F32));
    let losses = match chunk_rows {
        Some(chunk_rows) => linear_cross_entropy(
            x.clone(),
            w.clone(),
            labels,
            LinearLossSpec {
                weight: layout,
                chunk_rows,
            },
        ),
        None => {
            let logits = match layout {
                OutputWeight::Untied => x.clone().matmul(w.clone()),
                OutputWeight::Tied => x.clone().matmul(w.clone().transpose()),
            };
            cross_entropy(logits, labels).expect("the CUDA backend has a cross-entropy kernel")
        }
    };
    let grads = (losses.clone() * row_weights).sum().backward();
    let flat = |t: Tensor<Cuda, 2>| t.cast(DType::F32).reshape([-1]);
    let dx = flat(x.grad(&grads).expect("d rows"));
    let dw = flat(w.grad(&grads).expect("d weight"));
    Tensor::cat(vec![losses.inner().cast(DType::F32), dx, dw], 0).into_data()
}

fn linear_loss_row(
    device: &GpuDevice,
    rng: &mut StdRng,
    [rows, hidden, vocab]: [usize; 3],
    layout: OutputWeight,
    chunk_rows: usize,
) -> Row {
    let x = host(&[rows, hidden], rng, DType::BF16);
    let shape = match layout {
        OutputWeight::Untied => [hidden, vocab],
        OutputWeight::Tied => [vocab, hidden],
    };
    let w = host(&shape, rng, DType::BF16);
    let weights = host(&[rows], rng, DType::F32);
    let labels: Vec<i64> = (0..rows)
        .map(|_| rng.random_range(0..vocab as i64))
        .collect();
    let operands = (&x, &w, &weights);
    let got = guarded(|| {
        Ok(linear_loss_grads(
            operands,
            &labels,
            layout,
            Some(chunk_rows),
            device,
        ))
    });
    let want = guarded(|| Ok(linear_loss_grads(operands, &labels, layout, None, device)));
    let (errors, note) = match (got, want) {
        (Ok(g), Ok(w)) => (
            compare::compare(&round(g, DType::BF16), &round(w, DType::BF16), 8.0),
            format!(
                "{layout:?}, {chunk_rows} rows a chunk vs whole logits + fused loss; losses, d rows, d weight"
            ),
        ),
        (Err(e), _) => (failed(), format!("chunked: {}", first_line(&e))),
        (_, Err(e)) => (failed(), format!("whole: {}", first_line(&e))),
    };
    Row {
        op: "linear_cross_entropy".into(),
        dtype: dtype_label(DType::BF16),
        shape: format!("rows [{rows}, {hidden}], vocab {vocab}"),
        errors,
        note,
    }
}

/// Every cross-entropy row.
pub(crate) fn rows(device: &GpuDevice) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(23);
    let mut rows = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        // Rows of whole chunks of eight (the vectorised kernels), then a row that is not.
        rows.push(loss_row(device, &mut rng, [64, 50304], dtype));
        rows.push(loss_row(device, &mut rng, [37, 1000], dtype));
        rows.push(loss_row(device, &mut rng, [37, 1003], dtype));
    }
    for layout in [OutputWeight::Untied, OutputWeight::Tied] {
        rows.push(linear_loss_row(
            device,
            &mut rng,
            [37, 256, 1003],
            layout,
            16,
        ));
        rows.push(linear_loss_row(
            device,
            &mut rng,
            [64, 512, 50304],
            layout,
            24,
        ));
    }
    rows
}

/// Forward + backward time of the fused loss against the composed one over bf16 logits.
pub(crate) fn timings(device: &GpuDevice) -> String {
    let mut out = String::from(
        "| op | shape | kernel fwd+bwd ms | composed fwd+bwd ms | kernel GB/s |\n|---|---|---:|---:|---:|\n",
    );
    let line = guarded(|| {
        let [rows, vocab] = [16384usize, 50304];
        let logits = Tensor::<A, 2>::random(
            [rows, vocab],
            burn::tensor::Distribution::Normal(0.0, 2.0),
            device,
        )
        .cast(DType::BF16);
        let labels = Tensor::<A, 1, Int>::from_data(
            TensorData::new(
                (0..rows as i64).map(|r| r * 7 % vocab as i64).collect(),
                [rows],
            ),
            device,
        );
        let run = |fused: bool| {
            let x = logits.clone().detach().require_grad();
            let losses = if fused {
                cross_entropy(x.clone(), labels.clone()).expect("kernel")
            } else {
                let saved = cross_entropy_forward_reference::<A>(
                    x.clone().into_primitive().tensor(),
                    labels.clone().into_primitive(),
                );
                Tensor::from_primitive(TensorPrimitive::Float(saved.losses))
            };
            let _ = losses.mean().backward();
        };
        let kernel = median_ms(device, 10, || run(true));
        let composed = median_ms(device, 3, || run(false));
        // Forward reads the logits; backward reads them and writes their gradient.
        let bytes = (3 * rows * vocab * 2) as f64;
        Ok(format!(
            "| cross entropy bf16 | [{rows}, {vocab}] | {kernel:.3} | {composed:.3} | {:.0} |\n",
            bytes / (kernel * 1e-3) / 1e9
        ))
    });
    out.push_str(
        &line.unwrap_or_else(|e| format!("| cross entropy | failed: {} |\n", first_line(&e))),
    );
    out
}
