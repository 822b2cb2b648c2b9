//! The grouped matmul on burn-flex: the composed default is bit for bit the experts' old
//! one-matmul-per-group arithmetic; the autodiff node (reference backward) gives the composed
//! graph's gradients, an empty group's weight gradient included.

use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::tensor::{Tensor, TensorPrimitive};

use super::{B, assert_close, flat, fresh, tensor};
use crate::{FusedOps, GroupRows, grouped_matmul_node, grouped_matmul_parts_node};

/// Rows per group: the third group is empty.
const GROUPS: [usize; 4] = [3, 1, 0, 4];

fn bits(x: Vec<f32>) -> Vec<u32> {
    x.into_iter().map(f32::to_bits).collect()
}

/// Output and gradients (x, weight) of `Σ w ∘ f(x, weight)` for `x [8, 5]`, `weight [4, 5, 6]`.
fn run(f: impl Fn(Tensor<B, 2>, Tensor<B, 3>) -> Tensor<B, 2>) -> [Vec<f32>; 3] {
    let x = tensor([8, 5], 0.6).require_grad();
    let weight = tensor([4, 5, 6], 1.1).require_grad();
    let out = f(x.clone(), weight.clone());
    let grads = (out.clone() * tensor([8, 6], 1.7)).sum().backward();
    [
        flat(out),
        flat(x.grad(&grads).expect("an x gradient")),
        flat(weight.grad(&grads).expect("a weight gradient")),
    ]
}

fn fused(x: Tensor<B, 2>, weight: Tensor<B, 3>) -> Tensor<B, 2> {
    Tensor::from_primitive(TensorPrimitive::Float(B::fused_grouped_matmul(
        x.into_primitive().tensor(),
        weight.into_primitive().tensor(),
        &GroupRows::on_host(GROUPS.to_vec()),
    )))
}

/// One matmul per non-empty group, as the experts computed before the op.
fn per_group(x: Tensor<B, 2>, weight: Tensor<B, 3>) -> Tensor<B, 2> {
    let mut start = 0;
    let mut blocks = Vec::new();
    for (group, &len) in GROUPS.iter().enumerate() {
        if len > 0 {
            let w = weight
                .clone()
                .slice_dim(0, group..group + 1)
                .reshape([5, 6]);
            blocks.push(x.clone().slice_dim(0, start..start + len).matmul(w));
        }
        start += len;
    }
    Tensor::cat(blocks, 0)
}

#[test]
fn composed_grouped_matmul_is_the_per_group_arithmetic_bit_for_bit() {
    let old = run(per_group);
    let new = run(fused);
    for (new, old) in new.into_iter().zip(old) {
        assert_eq!(bits(new), bits(old));
    }
    let x = tensor([8, 5], 0.6).inner().into_primitive().tensor();
    let w = tensor([4, 5, 6], 1.1).inner().into_primitive().tensor();
    assert!(!Flex::has_grouped_matmul_kernel(&x, &w));
}

/// The node over the stacked weight, driven with Flex's reference kernels.
fn stacked_node(x: Tensor<B, 2>, weight: Tensor<B, 3>) -> Tensor<B, 2> {
    Tensor::from_primitive(TensorPrimitive::Float(grouped_matmul_node::<
        Flex,
        NoCheckpointing,
    >(
        x.into_primitive().tensor(),
        weight.into_primitive().tensor(),
        &GroupRows::on_host(GROUPS.to_vec()),
    )))
}

#[test]
fn grouped_matmul_node_gradients_equal_the_composed_graph() {
    let composed = run(fused);
    let node = run(stacked_node);
    assert_close(&node[0], &composed[0], "output");
    assert_close(&node[1], &composed[1], "x gradient");
    assert_close(&node[2], &composed[2], "weight gradient");
    // Group 2 has no rows: its weight gradient is exactly zero; group 3's is not.
    assert!(node[2][60..90].iter().all(|&g| g == 0.0));
    assert!(node[2][90..].iter().any(|g| g.abs() > 1e-3));
}

/// Output and gradients (x, each part's, concatenated) of the node over the groups' own weights,
/// each a leaf as a parameter is; `x_grad` false leaves `x` out of the graph, so only the parts
/// take gradients.
fn run_parts(x_grad: bool) -> [Vec<f32>; 3] {
    let x = tensor([8, 5], 0.6);
    let x = if x_grad { x.require_grad() } else { x };
    let weight = tensor([4, 5, 6], 1.1);
    let parts: Vec<Tensor<B, 2>> = (0..GROUPS.len())
        .map(|g| fresh(&weight.clone().slice_dim(0, g..g + 1).reshape([5, 6])).require_grad())
        .collect();
    let primitives: Vec<_> = parts
        .iter()
        .map(|part| part.clone().into_primitive().tensor())
        .collect();
    assert!(crate::parts_are_leaves::<Flex, NoCheckpointing>(
        &primitives
    ));
    let out: Tensor<B, 2> =
        Tensor::from_primitive(TensorPrimitive::Float(grouped_matmul_parts_node::<
            Flex,
            NoCheckpointing,
        >(
            x.clone().into_primitive().tensor(),
            primitives,
            &GroupRows::on_host(GROUPS.to_vec()),
        )));
    let grads = (out.clone() * tensor([8, 6], 1.7)).sum().backward();
    let part_grads = parts
        .iter()
        .flat_map(|part| flat(part.grad(&grads).expect("a part gradient")))
        .collect();
    let x_grad = x.grad(&grads).map(flat).unwrap_or_default();
    [flat(out), x_grad, part_grads]
}

/// The node over the groups' own weights (which it keeps for its backward, never stacked when the
/// backend's kernels take parts): the same output and gradients as the node over the stacked
/// weight, each part's gradient its slice of the stacked one's, bit for bit.
#[test]
fn grouped_matmul_parts_node_equals_the_stacked_node() {
    let stacked = run(stacked_node);
    let parts = run_parts(true);
    for (parts, stacked) in parts.into_iter().zip(stacked.clone()) {
        assert_eq!(bits(parts), bits(stacked));
    }
    // With only the weights taking gradients the node is still recorded, their gradients equal.
    let weights_only = run_parts(false);
    assert!(weights_only[1].is_empty());
    assert_eq!(bits(weights_only[2].clone()), bits(stacked[2].clone()));
}

/// Parts computed by other ops (slices of one weight) are not leaves: the op stacks them, and the
/// gradient reaches the weight through the slices' own backward.
#[test]
fn grouped_matmul_over_computed_parts_reaches_their_source() {
    let stacked = run(fused);
    let sliced = run(|x, weight| {
        let parts: Vec<_> = (0..GROUPS.len())
            .map(|g| {
                weight
                    .clone()
                    .slice_dim(0, g..g + 1)
                    .reshape([5, 6])
                    .into_primitive()
                    .tensor()
            })
            .collect();
        assert!(!crate::parts_are_leaves::<Flex, NoCheckpointing>(&parts));
        Tensor::from_primitive(TensorPrimitive::Float(B::fused_grouped_matmul_parts(
            x.into_primitive().tensor(),
            parts,
            &GroupRows::on_host(GROUPS.to_vec()),
        )))
    });
    for (sliced, stacked) in sliced.into_iter().zip(stacked) {
        assert_eq!(bits(sliced), bits(stacked));
    }
}
