//! Saving and restoring a rank's share through the sharded checkpoint format
//! (`crate::checkpoint`): parameters and moments under their global names, so any layout can
//! load what any other wrote. The distributed optimizer's moments are gathered over its group
//! first, since a checkpoint stores moments shaped like the local parameter, not ZeRO slices.
//! A 16-bit parameter is saved as its fp32 master copy (what the next update starts from) and
//! that copy is rebuilt from the saved values on load, so a mixed-precision run resumes exactly.
//! A rank alone writes whole tensors (`model.safetensors`, `optimizer.safetensors`). The fp8
//! layers' scaling states travel with the moments (`crate::rank::fp8`).

use std::path::PathBuf;

use super::model::RankModel;
use crate::TrainError;
use crate::checkpoint::{
    CheckpointInfo, CheckpointStore, ShardedCheckpoint, adamw_shards, save_sharded,
    start_sharded_save, trained_shards,
};

impl<B> RankModel<B>
where
    B: crate::TrainBackend,
{
    /// Write this rank's part of a checkpoint (collective over the world): the committed
    /// folder, or with `checkpoint.async_save` `None` and the save in flight once this rank's
    /// shards are in host memory.
    pub(crate) fn save_checkpoint(
        &mut self,
        store: &CheckpointStore,
        info: &CheckpointInfo<'_>,
    ) -> Result<Option<PathBuf>, TrainError> {
        let mut params = Vec::new();
        let mut moments = Vec::new();
        let chunks = self.chunks.iter().zip(&self.roles);
        for ((chunk, roles), optimizer) in chunks.zip(self.optimizer.per_chunk()) {
            params.extend(trained_shards::<B, _, _>(
                chunk, roles, optimizer, &self.ctx,
            )?);
            moments.extend(adamw_shards(optimizer, roles, &self.ctx)?);
        }
        moments.extend(crate::rank::fp8::checkpoint_shards(&self.chunks, &self.ctx));
        // a split into one piece is the whole dimension: what a rank alone writes are whole
        // tensors, as one-rank checkpoints always held
        for shard in params.iter_mut().chain(&mut moments) {
            shard.spec.splits.retain(|split| split.count > 1);
        }
        if info.recipe.checkpoint.async_save {
            let save = start_sharded_save(store, &self.ctx, info, (params, moments))?;
            for optimizer in self.optimizer.per_chunk_mut() {
                optimizer.hold_until(save.gate());
            }
            self.save_in_flight = Some(save);
            return Ok(None);
        }
        save_sharded(store, &self.ctx, info, &params, &moments).map(Some)
    }

    /// Replace parameters and optimizer state by `checkpoint`'s (no communication).
    pub(crate) fn load(&mut self, checkpoint: &ShardedCheckpoint) -> Result<(), TrainError> {
        let chunks = std::mem::take(&mut self.chunks);
        self.chunks = chunks
            .into_iter()
            .zip(&self.roles)
            .map(|(chunk, roles)| checkpoint.load_module::<B, _>(chunk, roles))
            .collect::<Result<Vec<_>, _>>()?;
        let chunks = self.chunks.iter().zip(&self.roles);
        for ((chunk, roles), optimizer) in chunks.zip(self.optimizer.per_chunk_mut()) {
            checkpoint.load_adamw(optimizer, roles, &self.device)?;
            checkpoint.restore_master_weights::<B, _, _>(optimizer, chunk, roles, &self.device)?;
        }
        crate::rank::fp8::restore(&self.chunks, checkpoint, &self.device)
    }
}
