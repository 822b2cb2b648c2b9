//! Rows for the norm's fp8 cast (`FusedOps::fp8_quantize_norm`, Transformer Engine's
//! `LayerNormLinear` input): the row statistics pass and the cast that normalises as it reads,
//! against the norm kernel's 16-bit output cast by the plain cast, on the same GPU from the
//! same inputs and the same delayed scale (each path's layer state warmed up by one identical
//! step). The statistics must match to the bit (the same kernel arithmetic); an fp8 byte may
//! differ only by one grid step, and at most one in a thousand (the two kernels may contract
//! the norm's multiply-add differently before rounding to bf16); the amax recorded must match.

use burn::tensor::{DType, Tensor, TensorData};
use ferrotron_cuda::{Cuda, GpuDevice};
use ferrotron_parallel::{
    Fp8InputNorm, Fp8Linear, Fp8State, Fp8Tensor, FusedOps, NormKind, NormSpec, NormStats,
    end_fp8_step, fp8_quantize_norm_composed,
};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::compare::Errors;
use crate::fp8::{bf16_values, decoded, f32s, hybrid_delayed};
use crate::{Row, failed, first_line, guarded};

type Quantize = fn(
    burn::tensor::ops::FloatTensor<Cuda>,
    Fp8InputNorm<Cuda>,
    &Fp8Linear,
    bool,
) -> (Fp8Tensor<Cuda>, NormStats<Cuda>);

/// Everything one path produces: the cast's bytes decoded, its transpose's, its inverse scale,
/// the statistics and the layer's state row after the cast recorded its amax.
fn run(
    quantize: Quantize,
    inputs: &[TensorData; 4],
    kind: NormKind,
    device: &GpuDevice,
) -> Result<[Vec<f32>; 5], String> {
    let state = Fp8State::new(hybrid_delayed(), vec!["qkv".into()]);
    let layer = Fp8Linear::new(&state, 0);
    let upload = |d: &TensorData| {
        Tensor::<Cuda, 2>::from_data(d.clone(), (device, DType::BF16))
            .into_primitive()
            .tensor()
    };
    let param = |d: &TensorData| {
        Tensor::<Cuda, 1>::from_data(d.clone(), (device, DType::BF16))
            .into_primitive()
            .tensor()
    };
    let norm = || Fp8InputNorm {
        gamma: param(&inputs[2]),
        beta: (kind == NormKind::Layer).then(|| param(&inputs[3])),
        spec: NormSpec {
            kind,
            epsilon: 1e-5,
        },
    };
    // The first step measures its scale from the tensor (both paths take the composed cast);
    // the second casts with the delayed scale that step left.
    quantize(upload(&inputs[0]), norm(), &layer, true);
    end_fp8_step::<Cuda>(&state, &[]);
    let (cast, stats) = quantize(upload(&inputs[1]), norm(), &layer, true);
    let mut statistics = f32s(&stats.rstd).map_err(|e| e.to_string())?;
    if let Some(mean) = &stats.mean {
        statistics.extend(f32s(mean).map_err(|e| e.to_string())?);
    }
    let row: Vec<f32> = state
        .rows::<Cuda>()
        .into_iter()
        .flat_map(|(_, row)| row)
        .collect();
    Ok([
        decoded(&cast.data, cast.format)?,
        decoded(&cast.transposed, cast.format)?,
        f32s(&cast.scale_inv).map_err(|e| e.to_string())?,
        statistics,
        row,
    ])
}

/// `(bytes off by one grid step, bytes off by more)` between two decoded casts.
fn grid_steps(got: &[f32], want: &[f32]) -> (usize, usize) {
    let mut near = 0;
    let mut far = 0;
    for (g, w) in got.iter().zip(want) {
        if g.to_bits() == w.to_bits() {
            continue;
        }
        // One e4m3 step is at most 1/8 of the value's magnitude (2^-3 mantissa).
        if (g - w).abs() <= 0.125 * g.abs().max(w.abs()) {
            near += 1;
        } else {
            far += 1;
        }
    }
    (near, far + got.len().abs_diff(want.len()))
}

fn norm_row(device: &GpuDevice, rng: &mut StdRng, kind: NormKind, [rows, cols]: [usize; 2]) -> Row {
    let data = |rng: &mut StdRng, shape: Vec<usize>, scale: f32, offset: f32| {
        let n = shape.iter().product();
        let values = bf16_values(rng, n, scale)
            .into_iter()
            .map(|v| v + offset)
            .collect::<Vec<_>>();
        TensorData::new(values, shape)
    };
    let inputs = [
        data(rng, vec![rows, cols], 2.0, 0.5),
        data(rng, vec![rows, cols], 2.0, 0.5),
        data(rng, vec![cols], 0.3, 1.0),
        data(rng, vec![cols], 0.2, 0.0),
    ];
    let got = guarded(|| run(Cuda::fp8_quantize_norm, &inputs, kind, device));
    let want = guarded(|| run(fp8_quantize_norm_composed::<Cuda>, &inputs, kind, device));
    let (errors, note) = match (got, want) {
        (Ok(got), Ok(want)) => {
            let (near_rows, far_rows) = grid_steps(&got[0], &want[0]);
            let (near_cols, far_cols) = grid_steps(&got[1], &want[1]);
            let exact = |i: usize| {
                got[i].len() != want[i].len()
                    || got[i]
                        .iter()
                        .zip(&want[i])
                        .any(|(g, w)| g.to_bits() != w.to_bits())
            };
            let allowed = (rows * cols).div_ceil(1000);
            let bad = far_rows
                + far_cols
                + near_rows.saturating_sub(allowed)
                + near_cols.saturating_sub(allowed)
                + [2, 3, 4].into_iter().filter(|&i| exact(i)).count();
            (
                Errors {
                    max_abs: (near_rows + near_cols) as f64,
                    max_rel: 0.0,
                    bad,
                    mismatch: None,
                },
                format!(
                    "norm cast vs norm kernel + cast: {near_rows} + {near_cols} bytes one step off, \
                     {far_rows} + {far_cols} further; scale⁻¹, statistics, amax exact"
                ),
            )
        }
        (Err(e), _) => (failed(), format!("fused: {}", first_line(&e))),
        (_, Err(e)) => (failed(), format!("composed: {}", first_line(&e))),
    };
    Row {
        op: format!(
            "fp8_quantize_norm {}",
            if kind == NormKind::Layer {
                "layer"
            } else {
                "rms"
            }
        ),
        dtype: "bf16→fp8",
        shape: format!("[{rows}, {cols}]"),
        errors,
        note,
    }
}

/// LayerNorm (with β) and RMSNorm at a layer's width, and a row count that leaves the last
/// band of rows partly filled.
pub(crate) fn rows(device: &GpuDevice) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(23);
    let mut rows = Vec::new();
    for kind in [NormKind::Layer, NormKind::Rms] {
        rows.push(norm_row(device, &mut rng, kind, [512, 2048]));
        rows.push(norm_row(device, &mut rng, kind, [520, 1024]));
    }
    rows
}
