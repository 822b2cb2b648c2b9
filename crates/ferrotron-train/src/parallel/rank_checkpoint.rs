//! Saving and restoring a rank's share through the sharded checkpoint format
//! (`crate::checkpoint`): parameters and moments under their global names, so any layout can
//! load what any other wrote. The distributed optimizer's moments are gathered over its group
//! first, since a checkpoint stores moments shaped like the local parameter, not ZeRO slices.

use std::path::PathBuf;

use ferrotron_parallel::{ParallelOps, ShardSpec};

use super::dist_optimizer::{self, ShardState};
use super::flat::FlatLayout;
use super::rank_model::{RankModel, RankOptimizer, fill_values, local_params};
use crate::checkpoint::{
    CheckpointInfo, CheckpointStore, ShardTensor, ShardedCheckpoint, adamw_shards,
    is_primary_replica, model_shards, moment_spec, save_sharded,
};
use crate::{EXP_AVG, EXP_AVG_SQ, TrainError};
use burn::tensor::backend::AutodiffBackend;

impl<B> RankModel<B>
where
    B: AutodiffBackend + ParallelOps,
    B::InnerBackend: ParallelOps,
{
    /// Write this rank's part of a checkpoint (collective over the world).
    pub(super) fn save(
        &self,
        store: &CheckpointStore,
        info: &CheckpointInfo<'_>,
    ) -> Result<PathBuf, TrainError> {
        let mut params = Vec::new();
        for (chunk, roles) in self.chunks.iter().zip(&self.roles) {
            params.extend(model_shards::<B, _>(chunk, roles, &self.ctx)?);
        }
        let mut moments = Vec::new();
        match &self.optimizer {
            RankOptimizer::Plain(optimizers) => {
                for (optimizer, roles) in optimizers.iter().zip(&self.roles) {
                    moments.extend(adamw_shards(optimizer, roles, &self.ctx)?);
                }
            }
            RankOptimizer::Sharded(state) => {
                let (dense, expert) = (&state.dense, &state.expert);
                for (layout, state, comm) in [
                    (&self.dense, dense, &self.ctx.dp_cp),
                    (&self.expert, expert, &self.ctx.edp),
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
            }
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
        match &mut self.optimizer {
            RankOptimizer::Plain(optimizers) => {
                for (optimizer, roles) in optimizers.iter_mut().zip(&self.roles) {
                    checkpoint.load_adamw(optimizer, roles, &self.device)?;
                }
            }
            RankOptimizer::Sharded(state) => {
                let params = local_params(&self.chunks);
                state.dense = restored_shard(&self.dense, &params, checkpoint)?;
                state.expert = restored_shard(&self.expert, &params, checkpoint)?;
                state.adam.set_step_count(iteration);
            }
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
