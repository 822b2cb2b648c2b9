//! burn-flex's layer kernels (LayerNorm/RMSNorm, packed attention, GELU, `Σ x²`) against the
//! composed ops within float tolerance (their summation orders and `exp`/`erf` are their own),
//! through the autodiff nodes the model records, and bit for bit the same on any number of
//! threads; the embedding's lookup node bit for bit burn's gradient, tied or not.

use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use super::cpu::{back, floats, on_threads};
use super::{B, assert_close, flat, tensor};
use crate::op::qkv::{qkv_attention_backward_reference, qkv_attention_forward_reference};
use crate::{
    AttentionSpec, FusedOps, NormKind, NormSpec, composed_embedding, composed_gelu,
    composed_sum_of_squares, gelu_backward_reference, gelu_node, norm_backward_reference,
    norm_forward_reference,
};

fn bits(x: Vec<f32>) -> Vec<u32> {
    x.into_iter().map(f32::to_bits).collect()
}

/// Thread counts that split the kernels' tasks differently.
const THREADS: [usize; 3] = [1, 2, 3];

/// `[rows, hidden]` with rows spanning several tasks, and γ, β away from 1 and 0.
fn norm_inputs() -> [FloatTensor<Flex>; 4] {
    [
        floats([150, 48], 0.3, 3.0),
        floats([48], 0.7, 0.5),
        floats([48], 1.9, 1.0),
        floats([150, 48], 2.3, 1.0),
    ]
}

/// The kernels' output, `1/σ`, dx, dγ and dβ.
fn norm_kernels(kind: NormKind) -> Vec<Vec<f32>> {
    let [x, gamma, beta, dy] = norm_inputs();
    let spec = NormSpec {
        kind,
        epsilon: 1e-5,
    };
    assert!(Flex::has_norm_kernel(&x, &gamma, &spec));
    let saved = Flex::norm_kernel_forward(x.clone(), gamma.clone(), Some(beta), spec);
    let (output, rstd) = (
        back::<2>(saved.output.clone()),
        back::<2>(saved.rstd.clone()),
    );
    // The input gradient from elsewhere (a residual's), added by the kernel.
    let into = floats([150, 48], 1.3, 0.5);
    let grads = Flex::norm_kernel_backward(x, gamma, true, saved.into_stats(), dy, Some(into));
    let beta = grads.beta.expect("dβ");
    vec![
        output,
        rstd,
        back::<2>(grads.input),
        back::<1>(grads.gamma),
        back::<1>(beta),
    ]
}

#[test]
fn flex_norm_kernels_match_the_reference_on_any_number_of_threads() {
    for kind in [NormKind::Layer, NormKind::Rms] {
        let [x, gamma, beta, dy] = norm_inputs();
        let spec = NormSpec {
            kind,
            epsilon: 1e-5,
        };
        let saved = norm_forward_reference::<Flex>(x.clone(), gamma.clone(), Some(beta), spec);
        let want_out = [
            back::<2>(saved.output.clone()),
            back::<2>(saved.rstd.clone()),
        ];
        let into = floats([150, 48], 1.3, 0.5);
        let grads =
            norm_backward_reference::<Flex>(x, gamma, true, saved.into_stats(), dy, Some(into));
        let want = [
            &want_out[..],
            &[
                back::<2>(grads.input),
                back::<1>(grads.gamma),
                back::<1>(grads.beta.expect("dβ")),
            ],
        ]
        .concat();
        let got = norm_kernels(kind);
        for ((got, want), name) in got.iter().zip(&want).zip(["y", "1/σ", "dx", "dγ", "dβ"]) {
            assert_close(got, want, &format!("{kind:?} {name}"));
        }
        for threads in THREADS {
            let again = on_threads(threads, || norm_kernels(kind));
            let same = again
                .into_iter()
                .map(bits)
                .eq(got.iter().cloned().map(bits));
            assert!(same, "{kind:?} on {threads} threads differs");
        }
    }
}

fn attention_spec(causal: bool) -> AttentionSpec {
    AttentionSpec {
        causal,
        scale: None,
        dropout: 0.0,
        window: None,
    }
}

/// `[batch 3, seq 20, groups 2, 2 query heads + k + v, d 8]` and a context gradient.
fn attention_inputs() -> (FloatTensor<Flex>, FloatTensor<Flex>) {
    (
        floats([3, 20, 2, 4, 8], 0.4, 2.0),
        floats([3, 20, 4, 8], 1.3, 1.0),
    )
}

/// The kernels' context, statistics and packed gradient.
fn attention_kernels(causal: bool) -> [Vec<f32>; 3] {
    let (qkv, grad) = attention_inputs();
    let spec = attention_spec(causal);
    assert!(Flex::has_qkv_attention_kernel(&qkv, &spec));
    let saved = Flex::qkv_attention_kernel_forward(qkv.clone(), spec);
    let (output, stats) = (
        back::<4>(saved.output.clone()),
        back::<4>(saved.stats.clone()),
    );
    [
        output,
        stats,
        back::<5>(Flex::qkv_attention_kernel_backward(qkv, saved, grad, spec)),
    ]
}

#[test]
fn flex_packed_attention_matches_the_reference_on_any_number_of_threads() {
    for causal in [true, false] {
        let (qkv, grad) = attention_inputs();
        let spec = attention_spec(causal);
        let saved = qkv_attention_forward_reference::<Flex>(qkv.clone(), spec);
        let want = [
            back::<4>(saved.output.clone()),
            back::<4>(saved.stats.clone()),
            back::<5>(qkv_attention_backward_reference::<Flex>(
                qkv, saved, grad, spec,
            )),
        ];
        let got = attention_kernels(causal);
        for ((got, want), name) in got.iter().zip(&want).zip(["context", "lse", "dqkv"]) {
            assert_close(got, want, &format!("causal {causal}: {name}"));
        }
        for threads in THREADS {
            let again = on_threads(threads, || attention_kernels(causal));
            let same = again
                .into_iter()
                .map(bits)
                .eq(got.iter().cloned().map(bits));
            assert!(same, "causal {causal} on {threads} threads differs");
        }
    }
    let dropout = AttentionSpec {
        dropout: 0.1,
        ..attention_spec(true)
    };
    assert!(!Flex::has_qkv_attention_kernel(
        &attention_inputs().0,
        &dropout
    ));
}

/// GELU's output and input gradient through the model's op, on `B` (autodiff over burn-flex).
fn gelu_of(f: impl Fn(Tensor<B, 2>) -> Tensor<B, 2>) -> [Vec<f32>; 2] {
    let x = (tensor([1000, 37], 0.6) * 4.0).require_grad();
    let out = f(x.clone());
    let grads = (out.clone() * tensor([1000, 37], 1.7)).sum().backward();
    [flat(out), flat(x.grad(&grads).expect("a gradient"))]
}

#[test]
fn flex_gelu_matches_burns_on_any_number_of_threads() {
    let composed = gelu_of(|x| {
        Tensor::from_primitive(TensorPrimitive::Float(composed_gelu::<B>(
            x.into_primitive().tensor(),
        )))
    });
    let kernel = || gelu_of(crate::gelu::<B, 2>);
    let got = kernel();
    assert_close(&got[0], &composed[0], "gelu");
    assert_close(&got[1], &composed[1], "gelu gradient");
    let node = gelu_of(|x| {
        Tensor::from_primitive(TensorPrimitive::Float(gelu_node::<Flex, NoCheckpointing>(
            x.into_primitive().tensor(),
        )))
    });
    assert_eq!(node, got, "the model's op is the node");
    let (x, dy) = (floats([64], 0.1, 3.0), floats([64], 0.2, 1.0));
    assert_close(
        &back::<1>(Flex::gelu_kernel_backward(x.clone(), dy.clone())),
        &back::<1>(gelu_backward_reference::<Flex>(x, dy)),
        "reference backward",
    );
    for threads in THREADS {
        let again = on_threads(threads, kernel);
        assert_eq!(again, got, "gelu on {threads} threads");
    }
}

#[test]
fn flex_sum_of_squares_matches_the_composed_sum_on_any_number_of_threads() {
    let x = floats([100_003], 0.5, 3.0);
    let want = back::<1>(composed_sum_of_squares::<Flex>(x.clone()));
    let got = back::<1>(Flex::sum_of_squares(x.clone()));
    assert!(
        (got[0] - want[0]).abs() <= 1e-5 * want[0],
        "Σx² {} vs {}",
        got[0],
        want[0]
    );
    for threads in THREADS {
        let again = on_threads(threads, || back::<1>(Flex::sum_of_squares(x.clone())));
        assert_eq!(bits(again), bits(got.clone()), "Σx² on {threads} threads");
    }
}

/// A 3 M-element gradient shaped like a tied embedding's: rows of 768, one in twenty of them
/// a thousand times larger than the rest (frequent tokens against rare ones), each element a
/// fixed pseudo-random fraction of its row's scale.
fn embedding_like_gradient() -> Vec<f32> {
    let hash = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    (0..3_000_017u64)
        .map(|i| {
            let scale = if hash(i / 768 + (1 << 40)) % 20 == 0 {
                1e-2
            } else {
                1e-5
            };
            let unit = (hash(i) >> 11) as f64 / (1u64 << 53) as f64;
            ((2.0 * unit - 1.0) * scale) as f32
        })
        .collect()
}

#[test]
fn flex_sum_of_squares_is_as_exact_as_f64_on_any_number_of_threads() {
    let values = embedding_like_gradient();
    let truth: f64 = values.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    let x = Tensor::<Flex, 1>::from_floats(values.as_slice(), &Default::default())
        .into_primitive()
        .tensor();
    let got = back::<1>(Flex::sum_of_squares(x.clone()));
    // Summed in f32 (2,048 squares a lane) this came out 6.5e-6 low; one rounding to f32 is
    // at most 6e-8.
    let error = (f64::from(got[0]) - truth) / truth;
    assert!(error.abs() <= 2e-7, "Σx² {} vs {truth}: {error:e}", got[0]);
    for threads in THREADS {
        let again = on_threads(threads, || back::<1>(Flex::sum_of_squares(x.clone())));
        assert_eq!(bits(again), bits(got.clone()), "Σx² on {threads} threads");
    }
}

/// The weight's gradient from a lookup (repeated tokens among the ids) and a tied product that
/// autodiff runs first, through the lookup's node or burn's `embedding`.
fn embedding_gradient(kernel: bool, tied: bool) -> Vec<f32> {
    let weight = tensor([40, 6], 0.2).require_grad();
    let ids: Vec<i64> = (0..15).map(|i| (i * 7 % 13) as i64).collect();
    let ids = Tensor::<B, 2, burn::tensor::Int>::from_data(
        burn::tensor::TensorData::new(ids, [3, 5]),
        &Default::default(),
    );
    let (w, i) = (
        weight.clone().into_primitive().tensor(),
        ids.into_primitive(),
    );
    let rows: Tensor<B, 3> = Tensor::from_primitive(TensorPrimitive::Float(if kernel {
        B::fused_embedding(w, i)
    } else {
        composed_embedding::<B>(w, i)
    }));
    let mut loss = (rows * tensor([3, 5, 6], 1.1)).sum();
    if tied {
        let x = tensor([4, 6], 0.9).require_grad() * 1.5;
        loss = loss + (crate::tied_logits(x, weight.clone()) * tensor([4, 40], 0.3)).sum();
    }
    flat(
        weight
            .grad(&loss.backward())
            .expect("the weight's gradient"),
    )
}

#[test]
fn flex_embedding_adds_into_the_weights_gradient_as_burns_sum_would() {
    assert!(Flex::has_embedding_kernel(&floats([40, 6], 0.2, 1.0)));
    for tied in [false, true] {
        let (got, want) = (
            embedding_gradient(true, tied),
            embedding_gradient(false, tied),
        );
        assert_eq!(bits(got), bits(want), "tied {tied}");
    }
}
