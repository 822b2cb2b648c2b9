//! The output layer and its cross-entropy as one op over chunks of rows (Megatron's
//! `--cross-entropy-fusion-impl linear`) for [`FusedOps`].
//!
//! Every other loss path keeps the whole `[rows, vocab]` logits from the forward to the backward,
//! and the backward writes their gradient whole beside them. At long sequence lengths that is
//! the largest activation of the step: 131,072 tokens of a 50,304-token vocabulary are 13 GB of
//! bf16 logits and as much again for their gradient, more than a whole layer of a 1B model.
//! This op computes the logits a chunk of rows at a time, keeps only one log-sum-exp per row,
//! and recomputes each chunk's logits in the backward (one more `rows × hidden × vocab` GEMM,
//! a third of the output layer's FLOPs) to form that chunk's gradient and use it for both
//! gradient products at once. At most one chunk's logits and their gradient are alive.
//!
//! The chunks run the backend's own kernels (the output layer's GEMM or tied-logits kernel, the
//! cross-entropy kernels), so a row's loss is what the unchunked path computes. Across chunks
//! the weight's gradient is summed in f32 and rounded once; its one difference from one GEMM
//! over all rows is that each chunk's product is rounded to the weight's dtype before the sum.
//!
//! [`FusedOps`]: crate::FusedOps

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Int, Tensor};

use crate::FusedOps;
use crate::primitive::{unwrap, wrap};

/// How the output layer's weight is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputWeight {
    /// `[vocab, hidden]`: the word embedding, tied.
    Tied,
    /// `[hidden, vocab]`: an output layer of its own (burn's `Linear` layout).
    Untied,
}

/// The op's settings: the weight's layout and how many rows one chunk holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearLossSpec {
    pub weight: OutputWeight,
    pub chunk_rows: usize,
}

/// Per-row losses `[rows]` (f32) of the output layer `weight` applied to `rows [n, hidden]`,
/// against `labels [n]`, never holding more than `spec.chunk_rows` rows of logits.
pub fn linear_cross_entropy<B: FusedOps>(
    rows: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    labels: Tensor<B, 1, Int>,
    spec: LinearLossSpec,
) -> Tensor<B, 1> {
    wrap(B::fused_linear_cross_entropy(
        unwrap(rows),
        unwrap(weight),
        labels.into_primitive(),
        spec,
    ))
}

/// What the forward returns: per-row losses and log-sum-exps, `[rows]` f32 each.
#[derive(Debug, Clone)]
pub struct LinearLossSaved<B: Backend> {
    pub losses: FloatTensor<B>,
    pub log_sum_exp: FloatTensor<B>,
}

/// The row ranges of the chunks of `rows` rows.
fn chunks(rows: usize, chunk_rows: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let step = chunk_rows.max(1);
    (0..rows)
        .step_by(step)
        .map(move |start| start..(start + step).min(rows))
}

/// One chunk's logits through the backend's output-layer kernels.
fn chunk_logits<B: FusedOps>(
    rows: FloatTensor<B>,
    weight: FloatTensor<B>,
    layout: OutputWeight,
) -> FloatTensor<B> {
    match layout {
        OutputWeight::Tied => B::tied_logits_kernel_forward(rows, weight),
        OutputWeight::Untied => B::float_matmul(rows, weight),
    }
}

/// Rows `range` of `x` (of rank `D`, sliced along its first dimension).
fn slice<B: Backend, const D: usize>(
    x: &FloatTensor<B>,
    range: std::ops::Range<usize>,
) -> FloatTensor<B> {
    unwrap(wrap::<B, D>(x.clone()).slice([range]))
}

fn slice_labels<B: Backend>(x: &IntTensor<B>, range: std::ops::Range<usize>) -> IntTensor<B> {
    Tensor::<B, 1, Int>::from_primitive(x.clone())
        .slice([range])
        .into_primitive()
}

fn cat<B: Backend, const D: usize>(parts: Vec<FloatTensor<B>>) -> FloatTensor<B> {
    if parts.len() == 1 {
        return parts.into_iter().next().expect("one part");
    }
    unwrap(Tensor::cat(
        parts.into_iter().map(wrap::<B, D>).collect(),
        0,
    ))
}

/// The forward chunk by chunk: each chunk's logits, its losses and log-sum-exps, the logits
/// dropped before the next chunk.
pub fn linear_cross_entropy_forward<B: FusedOps>(
    rows: FloatTensor<B>,
    weight: FloatTensor<B>,
    labels: IntTensor<B>,
    spec: LinearLossSpec,
) -> LinearLossSaved<B> {
    let n = wrap::<B, 2>(rows.clone()).dims()[0];
    let (mut losses, mut log_sum_exp) = (Vec::new(), Vec::new());
    for range in chunks(n, spec.chunk_rows) {
        let logits = chunk_logits::<B>(
            slice::<B, 2>(&rows, range.clone()),
            weight.clone(),
            spec.weight,
        );
        let saved = B::cross_entropy_kernel_forward(logits, slice_labels::<B>(&labels, range));
        losses.push(saved.losses);
        log_sum_exp.push(saved.log_sum_exp);
    }
    LinearLossSaved {
        losses: cat::<B, 1>(losses),
        log_sum_exp: cat::<B, 1>(log_sum_exp),
    }
}

/// `(d rows, d weight)` from the losses' gradient: each chunk's logits recomputed, their
/// gradient formed and used for both products while it is alive.
pub fn linear_cross_entropy_backward<B: FusedOps>(
    rows: FloatTensor<B>,
    weight: FloatTensor<B>,
    state: LinearLossState<B>,
    grad_losses: FloatTensor<B>,
    spec: LinearLossSpec,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let n = wrap::<B, 2>(rows.clone()).dims()[0];
    let weight_dtype = wrap::<B, 2>(weight.clone()).dtype();
    let ranges: Vec<_> = chunks(n, spec.chunk_rows).collect();
    let single = ranges.len() == 1;
    let mut d_rows = Vec::with_capacity(ranges.len());
    let mut d_weight: Option<Tensor<B, 2>> = None;
    for range in ranges {
        let chunk_rows = slice::<B, 2>(&rows, range.clone());
        let logits = chunk_logits::<B>(chunk_rows.clone(), weight.clone(), spec.weight);
        let grad_logits = B::cross_entropy_kernel_backward(
            logits,
            slice_labels::<B>(&state.labels, range.clone()),
            slice::<B, 1>(&state.log_sum_exp, range.clone()),
            slice::<B, 1>(&grad_losses, range),
        );
        let (d_chunk, d_weight_chunk) = match spec.weight {
            OutputWeight::Tied => {
                B::tied_logits_kernel_backward(chunk_rows, weight.clone(), grad_logits)
            }
            OutputWeight::Untied => (
                B::float_matmul(grad_logits.clone(), B::float_transpose(weight.clone())),
                B::float_matmul(B::float_transpose(chunk_rows), grad_logits),
            ),
        };
        d_rows.push(d_chunk);
        let d_weight_chunk = wrap::<B, 2>(d_weight_chunk);
        d_weight = Some(match d_weight {
            _ if single => d_weight_chunk,
            None => d_weight_chunk.cast(DType::F32),
            Some(sum) => sum + d_weight_chunk.cast(DType::F32),
        });
    }
    let d_weight = d_weight.expect("at least one row").cast(weight_dtype);
    (cat::<B, 2>(d_rows), unwrap(d_weight))
}

/// What the backward reads besides the operands: the labels and the log-sum-exps.
#[derive(Debug, Clone)]
pub struct LinearLossState<B: Backend> {
    pub labels: IntTensor<B>,
    pub log_sum_exp: FloatTensor<B>,
}

#[derive(Debug)]
struct LinearCrossEntropyOp {
    spec: LinearLossSpec,
}

impl<B: FusedOps> Backward<B, 2> for LinearCrossEntropyOp {
    type State = (FloatTensor<B>, FloatTensor<B>, LinearLossState<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_rows, node_weight] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (rows, weight, state) = ops.state;
        let (d_rows, d_weight) =
            linear_cross_entropy_backward::<B>(rows, weight, state, grad, self.spec);
        if let Some(node) = node_rows {
            grads.register::<B>(node.id, d_rows);
        }
        if let Some(node) = node_weight {
            grads.register::<B>(node.id, d_weight);
        }
    }
}

/// Records the chunked output layer and cross-entropy as one node keeping the operands, the
/// labels and the log-sum-exps: no logits. Public so tests can drive the node on the CPU.
pub fn linear_cross_entropy_node<B: FusedOps, C: CheckpointStrategy>(
    rows: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    labels: IntTensor<B>,
    spec: LinearLossSpec,
) -> FloatTensor<Autodiff<B, C>> {
    let prepared = LinearCrossEntropyOp { spec }
        .prepare::<C>([rows.node.clone(), weight.node.clone()])
        .compute_bound()
        .stateful();
    match prepared {
        OpsKind::Tracked(prep) => {
            let saved = linear_cross_entropy_forward::<B>(
                rows.primitive.clone(),
                weight.primitive.clone(),
                labels.clone(),
                spec,
            );
            let state = LinearLossState {
                labels,
                log_sum_exp: saved.log_sum_exp,
            };
            prep.finish((rows.primitive, weight.primitive, state), saved.losses)
        }
        OpsKind::UnTracked(prep) => prep.finish(
            linear_cross_entropy_forward::<B>(rows.primitive, weight.primitive, labels, spec)
                .losses,
        ),
    }
}
