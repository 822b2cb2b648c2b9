//! Rows for attention from the packed QKV projection: the packed node (cuDNN reading q, k, v as
//! views of the projection and writing one packed gradient) in bf16 against the composed
//! attention in f32 on the same GPU from the same rounded projection: the output and the packed
//! gradient of a weighted-sum loss (every slot of which the kernel must write: outputs are
//! poisoned). Multi-head (query read in place) and grouped-query (query copied) both.
//! The timing row puts the packed step beside the sliced one the model ran before.

use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use ferrotron_cuda::{Cuda, GpuDevice};
use ferrotron_ops::{AttentionSpec, FusedOps, composed_qkv_attention};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::compare;
use crate::fused::{A, dtype_label, host, median_ms, round, upload};
use crate::{Row, failed, first_line, guarded};

/// Output and d qkv of `Σ w ∘ attention(qkv)`, packed node (`FUSED`) or composed.
fn packed_grads<const FUSED: bool>(
    qkv: &TensorData,
    weights: &TensorData,
    dtype: DType,
    spec: AttentionSpec,
    device: &GpuDevice,
) -> TensorData {
    let x: Tensor<A, 5> = upload(qkv, dtype, device);
    let w = Tensor::<A, 4>::from_data(round(weights.clone(), DType::F32), (device, DType::F32));
    let primitive = x.clone().into_primitive().tensor();
    let out = if FUSED {
        A::fused_qkv_attention(primitive, spec)
    } else {
        composed_qkv_attention::<A>(primitive, spec)
    };
    let out: Tensor<A, 4> = Tensor::from_primitive(TensorPrimitive::Float(out));
    let grads = (out.clone().cast(DType::F32) * w).sum().backward();
    let dx = x.grad(&grads).expect("d qkv");
    Tensor::cat(
        vec![
            out.inner().cast(DType::F32).reshape([-1]),
            dx.cast(DType::F32).reshape([-1]),
        ],
        0,
    )
    .into_data()
}

fn packed_row(device: &GpuDevice, rng: &mut StdRng, dims: [usize; 5]) -> Row {
    packed_row_with(device, rng, dims, AttentionSpec::causal())
}

/// One packed-attention row for `spec`: the packed node in bf16 against composed in f32.
pub(crate) fn packed_row_with(
    device: &GpuDevice,
    rng: &mut StdRng,
    [b, s, g, per, d]: [usize; 5],
    spec: AttentionSpec,
) -> Row {
    let dtype = DType::BF16;
    let qkv = host(&[b, s, g, per + 2, d], rng, dtype);
    let weights = host(&[b, s, g * per, d], rng, DType::F32);
    let probe = Tensor::<Cuda, 5>::zeros([b, s, g, per + 2, d], (device, dtype))
        .into_primitive()
        .tensor();
    let kernel = Cuda::has_qkv_attention_kernel(&probe, &spec);
    let got = guarded(|| Ok(packed_grads::<true>(&qkv, &weights, dtype, spec, device)));
    let want = guarded(|| {
        Ok(packed_grads::<false>(
            &qkv,
            &weights,
            DType::F32,
            spec,
            device,
        ))
    });
    let (errors, note) = match (got, want) {
        (Ok(got), Ok(want)) => (
            compare::compare(&round(got, dtype), &round(want, dtype), 4.0),
            format!(
                "{} vs composed f32; out + packed d qkv{}",
                if kernel {
                    "packed cuDNN"
                } else {
                    "composed (no kernel!)"
                },
                crate::fused::mask_label(&spec)
            ),
        ),
        (Err(e), _) => (failed(), format!("packed: {}", first_line(&e))),
        (_, Err(e)) => (failed(), format!("composed: {}", first_line(&e))),
    };
    let errors = if kernel { errors } else { failed() };
    Row {
        op: format!(
            "fused_qkv_attention d{d} {}{}",
            if per == 1 { "mha" } else { "gqa" },
            spec.window
                .map_or(String::new(), |left| format!(" window {left}"))
        ),
        dtype: dtype_label(dtype),
        shape: format!("qkv [{b}, {s}, {g}, {}, {d}]", per + 2),
        errors,
        note,
    }
}

/// Every packed-attention row.
pub(crate) fn rows(device: &GpuDevice) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(17);
    vec![
        packed_row(device, &mut rng, [2, 256, 4, 1, 64]),
        packed_row(device, &mut rng, [2, 320, 4, 1, 128]),
        packed_row(device, &mut rng, [2, 256, 2, 4, 128]),
    ]
}

/// Forward + backward of one layer's attention at gpt-1.3b's shape (micro batch 4): the packed
/// node against the model's former slices of the projection.
pub(crate) fn timings(device: &GpuDevice) -> String {
    let mut out = String::from(
        "| attention fwd+bwd (bf16, causal, autodiff) | packed ms | sliced ms |\n|---|---:|---:|\n",
    );
    let [b, s, g, d] = [4, 2048, 16, 128];
    let line = guarded(|| {
        let x = Tensor::<A, 5>::random(
            [b, s, g, 3, d],
            burn::tensor::Distribution::Normal(0.0, 1.0),
            device,
        )
        .cast(DType::BF16)
        .require_grad();
        let spec = AttentionSpec::causal();
        let run = |packed: bool| {
            let p = x.clone().into_primitive().tensor();
            let o = if packed {
                A::fused_qkv_attention(p, spec)
            } else {
                composed_qkv_attention::<A>(p, spec)
            };
            let o: Tensor<A, 4> = Tensor::from_primitive(TensorPrimitive::Float(o));
            let grads = o.sum().backward();
            let _ = x.grad(&grads);
        };
        let packed = median_ms(device, 10, || run(true));
        let sliced = median_ms(device, 10, || run(false));
        Ok(format!(
            "| b {b} s {s} heads {g} d {d} | {packed:.3} | {sliced:.3} |\n"
        ))
    });
    out.push_str(
        &line.unwrap_or_else(|e| format!("| b {b} s {s} | failed: {} |\n", first_line(&e))),
    );
    out
}
