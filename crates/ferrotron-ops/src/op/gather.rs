//! Row gathers whose gradient is a gather too ([`FusedOps::gather_rows`]): the MoE layer's
//! dispatch (tokens to rows sorted by expert) and combine (expert rows back to their tokens'
//! slots).
//!
//! burn's `select` differentiates into a scatter-add onto zeros: on a GPU, atomics (for 16-bit
//! tensors on our backend a round trip through f32 copies of both sides), and with more than two
//! contributions per row a sum whose order depends on timing. Routing knows more: every input row
//! is read by a fixed number (`group`) of output rows, listed in `back`, so its gradient is a
//! gather of those rows and a sum over the group in a fixed order. Floating-point addition
//! commutes, so for groups of two (top-2 routing) the sums are the scatter-add's bit for bit.
//!
//! [`FusedOps::gather_rows`]: crate::FusedOps::gather_rows

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Int, Tensor, TensorMetadata};

use crate::FusedOps;
use crate::primitive::{unwrap, wrap};

/// Reference of `FusedOps::gather_rows_backward`: the rows of `grad [p, h]` at `back [m ·
/// group]`, summed over each group → `[m, h]` (a select and a sum over the group).
pub fn gather_rows_backward_reference<B: Backend>(
    grad: FloatTensor<B>,
    back: IntTensor<B>,
    group: usize,
) -> FloatTensor<B> {
    let grad: Tensor<B, 2> = wrap(grad);
    let [_, hidden] = grad.dims();
    let back = Tensor::<B, 1, Int>::from_primitive(back);
    let [reads] = back.dims();
    let rows = reads / group.max(1);
    let gathered = grad.select(0, back);
    unwrap(
        gathered
            .reshape([rows, group, hidden])
            .sum_dim(1)
            .reshape([rows, hidden]),
    )
}

#[derive(Debug)]
struct GatherRowsOp;

impl<B: FusedOps> Backward<B, 1> for GatherRowsOp {
    /// `back` and `group`.
    type State = (IntTensor<B>, usize);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (back, group) = ops.state;
        if let [Some(node)] = ops.parents {
            grads.register::<B>(node.id, B::gather_rows_backward(grad, back, group));
        }
    }
}

/// Records [`FusedOps::gather_rows`] as one node whose backward is
/// [`FusedOps::gather_rows_backward`].
///
/// # Panics
/// If `back` does not hold `group` entries for each row of `x`.
///
/// [`FusedOps::gather_rows`]: crate::FusedOps::gather_rows
pub(crate) fn gather_rows_node<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    index: IntTensor<B>,
    back: IntTensor<B>,
    group: usize,
) -> FloatTensor<Autodiff<B, C>> {
    let rows = x.primitive.shape().dims::<2>()[0];
    assert_eq!(
        back.shape().num_elements(),
        rows * group,
        "gather_rows: {rows} rows read {group} times each need as many back indices"
    );
    let prepared = GatherRowsOp
        .prepare::<C>([x.node.clone()])
        .compute_bound()
        .stateful();
    let out = B::float_select(x.primitive, 0, index);
    match prepared {
        OpsKind::Tracked(prep) => prep.finish((back, group), out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}
