//! Sliding-window attention (Megatron's `--window-size (left, 0)`) on burn-flex: the mask is
//! Megatron's own, the composed default is the band `i − left ≤ j ≤ i` written out in loops, a window reaching every key is
//! plain causal attention bit for bit, the attention node (reference kernels) and burn-flex's
//! packed kernel give the composed graph's values and gradients, and dropout never reaches a
//! key behind the window.

use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use super::{B, assert_close, flat, tensor};
use crate::{AttentionSpec, FusedOps, attention_node, composed_qkv_attention};

const SEQ: usize = 7;
const DIM: usize = 8;

fn spec(window: Option<usize>, dropout: f64) -> AttentionSpec {
    AttentionSpec {
        window,
        dropout,
        ..AttentionSpec::causal()
    }
}

/// q `[2, 4, 7, 8]`, k and v `[2, 2, 7, 8]` (two query heads per group), tracked.
fn qkv() -> [Tensor<B, 4>; 3] {
    [
        tensor([2, 4, SEQ, DIM], 0.1),
        tensor([2, 2, SEQ, DIM], 0.7),
        tensor([2, 2, SEQ, DIM], 1.3),
    ]
    .map(Tensor::require_grad)
}

type Attention =
    fn(FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, AttentionSpec) -> FloatTensor<B>;

/// The output and the gradients of q, k, v for `Σ w ∘ out`.
fn run(op: Attention, spec: AttentionSpec) -> (Vec<f32>, [Vec<f32>; 3]) {
    let inputs = qkv();
    let [q, k, v] = inputs.clone().map(|t| t.into_primitive().tensor());
    let out: Tensor<B, 4> = Tensor::from_primitive(TensorPrimitive::Float(op(q, k, v, spec)));
    let grads = (out.clone() * tensor([2, 4, SEQ, DIM], 2.9))
        .sum()
        .backward();
    let grad = |t: &Tensor<B, 4>| flat(t.grad(&grads).expect("a gradient"));
    (flat(out), inputs.each_ref().map(grad))
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn hidden_keys_are_megatrons_sliding_window_mask() {
    // `megatron.core.transformer.utils.get_sliding_window_causal_mask(7, 7, (2, 0))`, printed by
    // torch (true: masked).
    let megatron = [
        [0, 1, 1, 1, 1, 1, 1],
        [0, 0, 1, 1, 1, 1, 1],
        [0, 0, 0, 1, 1, 1, 1],
        [1, 0, 0, 0, 1, 1, 1],
        [1, 1, 0, 0, 0, 1, 1],
        [1, 1, 1, 0, 0, 0, 1],
        [1, 1, 1, 1, 0, 0, 0],
    ];
    let spec = spec(Some(2), 0.0);
    let hidden = spec
        .hidden_keys::<B>(SEQ, SEQ, &Default::default())
        .expect("a mask")
        .into_data()
        .into_vec::<bool>()
        .expect("bool");
    let expected: Vec<bool> = megatron.iter().flatten().map(|&m| m == 1).collect();
    assert_eq!(hidden, expected);
}

#[test]
fn composed_sliding_window_attention_is_the_band_written_out() {
    let left = 2;
    let (out, _) = run(B::fused_attention, spec(Some(left), 0.0));
    let [q, k, v] = qkv().map(flat);
    let scale = 1.0 / (DIM as f64).sqrt();
    let row = |x: &[f32], head: usize, i: usize| -> Vec<f64> {
        let at = (head * SEQ + i) * DIM;
        x[at..at + DIM].iter().map(|&v| f64::from(v)).collect()
    };
    let mut expected = Vec::new();
    for b in 0..2 {
        for h in 0..4 {
            let g = b * 2 + h / 2;
            for i in 0..SEQ {
                let query = row(&q, b * 4 + h, i);
                let keys: Vec<usize> = (i.saturating_sub(left)..=i).collect();
                let scores: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        let key = row(&k, g, j);
                        scale * query.iter().zip(&key).map(|(a, b)| a * b).sum::<f64>()
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                let mut context = vec![0.0f64; DIM];
                for (&j, w) in keys.iter().zip(&weights) {
                    for (c, value) in context.iter_mut().zip(row(&v, g, j)) {
                        *c += w / total * value;
                    }
                }
                expected.extend(context.into_iter().map(|c| c as f32));
            }
        }
    }
    assert_close(&out, &expected, "banded attention");
}

#[test]
fn a_window_reaching_every_key_is_plain_causal_attention_bit_for_bit() {
    let causal = run(B::fused_attention, spec(None, 0.0));
    for left in [SEQ - 1, SEQ, 4096] {
        let windowed = run(B::fused_attention, spec(Some(left), 0.0));
        assert_eq!(bits(&windowed.0), bits(&causal.0), "window {left}: output");
        for (w, c) in windowed.1.iter().zip(&causal.1) {
            assert_eq!(bits(w), bits(c), "window {left}: gradients");
        }
    }
    assert!(spec(Some(SEQ - 2), 0.0).effective_window(SEQ).is_some());
    assert!(spec(Some(SEQ - 1), 0.0).effective_window(SEQ).is_none());
}

#[test]
fn attention_node_with_a_window_gives_the_composed_graph_values_and_gradients() {
    for left in [0, 1, 3] {
        let composed = run(B::fused_attention, spec(Some(left), 0.0));
        let node = run(
            attention_node::<Flex, NoCheckpointing>,
            spec(Some(left), 0.0),
        );
        assert_close(&node.0, &composed.0, &format!("window {left}: output"));
        for (name, (n, c)) in ["dq", "dk", "dv"]
            .iter()
            .zip(node.1.iter().zip(&composed.1))
        {
            assert_close(n, c, &format!("window {left}: {name}"));
        }
    }
    // A window of 0 is each query attending to itself alone: the output is v's row.
    let (out, _) = run(B::fused_attention, spec(Some(0), 0.0));
    let [_, _, v] = qkv().map(flat);
    let head = |x: &[f32], b: usize, h: usize| x[(b * 4 + h) * SEQ * DIM..][..SEQ * DIM].to_vec();
    let group = |b: usize, h: usize| v[(b * 2 + h / 2) * SEQ * DIM..][..SEQ * DIM].to_vec();
    assert_close(&head(&out, 1, 3), &group(1, 3), "window 0");
}

#[test]
fn flex_packed_kernel_with_a_window_matches_the_composed_graph() {
    let shape = [2, SEQ, 2, 4, DIM];
    let weights = tensor([2, SEQ, 4, DIM], 1.9);
    let run = |kernel: bool| {
        let qkv = tensor(shape, 0.8).require_grad();
        let primitive = qkv.clone().into_primitive().tensor();
        let spec = spec(Some(3), 0.0);
        assert!(Flex::has_qkv_attention_kernel(
            &tensor(shape, 0.8).inner().into_primitive().tensor(),
            &spec
        ));
        let out = if kernel {
            B::fused_qkv_attention(primitive, spec)
        } else {
            composed_qkv_attention::<B>(primitive, spec)
        };
        let out: Tensor<B, 4> = Tensor::from_primitive(TensorPrimitive::Float(out));
        let grads = (out.clone() * weights.clone()).sum().backward();
        (flat(out), flat(qkv.grad(&grads).expect("d qkv")))
    };
    let (kernel, composed) = (run(true), run(false));
    assert_close(&kernel.0, &composed.0, "output");
    assert_close(&kernel.1, &composed.1, "packed gradient");
}

#[test]
fn dropout_never_reaches_a_key_behind_the_window() {
    let (left, last) = (2, SEQ - 1);
    let [q, k, v] = qkv();
    let out: Tensor<B, 4> = Tensor::from_primitive(TensorPrimitive::Float(B::fused_attention(
        q.into_primitive().tensor(),
        k.into_primitive().tensor(),
        v.clone().into_primitive().tensor(),
        spec(Some(left), 0.3),
    )));
    // Only the last query row's output: its probabilities are dV's only source.
    let grads = out.slice_dim(2, last..SEQ).sum().backward();
    let dv = v.grad(&grads).expect("dv");
    let behind = flat(dv.clone().slice_dim(2, 0..last - left));
    let inside = flat(dv.slice_dim(2, last - left..SEQ));
    assert!(behind.iter().all(|&g| g == 0.0), "{behind:?}");
    assert!(inside.iter().any(|&g| g != 0.0), "{inside:?}");
}
