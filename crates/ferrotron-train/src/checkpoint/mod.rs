//! Checkpoints: an atomic store of `iter_NNNNNNN/` folders, each holding the model parameters and
//! AdamW moments as safetensors keyed by stable parameter names, the manifest, the resolved plan
//! and recipe. See `store` for the commit protocol and `manifest` for what is recorded.

mod manifest;
mod store;
mod tensors;

pub use manifest::{
    CHECKPOINT_FORMAT_VERSION, MANIFEST_FILE, MODEL_FILE, Manifest, ManifestFiles, ModelShape,
    OPTIMIZER_FILE, PLAN_FILE, RECIPE_FILE, RngInfo,
};
pub use store::{COMMIT_MARKER, CheckpointStore, CommittedCheckpoint, is_committed};
pub use tensors::{read_safetensors, write_safetensors};
