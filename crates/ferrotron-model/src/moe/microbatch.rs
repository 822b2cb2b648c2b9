//! Routing a microbatch whose tokens are spread over tensor- and context-parallel ranks.
//!
//! Capacity, drop policies (the earlier token wins a tie), Sinkhorn and the balancing statistics
//! are functions of the whole microbatch in one-rank order, so splitting the tokens must not
//! change them. The router logits are small (`tokens × experts`) and the decisions are host-side
//! anyway, so every rank of the microbatch gathers all logits with their one-rank token ids,
//! routes the microbatch exactly as one rank does, and keeps the decisions of its own tokens.

use ferrotron_parallel::{Comm, ParallelContext};

use super::routing::Routing;
use crate::parallel::context_parallel_positions;

/// Where this rank's routed tokens sit in the one-rank microbatch.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct TokenPlacement {
    pub sequences: usize,
    /// The full sequence length (all tp and cp pieces).
    pub seq_len: usize,
    /// One-rank token id (`sequence · seq_len + position`) of each routed row, in row order.
    pub ids: Vec<usize>,
}

impl TokenPlacement {
    pub(super) fn total_tokens(&self) -> usize {
        self.sequences * self.seq_len
    }

    /// The placement of the rows this rank routes, for an input of `[batch, seq_local]` tokens.
    /// With sequence parallelism the input already is this tp rank's part of the sequence;
    /// without it the input is replicated over tp and the MoE routes its `tp_rank`-th block of
    /// rows (see [`splits_rows_over_tp`]).
    pub(super) fn of_rank(ctx: &ParallelContext, batch: usize, seq_local: usize) -> TokenPlacement {
        let (tp_rank, tp_size) = (ctx.tp.rank(), ctx.tp.size());
        let sequence_split = ctx.sequence_split();
        let cp_seq = if sequence_split {
            seq_local * tp_size
        } else {
            seq_local
        };
        let seq_len = cp_seq * ctx.cp.size();
        let positions = context_parallel_positions(seq_len, ctx.cp.rank(), ctx.cp.size())
            .unwrap_or_else(|error| panic!("MoE token placement: {error}"));
        let local_rows = batch * seq_local;
        let id = |row: usize| {
            let (sequence, local) = (row / seq_local, row % seq_local);
            let cp_local = if sequence_split {
                tp_rank * seq_local + local
            } else {
                local
            };
            sequence * seq_len + positions[cp_local]
        };
        let rows = if splits_rows_over_tp(ctx) {
            let block = local_rows / tp_size;
            tp_rank * block..(tp_rank + 1) * block
        } else {
            0..local_rows
        };
        TokenPlacement {
            sequences: batch,
            seq_len,
            ids: rows.map(id).collect(),
        }
    }
}

/// Without sequence parallelism the MoE input is replicated over tp; the layer then gives each
/// tp rank a block of the rows (Megatron requires sequence parallelism instead), so no token is
/// dispatched or back-propagated twice.
pub(super) fn splits_rows_over_tp(ctx: &ParallelContext) -> bool {
    ctx.tp.size() > 1 && !ctx.sequence_parallel
}

/// The groups whose ranks hold other tokens of the same microbatch.
pub(super) fn microbatch_groups(ctx: &ParallelContext) -> Vec<Comm> {
    [&ctx.tp, &ctx.cp]
        .into_iter()
        .filter(|comm| comm.size() > 1)
        .cloned()
        .collect()
}

/// Every rank's `(ids, logits)` of the microbatch, placed in one-rank order: `[T · experts]`.
pub(super) fn gather_logits(
    groups: &[Comm],
    placement: &TokenPlacement,
    logits: &[f32],
    num_experts: usize,
) -> Vec<f32> {
    let mut ids: Vec<u64> = placement.ids.iter().map(|&id| id as u64).collect();
    let mut values = logits.to_vec();
    for comm in groups {
        let size = comm.size();
        let mut all_ids = vec![0u64; ids.len() * size];
        let mut all_values = vec![0f32; values.len() * size];
        comm.all_gather_u64(&ids, &mut all_ids)
            .and_then(|()| comm.all_gather_f32(&values, &mut all_values))
            .unwrap_or_else(|error| panic!("MoE routing: gathering router logits: {error}"));
        ids = all_ids;
        values = all_values;
    }
    let total = placement.total_tokens();
    assert_eq!(
        ids.len(),
        total,
        "MoE routing: the microbatch's ranks hold {} tokens, expected {total}",
        ids.len()
    );
    let mut ordered = vec![f32::NAN; total * num_experts];
    for (row, &id) in values.chunks_exact(num_experts).zip(&ids) {
        let id = id as usize;
        ordered[id * num_experts..(id + 1) * num_experts].copy_from_slice(row);
    }
    ordered
}

/// The decisions of the rows at `ids` (one-rank token ids) of a microbatch's routing.
pub(super) fn rows_of(routing: &Routing, ids: &[usize]) -> Routing {
    let topk = routing.topk;
    Routing {
        num_tokens: ids.len(),
        topk,
        experts: slots_of(&routing.experts, ids, topk),
        weights: slots_of(&routing.weights, ids, topk),
        kept: slots_of(&routing.kept, ids, topk),
        capacity: routing.capacity,
    }
}

fn slots_of<T: Copy>(flat: &[T], ids: &[usize], topk: usize) -> Vec<T> {
    ids.iter()
        .flat_map(|&id| flat[id * topk..(id + 1) * topk].iter().copied())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routing() -> Routing {
        Routing {
            num_tokens: 3,
            topk: 2,
            experts: vec![0, 1, 2, 3, 1, 0],
            weights: vec![0.6, 0.4, 0.7, 0.3, 0.5, 0.5],
            kept: vec![true, false, true, true, true, true],
            capacity: Some(2),
        }
    }

    #[test]
    fn rows_keep_their_slots_in_the_asked_order() {
        let picked = rows_of(&routing(), &[2, 0]);
        assert_eq!(picked.num_tokens, 2);
        assert_eq!(picked.experts, vec![1, 0, 0, 1]);
        assert_eq!(picked.weights, vec![0.5, 0.5, 0.6, 0.4]);
        assert_eq!(picked.kept, vec![true, true, true, false]);
    }
}
