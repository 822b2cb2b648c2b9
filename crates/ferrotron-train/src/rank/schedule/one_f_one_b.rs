//! The 1F1B order of one pipeline stage (PipeDream-Flush, Megatron's
//! `forward_backward_pipelining_without_interleaving`): a stage first runs as many forwards as
//! there are stages after it, so the last stage can start its first backward as soon as possible;
//! then it alternates one forward with one backward, and finally drains the backwards. At most
//! `stages - stage` microbatches are in flight, which is the point of the schedule: activation
//! memory bounded by the pipeline depth, not the number of microbatches.

use super::{Compute, Order};

/// Compute order of `stage` (0-based) in a pipeline of `stages` with `microbatches`.
pub(super) fn order(stage: usize, stages: usize, microbatches: usize) -> Order {
    let warmup = (stages - stage - 1).min(microbatches);
    let steady = microbatches - warmup;
    let mut out = Vec::with_capacity(2 * microbatches);
    out.extend((0..warmup).map(|m| Compute::forward(0, m)));
    for i in 0..steady {
        out.push(Compute::forward(0, warmup + i));
        out.push(Compute::backward(0, i));
    }
    out.extend((steady..microbatches).map(|m| Compute::backward(0, m)));
    Order {
        computes: out,
        warmup,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_stage_alternates_like_the_one_rank_step() {
        let got = order(0, 1, 3).computes;
        let want = vec![
            Compute::forward(0, 0),
            Compute::backward(0, 0),
            Compute::forward(0, 1),
            Compute::backward(0, 1),
            Compute::forward(0, 2),
            Compute::backward(0, 2),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn first_of_four_stages_warms_up_with_three_forwards() {
        let got = order(0, 4, 6).computes;
        let kinds: String = got
            .iter()
            .map(|c| if c.is_forward() { 'F' } else { 'B' })
            .collect();
        assert_eq!(kinds, "FFFFBFBFBBBB");
        // fewer microbatches than stages: all forwards, then all backwards
        let kinds: String = order(0, 4, 2)
            .computes
            .iter()
            .map(|c| if c.is_forward() { 'F' } else { 'B' })
            .collect();
        assert_eq!(kinds, "FFBB");
    }
}
