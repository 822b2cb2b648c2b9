//! A few speed numbers through the burn backend traits, printed after the op table: where the
//! backend stands against the chip's ceilings (about 790 TFLOP/s bf16 dense, about 4.8 TB/s) and
//! against stock burn-cuda 0.21 (94 TFLOP/s at bf16 8192³, design.md). Not a benchmark suite:
//! each number is the median of a few synchronised repetitions after a warm-up.

use std::time::Instant;

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Distribution, FloatDType, Shape};

/// One measured line.
pub(crate) struct Timing {
    pub what: String,
    pub median_ms: f64,
    /// The rate the op reached, with its unit.
    pub rate: String,
}

fn median_ms<B: Backend>(device: &B::Device, reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let _ = B::sync(device);
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            let start = Instant::now();
            f();
            let _ = B::sync(device);
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn random<B: Backend>(shape: [usize; 2], dtype: FloatDType, device: &B::Device) -> FloatTensor<B> {
    B::float_random(
        Shape::new(shape),
        Distribution::Uniform(-1.0, 1.0),
        device,
        dtype,
    )
}

/// Square matmuls, a large element-wise add and a row softmax; every size is divided by
/// `shrink` (1 on the GPU; the GPU-free test runs the same code small on the CPU).
pub(crate) fn timings<B: Backend>(device: &B::Device, shrink: usize) -> Vec<Timing> {
    let mut out = Vec::new();
    for (n, dtype, name) in [
        (8192 / shrink, FloatDType::BF16, "bf16"),
        (4096 / shrink, FloatDType::BF16, "bf16"),
        (4096 / shrink, FloatDType::F32, "f32"),
    ] {
        let a = random::<B>([n, n], dtype, device);
        let b = random::<B>([n, n], dtype, device);
        let ms = median_ms::<B>(device, 10, || {
            let _ = B::float_matmul(a.clone(), b.clone());
        });
        let tflops = 2.0 * (n as f64).powi(3) / (ms * 1e-3) / 1e12;
        out.push(Timing {
            what: format!("matmul {name} {n}³"),
            median_ms: ms,
            rate: format!("{tflops:.0} TFLOP/s"),
        });
    }
    let (rows, cols) = (16384 / shrink, 16384 / shrink);
    let x = random::<B>([rows, cols], FloatDType::BF16, device);
    let y = random::<B>([rows, cols], FloatDType::BF16, device);
    let ms = median_ms::<B>(device, 10, || {
        let _ = B::float_add(x.clone(), y.clone());
    });
    let bytes = 3.0 * (rows * cols * 2) as f64;
    out.push(Timing {
        what: format!("add bf16 {rows}x{cols}"),
        median_ms: ms,
        rate: format!("{:.0} GB/s", bytes / (ms * 1e-3) / 1e9),
    });
    let (rows, cols) = (8192 / shrink, 32768 / shrink);
    let logits = random::<B>([rows, cols], FloatDType::BF16, device);
    let ms = median_ms::<B>(device, 10, || {
        let _ = B::softmax(logits.clone(), 1);
    });
    let bytes = 2.0 * (rows * cols * 2) as f64;
    out.push(Timing {
        what: format!("softmax bf16 {rows}x{cols} (burn's composition)"),
        median_ms: ms,
        rate: format!("{:.0} GB/s effective", bytes / (ms * 1e-3) / 1e9),
    });
    out
}

pub(crate) fn render(timings: &[Timing]) -> String {
    let mut out = String::from("| timing | median ms | rate |\n|---|---|---|\n");
    for t in timings {
        out.push_str(&format!(
            "| {} | {:.3} | {} |\n",
            t.what, t.median_ms, t.rate
        ));
    }
    out
}
