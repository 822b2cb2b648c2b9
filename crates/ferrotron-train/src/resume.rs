//! Saving and restoring a run: what goes into a checkpoint folder and how a model, its
//! optimizer and the loop position come back from one. The loop position is just
//! (iteration, consumed samples): data order and randomness are functions of those.

use std::path::{Path, PathBuf};

use burn::tensor::backend::{AutodiffBackend, Backend};
use ferrotron_model::{GptModel, ModelConfig};
use ferrotron_plan::Plan;
use ferrotron_recipe::Recipe;

use crate::checkpoint::{
    CHECKPOINT_FORMAT_VERSION, CheckpointStore, MODEL_FILE, Manifest, ManifestFiles, ModelShape,
    OPTIMIZER_FILE, RECIPE_FILE, RngInfo, read_safetensors, write_safetensors,
};
use crate::{AdamW, TrainError, load_named_tensors, named_tensors, param_entries};

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

/// Write the checkpoint of `model` and `optimizer` at `state` into `store` (atomically).
pub fn save_checkpoint<B: AutodiffBackend>(
    store: &CheckpointStore,
    model: &GptModel<B>,
    optimizer: &AdamW<B::InnerBackend>,
    state: &ResumeState,
    plan: &Plan,
    recipe: &Recipe,
    shape: &ModelShape,
) -> Result<PathBuf, TrainError> {
    let manifest = Manifest {
        format_version: CHECKPOINT_FORMAT_VERSION,
        iteration: state.iteration,
        consumed_samples: state.consumed_samples,
        consumed_tokens: state.consumed_tokens,
        rng: RngInfo::per_iteration(recipe.training.seed),
        recipe_name: recipe.name.clone(),
        recipe_hash: recipe_hash(recipe),
        plan_hash: plan.plan_hash.clone(),
        shape: shape.clone(),
        model: recipe.model.clone(),
        tokenizer: absolute_tokenizer(&recipe.data.tokenizer),
        files: ManifestFiles::default(),
    };
    store.save(state.iteration, |dir| {
        write_safetensors(&dir.join(MODEL_FILE), &named_tensors::<B, _>(model))?;
        let entries = param_entries::<B, _>(model);
        write_safetensors(
            &dir.join(OPTIMIZER_FILE),
            &optimizer.state_tensors(&entries),
        )?;
        plan.write_to(dir)
            .map_err(|e| TrainError::checkpoint(dir, format!("cannot write plan.json: {e}")))?;
        write_recipe(dir, recipe)?;
        manifest.write(dir)
    })
}

/// Load the checkpoint in `dir` into `model` and `optimizer`, after checking it was written
/// for the same model shape.
pub fn resume_from<B: AutodiffBackend>(
    dir: &Path,
    model: GptModel<B>,
    optimizer: &mut AdamW<B::InnerBackend>,
    shape: &ModelShape,
    recipe: &Recipe,
    device: &B::Device,
) -> Result<(GptModel<B>, ResumeState), TrainError> {
    let manifest = Manifest::read(dir)?;
    manifest.check_model(dir, shape)?;
    if manifest.rng.seed != recipe.training.seed {
        return Err(TrainError::checkpoint(
            dir,
            format!(
                "written with training.seed {}, the recipe has {}; a resumed run must keep its seed",
                manifest.rng.seed, recipe.training.seed
            ),
        ));
    }
    let tensors = read_safetensors(&dir.join(&manifest.files.model))?;
    let model = load_named_tensors::<B, _>(model, &tensors)
        .map_err(|problems| TrainError::checkpoint(dir, problems.join("; ")))?;
    let moments = read_safetensors(&dir.join(&manifest.files.optimizer))?;
    let entries = param_entries::<B, _>(&model);
    optimizer
        .load_state(&entries, &moments, manifest.iteration, device)
        .map_err(|problems| TrainError::checkpoint(dir, problems.join("; ")))?;
    Ok((
        model,
        ResumeState {
            iteration: manifest.iteration,
            consumed_samples: manifest.consumed_samples,
            consumed_tokens: manifest.consumed_tokens,
        },
    ))
}

/// A model for inference from a checkpoint folder alone (manifest + tensors).
pub fn load_for_inference<B: Backend>(
    dir: &Path,
    device: &B::Device,
) -> Result<(GptModel<B>, Manifest), TrainError> {
    if !crate::checkpoint::is_committed(dir) {
        return Err(TrainError::checkpoint(
            dir,
            "not a committed checkpoint folder (no COMMITTED marker; pass an iter_NNNNNNN folder)",
        ));
    }
    let manifest = Manifest::read(dir)?;
    let config = ModelConfig::from_model(&manifest.model, manifest.shape.padded_vocab_size)?;
    let model: GptModel<B> = config.init(device);
    let tensors = read_safetensors(&dir.join(&manifest.files.model))?;
    let model = load_named_tensors::<B, _>(model, &tensors)
        .map_err(|problems| TrainError::checkpoint(dir, problems.join("; ")))?;
    Ok((model, manifest))
}

/// The resolved recipe as YAML (`recipe validate` reads it back).
pub fn write_recipe(dir: &Path, recipe: &Recipe) -> Result<(), TrainError> {
    let path = dir.join(RECIPE_FILE);
    std::fs::create_dir_all(dir).map_err(|e| TrainError::io("create", dir, e))?;
    let text = serde_saphyr::to_string(recipe)
        .map_err(|e| TrainError::Config(format!("cannot write the recipe as YAML: {e}")))?;
    std::fs::write(&path, text).map_err(|e| TrainError::io("write", &path, e))
}

/// blake3 of the recipe's JSON: a change of any value changes it.
pub fn recipe_hash(recipe: &Recipe) -> String {
    let json = serde_json::to_vec(recipe).expect("a recipe serializes");
    blake3::hash(&json).to_hex().to_string()
}

/// The tokenizer with absolute paths, so a checkpoint samples from any working directory.
fn absolute_tokenizer(tokenizer: &ferrotron_recipe::Tokenizer) -> ferrotron_recipe::Tokenizer {
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
