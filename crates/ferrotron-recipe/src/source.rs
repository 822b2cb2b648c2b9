//! Where a value came from. Every node of the merged recipe tree carries an [`Origin`], so a
//! diagnostic can point at a line and column and `recipe show --origin` can name the layer that
//! won (a file, a `--set`, an environment variable, or the built-in default).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use miette::NamedSource;

/// One YAML file (or in-memory text) that took part in a load.
#[derive(Debug, Clone)]
pub(crate) struct SourceFile {
    /// The name shown in diagnostics: the path as the user (or an `extends:` chain) spelled it.
    pub name: String,
    /// The directory relative paths inside this file are resolved against.
    pub dir: PathBuf,
    pub text: Arc<String>,
}

impl SourceFile {
    pub(crate) fn named_source(&self) -> NamedSource<Arc<String>> {
        NamedSource::new(&self.name, Arc::clone(&self.text)).with_language("yaml")
    }
}

/// A position inside a [`SourceFile`]: byte span for miette, 1-based line and column for humans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Position {
    pub file: usize,
    pub offset: usize,
    pub len: usize,
    pub line: usize,
    pub column: usize,
}

/// The layer that set a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Origin {
    File(Position),
    /// A `--set key=value` argument (kept verbatim).
    Set(String),
    /// An environment variable, by name.
    Env(String),
    /// Filled in by the loader (e.g. the cache directory beside the recipe).
    Default,
}

impl Origin {
    pub(crate) fn position(&self) -> Option<Position> {
        match self {
            Origin::File(position) => Some(*position),
            Origin::Set(_) | Origin::Env(_) | Origin::Default => None,
        }
    }

    /// The directory a relative path set by this layer is relative to (`None`: the current one).
    pub(crate) fn base_dir<'a>(&self, files: &'a [SourceFile]) -> Option<&'a Path> {
        self.position().map(|p| files[p.file].dir.as_path())
    }

    /// `file:line:col`, `--set ARG` or `env NAME`.
    pub(crate) fn describe(&self, files: &[SourceFile]) -> String {
        match self {
            Origin::File(p) => format!("{}:{}:{}", files[p.file].name, p.line, p.column),
            Origin::Set(arg) => format!("--set {arg}"),
            Origin::Env(var) => format!("env {var}"),
            Origin::Default => "default".to_owned(),
        }
    }
}
