//! Which samples each data-parallel rank reads. The whole loader state is one number, the
//! samples consumed so far (Megatron's `consumed_train_samples`), so resuming from a checkpoint
//! continues the exact sample sequence without saving any iterator state.

use std::ops::Range;

/// The sample indices of data-parallel rank `dp_rank`'s share of the global batch that starts
/// after `consumed_samples` samples. Ranks get disjoint, contiguous slices that together cover
/// the batch exactly; when `global_batch_size` is not a multiple of `dp_size` the first ranks
/// get one sample fewer. A `dp_size` of 0 is treated as 1.
pub fn rank_batch_indices(
    consumed_samples: u64,
    global_batch_size: u32,
    dp_rank: u32,
    dp_size: u32,
) -> Range<u64> {
    let dp_size = u64::from(dp_size.max(1));
    let rank = u64::from(dp_rank).min(dp_size - 1);
    let batch = u64::from(global_batch_size);
    let start = consumed_samples + batch * rank / dp_size;
    let end = consumed_samples + batch * (rank + 1) / dp_size;
    start..end
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_split_each_global_batch_disjointly() {
        assert_eq!(rank_batch_indices(0, 8, 0, 2), 0..4);
        assert_eq!(rank_batch_indices(0, 8, 1, 2), 4..8);
        assert_eq!(rank_batch_indices(16, 8, 1, 4), 18..20);
        for (batch, dp) in [(8u32, 1u32), (12, 4), (10, 3), (7, 7)] {
            let mut covered = Vec::new();
            for rank in 0..dp {
                covered.extend(rank_batch_indices(100, batch, rank, dp));
            }
            assert_eq!(covered, (100..100 + u64::from(batch)).collect::<Vec<_>>());
        }
    }

    #[test]
    fn resuming_continues_the_same_sequence() {
        // Three iterations in one go equal one iteration, a "checkpoint", then two more.
        let gbs = 6;
        let straight: Vec<Range<u64>> = (0..3)
            .map(|it| rank_batch_indices(it * 6, gbs, 1, 2))
            .collect();
        let consumed_at_checkpoint = 6;
        let resumed: Vec<Range<u64>> = (0..2)
            .map(|it| rank_batch_indices(consumed_at_checkpoint + it * 6, gbs, 1, 2))
            .collect();
        assert_eq!(straight[1..], resumed[..]);
    }
}
