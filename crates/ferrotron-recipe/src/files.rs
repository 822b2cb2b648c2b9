//! Do the files a recipe names exist? Checked before any GPU is asked for, so a typo in a data
//! path fails `recipe validate --check-files` (or `recipe run` before it starts) at the recipe
//! line that set it, with the path as resolved and the nearest name that does exist — not an OS
//! error from deep inside the data loader an hour into a queue.
//!
//! Opt-in for `validate`: presets are checked in CI on machines without their data sets.
//! (`extends:` targets need no check here: the loader already reads them.)

use std::path::Path;

use crate::diagnostic::{Problem, codes};
use crate::{LoadedRecipe, Recipe, TokenizerKind};

impl LoadedRecipe {
    /// A located error for every data file, blend prefix and tokenizer file that is missing or
    /// unreadable.
    pub fn check_files(&self) -> Vec<Problem> {
        named_files(&self.recipe)
            .into_iter()
            .filter_map(|(key, wanted)| {
                let problem = missing(&key, &wanted)?;
                let located = self.tree.locate(&key, false);
                Some(
                    problem
                        .with_path(&key)
                        .with_label("this path")
                        .at(located.origin, &self.files),
                )
            })
            .collect()
    }
}

/// A file the recipe needs: one path, or a Megatron prefix whose `.bin` and `.idx` must both be
/// there.
enum Wanted {
    File(String),
    Prefix(String),
}

fn named_files(recipe: &Recipe) -> Vec<(String, Wanted)> {
    let mut out = Vec::new();
    let blends = [
        ("blend", Some(&recipe.data.blend)),
        ("valid_blend", recipe.data.valid_blend.as_ref()),
        ("test_blend", recipe.data.test_blend.as_ref()),
    ];
    let entries = blends.into_iter().flat_map(|(key, blend)| {
        blend
            .into_iter()
            .flatten()
            .enumerate()
            .map(move |(i, entry)| (key, i, entry))
    });
    for (key, i, entry) in entries {
        let wanted = if matches!(
            Path::new(&entry.path).extension().and_then(|e| e.to_str()),
            Some("jsonl" | "json")
        ) {
            Wanted::File(entry.path.clone())
        } else {
            Wanted::Prefix(entry.path.clone())
        };
        out.push((format!("data.{key}.{i}.path"), wanted));
    }
    let t = &recipe.data.tokenizer;
    let tokenizer_files: &[(&str, &Option<String>)] = match t.kind {
        TokenizerKind::Gpt2Bpe => &[("vocab_file", &t.vocab_file), ("merge_file", &t.merge_file)],
        TokenizerKind::Hf => &[("file", &t.file)],
    };
    for (key, path) in tokenizer_files {
        if let Some(path) = path {
            out.push((format!("data.tokenizer.{key}"), Wanted::File(path.clone())));
        }
    }
    out
}

fn missing(key: &str, wanted: &Wanted) -> Option<Problem> {
    let paths: Vec<String> = match wanted {
        Wanted::File(path) => vec![path.clone()],
        Wanted::Prefix(prefix) => vec![format!("{prefix}.bin"), format!("{prefix}.idx")],
    };
    let absent: Vec<(&String, std::io::Error)> = paths
        .iter()
        .filter_map(|p| std::fs::File::open(p).err().map(|e| (p, e)))
        .collect();
    let (first, error) = absent.first()?;
    let what = match wanted {
        Wanted::File(_) => format!("`{first}`"),
        Wanted::Prefix(prefix) => format!(
            "the Megatron dataset `{prefix}` ({})",
            absent
                .iter()
                .map(|(p, _)| format!("`{p}`"))
                .collect::<Vec<_>>()
                .join(" and ")
        ),
    };
    let reason = match error.kind() {
        std::io::ErrorKind::NotFound => "does not exist".to_owned(),
        std::io::ErrorKind::PermissionDenied => "is not readable".to_owned(),
        _ => format!("cannot be read ({})", error.kind()),
    };
    let help = match nearest(first) {
        Some(near) => format!("did you mean `{near}`? (paths are relative to the recipe file)"),
        None => "paths in a recipe are relative to the file that sets them".to_owned(),
    };
    Some(Problem::error(codes::FILE, format!("`{key}`: {what} {reason}")).with_help(Some(help)))
}

/// The existing entry of the path's directory closest in spelling to its file name.
fn nearest(path: &str) -> Option<String> {
    let path = Path::new(path);
    let name = path.file_name()?.to_str()?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let entries = std::fs::read_dir(dir.unwrap_or(Path::new("."))).ok()?;
    let best = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .map(|candidate| (strsim::jaro_winkler(name, &candidate), candidate))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))?;
    Some(match dir {
        Some(dir) => dir.join(best.1).display().to_string(),
        None => best.1,
    })
}
