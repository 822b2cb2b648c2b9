//! Token dispatch and combine across expert-parallel (`ep`) and expert-tensor-parallel (`etp`)
//! ranks, as Megatron-Core's token dispatchers do it.
//!
//! - all-to-all: kept (token, slot) rows are permuted by global expert, counts are exchanged,
//!   rows travel to the rank owning their expert (uneven `all_to_all_rows`), are all-gathered
//!   over etp, run through this rank's piece of each expert, reduce-scattered back over etp and
//!   returned by the reverse all-to-all; the token's own rank weights and sums them.
//! - all-gather: every rank gathers all tokens (with their combine weights) over ep and etp,
//!   computes its experts' weighted outputs for all of them, and a reduce-scatter returns each
//!   rank the sum for its tokens.
//!
//! Every exchange is an autodiff op whose backward is the reverse exchange, and each is called
//! on every rank in the same order whatever the data (an empty block is still sent), so the
//! backward's collectives line up on all ranks. The sums over etp happen in the exchanges; fc2's
//! bias (whole on every etp rank) enters each partial as `b − (1 − 1/etp)·detach(b)`: the pieces
//! add up to `b` and each rank's bias gradient is the full one, so replicas stay equal.

use burn::tensor::backend::Backend;
use burn::tensor::{IndexingUpdateOp, Int, Tensor, TensorData};
use ferrotron_ops::GroupRows;
use ferrotron_parallel::collectives::all_to_all_rows;
use ferrotron_parallel::{Comm, ParallelOps};

use super::expert::Expert;
use super::grouped::grouped_experts;
use super::routing::Routing;

/// The expert-parallel groups of a rank and the experts it holds.
#[derive(Debug, Clone)]
pub(super) struct ExpertGroups {
    pub ep: Comm,
    pub etp: Comm,
    pub num_experts: usize,
}

impl ExpertGroups {
    fn local_experts(&self) -> usize {
        self.num_experts / self.ep.size()
    }

    fn first_expert(&self) -> usize {
        self.ep.rank() * self.local_experts()
    }
}

/// Megatron's permutation: kept (token, slot) pairs grouped by global expert, in token order.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Permutation {
    pub tokens: Vec<usize>,
    pub slots: Vec<usize>,
    /// Rows per global expert.
    pub per_expert: Vec<usize>,
}

impl Permutation {
    pub(super) fn new(routing: &Routing, num_experts: usize) -> Permutation {
        let mut permutation = Permutation {
            tokens: Vec::new(),
            slots: Vec::new(),
            per_expert: Vec::with_capacity(num_experts),
        };
        for expert in 0..num_experts {
            let (tokens, slots) = routing.assignments(expert);
            permutation.per_expert.push(tokens.len());
            permutation.tokens.extend(tokens);
            permutation.slots.extend(slots);
        }
        permutation
    }
}

/// All-to-all dispatcher: `[tokens, hidden]` → the weighted sum of each token's kept experts.
pub(super) fn all_to_all<B: ParallelOps>(
    tokens: Tensor<B, 2>,
    weights: Tensor<B, 1>,
    routing: &Routing,
    experts: &[Expert<B>],
    groups: &ExpertGroups,
) -> Tensor<B, 2> {
    let [num_tokens, hidden] = tokens.dims();
    let device = tokens.device();
    let ep_size = groups.ep.size();
    let local = groups.local_experts();
    let permutation = Permutation::new(routing, groups.num_experts);

    // Rows this rank sends each ep rank, per local expert of that rank: [ep][local].
    let sent_per_expert: Vec<u64> = permutation.per_expert.iter().map(|&c| c as u64).collect();
    let mut received_per_expert = vec![0u64; groups.num_experts];
    let blocks = vec![local; ep_size];
    expect(
        groups
            .ep
            .all_to_all_u64(&sent_per_expert, &blocks, &mut received_per_expert, &blocks),
        "exchanging token counts over ep",
    );
    let send_rows = block_sums(&permutation.per_expert, local);
    let received: Vec<usize> = received_per_expert.iter().map(|&c| c as usize).collect();
    let recv_rows = block_sums(&received, local);

    let permuted = select_rows(tokens, &permutation.tokens);
    let dispatched = all_to_all_rows(permuted, &send_rows, &recv_rows, &groups.ep);

    // Every etp rank's received counts: rows of the etp-gathered buffer are [etp][ep][local].
    let all_counts = all_gather_counts(&received, &groups.etp);
    let etp_rows: Vec<usize> = all_counts.iter().map(|c| c.iter().sum()).collect();
    let gathered = gather_rows(dispatched, &etp_rows, &groups.etp);
    let mut rows_of_expert = vec![Vec::new(); local];
    let mut row = 0;
    for counts in &all_counts {
        for (index, &count) in counts.iter().enumerate() {
            rows_of_expert[index % local].extend(row..row + count);
            row += count;
        }
    }
    let assignments: Vec<ExpertRows> = rows_of_expert
        .into_iter()
        .map(|rows| ExpertRows {
            rows,
            slots: Vec::new(),
        })
        .collect();
    let outputs = run_experts(gathered, None, &assignments, experts, groups);
    let returned = reduce_scatter_rows(outputs, &etp_rows, &groups.etp);
    let combined_rows = all_to_all_rows(returned, &recv_rows, &send_rows, &groups.ep);

    let gate = select_rows(weights.unsqueeze_dim::<2>(1), &permutation.slots);
    let output = Tensor::<B, 2>::zeros([num_tokens, hidden], &device);
    scatter_add_rows(output, &permutation.tokens, combined_rows * gate)
}

/// All-gather dispatcher: the same result through all-gather and reduce-scatter.
pub(super) fn all_gather<B: ParallelOps>(
    tokens: Tensor<B, 2>,
    weights: Tensor<B, 1>,
    routing: &Routing,
    experts: &[Expert<B>],
    groups: &ExpertGroups,
) -> Tensor<B, 2> {
    let [num_tokens, hidden] = tokens.dims();
    let topk = routing.topk;
    // Expert of each slot, or `num_experts` where capacity dropped it.
    let decisions: Vec<u64> = routing
        .experts
        .iter()
        .zip(&routing.kept)
        .map(|(&expert, &kept)| if kept { expert } else { groups.num_experts } as u64)
        .collect();
    let with_weights = Tensor::cat(vec![tokens, weights.reshape([num_tokens, topk])], 1);
    let ep_rows = all_gather_count(num_tokens, &groups.ep);
    let ep_gathered = gather_rows(with_weights, &ep_rows, &groups.ep);
    let ep_decisions = gather_values(&decisions, &ep_rows, topk, &groups.ep);
    let etp_rows = all_gather_count(ep_rows.iter().sum(), &groups.etp);
    let gathered = gather_rows(ep_gathered, &etp_rows, &groups.etp);
    let all_decisions = gather_values(&ep_decisions, &etp_rows, topk, &groups.etp);

    let local = groups.local_experts();
    let first = groups.first_expert();
    let mut assignments = vec![
        ExpertRows {
            rows: Vec::new(),
            slots: Vec::new()
        };
        local
    ];
    for (slot, &expert) in all_decisions.iter().enumerate() {
        let expert = expert as usize;
        if (first..first + local).contains(&expert) {
            assignments[expert - first].rows.push(slot / topk);
            assignments[expert - first].slots.push(slot);
        }
    }
    let rows = gathered.dims()[0];
    let inputs = gathered.clone().slice_dim(1, 0..hidden);
    let gates = gathered
        .slice_dim(1, hidden..hidden + topk)
        .reshape([rows * topk, 1]);
    let outputs = run_experts(inputs, Some(gates), &assignments, experts, groups);
    let etp_returned = reduce_scatter_rows(outputs, &etp_rows, &groups.etp);
    reduce_scatter_rows(etp_returned, &ep_rows, &groups.ep)
}

/// Rows of the gathered buffer each local expert takes, and (all-gather dispatcher) the flat
/// slot of each row's combine weight.
#[derive(Debug, Clone)]
struct ExpertRows {
    rows: Vec<usize>,
    slots: Vec<usize>,
}

/// `[rows, hidden]` of this rank's expert pieces' outputs (partial sums over etp), each row's
/// weight applied when `gates` (`[rows · topk, 1]`) is given.
///
/// Every expert runs, on zero rows if none reached it, and the sum starts from `0 · inputs`:
/// the autograd graph then has the same shape on every rank whatever the routing. Backward
/// runs nodes by depth, so a data-dependent shape could order this layer's exchanges
/// differently from a peer's collectives on another branch (the shared expert's tp
/// all-reduce) and deadlock; and the inputs' exchange must be back-propagated on every rank.
///
/// Whole experts whose rows arrive unweighted (the all-to-all dispatcher without etp) run as
/// grouped matmuls over the rows sorted by expert (`grouped.rs`): one node whatever the routing.
fn run_experts<B: ParallelOps>(
    inputs: Tensor<B, 2>,
    gates: Option<Tensor<B, 2>>,
    assignments: &[ExpertRows],
    experts: &[Expert<B>],
    groups: &ExpertGroups,
) -> Tensor<B, 2> {
    let etp_size = groups.etp.size();
    if etp_size == 1 && gates.is_none() {
        return grouped_in_received_order(inputs, assignments, experts, groups.ep.size() == 1);
    }
    let mut outputs = inputs.clone().mul_scalar(0.0);
    for (expert, assigned) in experts.iter().zip(assignments) {
        let selected = select_rows(inputs.clone(), &assigned.rows);
        let mut out = if etp_size == 1 {
            expert.forward(selected)
        } else {
            let partial = expert.forward_partial(selected);
            match expert.fc2_bias() {
                Some(bias) => {
                    let share =
                        bias.clone() - bias.detach().mul_scalar(1.0 - 1.0 / etp_size as f64);
                    partial + share.unsqueeze_dim::<2>(0)
                }
                None => partial,
            }
        };
        if let Some(gates) = &gates {
            out = out * select_rows(gates.clone(), &assigned.slots);
        }
        outputs = scatter_add_rows(outputs, &assigned.rows, out);
    }
    outputs
}

/// Every received row (each belongs to exactly one local expert) through its expert, in the
/// order received: sorted by expert first, unless they come from one ep rank and so already are
/// (then no peer waits on this rank's exchanges). Which it is depends on the layout, never on the
/// routing, so the graph's shape stays the same on every rank.
fn grouped_in_received_order<B: ParallelOps>(
    inputs: Tensor<B, 2>,
    assignments: &[ExpertRows],
    experts: &[Expert<B>],
    one_source: bool,
) -> Tensor<B, 2> {
    let order: Vec<usize> = assignments
        .iter()
        .flat_map(|assigned| assigned.rows.iter().copied())
        .collect();
    let group_rows = GroupRows::on_host(assignments.iter().map(|a| a.rows.len()).collect());
    assert_eq!(
        order.len(),
        inputs.dims()[0],
        "MoE dispatch: every received row belongs to one local expert"
    );
    if one_source {
        debug_assert!(
            order
                .iter()
                .enumerate()
                .all(|(position, &row)| position == row)
        );
        return grouped_experts(experts, inputs, &group_rows, None);
    }
    // As in `run_experts`: `0 · inputs` keeps the inputs' exchange in the graph when this rank
    // received no rows (burn's ops on empty tensors can drop the link).
    let zero = inputs.clone().mul_scalar(0.0);
    let outputs = grouped_experts(experts, select_rows(inputs, &order), &group_rows, None);
    let mut received_order = vec![0; order.len()];
    for (position, &row) in order.iter().enumerate() {
        received_order[row] = position;
    }
    zero + select_rows(outputs, &received_order)
}

/// Uneven all-gather of rows (`counts[j]` rows from rank `j`), as an all-to-all that sends this
/// rank's block to everyone; its backward returns and sums every rank's gradient of the block.
fn gather_rows<B: ParallelOps>(x: Tensor<B, 2>, counts: &[usize], comm: &Comm) -> Tensor<B, 2> {
    let size = comm.size();
    if size == 1 {
        return x;
    }
    let mine = counts[comm.rank()];
    let copies = Tensor::cat((0..size).map(|_| x.clone()).collect(), 0);
    all_to_all_rows(copies, &vec![mine; size], counts, comm)
}

/// The conjugate of [`gather_rows`]: block `j` of `x` goes back to rank `j`, which sums the
/// blocks it receives.
fn reduce_scatter_rows<B: ParallelOps>(
    x: Tensor<B, 2>,
    counts: &[usize],
    comm: &Comm,
) -> Tensor<B, 2> {
    let size = comm.size();
    if size == 1 {
        return x;
    }
    let hidden = x.dims()[1];
    let mine = counts[comm.rank()];
    let received = all_to_all_rows(x, counts, &vec![mine; size], comm);
    received
        .reshape([size, mine, hidden])
        .sum_dim(0)
        .reshape([mine, hidden])
}

/// `count` of every rank of `comm`, in rank order.
fn all_gather_count(count: usize, comm: &Comm) -> Vec<usize> {
    let mut all = vec![0u64; comm.size()];
    expect(
        comm.all_gather_u64(&[count as u64], &mut all),
        "gathering token counts",
    );
    all.into_iter().map(|c| c as usize).collect()
}

/// Every rank's `counts` vector (all of one length), in rank order.
fn all_gather_counts(counts: &[usize], comm: &Comm) -> Vec<Vec<usize>> {
    let mine: Vec<u64> = counts.iter().map(|&c| c as u64).collect();
    let mut all = vec![0u64; mine.len() * comm.size()];
    expect(
        comm.all_gather_u64(&mine, &mut all),
        "gathering expert counts over etp",
    );
    all.chunks_exact(counts.len().max(1))
        .take(comm.size())
        .map(|chunk| chunk.iter().map(|&c| c as usize).collect())
        .collect()
}

/// Uneven all-gather of per-row host values (`width` per row, `rows[j]` rows from rank `j`).
fn gather_values(values: &[u64], rows: &[usize], width: usize, comm: &Comm) -> Vec<u64> {
    let size = comm.size();
    if size == 1 {
        return values.to_vec();
    }
    let copies: Vec<u64> = (0..size).flat_map(|_| values.iter().copied()).collect();
    let send = vec![values.len(); size];
    let recv: Vec<usize> = rows.iter().map(|r| r * width).collect();
    let mut all = vec![0u64; recv.iter().sum()];
    expect(
        comm.all_to_all_u64(&copies, &send, &mut all, &recv),
        "gathering routing decisions",
    );
    all
}

fn block_sums(values: &[usize], block: usize) -> Vec<usize> {
    values.chunks(block).map(|b| b.iter().sum()).collect()
}

pub(super) fn select_rows<B: Backend>(x: Tensor<B, 2>, rows: &[usize]) -> Tensor<B, 2> {
    let device = x.device();
    x.select(0, index_tensor::<B>(rows, &device))
}

pub(super) fn scatter_add_rows<B: Backend>(
    x: Tensor<B, 2>,
    rows: &[usize],
    values: Tensor<B, 2>,
) -> Tensor<B, 2> {
    let device = x.device();
    x.select_assign(
        0,
        index_tensor::<B>(rows, &device),
        values,
        IndexingUpdateOp::Add,
    )
}

pub(crate) fn index_tensor<B: Backend>(indices: &[usize], device: &B::Device) -> Tensor<B, 1, Int> {
    let values: Vec<i64> = indices.iter().map(|&i| i as i64).collect();
    Tensor::from_data(TensorData::new(values, [indices.len()]), device)
}

/// Host-side collectives of the dispatcher: a failure is a broken world, reported like the
/// tensor collectives do (a panic naming the group), which the rank runner turns into an error.
fn expect(result: Result<(), ferrotron_parallel::CommError>, what: &str) {
    if let Err(error) = result {
        panic!("MoE dispatch: {what}: {error}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_groups_kept_slots_by_expert_in_token_order() {
        let routing = Routing {
            num_tokens: 3,
            topk: 2,
            experts: vec![2, 0, 0, 1, 2, 0],
            weights: vec![0.5; 6],
            kept: vec![true, true, true, false, true, true],
            capacity: None,
        };
        let permutation = Permutation::new(&routing, 4);
        assert_eq!(permutation.per_expert, vec![3, 0, 2, 0]);
        assert_eq!(permutation.tokens, vec![0, 1, 2, 0, 2]);
        assert_eq!(permutation.slots, vec![1, 2, 5, 0, 4]);
        assert_eq!(block_sums(&permutation.per_expert, 2), vec![3, 2]);
    }
}
