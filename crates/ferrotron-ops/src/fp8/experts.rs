//! fp8 experts: an MoE layer's fc1 or fc2 over the routed rows (sorted by expert, the counts
//! per expert in a [`GroupRows`]) as fp8 grouped GEMMs, on Transformer Engine's roles. The
//! routed rows and their gradient are cast once for all experts (one [`Fp8Linear`]'s Input and
//! GradOutput roles: one amax over the layer's rows, as the dense linear's). Each expert's weight
//! is cast with a scale of its own (one [`Fp8Linear`] an expert, its Weight role), as
//! `GroupedLinear` keeps one fp8 meta per GEMM for its weights: a shared weight scale is set by
//! the largest expert, and an expert far smaller than it loses its small values to e4m3's
//! subnormals.
//!
//! Hopper's fp8 MMAs read both operands with the reduction contiguous, so the three products
//! take the casts' transposes as the dense linear's do:
//! - forward `x · W_g`: rows of `x` against `W_gᵀ [n, k]` ([`FusedOps::fp8_grouped_rows`]);
//! - input gradient `dy · W_gᵀ`: rows of `dy` against `W_g [k, n]` (the same product);
//! - weight gradient `x_gᵀ · dy_g`: each group's columns of `xᵀ [k, rows]` and `dyᵀ [n, rows]`
//!   ([`FusedOps::fp8_grouped_inner`]).
//!
//! The node keeps `x` cast (both layouts) and the step's weight casts, never the 16-bit `x`.

use burn::backend::Autodiff;
use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorMetadata};

use crate::fp8::linear::{Fp8Linear, Fp8Operand, Fp8Tensor};
use crate::fp8::scaling::Fp8Role;
use crate::op::grouped::{part_ids, parts_are_leaves};
use crate::primitive::{unwrap, wrap};
use crate::{FusedOps, GroupRows};

/// An MoE linear's fp8 handles: `rows` scales the routed rows and their gradient, `weights[e]`
/// expert `e`'s weight.
#[derive(Debug, Clone)]
pub struct Fp8Experts {
    pub rows: Fp8Linear,
    pub weights: Vec<Fp8Linear>,
}

/// What the forward leaves for the backward.
struct Fp8ExpertsForward<B: Backend> {
    output: FloatTensor<B>,
    input: Fp8Tensor<B>,
    weights: Vec<Fp8Tensor<B>>,
}

/// `x [rows, k]` through each group's `parts[g] [k, n]` in fp8, recording amaxes when `record`
/// (training); the weights are cast once per optimizer step ([`Fp8Linear::weight`]).
fn forward<B: FusedOps>(
    x: FloatTensor<B>,
    parts: &[FloatTensor<B>],
    group_rows: &GroupRows<B>,
    experts: &Fp8Experts,
    record: bool,
) -> Fp8ExpertsForward<B> {
    assert_eq!(
        parts.len(),
        experts.weights.len(),
        "one fp8 handle per expert's weight"
    );
    let dtype = x.dtype();
    let input = B::fp8_quantize(x, &experts.rows, Fp8Role::Input, record);
    let weights: Vec<Fp8Tensor<B>> = parts
        .iter()
        .zip(&experts.weights)
        .map(|(part, fp8)| fp8.weight::<B>(part.clone(), record))
        .collect();
    let transposed: Vec<Fp8Operand<B>> = weights.iter().map(Fp8Tensor::columns).collect();
    let output = B::fp8_grouped_rows(input.rows(), &transposed, group_rows, dtype, true);
    Fp8ExpertsForward {
        output,
        input,
        weights,
    }
}

/// The inference forward (no autodiff): casts that record nothing.
pub fn fp8_experts_inference<B: FusedOps>(
    x: FloatTensor<B>,
    parts: &[FloatTensor<B>],
    group_rows: &GroupRows<B>,
    experts: &Fp8Experts,
) -> FloatTensor<B> {
    forward::<B>(x, parts, group_rows, experts, false).output
}

#[cfg_attr(not(feature = "reference"), allow(unreachable_pub))]
/// Reference of [`FusedOps::fp8_grouped_rows`]: group by group on the host's counts, each an
/// [`FusedOps::fp8_matmul`] of the group's rows.
pub fn fp8_grouped_rows_reference<B: FusedOps>(
    a: Fp8Operand<B>,
    b: &[Fp8Operand<B>],
    group_rows: &GroupRows<B>,
    dtype: DType,
    fast_accumulation: bool,
) -> FloatTensor<B> {
    let rows: Tensor<B, 2> = wrap(a.data.clone());
    let [total, _] = rows.dims();
    let n = b.first().map_or(0, |b| b.data.shape().dims::<2>()[0]);
    let mut start = 0;
    let mut pieces = Vec::new();
    for (group, &count) in group_rows.host().iter().enumerate() {
        if count == 0 {
            continue;
        }
        let group_rows = Fp8Operand {
            data: unwrap(rows.clone().slice_dim(0, start..start + count)),
            ..a.clone()
        };
        pieces.push(wrap::<B, 2>(B::fp8_matmul(
            group_rows,
            b[group].clone(),
            None,
            dtype,
            fast_accumulation,
        )));
        start += count;
    }
    if pieces.is_empty() {
        return unwrap(Tensor::<B, 2>::zeros([total, n], (&rows.device(), dtype)));
    }
    unwrap(Tensor::cat(pieces, 0))
}

#[cfg_attr(not(feature = "reference"), allow(unreachable_pub))]
/// Reference of [`FusedOps::fp8_grouped_inner`]: group by group on the host's counts, each an
/// [`FusedOps::fp8_matmul`] of the group's columns of both operands, stacked
/// `[groups, m, n]` (zeros for a group without rows).
pub fn fp8_grouped_inner_reference<B: FusedOps>(
    a_t: Fp8Operand<B>,
    b_t: Fp8Operand<B>,
    group_rows: &GroupRows<B>,
    dtype: DType,
) -> FloatTensor<B> {
    let a: Tensor<B, 2> = wrap(a_t.data.clone());
    let b: Tensor<B, 2> = wrap(b_t.data.clone());
    let ([m, _], [n, _]) = (a.dims(), b.dims());
    let device = a.device();
    let mut start = 0;
    let mut groups = Vec::new();
    for &count in group_rows.host() {
        let columns = start..start + count;
        groups.push(if count == 0 {
            Tensor::<B, 2>::zeros([m, n], (&device, dtype))
        } else {
            wrap(B::fp8_matmul(
                Fp8Operand {
                    data: unwrap(a.clone().slice([0..m, columns.clone()])),
                    ..a_t.clone()
                },
                Fp8Operand {
                    data: unwrap(b.clone().slice([0..n, columns])),
                    ..b_t.clone()
                },
                None,
                dtype,
                false,
            ))
        });
        start += count;
    }
    unwrap(Tensor::stack::<3>(groups, 0))
}

#[derive(Debug)]
struct Fp8ExpertsOp;

/// What the backward needs: `x` cast (its transpose for the weight gradient), the step's
/// weight casts, the handles, the counts, each part's graph id and the gradients' dtypes.
struct Fp8ExpertsState<B: Backend> {
    input: Fp8Tensor<B>,
    weights: Vec<Fp8Tensor<B>>,
    experts: Fp8Experts,
    group_rows: GroupRows<B>,
    ids: Vec<Option<NodeId>>,
    input_dtype: DType,
    weight_dtype: DType,
}

impl<B: Backend> Clone for Fp8ExpertsState<B> {
    fn clone(&self) -> Self {
        Fp8ExpertsState {
            input: self.input.clone(),
            weights: self.weights.clone(),
            experts: self.experts.clone(),
            group_rows: self.group_rows.clone(),
            ids: self.ids.clone(),
            input_dtype: self.input_dtype,
            weight_dtype: self.weight_dtype,
        }
    }
}

impl<B: Backend> std::fmt::Debug for Fp8ExpertsState<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fp8ExpertsState({:?})", self.experts.rows)
    }
}

/// Parents are `x` and one of the parts (as the 16-bit parts node's); every part's gradient is
/// registered by its id.
impl<B: FusedOps> Backward<B, 2> for Fp8ExpertsOp {
    type State = Fp8ExpertsState<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let state = ops.state;
        let dy = B::fp8_quantize(grad, &state.experts.rows, Fp8Role::GradOutput, true);
        let [node_x, _] = ops.parents;
        if let Some(node) = node_x {
            let weights: Vec<Fp8Operand<B>> = state.weights.iter().map(Fp8Tensor::rows).collect();
            let dx = B::fp8_grouped_rows(
                dy.rows(),
                &weights,
                &state.group_rows,
                state.input_dtype,
                false,
            );
            grads.register::<B>(node.id, dx);
        }
        if state.ids.iter().any(Option::is_some) {
            let dw: Tensor<B, 3> = wrap(B::fp8_grouped_inner(
                state.input.columns(),
                dy.columns(),
                &state.group_rows,
                state.weight_dtype,
            ));
            let [_, k, n] = dw.dims();
            for (group, id) in state.ids.into_iter().enumerate() {
                if let Some(id) = id {
                    let part = dw.clone().slice_dim(0, group..group + 1).reshape([k, n]);
                    grads.register::<B>(id, unwrap(part));
                }
            }
        }
    }
}

/// Records `x [rows, k]` through each group's own weight `parts[g] [k, n]` (leaves of the
/// graph: parameters) in fp8 as one node, whose backward casts `dy` once for both gradient
/// products. Public so tests can drive the node with a CPU backend's reference primitives.
pub fn fp8_experts_node<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    parts: Vec<FloatTensor<Autodiff<B, C>>>,
    group_rows: &GroupRows<Autodiff<B, C>>,
    experts: &Fp8Experts,
) -> FloatTensor<Autodiff<B, C>> {
    assert!(
        parts_are_leaves::<B, C>(&parts),
        "fp8 experts: every expert's weight must be a leaf of the graph"
    );
    let group_rows = group_rows.of::<B>();
    let (anchor, ids) = part_ids::<B, C>(&parts);
    let prepared = Fp8ExpertsOp
        .prepare::<C>([x.node.clone(), parts[anchor].node.clone()])
        .compute_bound()
        .stateful();
    let input_dtype = x.primitive.dtype();
    let weight_dtype = parts[0].primitive.dtype();
    let parts: Vec<FloatTensor<B>> = parts.into_iter().map(|part| part.primitive).collect();
    // Untracked too (a recomputed range's first forward): its casts record the amaxes the
    // tracked re-run will, which the max makes harmless.
    let forward = forward::<B>(x.primitive, &parts, &group_rows, experts, true);
    match prepared {
        OpsKind::Tracked(prep) => {
            let state = Fp8ExpertsState {
                input: forward.input,
                weights: forward.weights,
                experts: experts.clone(),
                group_rows,
                ids,
                input_dtype,
                weight_dtype,
            };
            prep.finish(state, forward.output)
        }
        OpsKind::UnTracked(prep) => prep.finish(forward.output),
    }
}
