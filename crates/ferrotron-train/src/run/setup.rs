//! What every rank prepares before its first step, whatever the layout: the runtime recipe, the
//! data splits, the LR schedule and the checkpoint store (which checkpoint in it to continue
//! from is `resume.rs`'s).
//! One rank and N ranks share it so they read the same samples in the same order. It takes what
//! the caller already resolved (the plan, with its vocabulary; the tokenizer the caller loaded
//! for it) and derives nothing twice.

use ferrotron_data::{GptData, Tokenizer, build_gpt_data};
use ferrotron_plan::Plan;
use ferrotron_recipe::Recipe;

use crate::checkpoint::{CheckpointStore, ModelShape};
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
}

/// The recipe as the runtime uses it: the plan's resolved copy (the planner already recorded the
/// real vocabulary, so the loss and sampling ignore Megatron's padding rows) with `extends`
/// dropped (it is already merged).
fn runtime_recipe(plan: &Plan) -> Recipe {
    let mut recipe = plan.recipe.clone();
    recipe.extends = None;
    recipe
}
