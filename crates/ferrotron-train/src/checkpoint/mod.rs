//! Checkpoints: an atomic store of `iter_NNNNNNN/` folders holding the model parameters and
//! AdamW moments under GLOBAL names (the one-rank model's parameter paths) with the
//! [`ShardSpec`](ferrotron_parallel::ShardSpec) of every piece, the manifest, the resolved plan
//! and recipe.
//!
//! Global names and shard specs are what make a checkpoint independent of the layout that
//! wrote it: `load` assembles global tensors from whatever shards exist and cuts the shards the
//! loading layout wants, so a tp2·pp2 run resumes as tp1·dp4, and a one-rank checkpoint loads
//! into eight ranks and back. See `store` for the commit protocol, `save` for how a world of
//! ranks writes one folder, `async_save` for writing it while training goes on, `manifest` for
//! what is recorded.

mod async_save;
mod load;
mod manifest;
mod modules;
mod save;
mod store;
mod tensors;
mod vocab;

pub use async_save::{SaveInFlight, SnapshotGate, start_sharded_save};
pub use load::{ShardedCheckpoint, file_hash};
pub use manifest::{
    CHECKPOINT_FORMAT_VERSION, CheckpointLayout, MANIFEST_FILE, MODEL_FILE, Manifest,
    ManifestFiles, ModelShape, OPTIMIZER_FILE, PLAN_FILE, RECIPE_FILE, RngInfo, ShardFile,
    ShardKind,
};
pub(crate) use modules::trained_shards;
pub use modules::{adamw_shards, is_primary_replica, model_shards, moment_spec};
pub(crate) use save::write_recipe;
pub use save::{CheckpointInfo, save_sharded, shard_file_name, world_size};
pub use store::{COMMIT_MARKER, CheckpointStore, CommittedCheckpoint, is_committed};
pub use tensors::{
    DeviceShard, SHARDS_METADATA_KEY, ShardTensor, ShardValues, read_safetensors, read_shard_specs,
    write_safetensors, write_shard_file,
};

#[cfg(test)]
mod tests;
