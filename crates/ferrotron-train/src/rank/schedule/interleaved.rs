//! Megatron's interleaved 1F1B order (`forward_backward_pipelining_with_interleaving`): each
//! stage holds several model chunks (virtual stages), so a microbatch crosses the pipeline
//! `virtual` times and the bubble shrinks by that factor. Microbatches go through the chunks in
//! groups of `stages` (Megatron's `microbatch_group_size_per_vp_stage` default): the schedule
//! table lists, group by group, every chunk for every microbatch of the group; the k-th forward
//! runs table entry k, the k-th backward runs entry k with the chunk order reversed. The warm-up
//! is `2·(stages − stage − 1) + (virtual − 1)·stages` forwards, as Megatron computes it.

use super::{Compute, Order};

/// `(microbatch, chunk)` of every virtual microbatch, in forward order (`get_schedule_table`).
fn schedule_table(microbatches: usize, chunks: usize, group: usize) -> Vec<(usize, usize)> {
    let mut table = Vec::with_capacity(microbatches * chunks);
    let mut first = 0;
    while first < microbatches {
        let end = if first + group >= microbatches {
            microbatches
        } else {
            first + group
        };
        for chunk in 0..chunks {
            table.extend((first..end).map(|m| (m, chunk)));
        }
        first = end;
    }
    table
}

/// Compute order of `stage` with `chunks` virtual stages per stage.
pub(super) fn order(stage: usize, stages: usize, chunks: usize, microbatches: usize) -> Order {
    let table = schedule_table(microbatches, chunks, stages);
    let total = table.len();
    let forward = |k: usize| {
        let (m, chunk) = table[k];
        Compute::forward(chunk, m)
    };
    let backward = |k: usize| {
        let (m, chunk) = table[k];
        Compute::backward(chunks - 1 - chunk, m)
    };
    let warmup = (2 * (stages - stage - 1) + (chunks - 1) * stages).min(total);
    let steady = total - warmup;
    let mut out = Vec::with_capacity(2 * total);
    out.extend((0..warmup).map(forward));
    for k in 0..steady {
        out.push(forward(warmup + k));
        out.push(backward(k));
    }
    out.extend((steady..total).map(backward));
    Order {
        computes: out,
        warmup,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_groups_microbatches_by_pipeline_depth() {
        // 4 microbatches, 2 chunks, groups of 2: (0,0)(1,0)(0,1)(1,1)(2,0)(3,0)(2,1)(3,1)
        assert_eq!(
            schedule_table(4, 2, 2),
            vec![
                (0, 0),
                (1, 0),
                (0, 1),
                (1, 1),
                (2, 0),
                (3, 0),
                (2, 1),
                (3, 1)
            ]
        );
        // a short last group takes what is left
        assert_eq!(
            schedule_table(3, 2, 2),
            vec![(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (2, 1)]
        );
    }

    #[test]
    fn warmup_follows_megatron() {
        // stage 0 of 4 with 2 chunks: 2·3 + 1·4 = 10 warm-up forwards of 16
        let got = order(0, 4, 2, 8).computes;
        assert!(got[..10].iter().all(Compute::is_forward));
        assert!(!got[11].is_forward());
        // the last stage starts 1F1B after the first group's chunks: 4 forwards
        let got = order(3, 4, 2, 8).computes;
        assert!(got[..4].iter().all(Compute::is_forward));
        assert!(!got[5].is_forward());
        // backwards run chunks in reverse: the last stage's first backward is its last chunk
        assert_eq!(got[5], Compute::backward(1, 0));
    }
}
