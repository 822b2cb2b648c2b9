//! Recipe → plan for the commands that need both (`recipe plan`, `recipe run`).
//!
//! Both must print the loader's located diagnostics, fill in the vocabulary from the tokenizer
//! when the recipe leaves it out, and render the planner's layout findings at their YAML lines.
//! Keeping that here means the two commands cannot drift apart in what they accept.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;

use crate::exit;
use ferrotron_data::{DataError, Tokenizer};
use ferrotron_plan::{Plan, Unplanned};
use ferrotron_recipe::{Cluster, LoadOptions, LoadedRecipe, Recipe};

/// The recipe a command plans, trains or submits, with its overrides: `plan`, `run` and `submit`
/// flatten this one definition, so the three take the same flags with the same meaning.
#[derive(Debug, clap::Args)]
pub(crate) struct RecipeArgs {
    /// The recipe file.
    pub recipe: PathBuf,
    /// Override a recipe value: `--set training.train_iters=100` (the value is YAML; `submit`
    /// passes it on to the job's `recipe run`).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Ignore `FERROTRON_SECTION__KEY` environment overrides.
    #[arg(long)]
    pub no_env: bool,
}

impl RecipeArgs {
    /// [`load`] of this recipe with these overrides.
    pub(crate) fn load(&self) -> Result<LoadedRecipe, ExitCode> {
        load(&self.recipe, &self.overrides, !self.no_env)
    }
}

/// Loads a recipe with `--set` and (unless `--no-env`) environment overrides; on failure the diagnostics are printed
/// and the exit code returned: unreadable input or an invalid recipe (as `recipe validate`).
pub(crate) fn load(
    path: &Path,
    overrides: &[String],
    use_env: bool,
) -> Result<LoadedRecipe, ExitCode> {
    ferrotron_recipe::load(path, &LoadOptions { overrides, use_env }).map_err(|errors| {
        let code = if errors.is_unreadable() {
            exit::USAGE
        } else {
            exit::FAILED
        };
        eprintln!("{:?}", miette::Report::new(errors));
        exit::code(code)
    })
}

/// Every file the recipe names must exist before training starts; each missing one is printed
/// at the recipe line that named it and the run stops before any rank starts: exit 2 when a
/// tokenizer file is among them (unreadable input, as `validate` and `plan` say), else exit 1
/// (missing data fails the run).
pub(crate) fn check_files(loaded: &LoadedRecipe) -> Result<(), ExitCode> {
    let problems = loaded.check_files();
    if problems.is_empty() {
        return Ok(());
    }
    let handler = super::validate::handler();
    for problem in &problems {
        eprint!("{}", super::validate::render(&handler, problem));
    }
    let tokenizer = problems.iter().any(|p| {
        p.path()
            .is_some_and(|key| key.starts_with("data.tokenizer"))
    });
    Err(exit::code(if tokenizer {
        exit::USAGE
    } else {
        exit::FAILED
    }))
}

/// The unpadded vocabulary: the recipe's, else the tokenizer's.
pub(crate) fn vocab_size(recipe: &Recipe) -> anyhow::Result<u32> {
    ferrotron_plan::vocab_size(recipe, ferrotron_data::tokenizer_vocab_size).context(
        "model.vocab_size is not set and the tokenizer could not be loaded to find it; \
         set model.vocab_size or fix data.tokenizer",
    )
}

/// The recipe's tokenizer, read once by `recipe run` for the vocabulary (when the recipe leaves
/// it out) and the data. One that cannot be read is unreadable input, exit 2, as in planning.
pub(crate) fn tokenizer(recipe: &Recipe) -> Result<Tokenizer, ExitCode> {
    Tokenizer::from_recipe(&recipe.data.tokenizer).map_err(|err| {
        eprintln!("error: data.tokenizer cannot be read: {err}");
        exit::code(exit::USAGE)
    })
}

/// Plans the loaded recipe on `cluster` (None: the recipe's own) through
/// [`ferrotron_plan::plan_loaded`], the vocabulary from `tokenizer_vocab` when the recipe
/// leaves it out ([`ferrotron_data::tokenizer_vocab_size`] reads the tokenizer). Layout errors
/// are printed at their lines and turned into the invalid-recipe exit code; a tokenizer that
/// cannot be read (needed for the vocabulary) is unreadable input, exit 2, as an unreadable
/// recipe is — for `plan` and `run` alike.
pub(crate) fn plan_or_report(
    loaded: &LoadedRecipe,
    cluster: Option<Cluster>,
    tokenizer_vocab: impl FnOnce(&ferrotron_recipe::Tokenizer) -> Result<u32, DataError>,
) -> Result<Plan, ExitCode> {
    ferrotron_plan::plan_loaded(loaded, cluster, tokenizer_vocab).map_err(|unplanned| {
        match unplanned {
            Unplanned::Vocabulary(_) => {
                eprintln!(
                    "error: {}",
                    crate::failure::describe(&anyhow::Error::new(unplanned))
                );
                exit::code(exit::USAGE)
            }
            Unplanned::Invalid(errors) => {
                eprintln!("{:?}", miette::Report::new(errors));
                exit::code(exit::FAILED)
            }
            // Only warnings came back, yet the planner refused: show them as they are.
            Unplanned::Refused(warnings) => {
                for finding in warnings {
                    eprintln!("{}: {}", finding.path, finding.message);
                }
                exit::code(exit::FAILED)
            }
        }
    })
}
