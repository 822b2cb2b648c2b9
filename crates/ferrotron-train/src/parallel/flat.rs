//! The flat gradient buffer of one reduction group (dense parameters over dp×cp, expert
//! parameters over expert-dp), cut into buckets as Megatron's DDP does: parameters are laid out
//! back to back, a bucket closes once it holds [`GRAD_BUCKET_ELEMENTS`], and each bucket is padded
//! to a multiple of the group size so the distributed optimizer can reduce-scatter it into equal
//! shards. A parameter never straddles two buckets.

use std::ops::Range;

use burn::module::ParamId;
use ferrotron_parallel::ParamRole;

/// Elements per gradient bucket (Megatron's `--ddp-bucket-size` default of 40M).
pub(super) const GRAD_BUCKET_ELEMENTS: usize = 40_000_000;

/// One local parameter's place in the flat buffer.
#[derive(Debug, Clone)]
pub(super) struct Slot {
    /// Which local model chunk (virtual stage) holds it.
    pub chunk: usize,
    pub id: ParamId,
    pub offset: usize,
    pub numel: usize,
    pub role: ParamRole,
}

impl Slot {
    pub(super) fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.numel
    }
}

/// Slots, buckets and this rank's shard of each bucket.
#[derive(Debug, Clone)]
pub(super) struct FlatLayout {
    pub slots: Vec<Slot>,
    /// Padded bucket ranges, covering `0..len`.
    pub buckets: Vec<Range<usize>>,
    pub len: usize,
    /// Ranks the buffer is sharded over (the reduction group's size) and this rank's index.
    pub parts: usize,
    pub part: usize,
}

impl FlatLayout {
    /// Lay out `params` (chunk, role, element count) in order.
    pub(super) fn new(
        params: Vec<(usize, ParamRole, usize)>,
        bucket_elements: usize,
        parts: usize,
        part: usize,
    ) -> FlatLayout {
        let parts = parts.max(1);
        let mut slots = Vec::with_capacity(params.len());
        let mut buckets = Vec::new();
        let mut bucket_start = 0;
        let mut offset = 0;
        let close = |start: usize, end: usize| start..start + (end - start).next_multiple_of(parts);
        for (chunk, role, numel) in params {
            if offset > bucket_start && offset - bucket_start + numel > bucket_elements {
                let bucket = close(bucket_start, offset);
                offset = bucket.end;
                bucket_start = bucket.end;
                buckets.push(bucket);
            }
            slots.push(Slot {
                chunk,
                id: role.id,
                offset,
                numel,
                role,
            });
            offset += numel;
        }
        if offset > bucket_start {
            let bucket = close(bucket_start, offset);
            offset = bucket.end;
            buckets.push(bucket);
        }
        FlatLayout {
            slots,
            buckets,
            len: offset,
            parts,
            part,
        }
    }

    /// This rank's part of bucket `bucket` (absolute positions in the buffer).
    pub(super) fn shard_of(&self, bucket: usize) -> Range<usize> {
        let range = &self.buckets[bucket];
        let size = (range.end - range.start) / self.parts;
        let start = range.start + self.part * size;
        start..start + size
    }

    /// This rank's parts of every bucket, in order: concatenated, they are its shard.
    pub(super) fn shard_ranges(&self) -> Vec<Range<usize>> {
        (0..self.buckets.len()).map(|b| self.shard_of(b)).collect()
    }

    pub(super) fn shard_len(&self) -> usize {
        self.len / self.parts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrotron_parallel::ShardSpec;

    fn role(name: &str) -> ParamRole {
        ParamRole::new(ParamId::new(), ShardSpec::full(name, vec![1]))
    }

    #[test]
    fn buckets_close_at_the_size_and_pad_to_the_group() {
        let params = vec![
            (0, role("a"), 3),
            (0, role("b"), 4),
            (1, role("c"), 10),
            (1, role("d"), 1),
        ];
        let layout = FlatLayout::new(params, 8, 2, 1);
        // a+b = 7 (padded to 8); c alone exceeds the size: its own bucket; d after it
        assert_eq!(layout.buckets, vec![0..8, 8..18, 18..20]);
        let offsets: Vec<usize> = layout.slots.iter().map(|s| s.offset).collect();
        assert_eq!(offsets, vec![0, 3, 8, 18]);
        assert_eq!(layout.shard_ranges(), vec![4..8, 13..18, 19..20]);
        assert_eq!(layout.shard_len(), 10);
    }

    #[test]
    fn one_rank_owns_everything() {
        let layout = FlatLayout::new(vec![(0, role("a"), 5)], GRAD_BUCKET_ELEMENTS, 1, 0);
        assert_eq!(layout.buckets, vec![0..5]);
        assert_eq!(layout.shard_ranges(), vec![0..5]);
    }
}
