//! Turning member specs into resolved recipes through the recipe loader, so a member is exactly
//! what `recipe run BASE --set ...` would train, and an invalid member carries the same located
//! diagnostics the user would get from `recipe validate`.

use std::path::{Path, PathBuf};

use ferrotron_plan::{Plan, Unplanned};
use ferrotron_recipe::{LoadOptions, Recipe, RecipeErrors};

use crate::expand::{MemberSpec, expand};
use crate::paths::{absolute, map_paths, relative_to};
use crate::spec::SweepSpec;

/// Hex digits of the member hash shown in names and tables.
pub const SHORT_HASH_LEN: usize = 12;

/// A member the loader and the planner accepted.
#[derive(Debug, Clone)]
pub struct ValidMember {
    /// The resolved recipe, paths absolute (as the member recipe file will carry them).
    pub recipe: Recipe,
    /// blake3 of the canonical resolved recipe JSON, paths relative to the sweep file and run
    /// outputs (checkpoint dir, metrics file, TensorBoard directory) left out: the same training
    /// gives the same hash.
    pub hash: String,
    /// The plan on the recipe's cluster (one CPU rank when it names none).
    pub plan: Plan,
}

/// Why a member cannot run.
#[derive(Debug, Clone)]
pub enum Invalid {
    /// The loader or the planner's layout rules refused it.
    Recipe(RecipeErrors),
    /// Something outside the recipe failed (e.g. the tokenizer for the vocabulary size).
    Other(String),
}

/// One member after resolution.
#[derive(Debug, Clone)]
pub struct Member {
    pub spec: MemberSpec,
    pub resolution: Result<ValidMember, Invalid>,
}

impl Member {
    pub fn short_hash(&self) -> Option<&str> {
        self.resolution
            .as_ref()
            .ok()
            .map(|v| &v.hash[..SHORT_HASH_LEN])
    }
}

/// Expands and resolves every member of `spec`. Relative paths are resolved against `cwd`.
pub fn resolve(spec: &SweepSpec, cwd: &Path) -> Vec<Member> {
    let sweep_dir = absolute(cwd, spec.path.parent().unwrap_or(Path::new("")));
    expand(spec)
        .into_iter()
        .map(|member| {
            let resolution = resolve_one(spec, &member, cwd, &sweep_dir);
            Member {
                spec: member,
                resolution,
            }
        })
        .collect()
}

fn resolve_one(
    spec: &SweepSpec,
    member: &MemberSpec,
    cwd: &Path,
    sweep_dir: &Path,
) -> Result<ValidMember, Invalid> {
    let loaded = ferrotron_recipe::load(
        &spec.base,
        &LoadOptions {
            overrides: &member.overrides,
            use_env: false,
        },
    )
    .map_err(Invalid::Recipe)?;
    let mut loaded = loaded;
    loaded.recipe.extends = None;
    map_paths(&mut loaded.recipe, &|p| {
        absolute(cwd, Path::new(p)).display().to_string()
    });
    let hash = recipe_hash(&loaded.recipe, sweep_dir);
    let cluster = loaded.recipe.cluster.clone();
    let plan = ferrotron_plan::plan_loaded(&loaded, cluster, ferrotron_data::tokenizer_vocab_size)
        .map_err(|unplanned| match unplanned {
            Unplanned::Vocabulary(e) => Invalid::Other(format!(
                "model.vocab_size is not set and the tokenizer cannot be loaded: {e}"
            )),
            Unplanned::Invalid(errors) => Invalid::Recipe(errors),
            Unplanned::Refused(warnings) => Invalid::Other(
                warnings
                    .iter()
                    .map(|f| format!("{}: {}", f.path, f.message))
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
        })?;
    let recipe = loaded.recipe;
    Ok(ValidMember { recipe, hash, plan })
}

/// The member's identity: its resolved recipe without run outputs, paths relative to the sweep.
fn recipe_hash(recipe: &Recipe, sweep_dir: &Path) -> String {
    let mut identity = recipe.clone();
    identity.checkpoint.dir = None;
    identity.logging.jsonl = None;
    identity.logging.tensorboard = None;
    map_paths(&mut identity, &|p| {
        relative_to(Path::new(p), sweep_dir).display().to_string()
    });
    identity.content_hash()
}

/// The member recipe as it is written into its directory: outputs inside `member_dir`, the
/// member's name as the run name.
pub fn member_recipe(member: &Member, valid: &ValidMember, member_dir: &Path) -> Recipe {
    let mut recipe = valid.recipe.clone();
    recipe.name = member.spec.name.clone();
    recipe.checkpoint.dir = Some(path_string(member_dir.join("checkpoints")));
    recipe.logging.jsonl = Some(path_string(member_dir.join(METRICS_FILE)));
    // One TensorBoard run per member: `tensorboard --logdir <sweep dir>` overlays them.
    if recipe.logging.tensorboard.is_some() {
        recipe.logging.tensorboard = Some(path_string(member_dir.join(TENSORBOARD_DIR)));
    }
    recipe
}

/// Metrics file name inside a member (run) directory.
pub const METRICS_FILE: &str = "metrics.jsonl";
/// TensorBoard directory inside a member directory, when the base recipe sets
/// `logging.tensorboard`.
pub const TENSORBOARD_DIR: &str = "tensorboard";

fn path_string(path: PathBuf) -> String {
    path.display().to_string()
}
