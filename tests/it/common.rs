//! What the end-to-end modules share: where the repository is, how to run the binary the way a
//! user would (no colour, none of the caller's `FERROTRON_*` or `GIT_*` environment) and its
//! output as text.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};

/// The `recipe` binary under test.
pub(crate) const RECIPE: &str = env!("CARGO_BIN_EXE_recipe");

/// The repository root (fixtures, recipes, tools).
pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `recipe ARGS` run in `dir`, without colour and without environment overrides of the
/// recipe (`FERROTRON_*`) or of git (`GIT_*`, set when a hook runs the tests).
pub(crate) fn recipe_in(dir: &Path, args: &[&str]) -> Output {
    let mut command = Command::new(RECIPE);
    command.args(args).current_dir(dir).env("NO_COLOR", "1");
    for (key, _) in std::env::vars_os() {
        let key_text = key.to_string_lossy();
        if key_text.starts_with("FERROTRON_") || key_text.starts_with("GIT_") {
            command.env_remove(key);
        }
    }
    command.output().expect("the recipe binary runs")
}

/// `recipe ARGS` run in the repository root, as [`recipe_in`].
pub(crate) fn recipe(args: &[&str]) -> Output {
    recipe_in(&repo(), args)
}

/// Standard output as text.
pub(crate) fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Standard error as text.
pub(crate) fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The shipped presets, `recipes/*.yaml` relative to the repository root, sorted.
pub(crate) fn shipped_recipes() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(repo().join("recipes"))
        .expect("recipes/")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .map(|n| format!("recipes/{n}"))
        .collect();
    files.sort();
    files
}

/// `--set`s that make any tiny recipe diverge at its first step: a huge learning rate, no
/// warm-up, no clipping.
pub(crate) const DIVERGE: [&str; 6] = [
    "--set",
    "training.optimizer.lr=1e30",
    "--set",
    "training.schedule.warmup_iters=0",
    "--set",
    "training.clip_grad=0",
];

/// Waits for every rank process of a world; each must succeed (else its stderr is shown).
pub(crate) fn wait_ranks(ranks: Vec<Child>) -> Vec<Output> {
    ranks
        .into_iter()
        .enumerate()
        .map(|(rank, child)| {
            let output = child.wait_with_output().expect("the rank exits");
            assert!(
                output.status.success(),
                "rank {rank} failed:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            output
        })
        .collect()
}
