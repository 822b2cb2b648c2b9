//! A loaded recipe → its plan: the one path `recipe plan`, `recipe run`, `recipe submit`,
//! `recipe hf import` and every sweep member take.
//!
//! Fill in the vocabulary from the tokenizer when the recipe leaves it out, plan, and locate the
//! planner's layout findings at their recipe lines. Written once so the commands and the sweep
//! cannot drift apart in what they accept. Reading the tokenizer is the caller's (the data
//! crate's `tokenizer_vocab_size`), so the planner stays free of I/O.

use ferrotron_recipe::{Cluster, Finding, LoadedRecipe, Recipe, RecipeErrors, Tokenizer};

use crate::{Plan, PlanOptions, plan};

/// Why a loaded recipe has no plan.
#[derive(Debug, thiserror::Error)]
pub enum Unplanned<E: std::error::Error + 'static> {
    /// `model.vocab_size` is unset and the tokenizer could not be read to find it.
    #[error(
        "model.vocab_size is not set and the tokenizer could not be loaded to find it; \
         set model.vocab_size or fix data.tokenizer"
    )]
    Vocabulary(#[source] E),
    /// The layout rules refused it: errors located at their recipe lines.
    #[error(transparent)]
    Invalid(RecipeErrors),
    /// The planner refused it with warnings only (shown as they are).
    #[error("the planner refused the recipe")]
    Refused(Vec<Finding>),
}

/// The unpadded vocabulary: the recipe's `model.vocab_size`, else the tokenizer's.
pub fn vocab_size<E>(
    recipe: &Recipe,
    tokenizer_vocab: impl FnOnce(&Tokenizer) -> Result<u32, E>,
) -> Result<u32, E> {
    match recipe.model.vocab_size {
        Some(vocab) => Ok(vocab),
        None => tokenizer_vocab(&recipe.data.tokenizer),
    }
}

/// Plans `loaded.recipe` on `cluster` (None: the recipe's own, else one CPU rank), the
/// vocabulary from [`vocab_size`].
pub fn plan_loaded<E: std::error::Error + 'static>(
    loaded: &LoadedRecipe,
    cluster: Option<Cluster>,
    tokenizer_vocab: impl FnOnce(&Tokenizer) -> Result<u32, E>,
) -> Result<Plan, Unplanned<E>> {
    let recipe = &loaded.recipe;
    let vocab_size = vocab_size(recipe, tokenizer_vocab).map_err(Unplanned::Vocabulary)?;
    let options = PlanOptions {
        cluster,
        vocab_size,
    };
    plan(recipe, &options).map_err(|findings| match loaded.check(findings) {
        Err(errors) => Unplanned::Invalid(errors),
        Ok(warnings) => Unplanned::Refused(warnings),
    })
}
