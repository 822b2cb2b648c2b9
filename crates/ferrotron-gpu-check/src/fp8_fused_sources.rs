//! Rows for the fp8 casts that compute a layer's 16-bit tensor on the way in instead of reading
//! it: the norm's output (`FusedOps::fp8_quantize_norm`, Transformer Engine's `LayerNormLinear`
//! input: a row statistics pass, then a cast that normalises as it reads), RoPE's backward of
//! the QKV projection's gradient (`Fp8Source::RopeGrad`) and the dropped gradient of a residual
//! add with dropout (`Fp8Source::DropoutGrad`). Each runs against the 16-bit kernel's output
//! cast by the plain cast, on the same GPU from the same inputs and the same delayed scale (each
//! path's layer state warmed up by one identical step). The statistics must match to the bit
//! (the same kernel arithmetic); an fp8 byte may differ only by one grid step, and at most one
//! in a thousand (two kernels may contract a multiply-add differently before rounding to bf16);
//! the inverse scale and the amax recorded must match.

use burn::tensor::{DType, Tensor, TensorData};
use ferrotron_cuda::{Cuda, GpuDevice};
use ferrotron_ops::fp8::scaling::Fp8Role;
use ferrotron_ops::{
    Fp8InputNorm, Fp8Linear, Fp8Rope, Fp8Source, Fp8State, Fp8Tensor, FusedOps, NormKind, NormSpec,
    NormStats, fp8_quantize_norm_composed, fp8_quantize_source_composed,
};
use ferrotron_parallel::end_fp8_step;
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
) -> Result<Vec<Vec<f32>>, String> {
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
    Ok(vec![
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

/// The errors of a fused cast (`got`) against the 16-bit kernel then the plain cast (`want`):
/// parts 0 and 1 are the decoded bytes and their transpose (one grid step allowed on one byte
/// in a thousand), every later part must match to the bit.
fn compare_casts(
    got: Result<Vec<Vec<f32>>, String>,
    want: Result<Vec<Vec<f32>>, String>,
    elements: usize,
    what: &str,
) -> (Errors, String) {
    let (got, want) = match (got, want) {
        (Ok(got), Ok(want)) => (got, want),
        (Err(e), _) => return (failed(), format!("fused: {}", first_line(&e))),
        (_, Err(e)) => return (failed(), format!("composed: {}", first_line(&e))),
    };
    let (near_rows, far_rows) = grid_steps(&got[0], &want[0]);
    let (near_cols, far_cols) = grid_steps(&got[1], &want[1]);
    let inexact = (2..want.len())
        .filter(|&i| {
            got[i].len() != want[i].len()
                || got[i]
                    .iter()
                    .zip(&want[i])
                    .any(|(g, w)| g.to_bits() != w.to_bits())
        })
        .count();
    let allowed = elements.div_ceil(1000);
    let bad = far_rows
        + far_cols
        + near_rows.saturating_sub(allowed)
        + near_cols.saturating_sub(allowed)
        + inexact;
    (
        Errors {
            max_abs: (near_rows + near_cols) as f64,
            max_rel: 0.0,
            bad,
            mismatch: None,
        },
        format!(
            "{what}: {near_rows} + {near_cols} bytes one step off, {far_rows} + {far_cols} \
             further; {inexact} of the exact parts differ"
        ),
    )
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
    let (errors, note) = compare_casts(got, want, rows * cols, "norm cast vs norm kernel + cast");
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

/// A gradient cast's parts: bytes, transpose, inverse scale, the state row after it recorded
/// its amax. `quantize` is the backend's cast of a source or the composed one; `source` makes
/// the source from a gradient (the first warms the layer's scale up, the second is compared).
fn run_source(
    quantize: QuantizeSource,
    source: &dyn Fn(&TensorData) -> Fp8Source<Cuda>,
    grads: &[TensorData; 2],
    bias_grad: bool,
) -> Result<Vec<Vec<f32>>, String> {
    let state = Fp8State::new(hybrid_delayed(), vec!["layer".into()]);
    let layer = Fp8Linear::new(&state, 0);
    quantize(
        source(&grads[0]),
        &layer,
        Fp8Role::GradOutput,
        true,
        bias_grad,
    );
    end_fp8_step::<Cuda>(&state, &[]);
    let (cast, bias) = quantize(
        source(&grads[1]),
        &layer,
        Fp8Role::GradOutput,
        true,
        bias_grad,
    );
    let row: Vec<f32> = state
        .rows::<Cuda>()
        .into_iter()
        .flat_map(|(_, row)| row)
        .collect();
    let mut parts = vec![
        decoded(&cast.data, cast.format)?,
        decoded(&cast.transposed, cast.format)?,
        f32s(&cast.scale_inv).map_err(|e| e.to_string())?,
        row,
    ];
    if let Some(bias) = bias {
        let bias = bias
            .cast(ferrotron_cuda::DType::F32)
            .map_err(|e| e.to_string())?;
        parts.push(f32s(&bias).map_err(|e| e.to_string())?);
    }
    Ok(parts)
}

fn upload(device: &GpuDevice, d: &TensorData) -> burn::tensor::ops::FloatTensor<Cuda> {
    Tensor::<Cuda, 2>::from_data(d.clone(), (device, DType::BF16))
        .into_primitive()
        .tensor()
}

type QuantizeSource = fn(
    Fp8Source<Cuda>,
    &Fp8Linear,
    Fp8Role,
    bool,
    bool,
) -> (
    Fp8Tensor<Cuda>,
    Option<burn::tensor::ops::FloatTensor<Cuda>>,
);

/// The gradient of a packed projection `[batch · seq, groups · slots · head_dim]` rotated back.
fn rope_row(
    device: &GpuDevice,
    rng: &mut StdRng,
    [batch, seq, groups, slots, head_dim]: [usize; 5],
) -> Row {
    let (rows, cols) = (batch * seq, groups * slots * head_dim);
    let data = |rng: &mut StdRng, shape: [usize; 2]| {
        TensorData::new(bf16_values(rng, shape[0] * shape[1], 2.0), shape.to_vec())
    };
    let grads = [data(rng, [rows, cols]), data(rng, [rows, cols])];
    let tables = [data(rng, [seq, head_dim]), data(rng, [seq, head_dim])];
    let source = |grad: &TensorData| Fp8Source::RopeGrad {
        grad: upload(device, grad),
        rope: Fp8Rope {
            cos: upload(device, &tables[0]),
            sin: upload(device, &tables[1]),
            groups,
            slots,
            head_dim,
        },
    };
    let got = guarded(|| run_source(Cuda::fp8_quantize_source, &source, &grads, false));
    let want = guarded(|| run_source(fp8_quantize_source_composed::<Cuda>, &source, &grads, false));
    let (errors, note) = compare_casts(
        got,
        want,
        rows * cols,
        "RoPE grad cast vs RoPE kernel + cast",
    );
    Row {
        op: "fp8_cast_source rope grad".into(),
        dtype: "bf16→fp8",
        shape: format!("[{batch}·{seq}, {groups}·{slots}·{head_dim}]"),
        errors,
        note,
    }
}

/// The dropped input's gradient of a residual add with hidden dropout (probability 0.1), the
/// keep bits those of a real dropout-add forward on this GPU.
fn dropout_row(device: &GpuDevice, rng: &mut StdRng, [rows, cols]: [usize; 2]) -> Row {
    const PROB: f64 = 0.1;
    let mut data = || TensorData::new(bf16_values(rng, rows * cols, 2.0), vec![rows, cols]);
    let grads = [data(), data()];
    let zeros = || {
        upload(
            device,
            &TensorData::new(vec![0f32; rows * cols], vec![rows, cols]),
        )
    };
    let mask = guarded(|| Ok(Cuda::dropout_add_kernel_forward(zeros(), zeros(), PROB).mask));
    let (errors, note) = match mask {
        Ok(mask) => {
            let source = |grad: &TensorData| Fp8Source::DropoutGrad {
                grad: upload(device, grad),
                mask: mask.clone(),
                prob: PROB,
            };
            let got = guarded(|| run_source(Cuda::fp8_quantize_source, &source, &grads, true));
            let want =
                guarded(|| run_source(fp8_quantize_source_composed::<Cuda>, &source, &grads, true));
            compare_casts(
                got,
                want,
                rows * cols,
                "dropout grad cast vs dropout kernel + cast",
            )
        }
        Err(e) => (failed(), format!("dropout forward: {}", first_line(&e))),
    };
    Row {
        op: "fp8_cast_source dropout grad".into(),
        dtype: "bf16→fp8",
        shape: format!("[{rows}, {cols}]"),
        errors,
        note,
    }
}

/// LayerNorm (with β) and RMSNorm at a layer's width, and a row count that leaves the last
/// band of rows partly filled; RoPE's backward at head dims 64 and 128 with grouped and plain
/// heads; the dropout gradient with a partly filled last band.
pub(crate) fn rows(device: &GpuDevice) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(23);
    let mut rows = Vec::new();
    for kind in [NormKind::Layer, NormKind::Rms] {
        rows.push(norm_row(device, &mut rng, kind, [512, 2048]));
        rows.push(norm_row(device, &mut rng, kind, [520, 1024]));
    }
    rows.push(rope_row(device, &mut rng, [2, 128, 2, 6, 64]));
    rows.push(rope_row(device, &mut rng, [3, 40, 2, 3, 128]));
    rows.push(dropout_row(device, &mut rng, [520, 1024]));
    rows
}
