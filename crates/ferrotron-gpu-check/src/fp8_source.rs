//! Rows for the casts that compute their tensor on the way in (`fp8_cast_source`): GELU and
//! SwiGLU forward, their gradients, and the bias gradient summed in the same pass, each
//! against the host: the activation in f64 from the same bf16 inputs, rounded on the fp8 grid
//! with the state's delayed scale. A byte may sit one grid step from the host's only where the
//! scaled value lies within the kernel's arithmetic error of a rounding boundary: 1e-6 of the
//! value (the one-instruction `exp2`/`rcp` are a few f32 ulps from f64), plus for GELU the
//! normal CDF's approximation error (below 7.5e-8, [`cdf_allowance`]); any other difference
//! fails. The bias gradient (bf16) is held to 1 % of its largest element, the amax recorded
//! into the state to 1e-6.

use std::sync::Arc;

use burn::tensor::{DType, Distribution, Tensor};
use ferrotron_cuda::fp8::{Cast, CastExtra, CastInput, CastSource, ScaleFrom, cast_source};
use ferrotron_cuda::{Cuda, CudaDevice, DType as EDType, GpuDevice};
use ferrotron_ops::fp8::scaling::{AMAX, Fp8Format, SCALE, round_to_fp8};
use rand::rngs::StdRng;

use crate::compare::Errors;
use crate::fp8::{DELAYED_SCALE, bf16_values, decoded, f32s, upload_f32};
use crate::fused::median_ms;
use crate::{Row, failed, first_line, guarded};

fn sigmoid(a: f64) -> f64 {
    1.0 / (1.0 + (-a).exp())
}

fn gelu(a: f64) -> f64 {
    0.5 * a * (1.0 + libm::erf(a / std::f64::consts::SQRT_2))
}

fn gelu_grad(a: f64) -> f64 {
    0.5 * (1.0 + libm::erf(a / std::f64::consts::SQRT_2))
        + a * (-0.5 * a * a).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

/// The cast's `[rows, cols]` values on the host from `x` and `aux` (shapes as in
/// [`CastSource`]).
fn host_values(source: CastSource, x: &[f32], aux: &[f32], [rows, cols]: [usize; 2]) -> Vec<f32> {
    let (x, aux): (Vec<f64>, Vec<f64>) = (
        x.iter().map(|v| f64::from(*v)).collect(),
        aux.iter().map(|v| f64::from(*v)).collect(),
    );
    (0..rows * cols)
        .map(|i| {
            let (r, c) = (i / cols, i % cols);
            let v = match source {
                CastSource::Plain => x[i],
                CastSource::Norm { .. } | CastSource::RopeGrad { .. } | CastSource::DropoutGrad => {
                    unreachable!(
                        "the norm, RoPE and dropout casts have their rows in fp8_fused_sources.rs"
                    )
                }
                CastSource::Gelu => gelu(x[i]),
                CastSource::Swiglu => {
                    let (g, u) = (x[r * 2 * cols + c], x[r * 2 * cols + cols + c]);
                    g * sigmoid(g) * u
                }
                CastSource::GeluGrad => x[i] * gelu_grad(aux[i]),
                CastSource::SwigluGrad => {
                    let f = cols / 2;
                    if c < f {
                        let (a, b, g) = (aux[r * cols + c], aux[r * cols + f + c], x[r * f + c]);
                        let s = sigmoid(a);
                        g * b * s * (1.0 + a * (1.0 - s))
                    } else {
                        let (a, g) = (aux[r * cols + c - f], x[r * f + c - f]);
                        g * a * sigmoid(a)
                    }
                }
            };
            v as f32
        })
        .collect()
}

/// The absolute error the GELU forms may add to element `i` beyond f32 rounding: the normal
/// CDF inside them comes from a rational approximation with |error| < 7.5e-8
/// (`kernels::elementwise`), times `|a|` in GELU and the output gradient in its derivative
/// (2e-7 there: the density's `exp2` adds its share).
fn cdf_allowance(source: CastSource, x: &[f32], i: usize) -> f64 {
    let factor = match source {
        CastSource::Gelu => 1e-7,
        CastSource::GeluGrad => 2e-7,
        _ => return 0.0,
    };
    factor * f64::from(x[i].abs())
}

/// `[x shape, aux shape, output shape]` for an output of `[rows, f]` columns.
fn shapes(source: CastSource, rows: usize, f: usize) -> [[usize; 2]; 3] {
    match source {
        CastSource::Plain
        | CastSource::Gelu
        | CastSource::Norm { .. }
        | CastSource::RopeGrad { .. }
        | CastSource::DropoutGrad => [[rows, f], [0, 0], [rows, f]],
        CastSource::Swiglu => [[rows, 2 * f], [0, 0], [rows, f]],
        CastSource::GeluGrad => [[rows, f], [rows, f], [rows, f]],
        CastSource::SwigluGrad => [[rows, f / 2], [rows, f], [rows, f]],
    }
}

/// One cast of `x` (and `aux`) from `source`, with its column sums when `dbias`, at the
/// delayed scale the one-row `state` holds, recording the amax there.
fn delayed_cast(
    x: &ferrotron_cuda::CudaTensor,
    aux: Option<&ferrotron_cuda::CudaTensor>,
    (source, dbias): (CastSource, bool),
    state: &ferrotron_cuda::CudaTensor,
    format: Fp8Format,
    transpose: bool,
) -> ferrotron_cuda::Result<(Cast, Option<ferrotron_cuda::CudaTensor>)> {
    let input = CastInput {
        x,
        aux,
        extra: CastExtra::None,
        source,
    };
    let from = ScaleFrom::Delayed {
        state,
        scale: SCALE,
        amax: Some(AMAX),
    };
    cast_source(input, format, transpose, from, dbias)
}

/// The row of one source: bytes, transpose, bias gradient and amax.
fn source_row(
    device: &Arc<CudaDevice>,
    rng: &mut StdRng,
    source: CastSource,
    format: Fp8Format,
    [rows, f]: [usize; 2],
) -> Row {
    let [x_shape, aux_shape, [rows, cols]] = shapes(source, rows, f);
    let shape = format!("[{rows}, {cols}]");
    let note = format!("{source:?} {} delayed, bf16 in, dbias", format.name());
    let result = guarded(|| {
        let bf16 = |values: &[f32], shape: [usize; 2]| {
            upload_f32(device, values, &shape)
                .cast(EDType::BF16)
                .map_err(|e| e.to_string())
        };
        let x = bf16_values(rng, x_shape[0] * x_shape[1], 3.0);
        let aux = bf16_values(rng, aux_shape[0] * aux_shape[1], 3.0);
        let x_gpu = bf16(&x, x_shape)?;
        let aux_gpu = (!aux.is_empty())
            .then(|| bf16(&aux, aux_shape))
            .transpose()?;
        let state = upload_f32(device, &[DELAYED_SCALE, 0.0, 0.0], &[1, 3]);
        let (cast, bias) = delayed_cast(
            &x_gpu,
            aux_gpu.as_ref(),
            (source, true),
            &state,
            format,
            true,
        )
        .map_err(|e| e.to_string())?;
        let want = host_values(source, &x, &aux, [rows, cols]);
        let near = |i: usize, got: f32| {
            let v = f64::from(want[i]);
            let slack = 1e-6 * v.abs() + cdf_allowance(source, &x, i);
            let scaled = |v: f64| round_to_fp8((v * f64::from(DELAYED_SCALE)) as f32, format);
            (scaled(v - slack)..=scaled(v + slack)).contains(&got)
        };
        let bytes = decoded(&cast.data, format)?;
        let transposed = decoded(&cast.transposed.ok_or("no transpose")?, format)?;
        let bad_bytes = (0..rows * cols).filter(|&i| !near(i, bytes[i])).count();
        let bad_transpose = (0..rows * cols)
            .filter(|&i| transposed[(i % cols) * rows + i / cols].to_bits() != bytes[i].to_bits())
            .count();
        let sums: Vec<f64> = (0..cols)
            .map(|c| (0..rows).map(|r| f64::from(want[r * cols + c])).sum())
            .collect();
        let largest = sums.iter().fold(0f64, |m, v| m.max(v.abs()));
        let got_sums = f32s(&bias.ok_or("no bias gradient")?)?;
        let bias_err = got_sums
            .iter()
            .zip(&sums)
            .fold(0f64, |m, (g, w)| m.max((f64::from(*g) - w).abs()));
        let amax = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let got_amax = f32s(&state)?[AMAX];
        let amax_off = (got_amax - amax).abs() > 1e-6 * amax;
        let bad_bias = usize::from(bias_err > 0.01 * largest);
        Ok((
            bad_bytes,
            bad_transpose,
            bad_bias,
            usize::from(amax_off),
            bias_err / largest,
        ))
    });
    match result {
        Ok((bytes, transpose, bias, amax, bias_rel)) => {
            let bad = bytes + transpose + bias + amax;
            Row {
                op: "fp8_cast_source".into(),
                dtype: "fp8",
                shape,
                errors: Errors {
                    max_abs: 0.0,
                    max_rel: bias_rel,
                    bad,
                    mismatch: None,
                },
                note: format!(
                    "{note}; bytes off {bytes}, transpose off {transpose}, dbias rel {bias_rel:.1e}, amax off {amax}"
                ),
            }
        }
        Err(e) => Row {
            op: "fp8_cast_source".into(),
            dtype: "fp8",
            shape,
            errors: failed(),
            note: format!("backend: {}", first_line(&e)),
        },
    }
}

/// One row per source, e4m3 for the activations and e5m2 for the gradients as the hybrid
/// format casts them; 200 rows and 136 or 272 columns cross the 64 × 64 tiles' edges.
pub(crate) fn rows(device: &Arc<CudaDevice>, rng: &mut StdRng) -> Vec<Row> {
    let (e4, e5) = (Fp8Format::E4m3, Fp8Format::E5m2);
    vec![
        source_row(device, rng, CastSource::Plain, e5, [200, 136]),
        source_row(device, rng, CastSource::Gelu, e4, [200, 136]),
        source_row(device, rng, CastSource::Swiglu, e4, [200, 136]),
        source_row(device, rng, CastSource::GeluGrad, e5, [200, 136]),
        source_row(device, rng, CastSource::SwigluGrad, e5, [200, 272]),
    ]
}

/// A standard-normal `[rows, cols]` bf16 tensor on the GPU.
fn random_bf16(device: &GpuDevice, shape: [usize; 2]) -> Tensor<Cuda, 2> {
    Tensor::<Cuda, 2>::random(shape, Distribution::Normal(0.0, 1.0), device).cast(DType::BF16)
}

/// Milliseconds a call of `f`: the median of five synchronised runs of ten calls.
fn per_call_ms(device: &GpuDevice, mut f: impl FnMut()) -> f64 {
    const CALLS: usize = 10;
    median_ms(device, 5, || (0..CALLS).for_each(|_| f())) / CALLS as f64
}

/// Speed of the casts at the training shapes that dominate an fp8 step (gpt-1.3b 12 × 2048 and
/// the LLaMA-style 1B 4 × 4096): microseconds a call and the bytes moved (inputs read, the
/// row-major and transposed fp8 copies written) per second. Host-timed, so each call's output
/// allocations count too: the last row, a bf16 add of the same size, is this loop's ceiling
/// (2.9 TB/s on an H200, where training reads 4.0–4.2). `FERROTRON_OP_TIMING=1` adds each
/// kernel's CUDA-event time.
pub(crate) fn timings(device: &GpuDevice) -> String {
    let mut out =
        String::from("| fp8 cast (bf16 in, delayed) | output | µs | TB/s |\n|---|---|---:|---:|\n");
    let (e4, e5) = (Fp8Format::E4m3, Fp8Format::E5m2);
    for (source, format, transpose, dbias, [rows, f]) in [
        (CastSource::Plain, e4, true, false, [24576, 2048]),
        (CastSource::Plain, e4, false, false, [24576, 2048]),
        (CastSource::Plain, e5, true, true, [24576, 2048]),
        (CastSource::Gelu, e4, true, false, [24576, 8192]),
        (CastSource::Gelu, e4, false, false, [24576, 8192]),
        (CastSource::GeluGrad, e5, true, true, [24576, 8192]),
        (CastSource::Swiglu, e4, true, false, [16384, 8192]),
        (CastSource::SwigluGrad, e5, true, false, [16384, 16384]),
    ] {
        let what = format!(
            "{source:?} {}{}{}",
            format.name(),
            if transpose { "" } else { " no transpose" },
            if dbias { " dbias" } else { "" }
        );
        let line = guarded(|| {
            let [x_shape, aux_shape, [rows, cols]] = shapes(source, rows, f);
            let bf16 = |shape| random_bf16(device, shape).into_primitive().tensor();
            let x = bf16(x_shape);
            let aux = (aux_shape[0] > 0).then(|| bf16(aux_shape));
            let engine = CudaDevice::get(device.ordinal).map_err(|e| e.to_string())?;
            let state = upload_f32(&engine, &[DELAYED_SCALE, 0.0, 0.0], &[1, 3]);
            let cast = || {
                delayed_cast(&x, aux.as_ref(), (source, dbias), &state, format, transpose)
                    .expect("cast");
            };
            let ms = per_call_ms(device, cast);
            let read = (x_shape[0] * x_shape[1] + aux_shape[0] * aux_shape[1]) * 2;
            let bytes = (read + (1 + usize::from(transpose)) * rows * cols) as f64;
            Ok(format!(
                "| {what} | [{rows}, {cols}] | {:.1} | {:.2} |\n",
                ms * 1e3,
                bytes / (ms * 1e-3) / 1e12
            ))
        });
        out.push_str(
            &line.unwrap_or_else(|e| format!("| {what} | failed: {} | | |\n", first_line(&e))),
        );
    }
    let reference = guarded(|| {
        let [a, b] = [0, 1].map(|_| random_bf16(device, [24576, 2048]));
        let ms = per_call_ms(device, || drop(a.clone() + b.clone()));
        Ok(format!(
            "| (reference: bf16 add, 3 × 2 bytes an element) | [24576, 2048] | {:.1} | {:.2} |\n",
            ms * 1e3,
            (3 * 2 * 24576 * 2048) as f64 / (ms * 1e-3) / 1e12
        ))
    });
    out.push_str(
        &reference.unwrap_or_else(|e| format!("| reference | failed: {} | | |\n", first_line(&e))),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host side of the rows: SwiGLU's packed gradient is the two halves' formulas, and
    /// each source's derivative agrees with a finite difference of its forward.
    #[test]
    fn host_gradients_are_the_forward_derivatives() {
        let h = 1e-3f64;
        for a in [-2.5f64, -0.3, 0.0, 0.7, 2.0] {
            let numeric = (gelu(a + h) - gelu(a - h)) / (2.0 * h);
            assert!((numeric - gelu_grad(a)).abs() < 1e-5, "gelu' at {a}");
        }
        // SwiGLU with gate 0.7, up -1.3, output gradient 2: d/dgate and d/dup.
        let (gate, up, g) = (0.7f32, -1.3f32, 2.0f32);
        let grads = host_values(CastSource::SwigluGrad, &[g], &[gate, up], [1, 2]);
        let f = |gate: f64, up: f64| gate * sigmoid(gate) * up;
        let (gate, up) = (f64::from(gate), f64::from(up));
        let d_gate = f64::from(g) * (f(gate + h, up) - f(gate - h, up)) / (2.0 * h);
        let d_up = f64::from(g) * (f(gate, up + h) - f(gate, up - h)) / (2.0 * h);
        assert!(
            (f64::from(grads[0]) - d_gate).abs() < 1e-4,
            "{grads:?} {d_gate}"
        );
        assert!(
            (f64::from(grads[1]) - d_up).abs() < 1e-4,
            "{grads:?} {d_up}"
        );
    }
}
