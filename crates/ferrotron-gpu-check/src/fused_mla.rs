//! Rows for attention whose value head dim differs from the query/key one (multi-latent
//! attention: DeepSeek-V3's d_qk 192 = 128 plain + 64 rotary channels, d_v 128), through
//! `FusedOps::fused_attention` under autodiff as the model calls it.
//!
//! Each row runs on the GPU in bf16 (cuDNN's fused attention, which the row requires to have
//! served it), f16, or f32 (the composed path on the GPU: cuDNN has no f32 attention), and is
//! compared with the CPU reference backend: softmax(scale·q·kᵀ, causal)·v written out in f32 on
//! burn-flex under autodiff, from the same rounded inputs; output and dq, dk, dv of a
//! weighted-sum loss. The scale comes from the spec (DeepSeek-V3's yarn `mscale² / sqrt(192)` in
//! the 192/128 rows, the default `1/sqrt(d_qk)` in the others), so a kernel that took the scale
//! from another head dim fails. A dropout row checks that the backward regenerates the forward's
//! mask at 192/128 (`fused.rs`'s dropout check).
//!
//! MLA's other GPU work is composed burn ops (the low-rank projections are linears, the rotary
//! channels' de-interleave a reshape, a transpose and one copy, the shared rotary key broadcast
//! to the heads): the op table's rows and the `mla` / `deepseek` parity curves of
//! `gpu-train.sh` cover them, no kernel of their own.

use burn::backend::Autodiff;
use burn::backend::Flex;
use burn::backend::flex::FlexDevice;
use burn::tensor::activation::softmax;
use burn::tensor::{Bool, DType, Tensor, TensorData, TensorPrimitive};
use ferrotron_cuda::{Cuda, GpuDevice};
use ferrotron_ops::{AttentionSpec, FusedOps};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::compare;
use crate::fused::{attention_ms, bf16_normal, dropout_row_with, dtype_label, host, round};
use crate::{Row, failed, first_line, guarded};

/// DeepSeek-V3's softmax scale: `mscale² / sqrt(q_head_dim)` with yarn's
/// `mscale = 0.1 · mscale_all_dim · ln(factor) + 1` (factor 40, mscale_all_dim 1).
fn deepseek_v3_scale() -> f64 {
    let mscale = 0.1 * 40f64.ln() + 1.0;
    mscale * mscale / 192f64.sqrt()
}

/// `[batch, heads, key/value groups, seq, d_qk, d_v]` of one row.
type Dims = [usize; 6];

/// The weighted-sum loss's output and dq, dk, dv of `fused_attention` on `Autodiff<G>`,
/// flattened into one f32 tensor (`data`: q, k, v, the weights).
fn fused_outputs<G: FusedOps>(
    data: &[TensorData; 4],
    dtype: DType,
    spec: AttentionSpec,
    device: &G::Device,
) -> TensorData {
    type Ad<G> = Autodiff<G>;
    let upload = |d: &TensorData| {
        Tensor::<Ad<G>, 4>::from_data(round(d.clone(), dtype), (device, dtype)).require_grad()
    };
    let (q, k, v) = (upload(&data[0]), upload(&data[1]), upload(&data[2]));
    let w = Tensor::<Ad<G>, 4>::from_data(round(data[3].clone(), DType::F32), (device, DType::F32));
    let out = Ad::<G>::fused_attention(
        q.clone().into_primitive().tensor(),
        k.clone().into_primitive().tensor(),
        v.clone().into_primitive().tensor(),
        spec,
    );
    let out: Tensor<Ad<G>, 4> = Tensor::from_primitive(TensorPrimitive::Float(out));
    let grads = (out.clone().cast(DType::F32) * w).sum().backward();
    let flat = |t: Tensor<G, 4>| t.cast(DType::F32).reshape([-1]);
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

/// The same quantities from the attention written out in f32 on burn-flex (each key/value group
/// repeated for its query heads, causal as `spec` says, no dropout).
fn reference_outputs(data: &[TensorData; 4], spec: AttentionSpec) -> TensorData {
    type R = Autodiff<Flex>;
    let device = FlexDevice;
    let upload = |d: &TensorData| {
        Tensor::<R, 4>::from_data(round(d.clone(), DType::F32), &device).require_grad()
    };
    let (q, k, v) = (upload(&data[0]), upload(&data[1]), upload(&data[2]));
    let w = Tensor::<R, 4>::from_data(round(data[3].clone(), DType::F32), &device);
    let [b, h, s, d_qk] = q.dims();
    let repeat = |t: Tensor<R, 4>| {
        let [b, g, s, d] = t.dims();
        t.unsqueeze_dim::<5>(2)
            .expand([b, g, h / g, s, d])
            .reshape([b, h, s, d])
    };
    let (keys, values) = (repeat(k.clone()), repeat(v.clone()));
    let mut scores = q.clone().matmul(keys.swap_dims(2, 3)) * spec.scale_for(d_qk);
    if spec.causal {
        // True above the diagonal: the keys after each query.
        let future = Tensor::<R, 2, Bool>::tril_mask([s, s], 0, &device)
            .unsqueeze::<4>()
            .expand([b, h, s, s]);
        scores = scores.mask_fill(future, f32::NEG_INFINITY);
    }
    let out = softmax(scores, 3).matmul(values);
    let grads = (out.clone() * w).sum().backward();
    let flat = |t: Tensor<Flex, 4>| t.reshape([-1]);
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

/// One row: `fused_attention` on `G` in `dtype` against the f32 reference. `want_kernel`: the
/// row fails unless `G`'s fused kernel served it (cuDNN for 16-bit inputs on the GPU).
fn mla_row<G: FusedOps>(
    device: &G::Device,
    rng: &mut StdRng,
    [b, h, g, s, d_qk, d_v]: Dims,
    dtype: DType,
    spec: AttentionSpec,
    want_kernel: bool,
) -> Row {
    let data = [
        host(&[b, h, s, d_qk], rng, dtype),
        host(&[b, g, s, d_qk], rng, dtype),
        host(&[b, g, s, d_v], rng, dtype),
        host(&[b, h, s, d_v], rng, DType::F32),
    ];
    let probe = |shape: [usize; 4]| {
        Tensor::<G, 4>::zeros(shape, (device, dtype))
            .into_primitive()
            .tensor()
    };
    let kernel = guarded(|| {
        Ok(G::has_attention_kernel(
            &probe([b, h, s, d_qk]),
            &probe([b, g, s, d_qk]),
            &probe([b, g, s, d_v]),
            &spec,
        ))
    })
    .unwrap_or(false);
    let got = guarded(|| Ok(fused_outputs::<G>(&data, dtype, spec, device)));
    let want = guarded(|| Ok(reference_outputs(&data, spec)));
    let path = if kernel { "fused kernel" } else { "composed" };
    let scale = spec
        .scale
        .map_or(String::new(), |scale| format!(", scale {scale:.4}"));
    let (errors, note) = match (got, want) {
        (Ok(_), Ok(_)) if want_kernel && !kernel => (
            failed(),
            "the fused kernel did not take it (see cudnn::head_dims_supported)".to_string(),
        ),
        (Ok(got), Ok(want)) => (
            compare::compare(&round(got, dtype), &round(want, dtype), 4.0),
            format!("{path} vs f32 reference on the CPU; out + dq, dk, dv{scale}"),
        ),
        (Err(e), _) => (failed(), format!("fused: {}", first_line(&e))),
        (_, Err(e)) => (failed(), format!("reference: {}", first_line(&e))),
    };
    Row {
        op: format!(
            "fused_attention mla d{d_qk}/v{d_v} {}{}",
            if g == h { "mha" } else { "gqa" },
            if spec.causal { " causal" } else { "" }
        ),
        dtype: dtype_label(dtype),
        shape: format!(
            "q [{b}, {h}, {s}, {d_qk}] k [{b}, {g}, {s}, {d_qk}] v [{b}, {g}, {s}, {d_v}]"
        ),
        errors,
        note,
    }
}

/// The rows' shapes and specs: DeepSeek-V3's head dims at sequences 128 and 256 with its scale,
/// 96/64, the small parity models' 48/32 (`tools/gpu-families.sh`'s `mla` and `deepseek`
/// families: 32 plain + 16 rotary channels, values 32), an odd shape (3 heads, a sequence of no
/// tile's multiple), and grouped keys and values (MLA has none, cuDNN's graph takes them: 8
/// query heads on 2 groups).
fn cases() -> Vec<(Dims, AttentionSpec)> {
    let deepseek = AttentionSpec {
        scale: Some(deepseek_v3_scale()),
        ..AttentionSpec::causal()
    };
    let causal = AttentionSpec::causal();
    vec![
        ([2, 4, 4, 128, 192, 128], deepseek),
        ([2, 4, 4, 256, 192, 128], deepseek),
        ([2, 4, 4, 256, 96, 64], causal),
        ([2, 4, 4, 64, 48, 32], causal),
        ([1, 3, 3, 100, 48, 32], causal),
        ([2, 8, 2, 128, 192, 128], causal),
    ]
}

/// Every multi-latent attention row: each case in bf16 (cuDNN) and f32 (composed), the 192/128
/// one in f16 too, and dropout at 192/128.
pub(crate) fn rows(device: &GpuDevice) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(46);
    let mut rows = Vec::new();
    for (dims, spec) in cases() {
        rows.push(mla_row::<Cuda>(
            device,
            &mut rng,
            dims,
            DType::BF16,
            spec,
            true,
        ));
        rows.push(mla_row::<Cuda>(
            device,
            &mut rng,
            dims,
            DType::F32,
            spec,
            false,
        ));
    }
    let (dims, spec) = cases()[0];
    rows.push(mla_row::<Cuda>(
        device,
        &mut rng,
        dims,
        DType::F16,
        spec,
        true,
    ));
    rows.push(dropout_row_with(
        device,
        &mut rng,
        DType::BF16,
        None,
        [2, 4, 4, 256, 192, 128],
    ));
    rows
}

/// cuDNN's forward and backward at DeepSeek-V3's attention shape (its 128 heads, one sequence
/// of 4096) beside equal head dims of 128 at the same heads; TFLOP/s by the causal count:
/// forward `b·h·s²·(d_qk + d_v)` (QKᵀ and PV, half the square), backward `b·h·s²·(3·d_qk + 2·d_v)`
/// (QKᵀ again, dQ and dK over d_qk; dP and dV over d_v), which is 2.5× the forward for equal
/// dims as `fused.rs` counts it, and NVIDIA's benchmark of cudnn-frontend counts (H200, cuDNN
/// 9.19.1, 192/128 at s 4096: 599 and 404 TFLOP/s).
pub(crate) fn timings(device: &GpuDevice) -> String {
    let mut out = String::from(
        "| attention (bf16, causal, cuDNN) | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s |\n|---|---:|---:|---:|---:|\n",
    );
    for [b, h, s, d_qk, d_v] in [
        [1, 128, 4096, 192, 128],
        [1, 128, 4096, 128, 128],
        [2, 16, 4096, 192, 128],
    ] {
        let label = format!("b {b} h {h} s {s} d_qk {d_qk} d_v {d_v}");
        let line = guarded(|| {
            let mk = |d: usize| bf16_normal(device, [b, h, s, d]);
            let (q, k, v, grad) = (mk(d_qk), mk(d_qk), mk(d_v), mk(d_v));
            let spec = AttentionSpec::causal();
            if !Cuda::has_attention_kernel(&q, &k, &v, &spec) {
                return Err("cuDNN does not take it here".to_string());
            }
            let (fwd, bwd) = attention_ms(device, [&q, &k, &v, &grad], spec, 10);
            let square = (b * h * s * s) as f64;
            let fwd_flops = square * (d_qk + d_v) as f64;
            let bwd_flops = square * (3 * d_qk + 2 * d_v) as f64;
            Ok(format!(
                "| {label} | {fwd:.3} | {:.0} | {bwd:.3} | {:.0} |\n",
                fwd_flops / (fwd * 1e-3) / 1e12,
                bwd_flops / (bwd * 1e-3) / 1e12
            ))
        });
        out.push_str(
            &line.unwrap_or_else(|e| format!("| {label} | failed: {} |\n", first_line(&e))),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows' harness on the CPU: burn-flex's `fused_attention` (the composed attention of
    /// `ferrotron-ops`, under autodiff) against the written-out reference, at every row's
    /// shape and spec. A shape or scale the harness got wrong fails here, not on the GPU.
    #[test]
    fn the_rows_run_on_flex_against_the_reference() {
        let mut rng = StdRng::seed_from_u64(1);
        for (dims, spec) in cases() {
            let row = mla_row::<Flex>(&FlexDevice, &mut rng, dims, DType::F32, spec, false);
            assert!(row.errors.pass(), "{dims:?}: {:?} {}", row.errors, row.note);
            assert!(row.note.contains("composed"), "{}", row.note);
        }
    }

    /// A row that asks for a fused kernel fails where none served it.
    #[test]
    fn a_row_that_needs_the_kernel_fails_without_it() {
        let mut rng = StdRng::seed_from_u64(2);
        let (dims, spec) = cases()[3];
        let row = mla_row::<Flex>(&FlexDevice, &mut rng, dims, DType::F32, spec, true);
        assert!(!row.errors.pass());
    }

    #[test]
    fn deepseek_v3_scale_is_yarns_mscale_squared_over_sqrt_192() {
        // transformers' DeepseekV3Attention: softmax_scale = qk_head_dim**-0.5 * mscale**2,
        // mscale = 0.1 * mscale_all_dim * ln(factor) + 1 with factor 40, mscale_all_dim 1.
        let want = 0.1352_f64;
        assert!(
            (deepseek_v3_scale() - want).abs() < 1e-4,
            "{}",
            deepseek_v3_scale()
        );
    }
}
