//! Rows for the fused ops and the linear overrides, each against the composed version.
//!
//! Attention (cuDNN's fused flash attention through `FusedOps`, one autodiff node) is checked
//! in bf16 and f16 against burn's composed attention computed in f32 on the same GPU from the
//! same rounded inputs: output and the gradients of q, k, v for a weighted-sum loss. f32 inputs
//! take the composed path (cuDNN has no f32 fused attention), so their row checks that path.
//! Dropout cannot match a composed run (another generator), so its row checks that the
//! backward regenerated the forward's mask: the loss is linear in v, so `<dV, v>` must equal
//! the loss up to rounding (a different mask would put them ~60 % apart), and with v = 1 every
//! output element averages 1.

use std::time::Instant;

use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::module::linear;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive, bf16, f16};
use ferrotron_cuda::{Cuda, GpuDevice};
use ferrotron_ops::{AttentionSpec, FusedOps, composed_attention};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::compare::{self, Errors};
use crate::{Row, failed, first_line, guarded};

pub(crate) type A = Autodiff<Cuda>;

pub(crate) fn host(shape: &[usize], rng: &mut StdRng, dtype: DType) -> TensorData {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    round(TensorData::new(v, shape.to_vec()), dtype)
}

pub(crate) fn round(d: TensorData, dtype: DType) -> TensorData {
    match dtype {
        DType::BF16 => d.convert::<bf16>(),
        DType::F16 => d.convert::<f16>(),
        _ => d.convert::<f32>(),
    }
}

pub(crate) fn dtype_label(dtype: DType) -> &'static str {
    match dtype {
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        _ => "f32",
    }
}

pub(crate) fn upload<const D: usize>(
    d: &TensorData,
    dtype: DType,
    device: &GpuDevice,
) -> Tensor<A, D> {
    Tensor::<A, D>::from_data(round(d.clone(), dtype), (device, dtype)).require_grad()
}

/// A fused op's output and its input's gradient under a fixed weighting `w` (f32), flattened
/// into one f32 tensor: what its rows compare against the composed version.
pub(crate) fn output_and_grad<const D: usize>(
    out: FloatTensor<A>,
    x: &Tensor<A, D>,
    w: Tensor<A, D>,
) -> TensorData {
    let out: Tensor<A, D> = Tensor::from_primitive(TensorPrimitive::Float(out));
    let g = (out.clone().cast(DType::F32) * w).sum().backward();
    Tensor::cat(
        vec![
            out.inner().cast(DType::F32).reshape([-1]),
            x.grad(&g).expect("dx").cast(DType::F32).reshape([-1]),
        ],
        0,
    )
    .into_data()
}

/// The row of an op whose output and packed input gradient, kernel (`got`, in `dtype`) and
/// composed in f32 (`want`), are compared after rounding both to `dtype`.
pub(crate) fn packed_grad_row(
    op: &str,
    dtype: DType,
    shape: String,
    got: Result<TensorData, String>,
    want: Result<TensorData, String>,
) -> Row {
    rounded_row(op, dtype, shape, (2.0, "out + packed dx"), got, want)
}

/// The row of a kernel's values (`got`, in `dtype`) against the composed ones in f32 (`want`),
/// both rounded to `dtype`, compared at `scale` times the dtype's tolerance; `what` names them.
pub(crate) fn rounded_row(
    op: &str,
    dtype: DType,
    shape: String,
    (scale, what): (f64, &str),
    got: Result<TensorData, String>,
    want: Result<TensorData, String>,
) -> Row {
    let (errors, note) = match (got, want) {
        (Ok(got), Ok(want)) => (
            compare::compare(&round(got, dtype), &round(want, dtype), scale),
            format!("fused vs composed f32; {what}"),
        ),
        (Err(e), _) => (failed(), format!("fused: {}", first_line(&e))),
        (_, Err(e)) => (failed(), format!("composed: {}", first_line(&e))),
    };
    Row {
        op: op.into(),
        dtype: dtype_label(dtype),
        shape,
        errors,
        note,
    }
}

fn attention_on<const FUSED: bool>(
    q: Tensor<A, 4>,
    k: Tensor<A, 4>,
    v: Tensor<A, 4>,
    spec: AttentionSpec,
) -> Tensor<A, 4> {
    let (q, k, v) = (
        q.into_primitive().tensor(),
        k.into_primitive().tensor(),
        v.into_primitive().tensor(),
    );
    let out = if FUSED {
        A::fused_attention(q, k, v, spec)
    } else {
        composed_attention::<A>(q, k, v, spec)
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// Output and dq, dk, dv of `Σ w ∘ attention(q, k, v)`, flattened into one f32 tensor.
fn attention_grads<const FUSED: bool>(
    data: &[TensorData; 4],
    dtype: DType,
    spec: AttentionSpec,
    device: &GpuDevice,
) -> TensorData {
    let q: Tensor<A, 4> = upload(&data[0], dtype, device);
    let k: Tensor<A, 4> = upload(&data[1], dtype, device);
    let v: Tensor<A, 4> = upload(&data[2], dtype, device);
    let w = Tensor::<A, 4>::from_data(round(data[3].clone(), DType::F32), (device, DType::F32));
    let out = attention_on::<FUSED>(q.clone(), k.clone(), v.clone(), spec);
    let grads = (out.clone().cast(DType::F32) * w).sum().backward();
    let flat = |t: Tensor<Cuda, 4>| t.cast(DType::F32).reshape([-1]);
    Tensor::cat(
        vec![
            flat(out.inner()),
            flat(q.grad(&grads).expect("dq")),
            flat(k.grad(&grads).expect("dk")),
            flat(v.grad(&grads).expect("dv")),
        ],
        0,
    )
    .into_data()
}

/// One attention row: fused in `dtype` against composed in f32.
fn attention_row(
    device: &GpuDevice,
    rng: &mut StdRng,
    dims: [usize; 5],
    dtype: DType,
    causal: bool,
) -> Row {
    let spec = AttentionSpec {
        causal,
        ..AttentionSpec::causal()
    };
    attention_row_against(device, rng, dims, dtype, spec, spec)
}

/// What an attention row's note and name say of its mask.
pub(crate) fn mask_label(spec: &AttentionSpec) -> String {
    let causal = if spec.causal { ", causal" } else { "" };
    match spec.window {
        Some(left) => format!("{causal}, window {left}"),
        None => causal.to_string(),
    }
}

/// One attention row: fused `spec` in `dtype` against composed `reference` (the same spec, or
/// one it must equal) in f32.
pub(crate) fn attention_row_against(
    device: &GpuDevice,
    rng: &mut StdRng,
    [b, h, g, s, d]: [usize; 5],
    dtype: DType,
    spec: AttentionSpec,
    reference: AttentionSpec,
) -> Row {
    let data = [
        host(&[b, h, s, d], rng, dtype),
        host(&[b, g, s, d], rng, dtype),
        host(&[b, g, s, d], rng, dtype),
        host(&[b, h, s, d], rng, DType::F32),
    ];
    let probe = |shape: [usize; 4]| {
        Tensor::<Cuda, 4>::zeros(shape, (device, dtype))
            .into_primitive()
            .tensor()
    };
    let kernel = guarded(|| {
        Ok(Cuda::has_attention_kernel(
            &probe([b, h, s, d]),
            &probe([b, g, s, d]),
            &probe([b, g, s, d]),
            &spec,
        ))
    })
    .unwrap_or(false);
    let got = guarded(|| Ok(attention_grads::<true>(&data, dtype, spec, device)));
    let want = guarded(|| {
        Ok(attention_grads::<false>(
            &data,
            DType::F32,
            reference,
            device,
        ))
    });
    let (errors, note) = match (got, want) {
        (Ok(got), Ok(want)) => {
            let got = round(got, dtype);
            let want = round(want, dtype);
            let against = if reference == spec {
                String::new()
            } else {
                format!(" (composed{})", mask_label(&reference))
            };
            (
                compare::compare(&got, &want, 4.0),
                format!(
                    "{} vs composed f32{against}; out + dq, dk, dv{}",
                    if kernel { "cuDNN fused" } else { "composed" },
                    mask_label(&spec)
                ),
            )
        }
        (Err(e), _) => (failed(), format!("fused: {}", first_line(&e))),
        (_, Err(e)) => (failed(), format!("composed: {}", first_line(&e))),
    };
    Row {
        op: format!(
            "fused_attention d{d} {}{}",
            if g == h { "mha" } else { "gqa" },
            spec.window
                .map_or(String::new(), |left| format!(" window {left}"))
        ),
        dtype: dtype_label(dtype),
        shape: format!("q [{b}, {h}, {s}, {d}] kv [{b}, {g}, {s}, {d}]"),
        errors,
        note,
    }
}

/// Dropout: `<dV, v>` against the loss, and the mean output with v = 1; with a sliding
/// `window`, the same checks of the banded probabilities.
pub(crate) fn dropout_row(
    device: &GpuDevice,
    rng: &mut StdRng,
    dtype: DType,
    window: Option<usize>,
) -> Row {
    dropout_row_with(device, rng, dtype, window, [2, 8, 4, 512, 64, 64])
}

/// [`dropout_row`] at `[batch, heads, groups, seq, query/key head dim, value head dim]`.
pub(crate) fn dropout_row_with(
    device: &GpuDevice,
    rng: &mut StdRng,
    dtype: DType,
    window: Option<usize>,
    [b, h, g, s, d, dv]: [usize; 6],
) -> Row {
    let spec = AttentionSpec {
        dropout: 0.2,
        window,
        ..AttentionSpec::causal()
    };
    let run = || -> Result<(f64, f64, f64), String> {
        let q: Tensor<A, 4> = upload(&host(&[b, h, s, d], rng, dtype), dtype, device);
        let k: Tensor<A, 4> = upload(&host(&[b, g, s, d], rng, dtype), dtype, device);
        let v: Tensor<A, 4> = upload(&host(&[b, g, s, dv], rng, dtype), dtype, device);
        let w =
            Tensor::<A, 4>::from_data(host(&[b, h, s, dv], rng, DType::F32), (device, DType::F32));
        let out = attention_on::<true>(q.clone(), k.clone(), v.clone(), spec);
        let loss = (out.cast(DType::F32) * w).sum();
        let grads = loss.backward();
        let loss_value: f64 = loss.into_scalar().into();
        let grad_v = v.grad(&grads).ok_or("no dv")?.cast(DType::F32);
        let inner: f64 = (grad_v * v.inner().cast(DType::F32))
            .sum()
            .into_scalar()
            .into();
        let ones = Tensor::<A, 4>::ones([b, g, s, dv], (device, dtype));
        let mean_out: f64 = attention_on::<true>(q, k, ones, spec)
            .cast(DType::F32)
            .mean()
            .into_scalar()
            .into();
        Ok((loss_value, inner, mean_out))
    };
    let (errors, note) = match guarded(run) {
        Ok((loss, inner, mean)) => {
            let rel = (loss - inner).abs() / loss.abs().max(1e-6);
            // A mask regenerated differently would leave the two sums independent draws:
            // about sqrt(2p) ≈ 60 % apart at p 0.2. bf16 rounding of a sum of signed terms
            // that largely cancel leaves a few percent (measured 0.8–3 % on an H200).
            let ok = rel < 0.1 && (mean - 1.0).abs() < 0.02;
            (
                Errors {
                    max_abs: (mean - 1.0).abs(),
                    max_rel: rel,
                    bad: usize::from(!ok),
                    mismatch: None,
                },
                format!("p 0.2: loss {loss:.4} vs <dV, v> {inner:.4}; mean out (v = 1) {mean:.4}"),
            )
        }
        Err(e) => (failed(), format!("backend: {}", first_line(&e))),
    };
    Row {
        op: format!(
            "fused_attention dropout{}",
            window.map_or(String::new(), |left| format!(" window {left}"))
        ),
        dtype: dtype_label(dtype),
        shape: if d == dv {
            format!("q [{b}, {h}, {s}, {d}] kv [{b}, {g}, {s}, {d}]")
        } else {
            format!("q, k [{b}, {h}|{g}, {s}, {d}] v [{b}, {g}, {s}, {dv}]")
        },
        errors,
        note,
    }
}

/// Output and dx, dw, db of `Σ u ∘ linear(x, w, b)`, overridden (`FUSED`) or composed.
fn linear_grads<const FUSED: bool>(
    data: &[TensorData; 4],
    dtype: DType,
    device: &GpuDevice,
) -> TensorData {
    let x: Tensor<A, 3> = upload(&data[0], dtype, device);
    let w: Tensor<A, 2> = upload(&data[1], dtype, device);
    let bias: Tensor<A, 1> = upload(&data[2], dtype, device);
    let u = Tensor::<A, 3>::from_data(round(data[3].clone(), DType::F32), (device, DType::F32));
    let y = if FUSED {
        linear(x.clone(), w.clone(), Some(bias.clone()))
    } else {
        x.clone().matmul(w.clone().unsqueeze()) + bias.clone().unsqueeze()
    };
    let grads = (y.clone().cast(DType::F32) * u).sum().backward();
    Tensor::cat(
        vec![
            y.inner().cast(DType::F32).reshape([-1]),
            x.grad(&grads).expect("dx").cast(DType::F32).reshape([-1]),
            w.grad(&grads).expect("dw").cast(DType::F32).reshape([-1]),
            bias.grad(&grads)
                .expect("db")
                .cast(DType::F32)
                .reshape([-1]),
        ],
        0,
    )
    .into_data()
}

fn linear_row(device: &GpuDevice, rng: &mut StdRng, dtype: DType) -> Row {
    let [b, s, i, o] = [4, 96, 256, 384];
    let data = [
        host(&[b, s, i], rng, dtype),
        host(&[i, o], rng, dtype),
        host(&[o], rng, dtype),
        host(&[b, s, o], rng, DType::F32),
    ];
    let got = guarded(|| Ok(linear_grads::<true>(&data, dtype, device)));
    let want = guarded(|| Ok(linear_grads::<false>(&data, DType::F32, device)));
    let (errors, note) = match (got, want) {
        (Ok(g), Ok(w)) => (
            compare::compare(&round(g, dtype), &round(w, dtype), 8.0),
            "one-GEMM linear + bias epilogue vs composed f32; y + dx, dw, db".to_string(),
        ),
        (Err(e), _) => (failed(), format!("override: {}", first_line(&e))),
        (_, Err(e)) => (failed(), format!("composed: {}", first_line(&e))),
    };
    Row {
        op: "linear (override)".into(),
        dtype: dtype_label(dtype),
        shape: format!("x [{b}, {s}, {i}] w [{i}, {o}]"),
        errors,
        note,
    }
}

/// Every fused-op row.
pub(crate) fn rows(device: &GpuDevice) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(13);
    let mut rows = Vec::new();
    for dtype in [DType::BF16, DType::F16] {
        for d in [64, 128] {
            rows.push(attention_row(
                device,
                &mut rng,
                [2, 4, 4, 256, d],
                dtype,
                true,
            ));
            rows.push(attention_row(
                device,
                &mut rng,
                [2, 8, 2, 320, d],
                dtype,
                true,
            ));
        }
    }
    rows.push(attention_row(
        device,
        &mut rng,
        [2, 4, 4, 256, 64],
        DType::BF16,
        false,
    ));
    rows.push(attention_row(
        device,
        &mut rng,
        [1, 4, 2, 128, 64],
        DType::F32,
        true,
    ));
    rows.push(dropout_row(device, &mut rng, DType::BF16, None));
    for dtype in [DType::F32, DType::BF16] {
        rows.push(linear_row(device, &mut rng, dtype));
    }
    rows
}

pub(crate) fn median_ms(device: &GpuDevice, reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let _ = Cuda::sync(device);
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let start = Instant::now();
            f();
            let _ = Cuda::sync(device);
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// A `[b, heads, s, d]` bf16 tensor of standard normal values on the GPU.
pub(crate) fn bf16_normal(device: &GpuDevice, shape: [usize; 4]) -> FloatTensor<Cuda> {
    Tensor::<Cuda, 4>::random(shape, burn::tensor::Distribution::Normal(0.0, 1.0), device)
        .cast(DType::BF16)
        .into_primitive()
        .tensor()
}

/// Median times (ms) of `reps` forward and `reps` backward calls of the fused attention
/// kernel on `q, k, v`, the backward from the output gradient `grad`.
pub(crate) fn attention_ms(
    device: &GpuDevice,
    [q, k, v, grad]: [&FloatTensor<Cuda>; 4],
    spec: AttentionSpec,
    reps: usize,
) -> (f64, f64) {
    let fwd = median_ms(device, reps, || {
        let _ = Cuda::attention_kernel_forward(q.clone(), k.clone(), v.clone(), spec);
    });
    let saved = Cuda::attention_kernel_forward(q.clone(), k.clone(), v.clone(), spec);
    let bwd = median_ms(device, reps, || {
        let _ = Cuda::attention_kernel_backward(
            q.clone(),
            k.clone(),
            v.clone(),
            saved.clone(),
            grad.clone(),
            spec,
        );
    });
    (fwd, bwd)
}

/// Attention speed: cuDNN forward and backward kernels and the composed forward, TFLOP/s by
/// the causal count (half the dense `4·b·h·s²·d` forward; backward 2.5× forward).
pub(crate) fn timings(device: &GpuDevice) -> String {
    let mut out = String::from(
        "| attention (bf16, causal) | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | composed fwd ms |\n|---|---:|---:|---:|---:|---:|\n",
    );
    for [b, h, g, s, d] in [
        [4, 16, 16, 2048, 128],
        [4, 16, 16, 2048, 64],
        [2, 32, 8, 4096, 128],
    ] {
        let line = guarded(|| {
            let mk = |heads: usize| bf16_normal(device, [b, heads, s, d]);
            let (q, k, v, grad) = (mk(h), mk(g), mk(g), mk(h));
            let spec = AttentionSpec::causal();
            let (fwd, bwd) = attention_ms(device, [&q, &k, &v, &grad], spec, 10);
            let composed = median_ms(device, 3, || {
                let _ = composed_attention::<Cuda>(q.clone(), k.clone(), v.clone(), spec);
            });
            let flops = 2.0 * (b * h * s * s * d) as f64;
            Ok(format!(
                "| b {b} h {h} kv {g} s {s} d {d} | {fwd:.3} | {:.0} | {bwd:.3} | {:.0} | {composed:.2} |\n",
                flops / (fwd * 1e-3) / 1e12,
                2.5 * flops / (bwd * 1e-3) / 1e12
            ))
        });
        out.push_str(&line.unwrap_or_else(|e| {
            format!(
                "| b {b} h {h} kv {g} s {s} d {d} | failed: {} |\n",
                first_line(&e)
            )
        }));
    }
    out
}
