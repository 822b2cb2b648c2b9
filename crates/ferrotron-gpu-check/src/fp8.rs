//! Rows for fp8 (`--filter fp8`; Hopper or newer): each kernel against the host arithmetic of
//! `ferrotron_ops::fp8_scaling`, and the fp8 linear layer end to end.
//!
//! - `fp8_cast`: the cast-transpose kernel's bytes, decoded, must equal the host rounding of
//!   `x · scale` bit for bit, its transpose too, its inverse scale and the amax it maxed into
//!   the state exactly; delayed and current scaling, e4m3 and e5m2, a shape that is not a
//!   multiple of the 64 × 64 tile;
//! - `fp8_cast_source`: the casts that compute an activation or its gradient on the way in
//!   and sum the bias gradient (`fp8_source.rs`);
//! - `fp8_matmul`: cuBLASLt's fp8 GEMM (the forward's e4m3 × e4m3 with fast accumulation and a
//!   bias, the data gradient's e5m2 × e4m3, the weight gradient's e4m3 × e5m2) against the
//!   f64 product of the decoded operands times the inverse scales, within bf16 rounding;
//! - `fp8_scale_update`: the update kernel on a state with zero, infinite and NaN amaxes against
//!   the host update, bit for bit;
//! - `fp8_linear`: two training steps of the node on `Autodiff<Cuda>` (kernels) against the node
//!   on `Autodiff<Flex>` (the reference primitives) from the same bf16 inputs (output, dx, dW,
//!   db, and the scaling state after each step), and against a plain bf16 linear at fp8's
//!   tolerance.
//!
//! Every output buffer is poisoned first (`gpu_check` turns poisoning on), so an element a
//! kernel forgot to write fails its row.

use std::sync::Arc;

use burn::backend::{Autodiff, Flex};
use burn::tensor::module::linear;
use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use ferrotron_cuda::fp8::{Cast, Operand, ScaleFrom, amax, cast_transpose, fp8_matmul};
use ferrotron_cuda::{CudaDevice, CudaTensor, DType as EDType, GpuDevice};
use ferrotron_ops::fp8::scaling::{
    AMAX, AmaxAlgo, Fp8Format, Fp8Scaling, Fp8Settings, SCALE, round_to_fp8, update_state,
};
use ferrotron_ops::{Fp8Linear, Fp8State, FusedOps};
use ferrotron_parallel::{end_fp8_step, solo};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::compare::{self, Errors};
use crate::fused::round;
use crate::{Row, failed, first_line, guarded};

/// The value of fp8 byte `b` in `format`.
fn decode(b: u8, format: Fp8Format) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (mantissa_bits, bias) = match format {
        Fp8Format::E4m3 => (3, 7),
        Fp8Format::E5m2 => (2, 15),
    };
    let exponent = i32::from((b & 0x7f) >> mantissa_bits);
    let mantissa = f32::from(b & ((1 << mantissa_bits) - 1)) / (1 << mantissa_bits) as f32;
    let special = match format {
        Fp8Format::E4m3 => b & 0x7f == 0x7f,
        Fp8Format::E5m2 => exponent == 31,
    };
    if special {
        return if format == Fp8Format::E5m2 && mantissa == 0.0 {
            sign * f32::INFINITY
        } else {
            f32::NAN
        };
    }
    if exponent == 0 {
        sign * mantissa * ((1 - bias) as f32).exp2()
    } else {
        sign * (1.0 + mantissa) * ((exponent - bias) as f32).exp2()
    }
}

pub(crate) fn f32s(t: &CudaTensor) -> Result<Vec<f32>, String> {
    let bytes = t.cast(EDType::F32).and_then(|t| t.to_bytes());
    let bytes = bytes.map_err(|e| e.to_string())?;
    Ok(bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

pub(crate) fn decoded(t: &CudaTensor, format: Fp8Format) -> Result<Vec<f32>, String> {
    let bytes = t.to_bytes().map_err(|e| e.to_string())?;
    Ok(bytes.into_iter().map(|b| decode(b, format)).collect())
}

pub(crate) fn upload_f32(device: &Arc<CudaDevice>, values: &[f32], shape: &[usize]) -> CudaTensor {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    CudaTensor::from_bytes(device, &bytes, shape, EDType::F32).expect("upload")
}

/// Values rounded to bf16 and back, so host and GPU start from the same numbers.
pub(crate) fn bf16_values(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| burn::tensor::bf16::from_f32(rng.random_range(-scale..scale)).to_f32())
        .collect()
}

fn exact_row(op: &str, shape: String, note: String, bad: usize, checked: usize) -> Row {
    Row {
        op: op.into(),
        dtype: "fp8",
        shape,
        errors: Errors {
            max_abs: 0.0,
            max_rel: 0.0,
            bad,
            mismatch: (checked == 0).then(|| "nothing compared".into()),
        },
        note,
    }
}

/// Count of elements whose bits differ (NaN equal to NaN).
fn differing(got: &[f32], want: &[f32]) -> usize {
    if got.len() != want.len() {
        return got.len().max(want.len()).max(1);
    }
    got.iter()
        .zip(want)
        .filter(|(g, w)| !(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan())))
        .count()
}

/// The scale the delayed cast rows' state holds.
pub(crate) const DELAYED_SCALE: f32 = 37.5;

/// The cast rows' input: bf16 values with an outlier beyond the delayed scale's range, which
/// checks saturation. Every value must be a bf16 one, as the GPU casts them to bf16 before the
/// kernel reads them (an outlier of 3000 became 3008 there, another amax than the host's).
fn cast_input(rng: &mut StdRng, n: usize) -> Vec<f32> {
    let mut x = bf16_values(rng, n, 4.0);
    x[7] = burn::tensor::bf16::from_f32(3000.0).to_f32();
    x
}

fn cast_row(
    device: &Arc<CudaDevice>,
    rng: &mut StdRng,
    [rows, cols]: [usize; 2],
    format: Fp8Format,
    current: bool,
) -> Row {
    let op = "fp8_cast";
    let shape = format!("[{rows}, {cols}]");
    let note = format!(
        "{} {}, bf16 in; bytes, transpose, scale_inv, amax exact",
        format.name(),
        if current { "current" } else { "delayed" }
    );
    let result = guarded(|| {
        let x = cast_input(rng, rows * cols);
        let xt = upload_f32(device, &x, &[rows, cols])
            .cast(EDType::BF16)
            .map_err(|e| e.to_string())?;
        let host_amax = ferrotron_ops::fp8::scaling::amax(&x);
        let state = upload_f32(device, &[DELAYED_SCALE, 0.0, 2.0], &[1, 3]);
        let from = if current {
            ScaleFrom::Current {
                scaled_max: format.max(),
                record: None,
            }
        } else {
            ScaleFrom::Delayed {
                state: &state,
                scale: SCALE,
                amax: Some(AMAX),
            }
        };
        let Cast {
            data,
            transposed,
            scale_inv,
        } = cast_transpose(&xt, format, true, from).map_err(|e| e.to_string())?;
        let scale = if current {
            ferrotron_ops::fp8::scaling::current_scale(host_amax, format.max())
        } else {
            DELAYED_SCALE
        };
        let want: Vec<f32> = x.iter().map(|v| round_to_fp8(v * scale, format)).collect();
        let want_t: Vec<f32> = (0..rows * cols)
            .map(|i| want[(i % rows) * cols + i / rows])
            .collect();
        let transposed = transposed.ok_or("no transpose")?;
        let parts = [
            ("bytes", differing(&decoded(&data, format)?, &want)),
            (
                "transpose",
                differing(&decoded(&transposed, format)?, &want_t),
            ),
            ("scale_inv", differing(&f32s(&scale_inv)?, &[1.0 / scale])),
            (
                "state",
                if current {
                    0
                } else {
                    differing(&f32s(&state)?, &[DELAYED_SCALE, 0.0, host_amax.max(2.0)])
                },
            ),
        ];
        Ok((parts, want.len()))
    });
    match result {
        Ok((parts, checked)) => {
            let bad = parts.iter().map(|(_, n)| n).sum();
            let differ: Vec<String> = parts
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|(part, n)| format!("{part} {n}"))
                .collect();
            let note = if differ.is_empty() {
                note
            } else {
                format!("{note}; differing: {}", differ.join(", "))
            };
            exact_row(op, shape, note, bad, checked)
        }
        Err(e) => Row {
            op: op.into(),
            dtype: "fp8",
            shape,
            errors: failed(),
            note: format!("backend: {}", first_line(&e)),
        },
    }
}

fn amax_row(device: &Arc<CudaDevice>, rng: &mut StdRng) -> Row {
    let [rows, cols] = [1000, 264];
    let result = guarded(|| {
        let x = bf16_values(rng, rows * cols, 9.0);
        let xt = upload_f32(device, &x, &[rows, cols])
            .cast(EDType::BF16)
            .map_err(|e| e.to_string())?;
        let got = f32s(&amax(&xt).map_err(|e| e.to_string())?)?;
        Ok(differing(&got, &[ferrotron_ops::fp8::scaling::amax(&x)]))
    });
    let shape = format!("[{rows}, {cols}]");
    match result {
        Ok(bad) => exact_row("fp8_amax", shape, "bf16 in, exact".into(), bad, 1),
        Err(e) => Row {
            op: "fp8_amax".into(),
            dtype: "fp8",
            shape,
            errors: failed(),
            note: format!("backend: {}", first_line(&e)),
        },
    }
}

/// A random fp8 operand `[rows, k]`: host grid values and the device bytes of the same cast.
pub(crate) fn operand(
    device: &Arc<CudaDevice>,
    rng: &mut StdRng,
    [rows, k]: [usize; 2],
    format: Fp8Format,
    scale: f32,
) -> Result<(Vec<f32>, Cast), String> {
    let x = bf16_values(rng, rows * k, 1.0);
    let xt = upload_f32(device, &x, &[rows, k])
        .cast(EDType::BF16)
        .map_err(|e| e.to_string())?;
    let state = upload_f32(device, &[scale, 0.0, 0.0], &[1, 3]);
    let from = ScaleFrom::Delayed {
        state: &state,
        scale: SCALE,
        amax: None,
    };
    let cast = cast_transpose(&xt, format, false, from).map_err(|e| e.to_string())?;
    let grid = x.iter().map(|v| round_to_fp8(v * scale, format)).collect();
    Ok((grid, cast))
}

fn matmul_row(
    device: &Arc<CudaDevice>,
    rng: &mut StdRng,
    [m, n, k]: [usize; 3],
    formats: (Fp8Format, Fp8Format),
    bias: bool,
    fast: bool,
) -> Row {
    let note = format!(
        "{}·{}ᵀ{}{}, bf16 out vs f64",
        formats.0.name(),
        formats.1.name(),
        if bias { " + bias" } else { "" },
        if fast { ", fast accumulation" } else { "" }
    );
    let shape = format!("[{m}, {k}]·[{n}, {k}]ᵀ");
    let result = guarded(|| {
        let (sa, sb) = (64.0f32, 200.0f32);
        let (a, ca) = operand(device, rng, [m, k], formats.0, sa)?;
        let (b, cb) = operand(device, rng, [n, k], formats.1, sb)?;
        let bias_values = bf16_values(rng, n, 1.0);
        let bias_t = upload_f32(device, &bias_values, &[n])
            .cast(EDType::BF16)
            .map_err(|e| e.to_string())?;
        let got = fp8_matmul(
            Operand {
                data: &ca.data,
                format: formats.0,
                scale_inv: &ca.scale_inv,
            },
            Operand {
                data: &cb.data,
                format: formats.1,
                scale_inv: &cb.scale_inv,
            },
            bias.then_some(&bias_t),
            EDType::BF16,
            fast,
        )
        .map_err(|e| e.to_string())?;
        let inv = f64::from(1.0 / sa) * f64::from(1.0 / sb);
        let want: Vec<f32> = (0..m * n)
            .map(|i| {
                let (r, c) = (i / n, i % n);
                let dot: f64 = (0..k)
                    .map(|j| f64::from(a[r * k + j]) * f64::from(b[c * k + j]))
                    .sum();
                (dot * inv + if bias { f64::from(bias_values[c]) } else { 0.0 }) as f32
            })
            .collect();
        let got = TensorData::new(f32s(&got)?, [m, n]);
        let want = round(TensorData::new(want, [m, n]), DType::BF16);
        Ok(compare::compare(
            &got.convert::<burn::tensor::bf16>(),
            &want,
            2.0,
        ))
    });
    match result {
        Ok(errors) => Row {
            op: "fp8_matmul".into(),
            dtype: "fp8",
            shape,
            errors,
            note,
        },
        Err(e) => Row {
            op: "fp8_matmul".into(),
            dtype: "fp8",
            shape,
            errors: failed(),
            note: format!("backend: {}", first_line(&e)),
        },
    }
}

fn update_row(device: &Arc<CudaDevice>, rng: &mut StdRng) -> Row {
    let settings = Fp8Settings {
        forward: Fp8Format::E4m3,
        backward: Fp8Format::E5m2,
        scaling: Fp8Scaling::Delayed {
            history: 4,
            algo: AmaxAlgo::Max,
        },
        margin: 1,
    };
    let layers = 37;
    let result = guarded(|| {
        let mut state = settings.initial_state(layers);
        for v in state.iter_mut() {
            *v = rng.random_range(0.0f32..500.0);
        }
        let specials = [0.0, f32::INFINITY, f32::NAN, 1e-42, 3.0];
        let width = settings.block_width();
        for (block, special) in specials.iter().enumerate() {
            state[block * width + AMAX] = *special;
        }
        let mut ok = 0;
        for algo in [AmaxAlgo::Max, AmaxAlgo::MostRecent] {
            let settings = Fp8Settings {
                scaling: Fp8Scaling::Delayed { history: 4, algo },
                ..settings
            };
            let t = upload_f32(device, &state, &[layers, settings.row_width()]);
            ferrotron_cuda::fp8::update_scaling(&t, &settings).map_err(|e| e.to_string())?;
            let mut want = state.clone();
            update_state(&mut want, &settings);
            ok += differing(&f32s(&t)?, &want);
        }
        Ok((ok, state.len()))
    });
    let shape = format!("[{layers}, {}]", settings.row_width());
    match result {
        Ok((bad, n)) => exact_row(
            "fp8_scale_update",
            shape,
            "history 4, margin 1, max and most recent, 0/inf/NaN amaxes; exact".into(),
            bad,
            n,
        ),
        Err(e) => Row {
            op: "fp8_scale_update".into(),
            dtype: "fp8",
            shape,
            errors: failed(),
            note: format!("backend: {}", first_line(&e)),
        },
    }
}

/// Output and gradients (dx, dW, db) of `Σ g ∘ linear(x)` over two steps, then the state.
fn linear_steps<B>(
    inputs: &[TensorData; 3],
    g: &TensorData,
    fp8: Option<&Fp8Linear>,
    device: &B::Device,
) -> TensorData
where
    B::InnerBackend: FusedOps + ferrotron_parallel::ParallelOps,
    B: burn::tensor::backend::AutodiffBackend + FusedOps,
{
    let mut pieces = Vec::new();
    for _ in 0..2 {
        let leaf = |d: &TensorData| {
            Tensor::<B, 2>::from_data(d.clone(), (device, DType::BF16)).require_grad()
        };
        let (x, w) = (leaf(&inputs[0]), leaf(&inputs[1]));
        let b = Tensor::<B, 1>::from_data(inputs[2].clone(), (device, DType::BF16)).require_grad();
        let y = match fp8 {
            Some(fp8) => Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(B::fp8_linear(
                x.clone().into_primitive().tensor(),
                w.clone().into_primitive().tensor(),
                Some(b.clone().into_primitive().tensor()),
                fp8,
            ))),
            None => linear(x.clone(), w.clone(), Some(b.clone())),
        };
        let weights = Tensor::<B, 2>::from_data(g.clone(), (device, DType::F32));
        let grads = (y.clone().cast(DType::F32) * weights).sum().backward();
        let flat = |t: Tensor<B::InnerBackend, 2>| t.cast(DType::F32).reshape([-1]);
        pieces.push(flat(y.inner()));
        pieces.push(flat(x.grad(&grads).expect("dx")));
        pieces.push(flat(w.grad(&grads).expect("dW")));
        pieces.push(b.grad(&grads).expect("db").cast(DType::F32).reshape([-1]));
        if let Some(fp8) = fp8 {
            end_fp8_step::<B::InnerBackend>(fp8.state(), &[&solo()]);
            pieces.push(state_rows(fp8.state(), &pieces[0].device()));
        }
    }
    Tensor::cat(pieces, 0).into_data()
}

/// Every slot's scaling state after a step, flat: one more piece of a run's output to compare.
pub(crate) fn state_rows<K: burn::tensor::backend::Backend>(
    state: &Fp8State,
    device: &K::Device,
) -> Tensor<K, 1> {
    let rows: Vec<f32> = state
        .rows::<K>()
        .into_iter()
        .flat_map(|(_, row)| row)
        .collect();
    let n = rows.len();
    Tensor::from_data(TensorData::new(rows, [n]), device)
}

/// Megatron's hybrid format with delayed scaling over a history of two: the layer rows' recipe.
pub(crate) fn hybrid_delayed() -> Fp8Settings {
    Fp8Settings {
        forward: Fp8Format::E4m3,
        backward: Fp8Format::E5m2,
        scaling: Fp8Scaling::Delayed {
            history: 2,
            algo: AmaxAlgo::MostRecent,
        },
        margin: 0,
    }
}

fn linear_row(device: &GpuDevice, rng: &mut StdRng, [m, k, n]: [usize; 3]) -> Vec<Row> {
    let settings = hybrid_delayed();
    let data = |rng: &mut StdRng, shape: &[usize], scale: f32| {
        let n = shape.iter().product();
        TensorData::new(bf16_values(rng, n, scale), shape.to_vec())
    };
    let inputs = [
        data(rng, &[m, k], 2.0),
        data(rng, &[k, n], 0.05),
        data(rng, &[n], 0.1),
    ];
    let g = data(rng, &[m, n], 1.0);
    let layer = || Fp8Linear::new(&Fp8State::new(settings, vec!["layer".into()]), 0);
    let shape = format!("[{m}, {k}]·[{k}, {n}]");
    let got = guarded(|| {
        Ok(linear_steps::<Autodiff<ferrotron_cuda::Cuda>>(
            &inputs,
            &g,
            Some(&layer()),
            device,
        ))
    });
    let want = guarded(|| {
        Ok(linear_steps::<Autodiff<Flex>>(
            &inputs,
            &g,
            Some(&layer()),
            &Default::default(),
        ))
    });
    let bf16 = guarded(|| {
        Ok(linear_steps::<Autodiff<ferrotron_cuda::Cuda>>(
            &inputs, &g, None, device,
        ))
    });
    let mut rows = Vec::new();
    let label = |what: &str| format!("fp8_linear {what}");
    match (&got, &want) {
        (Ok(got), Ok(want)) => rows.push(Row {
            op: label("vs reference"),
            dtype: "fp8",
            shape: shape.clone(),
            // both round the same fp8 products to bf16: only accumulation order differs
            errors: compare::compare(
                &round(got.clone(), DType::BF16),
                &round(want.clone(), DType::BF16),
                1.0,
            ),
            note: "2 steps: out, dx, dW, db, state; kernels vs host reference".into(),
        }),
        (Err(e), _) | (_, Err(e)) => rows.push(Row {
            op: label("vs reference"),
            dtype: "fp8",
            shape: shape.clone(),
            errors: failed(),
            note: first_line(e),
        }),
    }
    match (&got, &bf16) {
        (Ok(got), Ok(bf16)) => {
            let errors = relative_errors(got, bf16, [m, k, n]);
            let worst = errors.iter().copied().fold(0.0, f64::max);
            rows.push(Row {
                op: label("vs bf16"),
                dtype: "fp8",
                shape,
                // e4m3 steps are 6 % apart and e5m2 12.5 %: a quantisation error of a few
                // percent of each tensor's norm, far below 10 %
                errors: Errors {
                    max_abs: worst,
                    max_rel: worst,
                    // NaN (a run that wrote nothing) fails too
                    bad: usize::from(worst.is_nan() || worst >= 0.1),
                    mismatch: None,
                },
                note: format!(
                    "step 1, ‖fp8 − bf16‖ / ‖bf16‖: out {:.3}, dx {:.3}, dW {:.3}, db {:.3}",
                    errors[0], errors[1], errors[2], errors[3]
                ),
            });
        }
        (Err(e), _) | (_, Err(e)) => rows.push(Row {
            op: label("vs bf16"),
            dtype: "fp8",
            shape,
            errors: failed(),
            note: first_line(e),
        }),
    }
    rows
}

/// The relative error in norm of the first step's output, dx, dW and db of two runs.
fn relative_errors(got: &TensorData, want: &TensorData, [m, k, n]: [usize; 3]) -> [f64; 4] {
    let values = |d: &TensorData| {
        d.clone()
            .convert::<f32>()
            .to_vec::<f32>()
            .unwrap_or_default()
    };
    let (got, want) = (values(got), values(want));
    let mut errors = [f64::NAN; 4];
    let mut start = 0;
    for (i, len) in [m * n, m * k, k * n, n].into_iter().enumerate() {
        let range = start..start + len;
        start += len;
        let (Some(g), Some(w)) = (got.get(range.clone()), want.get(range)) else {
            break;
        };
        let diff: f64 = g.iter().zip(w).map(|(a, b)| f64::from(a - b).powi(2)).sum();
        let norm: f64 = w.iter().map(|b| f64::from(*b).powi(2)).sum();
        errors[i] = (diff / norm.max(f64::MIN_POSITIVE)).sqrt();
    }
    errors
}

/// Every fp8 row (only `--filter fp8`, or the whole table, on a GPU with fp8).
pub(crate) fn rows(device: &GpuDevice) -> Vec<Row> {
    let engine = match CudaDevice::get(device.ordinal) {
        Ok(engine) => engine,
        Err(e) => {
            return vec![Row {
                op: "fp8".into(),
                dtype: "fp8",
                shape: "-".into(),
                errors: failed(),
                note: first_line(&e.to_string()),
            }];
        }
    };
    if let Err(why) = ferrotron_cuda::fp8::supported(&engine) {
        return vec![Row {
            op: "fp8".into(),
            dtype: "fp8",
            shape: "-".into(),
            errors: failed(),
            note: why,
        }];
    }
    let mut rng = StdRng::seed_from_u64(17);
    let mut rows = Vec::new();
    for format in [Fp8Format::E4m3, Fp8Format::E5m2] {
        for current in [false, true] {
            rows.push(cast_row(&engine, &mut rng, [200, 136], format, current));
        }
    }
    rows.push(cast_row(
        &engine,
        &mut rng,
        [2048, 1024],
        Fp8Format::E4m3,
        false,
    ));
    rows.push(amax_row(&engine, &mut rng));
    rows.extend(crate::fp8_source::rows(&engine, &mut rng));
    let (e4, e5) = (Fp8Format::E4m3, Fp8Format::E5m2);
    rows.push(matmul_row(
        &engine,
        &mut rng,
        [256, 384, 512],
        (e4, e4),
        true,
        true,
    ));
    rows.push(matmul_row(
        &engine,
        &mut rng,
        [272, 528, 400],
        (e5, e4),
        false,
        false,
    ));
    rows.push(matmul_row(
        &engine,
        &mut rng,
        [512, 384, 272],
        (e4, e5),
        false,
        false,
    ));
    rows.push(update_row(&engine, &mut rng));
    rows.extend(linear_row(device, &mut rng, [256, 512, 384]));
    rows.extend(linear_row(device, &mut rng, [272, 528, 400]));
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cast_inputs_are_bf16_values_with_a_saturating_outlier() {
        let x = cast_input(&mut StdRng::seed_from_u64(5), 64);
        for v in &x {
            assert_eq!(
                burn::tensor::bf16::from_f32(*v).to_f32().to_bits(),
                v.to_bits()
            );
        }
        let most = DELAYED_SCALE * ferrotron_ops::fp8::scaling::amax(&x);
        assert!(most > Fp8Format::E5m2.max(), "{most}");
    }

    #[test]
    fn decoding_inverts_the_host_rounding() {
        for format in [Fp8Format::E4m3, Fp8Format::E5m2] {
            let mut seen = 0;
            for b in 0..=255u8 {
                let v = decode(b, format);
                if v.is_finite() {
                    assert_eq!(round_to_fp8(v, format).to_bits(), v.to_bits(), "{b:#x}");
                    seen += 1;
                }
            }
            // e4m3: 254 finite codes (two NaNs); e5m2: 248 (two infinities, six NaNs)
            assert_eq!(seen, if format == Fp8Format::E4m3 { 254 } else { 248 });
        }
        assert_eq!(decode(0x7e, Fp8Format::E4m3), 448.0);
        assert_eq!(decode(0x7b, Fp8Format::E5m2), 57344.0);
        assert_eq!(decode(0x01, Fp8Format::E4m3), 2f32.powi(-9));
    }

    #[test]
    fn the_fp8_linear_rows_run_the_reference_on_flex() {
        let settings = Fp8Settings {
            forward: Fp8Format::E4m3,
            backward: Fp8Format::E5m2,
            scaling: Fp8Scaling::Current,
            margin: 0,
        };
        let layer = Fp8Linear::new(&Fp8State::new(settings, vec!["l".into()]), 0);
        let mut rng = StdRng::seed_from_u64(1);
        let data = |rng: &mut StdRng, shape: &[usize]| {
            let n = shape.iter().product();
            TensorData::new(bf16_values(rng, n, 1.0), shape.to_vec())
        };
        let inputs = [
            data(&mut rng, &[16, 32]),
            data(&mut rng, &[32, 16]),
            data(&mut rng, &[16]),
        ];
        let g = data(&mut rng, &[16, 16]);
        let out = linear_steps::<Autodiff<Flex>>(&inputs, &g, Some(&layer), &Default::default());
        // two steps of out (256), dx (512), dW (512), db (16); current scaling keeps no state
        assert_eq!(out.num_elements(), 2 * (256 + 512 + 512 + 16));
        let pieces = relative_errors(&out, &out, [16, 32, 16]);
        assert_eq!(pieces, [0.0; 4]);
    }
}
