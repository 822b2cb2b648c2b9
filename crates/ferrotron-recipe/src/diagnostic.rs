//! Diagnostics: every problem of a load, each with its file, line, column, key path, the YAML
//! snippet (through miette) and a fix. One type serves both outputs of `recipe validate`: the
//! graphical report (miette `related()` carries every problem) and the JSON list for CI tools.

use std::fmt;
use std::sync::Arc;

use miette::{Diagnostic, LabeledSpan, NamedSource, SourceCode};
use serde::Serialize;

use crate::Severity;
use crate::source::{Origin, SourceFile};

/// Where a problem points, resolved from an [`Origin`].
#[derive(Debug, Clone)]
struct Anchor {
    /// Index of the file in load order (the top recipe is 0, its base 1, ...).
    file_index: usize,
    file: String,
    line: usize,
    column: usize,
    source: NamedSource<Arc<String>>,
    text: Arc<String>,
    offset: usize,
    len: usize,
}

/// Where a problem points, as CI tools want it: the file as named in the load, the 1-based
/// start line and column, and the end of the span (the line and the column just past its last
/// character, SARIF's convention). Columns count characters, as the parser does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Location {
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub end_line: usize,
    pub end_column: usize,
}

impl Anchor {
    fn location(&self) -> Location {
        let end = (self.offset + self.len).min(self.text.len());
        let start = self.offset.min(end);
        // A span that ends in whitespace (a block value and its newline) ends at its last
        // visible character.
        let trimmed = start + self.text[start..end].trim_end().len();
        let (end_line, end_column) = if trimmed <= start {
            (self.line, self.column)
        } else {
            let before = &self.text[..trimmed];
            let line = self.line + self.text[start..trimmed].matches('\n').count();
            let line_start = before.rfind('\n').map_or(0, |i| i + 1);
            (line, before[line_start..].chars().count() + 1)
        };
        Location {
            file: self.file.clone(),
            line: self.line,
            column: self.column,
            end_line,
            end_column,
        }
    }
}

/// One problem in a recipe.
#[derive(Debug, Clone)]
pub struct Problem {
    severity: Severity,
    code: String,
    message: String,
    help: Option<String>,
    path: Option<String>,
    label: String,
    anchor: Option<Anchor>,
    /// The layer that set the offending value when it is not a file (`--set ..`, `env ..`).
    layer: Option<String>,
}

impl Problem {
    pub(crate) fn new(severity: Severity, code: &str, message: impl Into<String>) -> Self {
        Problem {
            severity,
            code: code.to_owned(),
            message: message.into(),
            help: None,
            path: None,
            label: String::from("here"),
            anchor: None,
            layer: None,
        }
    }

    pub(crate) fn error(code: &str, message: impl Into<String>) -> Self {
        Problem::new(Severity::Error, code, message)
    }

    pub(crate) fn with_help(mut self, help: Option<String>) -> Self {
        self.help = help;
        self
    }

    pub(crate) fn with_path(mut self, path: impl Into<String>) -> Self {
        let path = path.into();
        self.path = (!path.is_empty()).then_some(path);
        self
    }

    pub(crate) fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
        self
    }

    /// Point the problem at a value's origin.
    pub(crate) fn at(mut self, origin: &Origin, files: &[SourceFile]) -> Self {
        match origin {
            Origin::File(p) => {
                let file = &files[p.file];
                self.anchor = Some(Anchor {
                    file_index: p.file,
                    file: file.name.clone(),
                    line: p.line,
                    column: p.column,
                    source: file.named_source(),
                    text: Arc::clone(&file.text),
                    offset: p.offset,
                    len: p.len,
                });
            }
            Origin::Set(_) | Origin::Env(_) => self.layer = Some(origin.describe(files)),
            Origin::Default => {}
        }
        self
    }

    pub fn severity(&self) -> Severity {
        self.severity
    }

    pub fn code(&self) -> &str {
        &self.code
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn help_text(&self) -> Option<&str> {
        self.help.as_deref()
    }

    /// Dot path of the offending key, when the problem concerns one.
    pub fn path(&self) -> Option<&str> {
        self.path.as_deref()
    }

    /// `(file, line, column)` when the problem points into a file.
    pub fn file_position(&self) -> Option<(&str, usize, usize)> {
        self.anchor
            .as_ref()
            .map(|a| (a.file.as_str(), a.line, a.column))
    }

    /// The span the problem points at, with its end, when it points into a file.
    pub fn location(&self) -> Option<Location> {
        self.anchor.as_ref().map(Anchor::location)
    }

    /// The layer that set the offending value when it is not a file (`--set ..`, `env ..`).
    pub fn layer(&self) -> Option<&str> {
        self.layer.as_deref()
    }

    pub fn to_json(&self) -> serde_json::Value {
        #[derive(Serialize)]
        struct Json<'a> {
            severity: Severity,
            code: &'a str,
            file: Option<&'a str>,
            line: Option<usize>,
            column: Option<usize>,
            path: Option<&'a str>,
            origin: Option<&'a str>,
            message: &'a str,
            help: Option<&'a str>,
        }
        let position = self.file_position();
        serde_json::to_value(Json {
            severity: self.severity,
            code: &self.code,
            file: position.map(|p| p.0),
            line: position.map(|p| p.1),
            column: position.map(|p| p.2),
            path: self.path.as_deref(),
            origin: self.layer.as_deref(),
            message: &self.message,
            help: self.help.as_deref(),
        })
        .unwrap_or(serde_json::Value::Null)
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(layer) = &self.layer {
            write!(f, " (set by {layer})")?;
        }
        Ok(())
    }
}

impl std::error::Error for Problem {}

impl Diagnostic for Problem {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(&self.code))
    }

    fn severity(&self) -> Option<miette::Severity> {
        Some(match self.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning => miette::Severity::Warning,
        })
    }

    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.help
            .as_ref()
            .map(|h| Box::new(h) as Box<dyn fmt::Display>)
    }

    fn source_code(&self) -> Option<&dyn SourceCode> {
        self.anchor.as_ref().map(|a| &a.source as &dyn SourceCode)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        let anchor = self.anchor.as_ref()?;
        Some(Box::new(std::iter::once(LabeledSpan::new(
            Some(self.label.clone()),
            anchor.offset,
            anchor.len,
        ))))
    }
}

/// Every problem of a failed load or validation (errors, plus the warnings found alongside).
#[derive(Debug, Clone)]
pub struct RecipeErrors {
    subject: String,
    problems: Vec<Problem>,
    /// Stand-in typed forms for running further rules (see [`crate::partial`]).
    partial: Option<Box<crate::partial::Partial>>,
}

impl RecipeErrors {
    pub(crate) fn new(subject: impl Into<String>, mut problems: Vec<Problem>) -> Self {
        // Errors first; then the top recipe before its bases, each top to bottom.
        problems.sort_by_key(|p| {
            (
                p.severity,
                p.anchor.as_ref().map(|a| (a.file_index, a.line, a.column)),
            )
        });
        RecipeErrors {
            subject: subject.into(),
            problems,
            partial: None,
        }
    }

    pub(crate) fn with_partial(mut self, partial: Option<crate::partial::Partial>) -> Self {
        self.partial = partial.map(Box::new);
        self
    }

    /// Run more rules (e.g. the planner's layout rules) on what parsed of an invalid recipe,
    /// adding the findings that do not depend on its broken values. Does nothing when the
    /// recipe did not parse far enough to have a typed form.
    pub fn check_partial(&mut self, rules: &dyn Fn(&crate::Recipe) -> Vec<crate::Finding>) {
        let Some(partial) = &self.partial else {
            return;
        };
        let mut problems = std::mem::take(&mut self.problems);
        problems.extend(partial.check(rules));
        let subject = std::mem::take(&mut self.subject);
        let partial = self.partial.take();
        *self = RecipeErrors::new(subject, problems);
        self.partial = partial;
    }

    /// The recipe file (or name) the problems belong to.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    pub fn problems(&self) -> &[Problem] {
        &self.problems
    }

    pub fn error_count(&self) -> usize {
        self.problems
            .iter()
            .filter(|p| p.severity == Severity::Error)
            .count()
    }

    /// True for an `abstract: true` fragment whose only error is being one: valid as a base
    /// for `extends:`, not as a recipe to plan or run.
    pub fn is_valid_fragment(&self) -> bool {
        self.problems
            .iter()
            .filter(|p| p.severity == Severity::Error)
            .all(|p| p.code == codes::ABSTRACT)
            && self.problems.iter().any(|p| p.code == codes::ABSTRACT)
    }

    /// True when the top-level file could not be read at all (a usage problem, not a recipe one).
    pub fn is_unreadable(&self) -> bool {
        self.problems.iter().any(|p| p.code == codes::UNREADABLE)
    }

    /// One JSON object per problem.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::Value::Array(self.problems.iter().map(Problem::to_json).collect())
    }
}

impl fmt::Display for RecipeErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let errors = self.error_count();
        let warnings = self.problems.len() - errors;
        write!(
            f,
            "{}: {errors} error{}",
            self.subject,
            if errors == 1 { "" } else { "s" }
        )?;
        if warnings > 0 {
            write!(
                f,
                ", {warnings} warning{}",
                if warnings == 1 { "" } else { "s" }
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for RecipeErrors {}

impl Diagnostic for RecipeErrors {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new("recipe::invalid"))
    }

    fn related<'a>(&'a self) -> Option<Box<dyn Iterator<Item = &'a dyn Diagnostic> + 'a>> {
        Some(Box::new(self.problems.iter().map(|p| p as &dyn Diagnostic)))
    }
}

/// Stable codes of the problems the loader itself reports (rules carry their own).
pub(crate) mod codes {
    pub(crate) const UNREADABLE: &str = "recipe::unreadable";
    pub(crate) const SYNTAX: &str = "yaml::syntax";
    pub(crate) const DUPLICATE_KEY: &str = "yaml::duplicate-key";
    pub(crate) const UNSUPPORTED: &str = "yaml::unsupported";
    pub(crate) const LIMIT: &str = "yaml::limit";
    pub(crate) const EXTENDS: &str = "recipe::extends";
    pub(crate) const OVERRIDE: &str = "recipe::override";
    pub(crate) const FORMAT_VERSION: &str = "recipe::format-version";
    pub(crate) const ABSTRACT: &str = "recipe::abstract";
    pub(crate) const FILE: &str = "files::missing";
    pub(crate) const UNKNOWN_KEY: &str = "schema::unknown-key";
    pub(crate) const MISSING_KEY: &str = "schema::missing-key";
    pub(crate) const TYPE: &str = "schema::type";
    pub(crate) const VALUE: &str = "schema::value";
}
