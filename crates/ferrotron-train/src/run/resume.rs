//! Where a run stands and what a checkpoint folder gives back outside training: the loop
//! position (just iteration and consumed samples: data order and randomness are functions of
//! those), a one-rank model for inference, the recipe and tokenizer written beside the tensors.
//! Training ranks save and load their share in `parallel::rank_checkpoint`.

use std::collections::HashMap;
use std::path::Path;

use burn::tensor::backend::Backend;
use ferrotron_model::{GptModel, ModelConfig};
use ferrotron_parallel::ShardSpec;
use ferrotron_recipe::Recipe;

use crate::checkpoint::{RECIPE_FILE, ShardKind, ShardedCheckpoint};
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

/// The resolved recipe as YAML (`recipe validate` reads it back).
pub(crate) fn write_recipe(dir: &Path, recipe: &Recipe) -> Result<(), TrainError> {
    let path = dir.join(RECIPE_FILE);
    std::fs::create_dir_all(dir).map_err(|e| TrainError::io("create", dir, e))?;
    let text = serde_saphyr::to_string(recipe)
        .map_err(|e| TrainError::Config(format!("cannot write the recipe as YAML: {e}")))?;
    std::fs::write(&path, text).map_err(|e| TrainError::io("write", &path, e))
}

/// The tokenizer with absolute paths, so a checkpoint samples from any working directory.
pub(crate) fn absolute_tokenizer(
    tokenizer: &ferrotron_recipe::Tokenizer,
) -> ferrotron_recipe::Tokenizer {
    let absolute = |path: &Option<String>| {
        path.as_ref().map(|p| {
            std::fs::canonicalize(p)
                .map(|c| c.display().to_string())
                .unwrap_or_else(|_| p.clone())
        })
    };
    ferrotron_recipe::Tokenizer {
        kind: tokenizer.kind,
        vocab_file: absolute(&tokenizer.vocab_file),
        merge_file: absolute(&tokenizer.merge_file),
        file: absolute(&tokenizer.file),
    }
}
