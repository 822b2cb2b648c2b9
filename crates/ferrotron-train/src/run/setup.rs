//! What every rank prepares before its first step, whatever the layout: the runtime recipe, the
//! data splits, the LR schedule, the checkpoint store and which checkpoint to continue from.
//! One rank and N ranks share it so they read the same samples in the same order. It takes what
//! the caller already resolved (the plan, with its vocabulary; the tokenizer the caller loaded
//! for it) and derives nothing twice.

use std::path::{Path, PathBuf};

use ferrotron_data::{GptData, Tokenizer, build_gpt_data};
use ferrotron_model::ModelConfig;
use ferrotron_plan::Plan;
use ferrotron_recipe::{Recipe, ResumePolicy};

use crate::checkpoint::{CheckpointStore, ModelShape, ShardedCheckpoint};
use crate::run::eval_batches::valid_samples;
use crate::{LrSchedule, TrainError};

/// A rank's run inputs derived from the plan.
pub(crate) struct RunSetup {
    pub recipe: Recipe,
    pub data: GptData,
    pub schedule: LrSchedule,
    pub shape: ModelShape,
    pub store: Option<CheckpointStore>,
}

impl RunSetup {
    pub(crate) fn new(plan: &Plan, tokenizer: &Tokenizer) -> Result<Self, TrainError> {
        let recipe = runtime_recipe(plan);
        let global_batch = u64::from(plan.global_batch_size);
        let train_iters = plan.train_iters;
        let seed = recipe.training.seed;
        let data = build_gpt_data(
            &recipe.data,
            recipe.model.seq_length,
            seed,
            [
                train_iters * global_batch,
                valid_samples(&recipe.training, train_iters, plan.global_batch_size),
                recipe.training.eval_iters * global_batch,
            ],
            tokenizer,
            plan.vocab_size,
        )?;
        let schedule = LrSchedule::from_recipe(&recipe, train_iters)?;
        let shape = ModelShape::of(&recipe.model, plan.padded_vocab_size);
        let store = recipe
            .checkpoint
            .dir
            .as_ref()
            .map(|dir| CheckpointStore::new(dir, recipe.checkpoint.keep_last));
        Ok(RunSetup {
            recipe,
            data,
            schedule,
            shape,
            store,
        })
    }

    /// The model every rank builds (its own part of it on a parallel layout): the recipe's, with
    /// the plan's real and padded vocabulary.
    pub(crate) fn model_config(&self, plan: &Plan) -> Result<ModelConfig, TrainError> {
        Ok(ModelConfig::from_model_with_vocab(
            &self.recipe.model,
            plan.vocab_size,
            plan.padded_vocab_size,
        )?)
    }

    /// The checkpoint to continue from, by `checkpoint.resume`, opened and (unless
    /// `checkpoint.verify` is off) checked against its checksums. With `auto`, a damaged newest
    /// checkpoint is reported and the newest older one that verifies is taken instead; a path
    /// named explicitly must verify itself.
    pub(crate) fn resume_source(&self) -> Result<Option<ShardedCheckpoint>, TrainError> {
        let verify = self.recipe.checkpoint.verify;
        match self.recipe.checkpoint.resume_policy() {
            ResumePolicy::Never => Ok(None),
            ResumePolicy::Auto => match &self.store {
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

/// The recipe as the runtime uses it: the plan's resolved copy (the planner already recorded the
/// real vocabulary, so the loss and sampling ignore Megatron's padding rows) with `extends`
/// dropped (it is already merged).
fn runtime_recipe(plan: &Plan) -> Recipe {
    let mut recipe = plan.recipe.clone();
    recipe.extends = None;
    recipe
}

/// `plan.json` and the resolved recipe beside the checkpoints, so a run directory explains
/// itself without the recipe file that started it.
pub(crate) fn write_run_dir(
    run_dir: &Path,
    plan: &Plan,
    recipe: &Recipe,
) -> Result<(), TrainError> {
    plan.write_to(run_dir).map_err(|e| {
        TrainError::Config(format!(
            "cannot write plan.json into {}: {e}",
            run_dir.display()
        ))
    })?;
    crate::run::resume::write_recipe(run_dir, recipe)
}
