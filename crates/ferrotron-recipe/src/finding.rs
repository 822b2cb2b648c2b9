//! A problem found in a recipe, addressed by its key path rather than by a source position.
//!
//! Rules live in several crates (the recipe's own semantic rules here, the parallel-layout rules
//! in the planner). None of them should know about YAML or spans: they name the offending key
//! (`parallel.tensor`) and the loader, which kept the source map, turns the path into a file,
//! line and column. That is what lets the planner's rules "plug in" to `recipe validate`.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

/// One rule violation: where (a dot path into the recipe), what, and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub severity: Severity,
    /// Dot path of the offending key, e.g. `parallel.tensor` or `data.blend.1.weight`.
    pub path: String,
    /// Stable rule identifier, e.g. `layout::heads-divisible-by-tp`.
    pub code: String,
    pub message: String,
    /// A concrete fix, ideally naming valid values.
    pub help: Option<String>,
}

impl Finding {
    pub fn error(code: &str, path: impl Into<String>, message: impl Into<String>) -> Self {
        Finding {
            severity: Severity::Error,
            path: path.into(),
            code: code.to_owned(),
            message: message.into(),
            help: None,
        }
    }

    pub fn warning(code: &str, path: impl Into<String>, message: impl Into<String>) -> Self {
        Finding {
            severity: Severity::Warning,
            ..Finding::error(code, path, message)
        }
    }

    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}
