//! `FusedOps` on burn-flex: the composed default is bit for bit the arithmetic the model had
//! before the op existed; the autodiff node (driven with the reference kernels) gives the
//! composed graph's gradients.

use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::nn::DropoutConfig;
use burn::tensor::backend::Backend;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, Tensor, TensorPrimitive, activation::softmax};

use super::{B, assert_close, flat, tensor};
use crate::{AttentionSpec, FusedOps, attention_node, repeat_groups};

/// The model's attention before `FusedOps` (copied from `ferrotron-model`'s history).
fn old_model_attention<Bk: Backend>(
    query: Tensor<Bk, 4>,
    key: Tensor<Bk, 4>,
    value: Tensor<Bk, 4>,
    dropout: f64,
) -> Tensor<Bk, 4> {
    let [batch, heads, seq, head_dim] = query.dims();
    let per_group = heads / key.dims()[1];
    let key = repeat_groups(key, per_group);
    let value = repeat_groups(value, per_group);
    if dropout > 0.0 && Bk::ad_enabled(&query.device()) {
        let [_, _, keys, _] = key.dims();
        let scale = 1.0 / (head_dim as f64).sqrt();
        let scores = query.matmul(key.swap_dims(2, 3)) * scale;
        let future = Tensor::<Bk, 2, Bool>::tril_mask([seq, keys], 0, &scores.device());
        let future = future.unsqueeze::<4>().expand([batch, heads, seq, keys]);
        let probabilities = softmax(scores.mask_fill(future, f32::NEG_INFINITY), 3);
        DropoutConfig::new(dropout)
            .init()
            .forward(probabilities)
            .matmul(value)
    } else {
        let options = AttentionModuleOptions {
            is_causal: true,
            ..Default::default()
        };
        attention(query, key, value, None, None, options)
    }
}

fn fused<Bk: FusedOps>(
    q: Tensor<Bk, 4>,
    k: Tensor<Bk, 4>,
    v: Tensor<Bk, 4>,
    spec: AttentionSpec,
) -> Tensor<Bk, 4> {
    Tensor::from_primitive(TensorPrimitive::Float(Bk::fused_attention(
        q.into_primitive().tensor(),
        k.into_primitive().tensor(),
        v.into_primitive().tensor(),
        spec,
    )))
}

fn qkv(groups: usize) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) {
    (
        tensor([2, 4, 6, 8], 0.1).require_grad(),
        tensor([2, groups, 6, 8], 0.7).require_grad(),
        tensor([2, groups, 6, 8], 1.3).require_grad(),
    )
}

fn bits(x: Vec<f32>) -> Vec<u32> {
    x.into_iter().map(f32::to_bits).collect()
}

#[test]
fn composed_default_is_bit_identical_to_the_old_model_path() {
    for (groups, dropout) in [(4, 0.0), (2, 0.0), (2, 0.25), (1, 0.25)] {
        let spec = AttentionSpec {
            causal: true,
            scale: None,
            dropout,
            window: None,
        };
        // Autodiff (training): values and every gradient.
        let device = Default::default();
        let (q, k, v) = qkv(groups);
        B::seed(&device, 7);
        let old = old_model_attention(q.clone(), k.clone(), v.clone(), dropout);
        let old_grads = (old.clone() * old.clone()).sum().backward();
        let (q2, k2, v2) = qkv(groups);
        B::seed(&device, 7);
        let new = fused(q2.clone(), k2.clone(), v2.clone(), spec);
        let new_grads = (new.clone() * new.clone()).sum().backward();
        let what = format!("groups {groups}, dropout {dropout}");
        assert_eq!(bits(flat(new)), bits(flat(old)), "{what}: output");
        for (a, b, name) in [(&q2, &q, "dq"), (&k2, &k, "dk"), (&v2, &v, "dv")] {
            let ga = a.grad(&new_grads).expect("grad");
            let gb = b.grad(&old_grads).expect("grad");
            assert_eq!(bits(flat(ga)), bits(flat(gb)), "{what}: {name}");
        }
        // Plain Flex (inference): dropout never applies.
        let (q, k, v) = (q.inner(), k.inner(), v.inner());
        let old = old_model_attention::<Flex>(q.clone(), k.clone(), v.clone(), dropout);
        let new = fused::<Flex>(q, k, v, spec);
        assert_eq!(bits(flat(new)), bits(flat(old)), "{what}: inference");
    }
}

#[test]
fn flex_has_no_kernel_so_autodiff_records_the_composed_graph() {
    let (q, k, v) = qkv(2);
    let spec = AttentionSpec::causal();
    assert!(!Flex::has_attention_kernel(
        &q.inner().into_primitive().tensor(),
        &k.inner().into_primitive().tensor(),
        &v.inner().into_primitive().tensor(),
        &spec
    ));
}

/// The one-node path (reference kernels) against the composed graph: same values, same
/// gradients (to f32 rounding: the node's backward is the flash-attention formula).
#[test]
fn attention_node_gradients_equal_the_composed_graph() {
    for (groups, causal, scale) in [(4, true, None), (2, true, Some(0.5)), (1, false, None)] {
        let spec = AttentionSpec {
            causal,
            scale,
            dropout: 0.0,
            window: None,
        };
        let (q, k, v) = qkv(groups);
        let composed = fused(q.clone(), k.clone(), v.clone(), spec);
        let weights = tensor([2, 4, 6, 8], 2.9);
        let g_composed = (composed.clone() * weights.clone()).sum().backward();
        let (q2, k2, v2) = qkv(groups);
        let node: Tensor<B, 4> = Tensor::from_primitive(TensorPrimitive::Float(attention_node::<
            Flex,
            NoCheckpointing,
        >(
            q2.clone().into_primitive().tensor(),
            k2.clone().into_primitive().tensor(),
            v2.clone().into_primitive().tensor(),
            spec,
        )));
        let g_node = (node.clone() * weights).sum().backward();
        let what = format!("groups {groups}, causal {causal}, scale {scale:?}");
        assert_close(&flat(node), &flat(composed), &format!("{what}: output"));
        for (a, b, name) in [(&q2, &q, "dq"), (&k2, &k, "dk"), (&v2, &v, "dv")] {
            let ga = flat(a.grad(&g_node).expect("node grad"));
            let gb = flat(b.grad(&g_composed).expect("composed grad"));
            assert_close(&ga, &gb, &format!("{what}: {name}"));
            assert!(
                ga.iter().any(|x| x.abs() > 1e-3),
                "{what}: {name} is all zero"
            );
        }
    }
}

#[test]
fn causal_node_ignores_future_keys() {
    // Changing the last key/value must not change the first query's output.
    let spec = AttentionSpec::causal();
    let (q, k, v) = qkv(2);
    let out = |k: Tensor<B, 4>, v: Tensor<B, 4>| -> Vec<f32> {
        let o: Tensor<B, 4> = Tensor::from_primitive(TensorPrimitive::Float(attention_node::<
            Flex,
            NoCheckpointing,
        >(
            q.clone().into_primitive().tensor(),
            k.into_primitive().tensor(),
            v.into_primitive().tensor(),
            spec,
        )));
        flat(o.slice([0..1, 0..1, 0..1, 0..8]))
    };
    let a = out(k.clone(), v.clone());
    let k2 = k.clone().slice_assign(
        [0..2, 0..2, 5..6, 0..8],
        Tensor::ones([2, 2, 1, 8], &Default::default()),
    );
    let b = out(k2, v);
    assert_eq!(a, b);
}

/// `softmax(scale · q·kᵀ, causal) · v` element by element from the definition, every query head
/// `h` reading group `h / (heads / groups)`: `[b, heads, s, d_v]` flattened.
fn attention_by_definition(
    q: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
    v: &Tensor<B, 4>,
    scale: f64,
) -> Vec<f32> {
    let [batch, heads, seq, d] = q.dims();
    let [_, groups, _, d_v] = v.dims();
    let (q, k, v) = (flat(q.clone()), flat(k.clone()), flat(v.clone()));
    let mut out = Vec::new();
    for b in 0..batch {
        for h in 0..heads {
            let g = h / (heads / groups);
            let at = |x: &[f32], width: usize, i: usize, c: usize| -> f64 {
                f64::from(x[((b * groups + g) * seq + i) * width + c])
            };
            for i in 0..seq {
                let row = |c: usize| f64::from(q[((b * heads + h) * seq + i) * d + c]);
                let scores: Vec<f64> = (0..=i)
                    .map(|j| scale * (0..d).map(|c| row(c) * at(&k, d, j, c)).sum::<f64>())
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                for c in 0..d_v {
                    let sum: f64 = (0..=i).map(|j| weights[j] * at(&v, d_v, j, c)).sum();
                    out.push((sum / total) as f32);
                }
            }
        }
    }
    out
}

/// Multi-latent attention's shapes: a value head dim (6) other than the query/key one (8) and
/// its own softmax scale, through the composed default (training and inference) and through
/// the one-node path with the reference kernels (the contract a GPU kernel meets).
#[test]
fn value_head_dim_may_differ_from_the_query_key_head_dim() {
    for groups in [4, 2] {
        let spec = AttentionSpec {
            scale: Some(0.21),
            ..AttentionSpec::causal()
        };
        let qkv = || {
            (
                tensor([2, 4, 6, 8], 0.1).require_grad(),
                tensor([2, groups, 6, 8], 0.7).require_grad(),
                tensor([2, groups, 6, 6], 1.3).require_grad(),
            )
        };
        let (q, k, v) = qkv();
        let expected = attention_by_definition(&q, &k, &v, 0.21);
        let composed = fused(q.clone(), k.clone(), v.clone(), spec);
        assert_eq!(composed.dims(), [2, 4, 6, 6]);
        let what = format!("groups {groups}");
        assert_close(
            &flat(composed.clone()),
            &expected,
            &format!("{what}: composed"),
        );
        let inference = fused::<Flex>(
            q.clone().inner(),
            k.clone().inner(),
            v.clone().inner(),
            spec,
        );
        assert_close(&flat(inference), &expected, &format!("{what}: inference"));

        let weights = tensor([2, 4, 6, 6], 2.9);
        let g_composed = (composed * weights.clone()).sum().backward();
        let (q2, k2, v2) = qkv();
        let node: Tensor<B, 4> = Tensor::from_primitive(TensorPrimitive::Float(attention_node::<
            Flex,
            NoCheckpointing,
        >(
            q2.clone().into_primitive().tensor(),
            k2.clone().into_primitive().tensor(),
            v2.clone().into_primitive().tensor(),
            spec,
        )));
        assert_close(&flat(node.clone()), &expected, &format!("{what}: node"));
        let g_node = (node * weights).sum().backward();
        for (a, b, name) in [(&q2, &q, "dq"), (&k2, &k, "dk"), (&v2, &v, "dv")] {
            let ga = a.grad(&g_node).expect("node grad");
            let gb = b.grad(&g_composed).expect("composed grad");
            assert_eq!(ga.dims(), gb.dims(), "{what}: {name} shape");
            assert_close(&flat(ga), &flat(gb), &format!("{what}: {name}"));
        }
    }
}
