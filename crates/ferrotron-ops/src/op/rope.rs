//! Rotary embeddings applied to the packed QKV projection.
//!
//! Composed, RoPE is a slice of each half, a negation, a concatenation, two multiplies and an
//! add per rotated tensor (six passes forward, more backward, each writing a full tensor), and
//! it needs q and k split out of the projection first, which took models with RoPE off the
//! packed attention path (`op/qkv.rs`). Rotating the query and key slots of the packed
//! tensor in place of that keeps the whole layer packed: a kernel writes the rotated projection
//! in one pass and, backward, rotates its gradient back in one pass.
//!
//! Megatron's "rotate half" layout: channel `i` pairs with `i + d/2`; per row, with tables
//! `cos`, `sin` `[s, d]`, `out₁ = x₁·cos₁ − x₂·sin₁` and `out₂ = x₂·cos₂ + x₁·sin₂`. The value
//! slot passes through. The composed default is exactly the arithmetic the model used on the
//! split q and k (`x·cos + cat(−x₂, x₁)·sin`), so CPU numbers do not move.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

use crate::FusedOps;
use crate::primitive::{unwrap, wrap};

/// The packed projection's rotated slots `[b, s, g, slots − 1, d]` and its value slot.
fn rotated_and_value<B: Backend>(qkv: Tensor<B, 5>) -> (Tensor<B, 5>, Tensor<B, 5>) {
    let slots = qkv.dims()[3];
    assert!(
        slots >= 3,
        "packed qkv: {slots} slots per group leave no query head"
    );
    (
        qkv.clone().slice_dim(3, 0..slots - 1),
        qkv.slice_dim(3, slots - 1..slots),
    )
}

/// A `[s, d]` table as `[1, s, 1, 1, d]`, broadcasting over batch, groups and slots.
fn per_row<B: Backend>(table: FloatTensor<B>) -> Tensor<B, 5> {
    let [seq, dim] = wrap::<B, 2>(table.clone()).dims();
    wrap::<B, 2>(table).reshape([1, seq, 1, 1, dim])
}

/// `[x₁, x₂]` → `[−x₂, x₁]` along the channels.
fn rotate_half<B: Backend>(x: Tensor<B, 5>) -> Tensor<B, 5> {
    let dim = x.dims()[4];
    assert!(
        dim.is_multiple_of(2),
        "rope: head dim {dim} is odd, so its channels do not pair"
    );
    let half = dim / 2;
    let first = x.clone().slice_dim(4, 0..half);
    let second = x.slice_dim(4, half..dim);
    Tensor::cat(vec![second.neg(), first], 4)
}

/// Rotates the query and key slots of `qkv [b, s, g, slots, d]` by `cos`, `sin` `[s, d]`, in
/// burn ops: the model's arithmetic.
pub fn composed_rope_qkv<B: Backend>(
    qkv: FloatTensor<B>,
    cos: FloatTensor<B>,
    sin: FloatTensor<B>,
) -> FloatTensor<B> {
    let (rotated, value) = rotated_and_value(wrap::<B, 5>(qkv));
    let roped = rotated.clone() * per_row(cos) + rotate_half(rotated) * per_row(sin);
    unwrap(Tensor::cat(vec![roped, value], 3))
}

/// Reference of `FusedOps::rope_qkv_kernel_backward`: the projection's gradient from the
/// rotated projection's, `g·cos − rotate_half(g·sin)` = `[g₁·cos₁ + g₂·sin₂, g₂·cos₂ − g₁·sin₁]`
/// on the rotated slots (the transposed rotation), the value slot's passed through.
pub(crate) fn rope_qkv_backward_reference<B: Backend>(
    grad: FloatTensor<B>,
    cos: FloatTensor<B>,
    sin: FloatTensor<B>,
) -> FloatTensor<B> {
    let (rotated, value) = rotated_and_value(wrap::<B, 5>(grad));
    let back = rotated.clone() * per_row(cos) - rotate_half(rotated * per_row(sin));
    unwrap(Tensor::cat(vec![back, value], 3))
}

#[derive(Debug)]
struct RopeQkvOp;

impl<B: FusedOps> Backward<B, 1> for RopeQkvOp {
    /// The tables `cos`, `sin`.
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        if let [Some(node)] = ops.parents {
            let (cos, sin) = ops.state;
            grads.register::<B>(node.id, B::rope_qkv_kernel_backward(grad, cos, sin));
        }
    }
}

/// Records RoPE on the packed projection as one node whose forward and backward are `B`'s
/// kernels; it keeps only the tables (the rotation is linear). The tables are constants, not
/// parents. Public so tests can drive the node with a CPU backend's reference kernels.
pub fn rope_qkv_node<B: FusedOps, C: CheckpointStrategy>(
    qkv: FloatTensor<Autodiff<B, C>>,
    cos: FloatTensor<Autodiff<B, C>>,
    sin: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let prepared = RopeQkvOp
        .prepare::<C>([qkv.node.clone()])
        .compute_bound()
        .stateful();
    let output =
        B::rope_qkv_kernel_forward(qkv.primitive, cos.primitive.clone(), sin.primitive.clone());
    match prepared {
        OpsKind::Tracked(prep) => prep.finish((cos.primitive, sin.primitive), output),
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}
