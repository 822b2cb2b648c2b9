//! Rows for the norm and AdamW kernels, each against its composed version on the same GPU.
//!
//! Norms (LayerNorm with bias, RMSNorm) run as one autodiff node in f32 and bf16 against burn's
//! composition in f32 from the same rounded inputs: output and the gradients of x, γ, β for a
//! weighted-sum loss. AdamW runs the kernel and the composed update from the same fp32 state
//! (first step and a later one, with and without decay and clipping scale).

use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use ferrotron_cuda::{Cuda, GpuDevice};
use ferrotron_ops::{AdamWStep, FusedOps, NormKind, NormSpec, composed_adamw, composed_norm, norm};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::compare::{self, Errors};
use crate::fused::{A, dtype_label, host, median_ms, round, upload};
use crate::{Row, failed, first_line, guarded};

fn spec(kind: NormKind) -> NormSpec {
    NormSpec {
        kind,
        epsilon: 1e-5,
    }
}

/// Output and dx, dγ (, dβ) of `Σ w ∘ norm(x)`, plus `Σ w/2 ∘ x` with a `residual` (x read
/// again after the norm, as the residual add reads a layer's input: the node adds that
/// gradient in its kernel), fused node (`FUSED`) or composed.
fn norm_grads<const FUSED: bool>(
    data: &[TensorData; 4],
    dtype: DType,
    kind: NormKind,
    residual: bool,
    device: &GpuDevice,
) -> TensorData {
    let x: Tensor<A, 3> = upload(&data[0], dtype, device);
    let gamma: Tensor<A, 1> = upload(&data[1], dtype, device);
    let beta: Tensor<A, 1> = upload(&data[2], dtype, device);
    let w = Tensor::<A, 3>::from_data(round(data[3].clone(), DType::F32), (device, DType::F32));
    let with_beta = (kind == NormKind::Layer).then(|| beta.clone());
    let y = if FUSED {
        norm(x.clone(), gamma.clone(), with_beta, spec(kind))
    } else {
        composed_norm(x.clone(), gamma.clone(), with_beta, spec(kind))
    };
    let mut loss = (y.clone().cast(DType::F32) * w.clone()).sum();
    if residual {
        loss = loss + (x.clone().cast(DType::F32) * w.mul_scalar(0.5)).sum();
    }
    let grads = loss.backward();
    let flat = |t: Tensor<Cuda, 1>| t.cast(DType::F32);
    let mut parts = vec![
        y.inner().cast(DType::F32).reshape([-1]),
        x.grad(&grads).expect("dx").cast(DType::F32).reshape([-1]),
        flat(gamma.grad(&grads).expect("dgamma")),
    ];
    if kind == NormKind::Layer {
        parts.push(flat(beta.grad(&grads).expect("dbeta")));
    }
    Tensor::cat(parts, 0).into_data()
}

fn norm_row(
    device: &GpuDevice,
    rng: &mut StdRng,
    [b, s, h]: [usize; 3],
    dtype: DType,
    kind: NormKind,
    residual: bool,
) -> Row {
    let mut x = host(&[b, s, h], rng, DType::F32)
        .to_vec::<f32>()
        .expect("f32");
    // An offset and a scale per row, as activations have: the mean matters.
    for (i, v) in x.iter_mut().enumerate() {
        *v = *v * (1.0 + (i / h % 5) as f32) + (i / h % 3) as f32;
    }
    let data = [
        round(TensorData::new(x, vec![b, s, h]), dtype),
        host(&[h], rng, dtype),
        host(&[h], rng, dtype),
        host(&[b, s, h], rng, DType::F32),
    ];
    let probe = |shape: &[usize]| {
        Tensor::<Cuda, 1>::zeros([shape.iter().product::<usize>()], (device, dtype))
            .into_primitive()
            .tensor()
    };
    let kernel = guarded(|| {
        Ok(Cuda::has_norm_kernel(
            &probe(&[b * s, h]),
            &probe(&[h]),
            &spec(kind),
        ))
    })
    .unwrap_or(false);
    let got = guarded(|| Ok(norm_grads::<true>(&data, dtype, kind, residual, device)));
    let want = guarded(|| {
        Ok(norm_grads::<false>(
            &data,
            DType::F32,
            kind,
            residual,
            device,
        ))
    });
    let (errors, note) = match (got, want) {
        (Ok(g), Ok(w)) => (
            compare::compare(&round(g, dtype), &round(w, dtype), 8.0),
            format!(
                "{} vs composed f32; y + dx{}, dγ{}",
                if kernel { "fused kernel" } else { "composed" },
                if residual { " (+ a residual's)" } else { "" },
                if kind == NormKind::Layer { ", dβ" } else { "" }
            ),
        ),
        (Err(e), _) => (failed(), format!("fused: {}", first_line(&e))),
        (_, Err(e)) => (failed(), format!("composed: {}", first_line(&e))),
    };
    Row {
        op: format!(
            "fused_norm {}",
            if kind == NormKind::Layer {
                "layer"
            } else {
                "rms"
            }
        ),
        dtype: dtype_label(dtype),
        shape: format!("x [{b}, {s}, {h}]"),
        errors,
        note,
    }
}

fn primitive(t: Tensor<Cuda, 1>) -> burn::tensor::ops::FloatTensor<Cuda> {
    t.into_primitive().tensor()
}

fn tensor(p: burn::tensor::ops::FloatTensor<Cuda>) -> Tensor<Cuda, 1> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

fn adamw_step(first: bool, decay: bool, scale: f64, moments: [DType; 2]) -> AdamWStep {
    let t = if first { 1 } else { 7 };
    AdamWStep {
        lr: 3e-4,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        decay: decay.then_some(1.0 - 3e-4 * 0.1),
        bias_correction1: 1.0 - 0.9f64.powi(t),
        bias_correction2: 1.0 - 0.95f64.powi(t),
        grad_scale: scale,
        rounded: None,
        moment_dtypes: moments,
    }
}

/// The new value, and m and v concatenated in the dtype they are kept in, of one update, kernel
/// (`FUSED`) or composed.
fn adamw_result<const FUSED: bool>(
    data: &[TensorData; 4],
    grad_dtype: DType,
    step: AdamWStep,
    first: bool,
    device: &GpuDevice,
) -> [TensorData; 2] {
    let f32_tensor = |d: &TensorData| Tensor::<Cuda, 1>::from_data(d.clone(), (device, DType::F32));
    let value = primitive(f32_tensor(&data[0]));
    let grad = primitive(Tensor::<Cuda, 1>::from_data(
        round(data[1].clone(), grad_dtype),
        (device, grad_dtype),
    ));
    // v must be non-negative: it is a running mean of squares. Moments come in the dtype the
    // step keeps them in (bf16 under the precision-aware optimizer).
    let [m_dtype, v_dtype] = step.moment_dtypes;
    let moments = (!first).then(|| {
        (
            primitive(f32_tensor(&data[2]).cast(m_dtype)),
            primitive(f32_tensor(&data[3]).abs().cast(v_dtype)),
        )
    });
    // Later steps also take a device-resident clipping factor.
    let device_scale = (!first).then(|| primitive(f32_tensor(&TensorData::new(vec![0.8f32], [1]))));
    let out = if FUSED {
        Cuda::adamw_step(value, grad, moments, step, device_scale)
    } else {
        composed_adamw::<Cuda>(value, grad, moments, step, device_scale)
    };
    [
        tensor(out.value).into_data(),
        Tensor::cat(
            vec![tensor(out.exp_avg), tensor(out.exp_avg_sq).cast(m_dtype)],
            0,
        )
        .into_data(),
    ]
}

/// Two comparisons as one row's: the worse of each measure, every bad element.
fn both(a: Errors, b: Errors) -> Errors {
    Errors {
        max_abs: a.max_abs.max(b.max_abs),
        max_rel: a.max_rel.max(b.max_rel),
        bad: a.bad + b.bad,
        mismatch: a.mismatch.or(b.mismatch),
    }
}

fn adamw_row(
    device: &GpuDevice,
    rng: &mut StdRng,
    grad_dtype: DType,
    first: bool,
    moments: [DType; 2],
) -> Row {
    let n = 1_000_003;
    let data = [
        host(&[n], rng, DType::F32),
        host(&[n], rng, DType::F32),
        host(&[n], rng, DType::F32),
        host(&[n], rng, DType::F32),
    ];
    let step = adamw_step(first, !first, if first { 1.0 } else { 0.5 }, moments);
    let got = guarded(|| Ok(adamw_result::<true>(&data, grad_dtype, step, first, device)));
    let want = guarded(|| {
        Ok(adamw_result::<false>(
            &data, grad_dtype, step, first, device,
        ))
    });
    let (errors, note) = match (got, want) {
        // moments kept in bf16 are compared as bf16 (one rounding step apart where the two
        // f32 results straddle a bf16 boundary)
        (Ok([g_value, g_moments]), Ok([w_value, w_moments])) => (
            both(
                compare::compare(&g_value, &w_value, 4.0),
                compare::compare(&g_moments, &w_moments, 4.0),
            ),
            format!(
                "one kernel vs composed; value, m, v{}; {}",
                if moments == ferrotron_ops::F32_MOMENTS {
                    ""
                } else {
                    " (kept in bf16)"
                },
                if first {
                    "first step"
                } else {
                    "step 7, decay, scale 0.5, device scale 0.8"
                }
            ),
        ),
        (Err(e), _) => (failed(), format!("kernel: {}", first_line(&e))),
        (_, Err(e)) => (failed(), format!("composed: {}", first_line(&e))),
    };
    Row {
        op: "fused_adamw".into(),
        dtype: dtype_label(grad_dtype),
        shape: format!("[{n}]"),
        errors,
        note,
    }
}

/// Every norm and AdamW row.
pub(crate) fn rows(device: &GpuDevice) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(17);
    let mut rows = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        for kind in [NormKind::Layer, NormKind::Rms] {
            // Warp-per-row forward (whole lanes; a partly filled last lane), then the
            // block-per-row one (rows past 2,048 elements; not whole chunks of eight).
            rows.push(norm_row(
                device,
                &mut rng,
                [4, 96, 1024],
                dtype,
                kind,
                false,
            ));
            rows.push(norm_row(
                device,
                &mut rng,
                [2, 33, 1000],
                dtype,
                kind,
                false,
            ));
            rows.push(norm_row(
                device,
                &mut rng,
                [2, 17, 3000],
                dtype,
                kind,
                false,
            ));
            rows.push(norm_row(device, &mut rng, [2, 9, 1004], dtype, kind, false));
            // The residual's gradient added by the one-pass backward and the block kernel.
            rows.push(norm_row(device, &mut rng, [4, 96, 1024], dtype, kind, true));
            rows.push(norm_row(device, &mut rng, [2, 9, 1004], dtype, kind, true));
            // More rows than the one-pass backward has blocks: each block walks several rows
            // (the row sums' alternating slots, the partial γ/β sums over rows). f32 only: a
            // bf16 dγ summed over 4,096 rows differs from the f32 reference by the rounding of
            // every dy to bf16, which grows with √rows past the row's tolerance (on an H200:
            // 0.5, one bf16 step at the sums' size, where the 384-row shape passes).
            if dtype == DType::F32 {
                rows.push(norm_row(
                    device,
                    &mut rng,
                    [8, 512, 2048],
                    dtype,
                    kind,
                    true,
                ));
            }
        }
        for first in [true, false] {
            rows.push(adamw_row(
                device,
                &mut rng,
                dtype,
                first,
                ferrotron_ops::F32_MOMENTS,
            ));
            // Megatron's precision-aware optimizer: both moments stored in bf16
            rows.push(adamw_row(device, &mut rng, dtype, first, [DType::BF16; 2]));
        }
    }
    rows
}

/// Norm and AdamW speed against their composed versions.
pub(crate) fn timings(device: &GpuDevice) -> String {
    let mut out = String::from(
        "| op | shape | kernel ms | composed ms | kernel GB/s |\n|---|---|---:|---:|---:|\n",
    );
    let line = guarded(|| {
        let [rows, h] = [8192, 2048];
        let x = Tensor::<Cuda, 2>::random(
            [rows, h],
            burn::tensor::Distribution::Normal(0.0, 1.0),
            device,
        )
        .cast(DType::BF16);
        let gamma = Tensor::<Cuda, 1>::ones([h], (device, DType::BF16));
        let beta = Tensor::<Cuda, 1>::zeros([h], (device, DType::BF16));
        let spec = spec(NormKind::Layer);
        let kernel = median_ms(device, 20, || {
            let _ = norm(x.clone(), gamma.clone(), Some(beta.clone()), spec);
        });
        let composed = median_ms(device, 5, || {
            let _ = composed_norm(x.clone(), gamma.clone(), Some(beta.clone()), spec);
        });
        let bytes = (2 * rows * h * 2) as f64;
        Ok(format!(
            "| layer norm fwd bf16 | [{rows}, {h}] | {kernel:.3} | {composed:.3} | {:.0} |\n",
            bytes / (kernel * 1e-3) / 1e9
        ))
    });
    out.push_str(
        &line.unwrap_or_else(|e| format!("| layer norm | failed: {} |\n", first_line(&e))),
    );
    let line = guarded(|| {
        let n: usize = 50304 * 2048;
        let mk = || {
            Tensor::<Cuda, 1>::random([n], burn::tensor::Distribution::Uniform(0.0, 1.0), device)
        };
        let (value, grad, m, v) = (mk(), mk(), mk(), mk());
        let step = adamw_step(false, true, 0.5, ferrotron_ops::F32_MOMENTS);
        let run = |fused: bool| {
            let args = (
                primitive(value.clone()),
                primitive(grad.clone()),
                Some((primitive(m.clone()), primitive(v.clone()))),
            );
            if fused {
                let _ = Cuda::adamw_step(args.0, args.1, args.2, step, None);
            } else {
                let _ = composed_adamw::<Cuda>(args.0, args.1, args.2, step, None);
            }
        };
        let kernel = median_ms(device, 10, || run(true));
        let composed = median_ms(device, 3, || run(false));
        let bytes = (7 * 4 * n) as f64;
        Ok(format!(
            "| adamw f32 | [{n}] | {kernel:.3} | {composed:.3} | {:.0} |\n",
            bytes / (kernel * 1e-3) / 1e9
        ))
    });
    out.push_str(&line.unwrap_or_else(|e| format!("| adamw | failed: {} |\n", first_line(&e))));
    out
}
