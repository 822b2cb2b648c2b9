//! The distributed optimizer (ZeRO-1, Megatron's `--use-distributed-optimizer`): each rank of a
//! data-parallel group keeps the fp32 master weights and Adam moments of only its shard of the
//! flat parameter buffer, updates that shard from the reduce-scattered gradient and all-gathers
//! the parameters. Optimizer memory falls by the group size; the arithmetic is element for
//! element that of [`crate::AdamW`] (same f32 operations in the same order, scalars rounded to
//! f32 the way burn's scalar ops round them), so sharding changes nothing but who computes what.

use std::ops::Range;

use ferrotron_parallel::Comm;

use super::flat::FlatLayout;
use crate::error::comm_error;
use crate::{AdamWConfig, TrainError};

/// A run of shard elements belonging to one parameter slot.
#[derive(Debug, Clone)]
struct Segment {
    local: Range<usize>,
    slot: usize,
    decay: bool,
}

/// Master weights and moments of this rank's shard of one flat buffer.
#[derive(Debug, Clone)]
pub(super) struct ShardState {
    segments: Vec<Segment>,
    pub master: Vec<f32>,
    pub exp_avg: Vec<f32>,
    pub exp_avg_sq: Vec<f32>,
}

impl ShardState {
    /// This rank's shard of `layout`, master weights taken from `params` (the full local buffer).
    pub(super) fn new(layout: &FlatLayout, params: &[f32]) -> ShardState {
        let mut segments = Vec::new();
        let mut master = Vec::with_capacity(layout.shard_len());
        for part in layout.shard_ranges() {
            let base = master.len();
            master.extend_from_slice(&params[part.clone()]);
            for (slot_index, slot) in layout.slots.iter().enumerate() {
                let start = slot.offset.max(part.start);
                let end = (slot.offset + slot.numel).min(part.end);
                if start < end {
                    segments.push(Segment {
                        local: base + start - part.start..base + end - part.start,
                        slot: slot_index,
                        decay: !slot.role.no_weight_decay,
                    });
                }
            }
        }
        let len = master.len();
        ShardState {
            segments,
            master,
            exp_avg: vec![0.0; len],
            exp_avg_sq: vec![0.0; len],
        }
    }
}

/// AdamW over flat shards; one [`ShardState`] per reduction group (dense, expert).
#[derive(Debug, Clone)]
pub(super) struct ShardedAdamW {
    config: AdamWConfig,
    step: u64,
}

/// One update's scalars, shared by every group.
#[derive(Debug, Clone, Copy)]
pub(super) struct Update {
    pub lr: f64,
    pub grad_scale: f64,
}

impl ShardedAdamW {
    pub(super) fn new(config: AdamWConfig) -> Self {
        ShardedAdamW { config, step: 0 }
    }

    /// Restore the step count (the moments are restored into the [`ShardState`]s).
    pub(super) fn set_step_count(&mut self, step: u64) {
        self.step = step;
    }

    /// Start a step: the bias corrections use the new step count.
    pub(super) fn begin_step(&mut self) {
        self.step += 1;
    }

    /// Update `state` from `grad` (this rank's reduced shard). Slots without a gradient anywhere
    /// (`has_grad[slot] == 0`) are left alone, like parameters without gradients on one rank.
    pub(super) fn update(
        &self,
        state: &mut ShardState,
        grad: &[f32],
        has_grad: &[f32],
        update: Update,
    ) {
        let config = self.config;
        let step = i32::try_from(self.step).unwrap_or(i32::MAX);
        let bias_correction1 = (1.0 - config.beta1.powi(step)) as f32;
        let bias_correction2 = (1.0 - config.beta2.powi(step)) as f32;
        let beta1 = config.beta1 as f32;
        let beta2 = config.beta2 as f32;
        let one_minus_beta1 = (1.0 - config.beta1) as f32;
        let one_minus_beta2 = (1.0 - config.beta2) as f32;
        let eps = config.eps as f32;
        let lr = update.lr as f32;
        let decay_factor = (1.0 - update.lr * config.weight_decay) as f32;
        let grad_scale = update.grad_scale as f32;
        let scaled = update.grad_scale != 1.0;
        for segment in &state.segments {
            if has_grad[segment.slot] == 0.0 {
                continue;
            }
            let decay = config.weight_decay > 0.0 && segment.decay;
            for i in segment.local.clone() {
                let mut g = grad[i];
                if scaled {
                    g *= grad_scale;
                }
                let m = state.exp_avg[i] * beta1 + g * one_minus_beta1;
                let v = state.exp_avg_sq[i] * beta2 + (g * g) * one_minus_beta2;
                state.exp_avg[i] = m;
                state.exp_avg_sq[i] = v;
                let mut p = state.master[i];
                if decay {
                    p *= decay_factor;
                }
                let m_hat = m / bias_correction1;
                let v_hat = v / bias_correction2;
                let step = m_hat / (v_hat.sqrt() + eps);
                state.master[i] = p - step * lr;
            }
        }
    }
}

/// The full local buffer of `layout` from every rank's shard `shard` (all-gather per bucket).
pub(super) fn gather(
    comm: &Comm,
    layout: &FlatLayout,
    shard: &[f32],
) -> Result<Vec<f32>, TrainError> {
    let mut full = vec![0.0; layout.len];
    let mut at = 0;
    for (b, bucket) in layout.buckets.iter().enumerate() {
        let len = layout.shard_of(b).len();
        let mine = &shard[at..at + len];
        if comm.size() == 1 {
            full[bucket.clone()].copy_from_slice(mine);
        } else {
            comm.all_gather_f32(mine, &mut full[bucket.clone()])
                .map_err(|e| comm_error("distributed-optimizer parameter all-gather", e))?;
        }
        at += len;
    }
    Ok(full)
}

/// This rank's shard of a full local buffer (the inverse of [`gather`], no communication).
pub(super) fn cut(layout: &FlatLayout, full: &[f32]) -> Vec<f32> {
    let mut shard = Vec::with_capacity(layout.shard_len());
    for part in layout.shard_ranges() {
        shard.extend_from_slice(&full[part]);
    }
    shard
}
