//! The packed attention on burn-flex: its composed default is bit for bit the model's old path
//! (three slices of the projection, then attention); its autodiff node, driven with burn-flex's
//! kernels, gives the composed graph's packed gradient.

use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};

use super::{B, assert_close, flat, tensor};
use crate::{AttentionSpec, FusedOps, composed_qkv_attention, qkv_attention_node};

fn bits(x: Vec<f32>) -> Vec<u32> {
    x.into_iter().map(f32::to_bits).collect()
}

/// The model's split before the packed op: slices of `[b, s, g, per_group + 2, d]`, then the
/// unpacked fused attention and the context back to `[b, s, heads, d]`.
fn sliced<Bk: FusedOps>(qkv: Tensor<Bk, 5>, spec: AttentionSpec) -> Tensor<Bk, 4> {
    let [b, s, g, slots, d] = qkv.dims();
    let per = slots - 2;
    let q = qkv
        .clone()
        .slice_dim(3, 0..per)
        .reshape([b, s, g * per, d])
        .swap_dims(1, 2);
    let k = qkv
        .clone()
        .slice_dim(3, per..per + 1)
        .reshape([b, s, g, d])
        .swap_dims(1, 2);
    let v = qkv
        .slice_dim(3, per + 1..per + 2)
        .reshape([b, s, g, d])
        .swap_dims(1, 2);
    let context: Tensor<Bk, 4> =
        Tensor::from_primitive(TensorPrimitive::Float(Bk::fused_attention(
            q.into_primitive().tensor(),
            k.into_primitive().tensor(),
            v.into_primitive().tensor(),
            spec,
        )));
    context.swap_dims(1, 2)
}

/// The composed packed attention (what a backend without a kernel runs).
fn packed<Bk: FusedOps>(qkv: Tensor<Bk, 5>, spec: AttentionSpec) -> Tensor<Bk, 4> {
    Tensor::from_primitive(TensorPrimitive::Float(composed_qkv_attention::<Bk>(
        qkv.into_primitive().tensor(),
        spec,
    )))
}

#[test]
fn composed_packed_attention_is_bit_identical_to_the_sliced_path() {
    // groups × per_group heads of dim 8 over 6 positions: MHA (4 × 1), GQA (2 × 2), MQA (1 × 4)
    for (groups, per, dropout) in [(4, 1, 0.0), (2, 2, 0.0), (2, 2, 0.25), (1, 4, 0.25)] {
        let spec = AttentionSpec {
            causal: true,
            scale: None,
            dropout,
            window: None,
        };
        let device = Default::default();
        let weights = tensor([2, 6, groups * per, 8], 2.3);
        let qkv = tensor([2, 6, groups, per + 2, 8], 0.4).require_grad();
        B::seed(&device, 5);
        let old = sliced(qkv.clone(), spec);
        let old_grad = qkv.grad(&(old.clone() * weights.clone()).sum().backward());
        let qkv2 = tensor([2, 6, groups, per + 2, 8], 0.4).require_grad();
        B::seed(&device, 5);
        let new = packed(qkv2.clone(), spec);
        let new_grad = qkv2.grad(&(new.clone() * weights).sum().backward());
        let what = format!("groups {groups} × {per}, dropout {dropout}");
        assert_eq!(bits(flat(new)), bits(flat(old)), "{what}: output");
        let (new_grad, old_grad) = (new_grad.expect("grad"), old_grad.expect("grad"));
        assert_eq!(bits(flat(new_grad)), bits(flat(old_grad)), "{what}: dqkv");
        // Plain Flex (inference): dropout never applies.
        let qkv = qkv.inner();
        assert_eq!(
            bits(flat(packed::<Flex>(qkv.clone(), spec))),
            bits(flat(sliced::<Flex>(qkv, spec))),
            "{what}: inference"
        );
    }
}

/// The one-node path (burn-flex's kernels): the composed graph's output and packed gradient, to
/// f32 rounding, with every slot of the packed gradient written.
#[test]
fn packed_node_gradient_equals_the_composed_graph() {
    for (groups, per, causal) in [(4, 1, true), (2, 2, true), (1, 3, false)] {
        let spec = AttentionSpec {
            causal,
            scale: None,
            dropout: 0.0,
            window: None,
        };
        let shape = [2, 6, groups, per + 2, 8];
        let weights = tensor([2, 6, groups * per, 8], 1.9);
        let qkv = tensor(shape, 0.8).require_grad();
        let composed = packed(qkv.clone(), spec);
        let g_composed = qkv
            .grad(&(composed.clone() * weights.clone()).sum().backward())
            .expect("composed grad");
        let qkv2 = tensor(shape, 0.8).require_grad();
        let node: Tensor<B, 4> =
            Tensor::from_primitive(TensorPrimitive::Float(qkv_attention_node::<
                Flex,
                NoCheckpointing,
            >(
                qkv2.clone().into_primitive().tensor(),
                spec,
            )));
        let g_node = qkv2
            .grad(&(node.clone() * weights).sum().backward())
            .expect("node grad");
        let what = format!("groups {groups} × {per}, causal {causal}");
        assert_close(&flat(node), &flat(composed), &format!("{what}: output"));
        for slot in 0..per + 2 {
            let part = |g: &Tensor<Flex, 5>| flat(g.clone().slice_dim(3, slot..slot + 1));
            let (a, b) = (part(&g_node), part(&g_composed));
            assert_close(&a, &b, &format!("{what}: slot {slot}"));
            assert!(
                a.iter().any(|x| x.abs() > 1e-3),
                "{what}: slot {slot} is all zero"
            );
        }
    }
}
