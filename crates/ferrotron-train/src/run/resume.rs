//! Where a run stands and where it continues from: the loop position (just iteration and
//! consumed samples: data order and randomness are functions of those), the checkpoint a run
//! resumes from (`checkpoint.resume`), and a one-rank model for inference from a checkpoint
//! folder. Training ranks save and load their share in `crate::rank::checkpointing`; what a
//! checkpoint records beside the tensors is written in `crate::checkpoint::save`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use ferrotron_model::{GptModel, ModelConfig};
use ferrotron_parallel::ShardSpec;
use ferrotron_recipe::{Checkpoint, ResumePolicy};

use crate::checkpoint::{CheckpointStore, ShardKind, ShardedCheckpoint};
use crate::params::{NamedTensor, ParamEntry};
use crate::{TrainError, load_named_tensors, param_entries};

/// Where the loop stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumeState {
    pub iteration: u64,
    pub consumed_samples: u64,
    pub consumed_tokens: u64,
}

impl ResumeState {
    pub fn fresh() -> Self {
        ResumeState {
            iteration: 0,
            consumed_samples: 0,
            consumed_tokens: 0,
        }
    }
}

/// The checkpoint to continue from, by `checkpoint.resume`, opened and (unless
/// `checkpoint.verify` is off) checked against its checksums. With `auto`, a damaged newest
/// checkpoint of `store` is reported and the newest older one that verifies is taken instead; a
/// path named explicitly must verify itself.
pub(crate) fn resume_source(
    checkpoint: &Checkpoint,
    store: Option<&CheckpointStore>,
) -> Result<Option<ShardedCheckpoint>, TrainError> {
    let verify = checkpoint.verify;
    match checkpoint.resume_policy() {
        ResumePolicy::Never => Ok(None),
        ResumePolicy::Auto => match store {
            Some(store) => newest_intact(store, verify),
            None => Ok(None),
        },
        ResumePolicy::Path(path) => {
            let path = PathBuf::from(path);
            if crate::checkpoint::is_committed(&path) {
                ShardedCheckpoint::open_with(&path, verify).map(Some)
            } else {
                Err(TrainError::checkpoint(
                    &path,
                    "checkpoint.resume names a folder that is not a committed checkpoint",
                ))
            }
        }
    }
}

/// The newest committed checkpoint of `store` that opens and verifies. Damaged ones are passed
/// over with a warning; when none is intact the newest one's damage is the error (starting
/// from scratch would silently overwrite the run).
fn newest_intact(
    store: &CheckpointStore,
    verify: bool,
) -> Result<Option<ShardedCheckpoint>, TrainError> {
    let mut first_damage = None;
    for committed in store.committed()?.into_iter().rev() {
        match ShardedCheckpoint::open_with(&committed.path, verify) {
            Ok(checkpoint) => {
                if let Some(damage) = &first_damage {
                    tracing::warn!(
                        "{damage}; resuming from the newest intact checkpoint, {}",
                        committed.path.display()
                    );
                }
                return Ok(Some(checkpoint));
            }
            Err(damage @ TrainError::Damaged { .. }) => {
                tracing::warn!("{damage}; trying the checkpoint before it");
                first_damage.get_or_insert(damage);
            }
            Err(other) => return Err(other),
        }
    }
    first_damage.map_or(Ok(None), Err)
}

/// A one-rank model for inference from a checkpoint folder alone (manifest + tensors), whatever
/// layout wrote it.
pub fn load_for_inference<B: Backend>(
    dir: &Path,
    device: &B::Device,
) -> Result<(GptModel<B>, crate::checkpoint::Manifest), TrainError> {
    let checkpoint = ShardedCheckpoint::open(dir)?;
    let manifest = checkpoint.manifest().clone();
    let config = ModelConfig::from_model(&manifest.model, manifest.shape.padded_vocab_size)?;
    let model: GptModel<B> = config.init(device);
    let tensors = whole_tensors(
        &checkpoint,
        ShardKind::Model,
        &param_entries::<B, _>(&model),
    )?;
    let model = load_named_tensors::<B, _>(model, &tensors)
        .map_err(|problems| TrainError::checkpoint(dir, problems.join("; ")))?;
    Ok((model, manifest))
}

/// The checkpoint's tensors of `kind` as whole one-rank tensors, shaped like the parameters
/// `entries` (moments like their parameter), so a vocabulary padded differently is re-padded.
/// Names the model lacks are passed through for the loader to report.
fn whole_tensors(
    checkpoint: &ShardedCheckpoint,
    kind: ShardKind,
    entries: &[ParamEntry],
) -> Result<HashMap<String, NamedTensor>, TrainError> {
    let shapes: HashMap<&str, &[usize]> = entries
        .iter()
        .map(|e| (e.name.as_str(), e.shape.as_slice()))
        .collect();
    let mut out = HashMap::new();
    for name in checkpoint.names(kind) {
        let param = match kind {
            ShardKind::Model => name.as_str(),
            ShardKind::Optimizer => name.rsplit_once('.').map_or(name.as_str(), |(p, _)| p),
        };
        let tensor = match shapes.get(param) {
            Some(shape) => NamedTensor {
                name: name.clone(),
                shape: shape.to_vec(),
                values: checkpoint.shard(&ShardSpec::full(name.clone(), shape.to_vec()))?,
            },
            None => checkpoint.global(&name)?.as_ref().clone(),
        };
        out.insert(name, tensor);
    }
    Ok(out)
}
