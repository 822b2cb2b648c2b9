//! QK-norm on the packed projection on burn-flex: the composed default is transformers' Qwen3
//! per-head RMSNorm (its numbers) and a per-head norm of the query and key slots written out in
//! loops (values, and both weights' gradients); the autodiff node driven by the reference
//! kernels gives the composed graph's values and every gradient; the value slot passes through
//! untouched.

use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use super::{B, assert_close, flat, tensor, values};
use crate::{FusedOps, NormKind, NormSpec, QkNormParams, qk_norm_node};

/// batch, seq, groups, 2 query heads + key + value, head dim.
const SHAPE: [usize; 5] = [2, 3, 2, 4, 8];
const DIM: usize = 8;

fn spec(kind: NormKind) -> NormSpec {
    NormSpec {
        kind,
        epsilon: 1e-5,
    }
}

/// The projection (offset per row, so LayerNorm's mean matters) and `[q weight, k weight,
/// q bias, k bias]`, all tracked.
fn inputs() -> (Tensor<B, 5>, [Tensor<B, 1>; 4]) {
    let qkv = (tensor(SHAPE, 0.3) * 2.0 + tensor([2, 3, 2, 4, 1], 1.7)).require_grad();
    let params = [0.2, 0.9, 1.4, 2.6].map(|seed| {
        // weights near 1, biases away from 0
        let p = tensor([DIM], seed);
        let p = if seed < 1.0 { p + 1.0 } else { p };
        p.require_grad()
    });
    (qkv, params)
}

fn params<Bk: burn::tensor::backend::Backend>(
    p: &[Tensor<Bk, 1>; 4],
    kind: NormKind,
) -> QkNormParams<Bk> {
    let prim = |t: &Tensor<Bk, 1>| t.clone().into_primitive().tensor();
    QkNormParams {
        weight: [prim(&p[0]), prim(&p[1])],
        bias: (kind == NormKind::Layer).then(|| [prim(&p[2]), prim(&p[3])]),
    }
}

type Op = fn(FloatTensor<B>, QkNormParams<B>, NormSpec) -> FloatTensor<B>;

/// The op's output and the gradients of `Σ w ∘ out` for the projection and the four parameters
/// (biases' gradients empty for RMSNorm).
fn run(op: Op, kind: NormKind) -> (Vec<f32>, Vec<Vec<f32>>) {
    let (qkv, p) = inputs();
    let out: Tensor<B, 5> = Tensor::from_primitive(TensorPrimitive::Float(op(
        qkv.clone().into_primitive().tensor(),
        params(&p, kind),
        spec(kind),
    )));
    let grads = (out.clone() * tensor(SHAPE, 2.2)).sum().backward();
    let mut g = vec![flat(qkv.grad(&grads).expect("d qkv"))];
    g.extend(
        p.iter()
            .map(|t| t.grad(&grads).map(flat).unwrap_or_default()),
    );
    (flat(out), g)
}

/// One head row `x [d]` normalised and scaled, in f64.
fn host_norm(x: &[f32], weight: &[f32], bias: Option<&[f32]>, kind: NormKind) -> Vec<f64> {
    let n = x.len() as f64;
    let mean = match kind {
        NormKind::Layer => x.iter().map(|&v| f64::from(v)).sum::<f64>() / n,
        NormKind::Rms => 0.0,
    };
    let var = x
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n;
    let rstd = 1.0 / (var + 1e-5).sqrt();
    (0..x.len())
        .map(|c| {
            let y = (f64::from(x[c]) - mean) * rstd * f64::from(weight[c]);
            y + bias.map_or(0.0, |b| f64::from(b[c]))
        })
        .collect()
}

#[test]
fn composed_qk_norm_normalises_each_query_and_key_head_and_passes_the_value_through() {
    for kind in [NormKind::Rms, NormKind::Layer] {
        let (out, grads) = run(B::fused_qk_norm, kind);
        let (qkv, p) = inputs();
        let x = flat(qkv);
        let p: Vec<Vec<f32>> = p.into_iter().map(flat).collect();
        let dy = values(&SHAPE, 2.2);
        let slots = SHAPE[3];
        let mut expected = Vec::with_capacity(x.len());
        // Σ over rows of dy ∘ x̂ for the query's and the key's weight.
        let mut weight_grads = [vec![0.0f64; DIM], vec![0.0f64; DIM]];
        for (row, chunk) in x.chunks(DIM).enumerate() {
            let slot = row % slots;
            if slot == slots - 1 {
                expected.extend(chunk.iter().map(|&v| f64::from(v)));
                continue;
            }
            let which = usize::from(slot == slots - 2);
            let bias = (kind == NormKind::Layer).then(|| p[2 + which].as_slice());
            expected.extend(host_norm(chunk, &p[which], bias, kind));
            let unit = vec![1.0f32; DIM];
            let x_hat = host_norm(chunk, &unit, None, kind);
            for c in 0..DIM {
                weight_grads[which][c] += f64::from(dy[row * DIM + c]) * x_hat[c];
            }
        }
        let what = format!("{kind:?}");
        let expected: Vec<f32> = expected.into_iter().map(|v| v as f32).collect();
        assert_close(&out, &expected, &format!("{what}: output"));
        for (which, name) in [(0, "query weight"), (1, "key weight")] {
            let host: Vec<f32> = weight_grads[which].iter().map(|&v| v as f32).collect();
            assert_close(&grads[1 + which], &host, &format!("{what}: d {name}"));
        }
        // The value slot's gradient is the loss weight, untouched.
        for (row, chunk) in grads[0].chunks(DIM).enumerate() {
            if row % slots == slots - 1 {
                assert_eq!(chunk, &dy[row * DIM..(row + 1) * DIM], "{what}: d value");
            }
        }
    }
}

#[test]
fn qk_norm_node_values_and_gradients_equal_the_composed_graph() {
    for kind in [NormKind::Rms, NormKind::Layer] {
        let composed = run(B::fused_qk_norm, kind);
        let node = run(qk_norm_node::<Flex, NoCheckpointing>, kind);
        let what = format!("{kind:?}");
        assert_close(&node.0, &composed.0, &format!("{what}: output"));
        let names = ["qkv", "q weight", "k weight", "q bias", "k bias"];
        for ((n, c), name) in node.1.iter().zip(&composed.1).zip(names) {
            assert_close(n, c, &format!("{what}: d {name}"));
        }
        assert_eq!(
            composed.1[3].is_empty(),
            kind == NormKind::Rms,
            "{what}: biases only with LayerNorm"
        );
    }
    assert!(!Flex::has_qk_norm_kernel(
        &tensor(SHAPE, 0.3).inner().into_primitive().tensor(),
        &tensor([DIM], 0.2).inner().into_primitive().tensor(),
        &spec(NormKind::Rms),
    ));
}

#[test]
fn composed_qk_norm_is_transformers_qwen3_per_head_rms_norm() {
    // transformers' `Qwen3RMSNorm(8, eps=1e-6)` as `q_norm` on the two query heads and `k_norm`
    // on the key head of `values([1, 2, 1, 4, 8], 0.3)`, weights `values([8], 0.2 / 0.9) + 1`
    // (torch 2, transformers 5; printed to six decimals), the value slot appended.
    let transformers = [
        2.134321, 2.705196, 1.401555, -0.11564, -0.346681, -0.011008, -0.186461, -0.142708,
        1.377001, 2.636893, 2.022131, 0.478686, -0.173749, -0.009724, -0.232657, -0.563836,
        0.440573, 1.826714, 1.443578, 0.360948, 0.00097, -0.137713, -1.001999, -1.68597, -0.271121,
        0.440759, 0.927416, 0.940177, 0.472522, -0.236586, -0.824801, -0.991555, -1.719483,
        0.062116, 1.681343, 1.484199, 0.404803, 0.002278, -0.132259, -1.071094, -2.413411,
        -1.180419, 0.770518, 1.296529, 0.497194, 0.006925, -0.025889, -0.832621, -2.868683,
        -1.835441, -0.177395, 0.305022, 0.017291, 0.201207, 0.348553, -0.800687, -0.902825,
        -0.95924, -0.525495, 0.176769, 0.788706, 0.997627, 0.696773, 0.03988,
    ];
    let qkv = tensor([1, 2, 1, 4, DIM], 0.3);
    let weights = [0.2, 0.9].map(|seed| (tensor([DIM], seed) + 1.0).into_primitive().tensor());
    let out: Tensor<B, 5> = Tensor::from_primitive(TensorPrimitive::Float(B::fused_qk_norm(
        qkv.into_primitive().tensor(),
        QkNormParams {
            weight: weights,
            bias: None,
        },
        NormSpec {
            kind: NormKind::Rms,
            epsilon: 1e-6,
        },
    )));
    assert_close(&flat(out), &transformers, "Qwen3's q_norm and k_norm");
}
