//! Grouped matmul: row block `g` of `x [rows, k]` (`group_rows[g]` consecutive rows) times
//! `weight[g]` of `weight [groups, k, n]` → `[rows, n]`; the counts may stay on the device
//! ([`GroupRows`]: the composed arithmetic reads them, a kernel need not).
//!
//! It is one MoE projection for all of a rank's experts at once, over the routed tokens sorted
//! by expert. Composed, every group is a slice of the rows and of the stacked weight and one
//! matmul (the arithmetic the experts did one by one before the op, so burn-flex keeps its
//! numbers), which on a GPU is one small GEMM per expert and per pass plus the slicing around
//! it; a kernel runs each pass (forward, input gradient, weight gradient) as one grouped GEMM.
//!
//! Every group appears in the composed graph, an empty one as a zero-row product added into the
//! output, so the graph has the same shape and stays connected to `x` whatever the routing (the
//! token dispatchers need that; see `ferrotron-model`'s `moe/dispatch.rs`). Hence the
//! scatter-add of each block: `Tensor::cat` drops empty blocks, and with every block empty
//! returns a tensor cut off from the graph.

use burn::backend::Autodiff;
use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{IndexingUpdateOp, Int, Tensor, TensorData};

use crate::FusedOps;
use crate::op::group_rows::GroupRows;
use crate::primitive::{unwrap, wrap};

/// Gradients of a grouped matmul: `x [rows, k]` and `weight [groups, k, n]` (zero for a group
/// with no rows).
#[derive(Debug, Clone)]
pub struct GroupedMatmulGrads<B: Backend> {
    pub x: FloatTensor<B>,
    pub weight: FloatTensor<B>,
}

/// Gradients of a grouped matmul over the groups' own weights: `x [rows, k]` and one `[k, n]`
/// per part.
#[derive(Debug, Clone)]
pub struct GroupedMatmulPartsGrads<B: Backend> {
    pub x: FloatTensor<B>,
    pub parts: Vec<FloatTensor<B>>,
}

/// Checks the shapes against the group sizes: `(k, n)`.
pub(crate) fn grouped_dims(x: &[usize], weight: &[usize], group_rows: &[usize]) -> (usize, usize) {
    assert!(
        x.len() == 2 && weight.len() == 3,
        "grouped matmul: x {x:?} must be [rows, k] and weight {weight:?} [groups, k, n]"
    );
    assert_eq!(
        weight[0],
        group_rows.len(),
        "grouped matmul: {} weight groups for {} row groups",
        weight[0],
        group_rows.len()
    );
    assert_eq!(
        x[0],
        group_rows.iter().sum::<usize>(),
        "grouped matmul: {} rows, but the groups hold {:?}",
        x[0],
        group_rows
    );
    assert_eq!(x[1], weight[1], "grouped matmul: inner dims differ");
    (weight[1], weight[2])
}

/// The row indices `start..start + len`.
fn row_index<B: Backend>(start: usize, len: usize, device: &B::Device) -> Tensor<B, 1, Int> {
    let rows: Vec<i64> = (start..start + len).map(|row| row as i64).collect();
    Tensor::from_data(TensorData::new(rows, [len]), device)
}

/// `weight[g]` as `[k, n]`.
fn group_weight<B: Backend>(weight: Tensor<B, 3>, group: usize) -> Tensor<B, 2> {
    let [_, k, n] = weight.dims();
    weight.slice_dim(0, group..group + 1).reshape([k, n])
}

/// Burn's ops, group by group: the model's arithmetic (gather the group's rows, multiply,
/// scatter-add into the output).
pub fn composed_grouped_matmul<B: Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    group_rows: &GroupRows<B>,
) -> FloatTensor<B> {
    let group_rows = group_rows.host();
    let x = wrap::<B, 2>(x);
    let weight = wrap::<B, 3>(weight);
    let (_, n) = grouped_dims(&x.dims(), &weight.dims(), group_rows);
    let device = x.device();
    let mut out = Tensor::<B, 2>::zeros([x.dims()[0], n], &device).cast(x.dtype());
    let mut start = 0;
    for (group, &len) in group_rows.iter().enumerate() {
        let rows = row_index::<B>(start, len, &device);
        let block = x
            .clone()
            .select(0, rows.clone())
            .matmul(group_weight(weight.clone(), group));
        out = out.select_assign(0, rows, block, IndexingUpdateOp::Add);
        start += len;
    }
    unwrap(out)
}

/// Reference of `FusedOps::grouped_matmul_kernel_backward`: `dx` block `g` = `grad_g ·
/// weight[g]ᵀ`, `dweight[g]` = `x_gᵀ · grad_g` (zero for an empty group), in the inputs' dtype.
pub(crate) fn grouped_matmul_backward_reference<B: Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    grad_output: FloatTensor<B>,
    rows: &GroupRows<B>,
) -> GroupedMatmulGrads<B> {
    let group_rows = rows.host();
    let x = wrap::<B, 2>(x);
    let weight = wrap::<B, 3>(weight);
    let grad = wrap::<B, 2>(grad_output);
    let (k, n) = grouped_dims(&x.dims(), &weight.dims(), group_rows);
    let transposed = weight.clone().swap_dims(1, 2);
    let dx = composed_grouped_matmul::<B>(unwrap(grad.clone()), unwrap(transposed), rows);
    let mut start = 0;
    let dweight = group_rows
        .iter()
        .map(|&len| {
            let block = if len == 0 {
                Tensor::<B, 2>::zeros([k, n], &x.device()).cast(x.dtype())
            } else {
                let rows = start..start + len;
                let xg = x.clone().slice_dim(0, rows.clone());
                xg.transpose().matmul(grad.clone().slice_dim(0, rows))
            };
            start += len;
            block
        })
        .collect();
    GroupedMatmulGrads {
        x: dx,
        weight: unwrap(Tensor::stack::<3>(dweight, 0)),
    }
}

#[derive(Debug)]
struct GroupedMatmulOp;

/// `parts`, each `[k, n]`, as one `[groups, k, n]` tensor.
pub(crate) fn stack_parts<B: Backend>(parts: Vec<FloatTensor<B>>) -> FloatTensor<B> {
    unwrap(Tensor::stack::<3>(
        parts.into_iter().map(wrap::<B, 2>).collect(),
        0,
    ))
}

/// `stacked [groups, k, n]` as its groups' `[k, n]` matrices (slices).
pub(crate) fn unstack_parts<B: Backend>(stacked: FloatTensor<B>) -> Vec<FloatTensor<B>> {
    let stacked = wrap::<B, 3>(stacked);
    let [groups, k, n] = stacked.dims();
    (0..groups)
        .map(|group| unwrap(group_weight(stacked.clone(), group).reshape([k, n])))
        .collect()
}

/// State of one grouped-matmul node: `x`, the stacked weight and the group sizes.
type GroupedMatmulState<B> = (FloatTensor<B>, FloatTensor<B>, GroupRows<B>);

/// Parents are `x` and `weight`.
impl<B: FusedOps> Backward<B, 2> for GroupedMatmulOp {
    type State = GroupedMatmulState<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (x, weight, group_rows) = ops.state;
        let out = B::grouped_matmul_kernel_backward(x, weight, grad, &group_rows);
        let [node_x, node_weight] = ops.parents;
        if let Some(node) = node_x {
            grads.register::<B>(node.id, out.x);
        }
        if let Some(node) = node_weight {
            grads.register::<B>(node.id, out.weight);
        }
    }
}

/// Records a grouped matmul as one node whose forward and backward are `B`'s kernels; it keeps
/// `x` and `weight` (as the composed matmuls do). Public so tests can drive the node with a CPU
/// backend's reference kernels.
pub fn grouped_matmul_node<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    group_rows: &GroupRows<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let group_rows = &group_rows.of::<B>();
    let prepared = GroupedMatmulOp
        .prepare::<C>([x.node.clone(), weight.node.clone()])
        .compute_bound()
        .stateful();
    match prepared {
        OpsKind::Tracked(prep) => {
            let output = B::grouped_matmul_kernel_forward(
                x.primitive.clone(),
                weight.primitive.clone(),
                group_rows,
            );
            prep.finish((x.primitive, weight.primitive, group_rows.clone()), output)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::grouped_matmul_kernel_forward(
            x.primitive,
            weight.primitive,
            group_rows,
        )),
    }
}

/// Whether `parts` can go to [`grouped_matmul_parts_node`]: each is a leaf of the graph (a
/// parameter), whose gradient the node registers itself; a part computed by another op would
/// need that op's backward run, which only a parent gets.
pub fn parts_are_leaves<B: Backend, C: CheckpointStrategy>(
    parts: &[FloatTensor<Autodiff<B, C>>],
) -> bool {
    !parts.is_empty() && parts.iter().all(|part| part.node.parents.is_empty())
}

/// Which part a node over `parts` hangs on beside `x` (one that takes a gradient, else the
/// first: the node is then tracked when only the weights take gradients), and each part's graph
/// id where it takes a gradient, which the node's backward registers itself.
pub(crate) fn part_ids<B: Backend, C: CheckpointStrategy>(
    parts: &[FloatTensor<Autodiff<B, C>>],
) -> (usize, Vec<Option<NodeId>>) {
    let takes = |part: &FloatTensor<Autodiff<B, C>>| !part.node.requirement.is_none();
    let anchor = parts.iter().position(takes).unwrap_or(0);
    let ids = parts
        .iter()
        .map(|part| takes(part).then_some(part.node.id))
        .collect();
    (anchor, ids)
}

#[derive(Debug)]
struct GroupedMatmulPartsOp;

/// State of one node over the groups' own weights: `x`, the parts, the graph id of each part
/// that takes a gradient, and the group sizes.
type GroupedMatmulPartsState<B> = (
    FloatTensor<B>,
    Vec<FloatTensor<B>>,
    Vec<Option<NodeId>>,
    GroupRows<B>,
);

/// Parents are `x` and one of the parts, which makes the node tracked when only the weights
/// take gradients; every part's gradient is registered by its id, that one's too.
impl<B: FusedOps> Backward<B, 2> for GroupedMatmulPartsOp {
    type State = GroupedMatmulPartsState<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (x, parts, ids, group_rows) = ops.state;
        let out = B::grouped_matmul_parts_kernel_backward(x, &parts, grad, &group_rows);
        let [node_x, _] = ops.parents;
        if let Some(node) = node_x {
            grads.register::<B>(node.id, out.x);
        }
        for (id, grad) in ids.into_iter().zip(out.parts) {
            if let Some(id) = id {
                grads.register::<B>(id, grad);
            }
        }
    }
}

/// A grouped matmul over the groups' own weights `parts` (each `[k, n]`, leaves of the graph:
/// [`parts_are_leaves`]), never stacked: the inner backend's kernels take the parts
/// ([`FusedOps::grouped_matmul_parts_kernel_forward`]), the node keeps them (parameters the model
/// holds anyway) and registers each part's gradient. A stacked copy costs a read and write of
/// every expert's weights forward and backward (Qwen3-30B-A3B: 1.2 GB a layer, one copy launch
/// per expert) and, kept from forward to backward, a copy per MoE layer and microbatch in flight
/// (DeepSeek-V3's layout: 21 GiB on a stage).
pub fn grouped_matmul_parts_node<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    parts: Vec<FloatTensor<Autodiff<B, C>>>,
    group_rows: &GroupRows<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    assert!(
        parts_are_leaves::<B, C>(&parts),
        "grouped matmul over parts: every part must be a leaf of the graph"
    );
    let group_rows = &group_rows.of::<B>();
    let (anchor, ids) = part_ids::<B, C>(&parts);
    let prepared = GroupedMatmulPartsOp
        .prepare::<C>([x.node.clone(), parts[anchor].node.clone()])
        .compute_bound()
        .stateful();
    let parts: Vec<FloatTensor<B>> = parts.into_iter().map(|part| part.primitive).collect();
    match prepared {
        OpsKind::Tracked(prep) => {
            let output =
                B::grouped_matmul_parts_kernel_forward(x.primitive.clone(), &parts, group_rows);
            prep.finish((x.primitive, parts, ids, group_rows.clone()), output)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::grouped_matmul_parts_kernel_forward(
            x.primitive,
            &parts,
            group_rows,
        )),
    }
}
