//! The MoE layer's combine ([`FusedOps::fused_combine_rows`]): each token's `k` expert output
//! rows, weighted by its combine weights and summed.
//!
//! Composed, it is a gather of every slot's row, a multiply by the weights and a sum over each
//! token's slots: three passes over `tokens · k · hidden` values forward, and backward the sum's
//! broadcast, the multiply's two products (one reduced again for the weights) and the gather's
//! gather. A kernel reads each expert row once forward (its `k` rows summed in f32, rounded
//! once) and once backward, where one pass per slot writes the row's gradient (each row is read
//! by exactly one slot, so no two slots write the same row) and the weight's (a dot product of
//! the token's output gradient and the row).
//!
//! A slot that capacity dropped reads "row `rows`", one past the last: a zero row, whose
//! gradient goes nowhere. The composed default is exactly the model's arithmetic before the op
//! (an appended zero row where a slot was dropped), so burn-flex keeps its numbers bit for bit;
//! the reference kernels (burn ops, f32) are the contract a kernel meets.
//!
//! [`FusedOps::fused_combine_rows`]: crate::FusedOps::fused_combine_rows

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Int, Tensor, TensorMetadata, TensorPrimitive};

use crate::FusedOps;
use crate::primitive::{unwrap, wrap};

/// How a combine reads its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CombineSpec {
    /// Slots per token (the routing's `k`).
    pub topk: usize,
    /// Whether any slot reads the zero row (capacity dropped it).
    pub dropped: bool,
}

/// The combine's integer inputs: `index [tokens · k]`, each slot's row (`rows` for a dropped
/// slot); `back [rows]`, the slot that reads each row.
#[derive(Debug, Clone)]
pub struct CombineIndex<B: Backend> {
    pub index: IntTensor<B>,
    pub back: IntTensor<B>,
}

fn int<B: Backend>(x: IntTensor<B>) -> Tensor<B, 1, Int> {
    Tensor::from_primitive(x)
}

/// `rows` with the zero row appended where a slot was dropped, and the back index likewise
/// (the zero row's entry is never used: its gradient is discarded).
fn with_zero_row<B: Backend>(
    rows: Tensor<B, 2>,
    back: Tensor<B, 1, Int>,
    dropped: bool,
) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
    if !dropped {
        return (rows, back);
    }
    let [_, hidden] = rows.dims();
    let device = rows.device();
    let zero = Tensor::<B, 2>::zeros([1, hidden], (&device, rows.dtype()));
    let any = Tensor::<B, 1, Int>::zeros([1], &device);
    (
        Tensor::cat(vec![rows, zero], 0),
        Tensor::cat(vec![back, any], 0),
    )
}

/// The model's combine before the op: [`FusedOps::gather_rows`] of each slot's row, times its
/// weight, summed over the token's slots.
///
/// [`FusedOps::gather_rows`]: crate::FusedOps::gather_rows
pub fn composed_combine_rows<B: FusedOps>(
    rows: FloatTensor<B>,
    index: CombineIndex<B>,
    weights: FloatTensor<B>,
    spec: CombineSpec,
) -> FloatTensor<B> {
    let (source, back) = with_zero_row(wrap::<B, 2>(rows), int(index.back), spec.dropped);
    let [_, hidden] = source.dims();
    let slots = index.index.shape().num_elements();
    let tokens = slots / spec.topk.max(1);
    let slot_rows = wrap::<B, 2>(B::gather_rows(
        unwrap(source),
        index.index,
        back.into_primitive(),
        1,
    ));
    unwrap(
        (slot_rows * wrap::<B, 1>(weights).reshape([slots, 1]))
            .reshape([tokens, spec.topk, hidden])
            .sum_dim(1)
            .reshape([tokens, hidden]),
    )
}

/// Every slot's row in f32 `[tokens · k, hidden]` (zeros for a dropped slot).
fn slot_rows_f32<B: Backend>(
    rows: FloatTensor<B>,
    index: &CombineIndex<B>,
    dropped: bool,
) -> Tensor<B, 2> {
    let (source, _) = with_zero_row(
        wrap::<B, 2>(rows).cast(DType::F32),
        int(index.back.clone()),
        dropped,
    );
    source.select(0, int(index.index.clone()))
}

/// Reference of `FusedOps::combine_rows_kernel_forward`: the weighted sum in f32, returned in
/// the rows' dtype.
pub(crate) fn combine_rows_forward_reference<B: Backend>(
    rows: FloatTensor<B>,
    index: &CombineIndex<B>,
    weights: FloatTensor<B>,
    spec: CombineSpec,
) -> FloatTensor<B> {
    let dtype = rows.dtype();
    let slot_rows = slot_rows_f32(rows, index, spec.dropped);
    let [slots, hidden] = slot_rows.dims();
    let tokens = slots / spec.topk.max(1);
    let weights = wrap::<B, 1>(weights).cast(DType::F32).reshape([slots, 1]);
    unwrap(
        (slot_rows * weights)
            .reshape([tokens, spec.topk, hidden])
            .sum_dim(1)
            .reshape([tokens, hidden])
            .cast(dtype),
    )
}

/// Reference of `FusedOps::combine_rows_kernel_backward`: from the output gradient `[tokens,
/// hidden]`, the rows' gradient (row `r`: its slot's weight times its token's gradient) and the
/// weights' (slot `s`: the token's gradient · the slot's row), in f32, returned in the rows' and
/// the weights' dtypes.
pub(crate) fn combine_rows_backward_reference<B: Backend>(
    rows: FloatTensor<B>,
    index: &CombineIndex<B>,
    weights: FloatTensor<B>,
    grad_output: FloatTensor<B>,
    spec: CombineSpec,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let (rows_dtype, weights_dtype) = (rows.dtype(), weights.dtype());
    let slot_rows = slot_rows_f32(rows, index, spec.dropped);
    let [slots, hidden] = slot_rows.dims();
    let tokens = slots / spec.topk.max(1);
    let grad = wrap::<B, 2>(grad_output)
        .cast(DType::F32)
        .reshape([tokens, 1, hidden])
        .expand([tokens, spec.topk, hidden])
        .reshape([slots, hidden]);
    let d_weights = (grad.clone() * slot_rows).sum_dim(1).reshape([slots]);
    let weights = wrap::<B, 1>(weights).cast(DType::F32).reshape([slots, 1]);
    let d_rows = (grad * weights).select(0, int(index.back.clone()));
    (
        unwrap(d_rows.cast(rows_dtype)),
        unwrap(d_weights.cast(weights_dtype)),
    )
}

#[derive(Debug)]
struct CombineRowsOp;

impl<B: FusedOps> Backward<B, 2> for CombineRowsOp {
    /// The rows, the index, the weights and the spec.
    type State = (FloatTensor<B>, CombineIndex<B>, FloatTensor<B>, CombineSpec);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (rows, index, weights, spec) = ops.state;
        let (d_rows, d_weights) =
            B::combine_rows_kernel_backward(rows, &index, weights, grad, spec);
        let [rows_node, weights_node] = ops.parents;
        if let Some(node) = rows_node {
            grads.register::<B>(node.id, d_rows);
        }
        if let Some(node) = weights_node {
            grads.register::<B>(node.id, d_weights);
        }
    }
}

/// Records the combine as one node whose forward and backward are `B`'s kernels; it keeps the
/// rows, the index and the weights (the composed graph keeps the gathered rows and the weights).
/// Public so tests can drive the node with a CPU backend's reference kernels.
pub fn combine_rows_node<B: FusedOps, C: CheckpointStrategy>(
    rows: FloatTensor<Autodiff<B, C>>,
    index: CombineIndex<Autodiff<B, C>>,
    weights: FloatTensor<Autodiff<B, C>>,
    spec: CombineSpec,
) -> FloatTensor<Autodiff<B, C>> {
    let index = CombineIndex::<B> {
        index: index.index,
        back: index.back,
    };
    let prepared = CombineRowsOp
        .prepare::<C>([rows.node.clone(), weights.node.clone()])
        .compute_bound()
        .stateful();
    let out = B::combine_rows_kernel_forward(
        rows.primitive.clone(),
        &index,
        weights.primitive.clone(),
        spec,
    );
    match prepared {
        OpsKind::Tracked(prep) => {
            prep.finish((rows.primitive, index, weights.primitive, spec), out)
        }
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}

/// The combine of `rows [r, hidden]` as a tensor op (the model's call).
pub fn combine_rows<B: FusedOps>(
    rows: Tensor<B, 2>,
    index: Tensor<B, 1, Int>,
    back: Tensor<B, 1, Int>,
    weights: Tensor<B, 1>,
    spec: CombineSpec,
) -> Tensor<B, 2> {
    Tensor::from_primitive(TensorPrimitive::Float(B::fused_combine_rows(
        rows.into_primitive().tensor(),
        CombineIndex {
            index: index.into_primitive(),
            back: back.into_primitive(),
        },
        weights.into_primitive().tensor(),
        spec,
    )))
}
