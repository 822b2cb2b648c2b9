//! Vocabulary parallelism: the embedding table and the output layer are split by rows over tp,
//! and the cross-entropy is computed from the local logit slices without ever gathering the
//! full `[tokens, vocab]` logits (Megatron's `VocabParallelEmbedding` and
//! `vocab_parallel_cross_entropy`). On one rank both reduce to the plain lookup and loss.

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor, TensorPrimitive};
use ferrotron_ops::FusedOps;
use ferrotron_parallel::collectives::{all_reduce_detached, reduce_from_region};
use ferrotron_parallel::{Comm, ParallelOps, ReduceOp};

/// The rows `start..start + rows` of the padded vocabulary that this rank holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct VocabShard {
    pub start: usize,
    pub rows: usize,
    /// Whether other ranks hold the rest (false: `rows` is the whole vocabulary).
    pub split: bool,
}

impl VocabShard {
    pub(crate) fn new(padded_vocab: usize, rank: usize, size: usize) -> Self {
        let rows = padded_vocab / size;
        VocabShard {
            start: rank * rows,
            rows,
            split: size > 1,
        }
    }

    /// `ids` shifted into this shard with out-of-range ids pointed at row 0, and the mask of
    /// the out-of-range ones (`None` when this rank holds every row).
    fn localise<B: Backend, const D: usize>(
        &self,
        ids: Tensor<B, D, Int>,
    ) -> (Tensor<B, D, Int>, Option<Tensor<B, D, Bool>>) {
        if !self.split {
            return (ids, None);
        }
        let local = ids - self.start as i64;
        let outside = local
            .clone()
            .lower_elem(0)
            .bool_or(local.clone().greater_equal_elem(self.rows as i64));
        (local.mask_fill(outside.clone(), 0), Some(outside))
    }
}

/// `[batch, seq]` ids → `[batch, seq, hidden]` rows of this rank's part of the table: zero
/// for ids another rank holds, so the sum over tp (the caller's reduction) is the full lookup.
pub(crate) fn vocab_parallel_lookup<B: FusedOps>(
    weight: Tensor<B, 2>,
    tokens: Tensor<B, 2, Int>,
    shard: VocabShard,
) -> Tensor<B, 3> {
    let (local, outside) = shard.localise(tokens);
    let rows = Tensor::from_primitive(TensorPrimitive::Float(B::fused_embedding(
        weight.into_primitive().tensor(),
        local.into_primitive(),
    )));
    match outside {
        Some(outside) => {
            let dims = rows.dims();
            rows.mask_fill(outside.unsqueeze_dim::<3>(2).expand(dims), 0.0)
        }
        None => rows,
    }
}

/// Per-token negative log-likelihood `[batch·seq]` from this rank's logit columns
/// (`[batch, seq, vocab/tp]`), as `log Σ exp(l − m) − (l[label] − m)` with `m` the global
/// maximum (detached: the loss does not depend on it). The sum of exponentials and the target
/// logit are partial over tp and summed with `reduce_from_region`, whose backward is the
/// identity, so each rank's logit gradient is its slice of `softmax − one_hot`.
pub(crate) fn vocab_parallel_cross_entropy<B: ParallelOps>(
    logits: Tensor<B, 3>,
    labels: Tensor<B, 2, Int>,
    shard: VocabShard,
    tp: &Comm,
) -> Tensor<B, 1> {
    let [batch, seq, vocab] = logits.dims();
    let rows = batch * seq;
    let logits = logits.reshape([rows, vocab]);
    let max = all_reduce_detached(logits.clone().detach().max_dim(1), ReduceOp::Max, tp);
    let shifted = logits - max;
    let sum_exp = reduce_from_region(shifted.clone().exp().sum_dim(1), tp);
    let (local, outside) = shard.localise(labels.reshape([rows, 1]));
    let target = shifted.gather(1, local);
    let target = match outside {
        Some(outside) => target.mask_fill(outside, 0.0),
        None => target,
    };
    let target = reduce_from_region(target, tp);
    (sum_exp.log() - target).reshape([rows])
}
