//! Path fields of a recipe, made absolute for the member recipe file (which lives elsewhere than
//! the base) and relative to the sweep file for hashing (so a member's hash does not depend on
//! where the checkout lives or which directory the sweep was started from).

use std::path::{Component, Path, PathBuf};

use ferrotron_recipe::Recipe;

/// Applies `f` to every path-valued field of `recipe` (those the loader resolves).
pub(crate) fn map_paths(recipe: &mut Recipe, f: &dyn Fn(&str) -> String) {
    let data = &mut recipe.data;
    for entry in &mut data.blend {
        entry.path = f(&entry.path);
    }
    let tokenizer = &mut data.tokenizer;
    for field in [
        &mut tokenizer.vocab_file,
        &mut tokenizer.merge_file,
        &mut tokenizer.file,
        &mut data.cache_dir,
        &mut recipe.checkpoint.dir,
        &mut recipe.logging.jsonl,
        &mut recipe.logging.tensorboard,
    ] {
        if let Some(path) = field.as_mut() {
            *path = f(path);
        }
    }
    let resume = &recipe.checkpoint.resume;
    if !matches!(resume.as_str(), "auto" | "never" | "") {
        recipe.checkpoint.resume = f(resume);
    }
}

/// `path` joined to `base` when relative, with `.` and `name/..` removed lexically.
pub(crate) fn absolute(base: &Path, path: &Path) -> PathBuf {
    normalize(&base.join(path))
}

/// Lexically normalized path (no file-system access: the files may not exist yet).
pub(crate) fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// `path` relative to `from`, both absolute and normalized.
pub(crate) fn relative_to(path: &Path, from: &Path) -> PathBuf {
    let path: Vec<_> = path.components().collect();
    let from: Vec<_> = from.components().collect();
    let common = path.iter().zip(&from).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..from.len() {
        out.push("..");
    }
    for component in &path[common..] {
        out.push(component);
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_climb_and_descend() {
        assert_eq!(
            relative_to(
                Path::new("/r/recipes/data/x"),
                Path::new("/r/recipes/sweeps")
            ),
            Path::new("../data/x")
        );
        assert_eq!(
            relative_to(Path::new("/r/a"), Path::new("/r/a")),
            Path::new(".")
        );
        assert_eq!(
            absolute(Path::new("/w"), Path::new("recipes/sweeps/../data/x")),
            Path::new("/w/recipes/data/x")
        );
        assert_eq!(
            absolute(Path::new("/w"), Path::new("/abs/y")),
            Path::new("/abs/y")
        );
    }
}
