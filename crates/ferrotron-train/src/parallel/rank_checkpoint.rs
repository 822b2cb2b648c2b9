//! Saving and restoring a rank's share through the sharded checkpoint format
//! (`crate::checkpoint`): parameters and moments under their global names, so any layout can
//! load what any other wrote. The distributed optimizer's moments are gathered over its group
//! first, since a checkpoint stores moments shaped like the local parameter, not ZeRO slices.
//! A 16-bit parameter is saved as its fp32 master copy (what the next update starts from) and
//! that copy is rebuilt from the saved values on load, so a mixed-precision run resumes exactly.
//! A rank alone writes whole tensors (`model.safetensors`, `optimizer.safetensors`).

use std::path::PathBuf;

use ferrotron_parallel::{ParallelOps, ShardSpec};

use super::dist_optimizer::{self, ShardState};
use super::flat::FlatLayout;
use super::rank_model::{RankModel, RankOptimizer, fill_values, local_params};
use crate::checkpoint::{
    CheckpointInfo, CheckpointStore, ShardTensor, ShardedCheckpoint, adamw_shards,
    is_primary_replica, model_shards, moment_spec, save_sharded, trained_shards,
};
use crate::{EXP_AVG, EXP_AVG_SQ, TrainError};
use burn::tensor::backend::AutodiffBackend;

impl<B> RankModel<B>
where
    B: AutodiffBackend + ParallelOps,
    B::InnerBackend: ParallelOps,
{
    /// Write this rank's part of a checkpoint (collective over the world).
    pub(super) fn save_checkpoint(
        &self,
        store: &CheckpointStore,
        info: &CheckpointInfo<'_>,
    ) -> Result<PathBuf, TrainError> {
        let mut params = Vec::new();
        let mut moments = Vec::new();
        if let RankOptimizer::Sharded(state) = &self.optimizer {
            for (chunk, roles) in self.chunks.iter().zip(&self.roles) {
                params.extend(model_shards::<B, _>(chunk, roles, &self.ctx)?);
            }
            for (layout, state, comm) in [
                (&self.dense, &state.dense, &self.ctx.dp_cp),
                (&self.expert, &state.expert, &self.ctx.edp),
            ] {
                let avg = dist_optimizer::gather(comm, layout, &state.exp_avg)?;
                let avg_sq = dist_optimizer::gather(comm, layout, &state.exp_avg_sq)?;
                for slot in &layout.slots {
                    if !is_primary_replica(&slot.role, &self.ctx) {
                        continue;
                    }
                    for (suffix, full) in [(EXP_AVG, &avg), (EXP_AVG_SQ, &avg_sq)] {
                        moments.push(ShardTensor {
                            spec: moment_spec(&slot.role.shard, suffix),
                            values: full[slot.range()].to_vec(),
                        });
                    }
                }
            }
        } else {
            let chunks = self.chunks.iter().zip(&self.roles);
            for ((chunk, roles), optimizer) in chunks.zip(self.optimizer.per_chunk()) {
                params.extend(trained_shards::<B, _, _>(
                    chunk, roles, optimizer, &self.ctx,
                )?);
                moments.extend(adamw_shards(optimizer, roles, &self.ctx)?);
            }
        }
        // a split into one piece is the whole dimension: what a rank alone writes are whole
        // tensors, as one-rank checkpoints always held
        for shard in params.iter_mut().chain(&mut moments) {
            shard.spec.splits.retain(|split| split.count > 1);
        }
        save_sharded(store, &self.ctx, info, &params, &moments)
    }

    /// Replace parameters and optimizer state by `checkpoint`'s (no communication).
    pub(super) fn load(&mut self, checkpoint: &ShardedCheckpoint) -> Result<(), TrainError> {
        let chunks = std::mem::take(&mut self.chunks);
        self.chunks = chunks
            .into_iter()
            .zip(&self.roles)
            .map(|(chunk, roles)| checkpoint.load_module::<B, _>(chunk, roles))
            .collect::<Result<Vec<_>, _>>()?;
        let iteration = checkpoint.manifest().iteration;
        if let RankOptimizer::Sharded(state) = &mut self.optimizer {
            let params = local_params(&self.chunks);
            state.dense = restored_shard(&self.dense, &params, checkpoint)?;
            state.expert = restored_shard(&self.expert, &params, checkpoint)?;
            state.adam.set_step_count(iteration);
            return Ok(());
        }
        let chunks = self.chunks.iter().zip(&self.roles);
        for ((chunk, roles), optimizer) in chunks.zip(self.optimizer.per_chunk_mut()) {
            checkpoint.load_adamw(optimizer, roles, &self.device)?;
            checkpoint.restore_master_weights::<B, _, _>(optimizer, chunk, roles, &self.device)?;
        }
        Ok(())
    }
}

/// A shard state whose master weights are the (loaded) parameters and whose moments are cut
/// from the checkpoint's (absent moments: a parameter that never had a gradient, zeros).
fn restored_shard(
    layout: &FlatLayout,
    params: &[std::collections::HashMap<burn::module::ParamId, Vec<f32>>],
    checkpoint: &ShardedCheckpoint,
) -> Result<ShardState, TrainError> {
    let mut state = ShardState::new(layout, &fill_values(layout, params));
    for (suffix, target) in [(EXP_AVG, 0), (EXP_AVG_SQ, 1)] {
        let mut full = vec![0.0; layout.len];
        for slot in &layout.slots {
            let spec: ShardSpec = moment_spec(&slot.role.shard, suffix);
            if checkpoint.contains(&spec.global_name) {
                full[slot.range()].copy_from_slice(&checkpoint.shard(&spec)?);
            }
        }
        let shard = dist_optimizer::cut(layout, &full);
        if target == 0 {
            state.exp_avg = shard;
        } else {
            state.exp_avg_sq = shard;
        }
    }
    Ok(state)
}
