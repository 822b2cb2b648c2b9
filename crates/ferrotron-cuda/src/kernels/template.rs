//! Kernel sources as `.cu` files with named holes, filled from typed Rust values.
//!
//! Why not `format!`: a kernel assembled from dozens of `s += &format!(…)` lines cannot be read
//! as CUDA, and a misspelt or forgotten argument only shows in the emitted text. A template is
//! CUDA with holes, read whole from its `.cu` file (`include_str!`); [`Template::fill`] refuses
//! (panics, naming the file and the hole) a hole left without a value, a value without a hole, a
//! value of the wrong kind, and a template that does not parse. A template and its filler are
//! written together, so each of these is a bug, and the snapshot tests meet it first.
//!
//! The syntax is two things only. `{{NAME}}` (upper-case letters, digits, `_`) is replaced by its
//! [`Hole`]'s text; a hole on a dropped line needs no value, nor does a condition there. A line
//! holding only `{{#if NAME}}` (or `{{#if !NAME}}`), `{{#else}}` or `{{/if}}` (indent allowed)
//! keeps or drops the lines up to the next marker by a [`Hole::Flag`]; the marker lines themselves
//! emit nothing, so the output is exactly the kept lines. A line holding only `{{! words }}` is a
//! comment for the reader of the `.cu` file and emits nothing either.

use std::collections::{BTreeMap, BTreeSet};

use crate::engine::dtype::DType;

/// A kernel source with holes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Template {
    file: &'static str,
    text: &'static str,
}

/// What fills a hole, said at the call site.
#[derive(Debug, Clone)]
pub(crate) enum Hole<'a> {
    /// A storage dtype's C type (`float`, `__nv_bfloat16`).
    Storage(DType),
    /// A dtype's short name (`bf16`), as kernel headers spell it.
    Name(DType),
    /// An integer constant.
    Int(i64),
    /// Generated code or text (an expression, a statement, a header's words), verbatim.
    Code(std::borrow::Cow<'a, str>),
    /// Keeps the `{{#if NAME}}` lines (true) or the `{{#else}}` ones (false).
    Flag(bool),
}

impl<'a> Hole<'a> {
    pub(crate) fn code(text: impl Into<std::borrow::Cow<'a, str>>) -> Self {
        Hole::Code(text.into())
    }

    fn text(&self) -> Option<String> {
        match self {
            Hole::Storage(dtype) => Some(dtype.storage_c().to_string()),
            Hole::Name(dtype) => Some(dtype.to_string()),
            Hole::Int(n) => Some(n.to_string()),
            Hole::Code(text) => Some(text.to_string()),
            Hole::Flag(_) => None,
        }
    }
}

/// One line of a template: a conditional marker, or text with holes.
enum Line<'t> {
    /// The condition's name, and whether it is negated (`!NAME`).
    If(&'t str, bool),
    Else,
    EndIf,
    Comment,
    Text(&'t str),
}

fn marker(line: &str) -> Option<Line<'_>> {
    let trimmed = line.trim();
    let inner = trimmed.strip_prefix("{{")?.strip_suffix("}}")?;
    match inner {
        "#else" => Some(Line::Else),
        "/if" => Some(Line::EndIf),
        _ if inner.starts_with('!') => Some(Line::Comment),
        _ => inner.strip_prefix("#if ").map(|name| {
            let name = name.trim();
            match name.strip_prefix('!') {
                Some(name) => Line::If(name, true),
                None => Line::If(name, false),
            }
        }),
    }
}

fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

impl Template {
    pub(crate) const fn new(file: &'static str, text: &'static str) -> Self {
        Self { file, text }
    }

    /// The source with every hole filled from `holes` (see the module doc for what panics).
    #[track_caller]
    pub(crate) fn fill(&self, holes: &[(&str, Hole<'_>)]) -> String {
        let mut values = BTreeMap::new();
        for (name, hole) in holes {
            if values.insert(*name, hole).is_some() {
                self.fail(format!("`{name}` is given twice"));
            }
        }
        let mut used = BTreeSet::new();
        // (keeping lines here, the branch taken) for each open `{{#if}}`
        let mut open: Vec<(bool, bool)> = Vec::new();
        let mut out = String::with_capacity(self.text.len());
        for line in self.text.split_inclusive('\n') {
            let keeping = open.iter().all(|(keep, _)| *keep);
            match marker(line).unwrap_or(Line::Text(line)) {
                Line::If(name, negated) => {
                    let flag = match values.get(name) {
                        Some(Hole::Flag(flag)) => *flag != negated,
                        Some(_) => self.fail(format!("`{name}` is a condition, not a value")),
                        // inside dropped lines, both branches stay dropped
                        None if !keeping => true,
                        None => self.fail(format!("condition `{name}` has no value")),
                    };
                    used.insert(name);
                    open.push((flag && keeping, flag || !keeping));
                }
                Line::Else => match open.last_mut() {
                    Some((keep, taken)) => *keep = !*taken,
                    None => self.fail("`{{#else}}` outside `{{#if}}`".to_string()),
                },
                Line::EndIf => {
                    if open.pop().is_none() {
                        self.fail("`{{/if}}` without `{{#if}}`".to_string());
                    }
                }
                Line::Comment => {}
                Line::Text(text) => {
                    let filled = self.fill_line(text, keeping, &values, &mut used);
                    out.push_str(&filled);
                }
            }
        }
        if !open.is_empty() {
            self.fail("an `{{#if}}` is not closed".to_string());
        }
        if let Some(name) = values.keys().find(|name| !used.contains(*name)) {
            self.fail(format!("`{name}` fills no hole"));
        }
        out
    }

    /// [`Template::fill`] without the last line break: a piece of kernel (a declaration, a loop)
    /// that another template holds on a line of its own.
    #[track_caller]
    pub(crate) fn fill_piece(&self, holes: &[(&str, Hole<'_>)]) -> String {
        let mut text = self.fill(holes);
        if text.ends_with('\n') {
            text.pop();
        }
        text
    }

    /// `line` with its holes filled, or (`keeping` false) nothing, its hole names only noted.
    #[track_caller]
    fn fill_line<'t>(
        &self,
        line: &'t str,
        keeping: bool,
        values: &BTreeMap<&str, &Hole<'_>>,
        used: &mut BTreeSet<&'t str>,
    ) -> String {
        let mut out = String::with_capacity(line.len());
        let mut rest = line;
        while let Some(start) = rest.find("{{") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let Some(end) = after.find("}}") else {
                self.fail(format!("unclosed `{{{{` in `{}`", line.trim_end()));
            };
            let name = &after[..end];
            if !is_name(name) {
                self.fail(format!("`{{{{{name}}}}}` is not a hole name"));
            }
            match values.get(name).map(|hole| hole.text()) {
                Some(Some(text)) => out.push_str(&text),
                Some(None) => self.fail(format!("`{name}` is a condition, not a value")),
                None if keeping => self.fail(format!("hole `{name}` has no value")),
                None => {}
            }
            used.insert(name);
            rest = &after[end + 2..];
        }
        if keeping {
            out.push_str(rest);
            out
        } else {
            String::new()
        }
    }

    #[track_caller]
    fn fail(&self, why: String) -> ! {
        panic!("kernel template {}: {why}", self.file)
    }
}

/// A [`Template`] of a `.cu` file beside the calling module.
macro_rules! template {
    ($file:literal) => {
        $crate::kernels::template::Template::new($file, include_str!($file))
    };
}
pub(crate) use template;

#[cfg(test)]
mod tests {
    use super::*;

    const T: Template = Template::new(
        "test.cu",
        "// {{NAME}} {{T}}\n{{! a comment }}\n{{#if ON}}\n  on {{N}};\n{{#else}}\n  off;\n{{/if}}\n{{#if !ON}}\n  not {{M}};\n{{/if}}\nend\n",
    );

    #[test]
    fn holes_and_conditions_fill() {
        let on = T.fill(&[
            ("NAME", Hole::code("x")),
            ("T", Hole::Storage(DType::BF16)),
            ("ON", Hole::Flag(true)),
            ("N", Hole::Int(-3)),
        ]);
        assert_eq!(on, "// x __nv_bfloat16\n  on -3;\nend\n");
        let off = T.fill(&[
            ("NAME", Hole::code("x")),
            ("T", Hole::Name(DType::BF16)),
            ("ON", Hole::Flag(false)),
            ("M", Hole::Int(2)),
        ]);
        assert_eq!(off, "// x bf16\n  off;\n  not 2;\nend\n");
    }

    #[test]
    fn a_dropped_branch_needs_no_values() {
        let nested = Template::new(
            "nested.cu",
            "{{#if OUTER}}\n{{#if INNER}}\n  a {{X}};\n{{#else}}\n  b;\n{{/if}}\n{{#else}}\n  c;\n{{/if}}\n",
        );
        assert_eq!(nested.fill(&[("OUTER", Hole::Flag(false))]), "  c;\n");
        let inner = [("OUTER", Hole::Flag(true)), ("INNER", Hole::Flag(false))];
        assert_eq!(nested.fill(&inner), "  b;\n");
    }

    fn panic_text(f: impl FnOnce() -> String + std::panic::UnwindSafe) -> String {
        let err = std::panic::catch_unwind(f).expect_err("should refuse");
        err.downcast_ref::<String>().cloned().unwrap_or_default()
    }

    #[test]
    fn a_missing_an_unknown_or_a_mistyped_hole_is_refused() {
        let all = || {
            vec![
                ("NAME", Hole::code("x")),
                ("T", Hole::Storage(DType::F32)),
                ("ON", Hole::Flag(true)),
                ("N", Hole::Int(1)),
                ("M", Hole::Int(1)),
            ]
        };
        let mut missing = all();
        missing.retain(|(name, _)| *name != "N");
        assert!(panic_text(move || T.fill(&missing)).contains("hole `N` has no value"));
        let mut extra = all();
        extra.push(("EXTRA", Hole::Int(0)));
        assert!(panic_text(move || T.fill(&extra)).contains("`EXTRA` fills no hole"));
        let mut mistyped = all();
        mistyped[2].1 = Hole::Int(1);
        assert!(panic_text(move || T.fill(&mistyped)).contains("`ON` is a condition"));
        let unclosed = Template::new("u.cu", "{{#if ON}}\nx\n");
        assert!(panic_text(move || unclosed.fill(&[("ON", Hole::Flag(true))])).contains("u.cu"));
    }
}
