//! Rows for QK-norm on the packed projection (Megatron's `--qk-layernorm`): the fused node in f32
//! and bf16 against the composed per-head norms in f32 on the same GPU from the same rounded
//! inputs: the normalised projection, its packed gradient (every slot of which the kernels must
//! write: outputs are poisoned) and the query's and key's weight (and, LayerNorm, bias)
//! gradients of a weighted-sum loss. RMSNorm and LayerNorm, head dims 64 and 128, two groups of
//! four query heads each.

use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use ferrotron_cuda::{Cuda, GpuDevice};
use ferrotron_ops::{FusedOps, NormKind, NormSpec, QkNormParams, composed_qk_norm};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::compare;
use crate::fused::{A, dtype_label, host, round, upload};
use crate::{Row, failed, first_line, guarded};

fn spec(kind: NormKind) -> NormSpec {
    NormSpec {
        kind,
        epsilon: 1e-6,
    }
}

/// Output, d qkv and the parameters' gradients of `Σ w ∘ qk_norm(qkv)`, flattened into one f32
/// tensor; fused node (`FUSED`) or composed. `data`: qkv, w, then the four parameters.
fn grads<const FUSED: bool>(
    data: &[TensorData; 6],
    dtype: DType,
    kind: NormKind,
    device: &GpuDevice,
) -> TensorData {
    let x: Tensor<A, 5> = upload(&data[0], dtype, device);
    let w = Tensor::<A, 5>::from_data(round(data[1].clone(), DType::F32), (device, DType::F32));
    let layer = kind == NormKind::Layer;
    let count = if layer { 4 } else { 2 };
    let params: Vec<Tensor<A, 1>> = data[2..2 + count]
        .iter()
        .map(|d| upload(d, dtype, device))
        .collect();
    let prim = |t: &Tensor<A, 1>| t.clone().into_primitive().tensor();
    let qk = QkNormParams {
        weight: [prim(&params[0]), prim(&params[1])],
        bias: layer.then(|| [prim(&params[2]), prim(&params[3])]),
    };
    let input = x.clone().into_primitive().tensor();
    let out = if FUSED {
        A::fused_qk_norm(input, qk, spec(kind))
    } else {
        composed_qk_norm::<A>(input, qk, spec(kind))
    };
    let out: Tensor<A, 5> = Tensor::from_primitive(TensorPrimitive::Float(out));
    let g = (out.clone().cast(DType::F32) * w).sum().backward();
    let mut parts = vec![
        out.inner().cast(DType::F32).reshape([-1]),
        x.grad(&g).expect("d qkv").cast(DType::F32).reshape([-1]),
    ];
    parts.extend(
        params
            .iter()
            .map(|p| p.grad(&g).expect("a parameter's gradient").cast(DType::F32)),
    );
    Tensor::cat(parts, 0).into_data()
}

fn row(device: &GpuDevice, rng: &mut StdRng, dtype: DType, kind: NormKind, dim: usize) -> Row {
    let shape = [2, 128, 2, 6, dim];
    let mut x = host(&shape, rng, DType::F32).to_vec::<f32>().expect("f32");
    // An offset and a scale per head row, as projections have: LayerNorm's mean matters.
    for (i, v) in x.iter_mut().enumerate() {
        *v = *v * (1.0 + (i / dim % 5) as f32) + (i / dim % 3) as f32;
    }
    let weight = |rng: &mut StdRng| {
        let v: Vec<f32> = host(&[dim], rng, DType::F32)
            .to_vec::<f32>()
            .expect("f32")
            .into_iter()
            .map(|v| 1.0 + 0.5 * v)
            .collect();
        round(TensorData::new(v, [dim]), dtype)
    };
    let data = [
        round(TensorData::new(x, shape.to_vec()), dtype),
        host(&shape, rng, DType::F32),
        weight(rng),
        weight(rng),
        host(&[dim], rng, dtype),
        host(&[dim], rng, dtype),
    ];
    let kernel = guarded(|| {
        Ok(Cuda::has_qk_norm_kernel(
            &Tensor::<Cuda, 5>::zeros(shape, (device, dtype))
                .into_primitive()
                .tensor(),
            &Tensor::<Cuda, 1>::zeros([dim], (device, dtype))
                .into_primitive()
                .tensor(),
            &spec(kind),
        ))
    })
    .unwrap_or(false);
    let got = guarded(|| Ok(grads::<true>(&data, dtype, kind, device)));
    let want = guarded(|| Ok(grads::<false>(&data, DType::F32, kind, device)));
    let layer = kind == NormKind::Layer;
    let (errors, note) = match (got, want) {
        (Ok(g), Ok(w)) => (
            compare::compare(&round(g, dtype), &round(w, dtype), 8.0),
            format!(
                "{} vs composed f32; out + packed d qkv, dγ q/k{}",
                if kernel {
                    "fused kernel"
                } else {
                    "composed (no kernel!)"
                },
                if layer { ", dβ q/k" } else { "" }
            ),
        ),
        (Err(e), _) => (failed(), format!("fused: {}", first_line(&e))),
        (_, Err(e)) => (failed(), format!("composed: {}", first_line(&e))),
    };
    let errors = if kernel { errors } else { failed() };
    Row {
        op: format!(
            "fused_qk_norm {} d{dim}",
            if layer { "layer" } else { "rms" }
        ),
        dtype: dtype_label(dtype),
        shape: format!("qkv {shape:?}"),
        errors,
        note,
    }
}

/// Every QK-norm row.
pub(crate) fn rows(device: &GpuDevice) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(31);
    let mut rows = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        for kind in [NormKind::Rms, NormKind::Layer] {
            for dim in [64, 128] {
                rows.push(row(device, &mut rng, dtype, kind, dim));
            }
        }
    }
    rows
}
