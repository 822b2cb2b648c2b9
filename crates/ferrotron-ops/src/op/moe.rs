//! MoE routing's two discrete steps as backend ops: each token's top-k experts
//! ([`FusedOps::moe_topk`]), and the permutation that groups the (token, slot) pairs by expert
//! with each expert's count ([`FusedOps::moe_permutation`]).
//!
//! They are ops because of where a GPU's time went: deciding on the host meant reading the
//! router's logits back in every MoE layer, and every host-side step of the routing after that
//! read ran with an empty device queue. With both steps on the device the host reads only the
//! experts' row counts (`[experts]` integers, which the grouped GEMM takes as host numbers), and
//! right after that read it has nothing to do but queue the experts' GEMMs.
//!
//! The defaults are the host reference, exact and the contract a kernel meets: scores are read,
//! decided in plain Rust, and the decisions uploaded. Ties go to the lower expert (or group)
//! index and the permutation is stable (an expert's pairs keep their order), so every backend
//! makes the same decisions from the same scores and feeds the experts the same rows.
//! [`select_topk`] is also what the host-side router (capacity, Sinkhorn, the expert-parallel
//! dispatchers) selects with.

use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Int, Tensor, TensorData};

use crate::primitive::wrap;

/// DeepSeek's group-limited routing: experts split into `num_groups` equal groups, each token
/// first picks `group_topk` groups by the sum of their best `k / group_topk` scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GroupLimit {
    pub num_groups: usize,
    pub group_topk: usize,
}

/// [`FusedOps::moe_permutation`]'s result.
///
/// [`FusedOps::moe_permutation`]: crate::FusedOps::moe_permutation
#[derive(Debug, Clone)]
pub struct MoePermutation<B: Backend> {
    /// `[n]`: the positions of `experts`, sorted by expert, stably.
    pub order: IntTensor<B>,
    /// `[n]`: where each position went in `order` (the inverse permutation).
    pub rows: IntTensor<B>,
    /// `[num_experts]`: how many positions hold each expert.
    pub counts: IntTensor<B>,
}

/// The `k` best experts of one token, best first. With a group limit, only experts of the
/// `group_topk` groups with the highest sum of their top `k / group_topk` scores compete.
/// Scores compare by `total_cmp`; a tie goes to the lower index.
pub fn select_topk(scores: &[f32], k: usize, group_limit: Option<GroupLimit>) -> Vec<usize> {
    let allowed: Vec<bool> = match group_limit {
        None => vec![true; scores.len()],
        Some(limit) => allowed_by_groups(scores, k, limit),
    };
    let mut candidates: Vec<usize> = (0..scores.len()).filter(|&e| allowed[e]).collect();
    candidates.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    candidates.truncate(k);
    candidates
}

fn allowed_by_groups(scores: &[f32], k: usize, limit: GroupLimit) -> Vec<bool> {
    let group_size = scores.len() / limit.num_groups;
    let per_group = k / limit.group_topk;
    let group_scores: Vec<f32> = scores
        .chunks_exact(group_size)
        .map(|group| {
            let mut sorted = group.to_vec();
            sorted.sort_by(|a, b| b.total_cmp(a));
            sorted.iter().take(per_group).sum()
        })
        .collect();
    let chosen_groups = select_topk(&group_scores, limit.group_topk, None);
    let mut allowed = vec![false; scores.len()];
    for group in chosen_groups {
        for flag in &mut allowed[group * group_size..(group + 1) * group_size] {
            *flag = true;
        }
    }
    allowed
}

/// `scores [rows, experts]` → `[rows, k]`: each row's [`select_topk`], on the host.
pub fn moe_topk_reference<B: Backend>(
    scores: FloatTensor<B>,
    k: usize,
    group_limit: Option<GroupLimit>,
) -> IntTensor<B> {
    let scores: Tensor<B, 2> = wrap(scores);
    let [rows, experts] = scores.dims();
    let device = scores.device();
    let host: Vec<f32> = scores.into_data().iter::<f32>().collect();
    let chosen: Vec<i64> = host
        .chunks_exact(experts.max(1))
        .flat_map(|row| select_topk(row, k, group_limit))
        .map(|expert| expert as i64)
        .collect();
    let chosen = Tensor::<B, 2, Int>::from_data(TensorData::new(chosen, [rows, k]), &device);
    chosen.into_primitive()
}

/// `experts [n]` → the positions sorted stably by expert, its inverse and the count of each
/// expert, on the host (a counting sort).
///
/// # Panics
/// If an expert is outside `0..num_experts`.
pub fn moe_permutation_reference<B: Backend>(
    experts: IntTensor<B>,
    num_experts: usize,
) -> MoePermutation<B> {
    let experts = Tensor::<B, 1, Int>::from_primitive(experts);
    let device = experts.device();
    let experts: Vec<usize> = experts
        .into_data()
        .iter::<i64>()
        .map(|expert| {
            usize::try_from(expert)
                .ok()
                .filter(|&e| e < num_experts)
                .unwrap_or_else(|| panic!("moe permutation: expert {expert} of {num_experts}"))
        })
        .collect();
    let mut counts = vec![0usize; num_experts];
    for &expert in &experts {
        counts[expert] += 1;
    }
    let mut next: Vec<usize> = counts
        .iter()
        .scan(0, |start, &count| {
            let first = *start;
            *start += count;
            Some(first)
        })
        .collect();
    let mut order = vec![0i64; experts.len()];
    let mut rows = vec![0i64; experts.len()];
    for (position, &expert) in experts.iter().enumerate() {
        order[next[expert]] = position as i64;
        rows[position] = next[expert] as i64;
        next[expert] += 1;
    }
    let upload = |values: Vec<i64>| {
        let len = values.len();
        Tensor::<B, 1, Int>::from_data(TensorData::new(values, [len]), &device).into_primitive()
    };
    MoePermutation {
        order: upload(order),
        rows: upload(rows),
        counts: upload(counts.into_iter().map(|c| c as i64).collect()),
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;

    use super::*;

    fn ints(x: IntTensor<Flex>) -> Vec<i64> {
        Tensor::<Flex, 1, Int>::from_primitive(x)
            .into_data()
            .iter::<i64>()
            .collect()
    }

    #[test]
    fn topk_picks_the_highest_scores_best_first() {
        assert_eq!(select_topk(&[0.1, 0.7, 0.3, 0.5], 2, None), vec![1, 3]);
        // Ties go to the lower expert index.
        assert_eq!(select_topk(&[0.5, 0.5, 0.5, 0.1], 2, None), vec![0, 1]);
    }

    #[test]
    fn group_limited_routing_only_picks_inside_the_best_groups() {
        // Groups {0,1} and {2,3}; expert 0 is the single best, but group {2,3} has the higher
        // sum of its top-2 (0.8 + 0.7 > 0.9 + 0.0).
        let limit = GroupLimit {
            num_groups: 2,
            group_topk: 1,
        };
        assert_eq!(
            select_topk(&[0.9, 0.0, 0.8, 0.7], 2, Some(limit)),
            vec![2, 3]
        );
    }

    #[test]
    fn topk_reference_decides_row_by_row() {
        let scores = Tensor::<Flex, 2>::from_data(
            [[0.1, 0.7, 0.3, 0.5], [0.5, 0.5, 0.5, 0.1]],
            &Default::default(),
        );
        let chosen = moe_topk_reference::<Flex>(scores.into_primitive().tensor(), 2, None);
        let chosen = Tensor::<Flex, 2, Int>::from_primitive(chosen);
        assert_eq!(chosen.dims(), [2, 2]);
        assert_eq!(ints(chosen.reshape([4]).into_primitive()), vec![1, 3, 0, 1]);
    }

    #[test]
    fn permutation_groups_by_expert_and_keeps_the_order_within_one() {
        let experts = Tensor::<Flex, 1, Int>::from_data([2, 0, 2, 1, 0, 2], &Default::default());
        let permutation = moe_permutation_reference::<Flex>(experts.into_primitive(), 4);
        assert_eq!(ints(permutation.order), vec![1, 4, 3, 0, 2, 5]);
        assert_eq!(ints(permutation.rows), vec![3, 0, 4, 2, 1, 5]);
        assert_eq!(ints(permutation.counts), vec![2, 1, 3, 0]);
    }

    #[test]
    fn permutation_of_nothing_counts_zeros() {
        let experts = Tensor::<Flex, 1, Int>::empty([0], &Default::default());
        let permutation = moe_permutation_reference::<Flex>(experts.into_primitive(), 3);
        assert!(ints(permutation.order).is_empty());
        assert!(ints(permutation.rows).is_empty());
        assert_eq!(ints(permutation.counts), vec![0, 0, 0]);
    }

    #[test]
    #[should_panic(expected = "expert 4 of 4")]
    fn permutation_refuses_an_expert_out_of_range() {
        let experts = Tensor::<Flex, 1, Int>::from_data([0, 4], &Default::default());
        moe_permutation_reference::<Flex>(experts.into_primitive(), 4);
    }
}
