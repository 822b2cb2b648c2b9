//! Recipe format versions and the migrations between them.
//!
//! A recipe says which format it is written in (`version: 2`). The version changes only when a
//! recipe that was valid would be rejected, or would mean something else, under the new format:
//! a key renamed, moved or removed, a value's meaning or a default changed. Adding an optional
//! key whose default keeps the old behaviour is not a new version. Every new version comes with
//! a migration step from the one before ([`STEPS`]), a fixture written in the old format, and the
//! schema's `version` range moved to the new number. A build reads only the current version: an
//! older file is refused with one diagnostic that names `recipe migrate`, rather than upgraded in
//! memory, so every origin (`file:line`) and every recipe hash is of text that is really in the
//! file.
//!
//! Version 0 is the first step's source format. No Ferrotron release wrote it (versioning is as
//! old as the format); it is defined as what recipes transcribed from Megatron-LM launch scripts
//! look like: no `version:` key, and Megatron's argument names (`tensor_model_parallel_size`,
//! `recompute_granularity`, `adam_beta1`, `untie_embeddings_and_output_weights`, ...) where the
//! recipe format has shorter ones. Migrating it is a text edit on the located YAML: keys are
//! renamed where they stand and values rewritten in place, so comments, key order, quoting and
//! flow style survive.

use std::fmt::Write as _;

use crate::diagnostic::{Problem, RecipeErrors, codes};
use crate::node::{Entry, Node, NodeValue};
use crate::source::{Origin, SourceFile};
use crate::types::FORMAT_VERSION;

mod v1_schedule;

/// The oldest format `recipe migrate` reads.
pub const OLDEST_FORMAT_VERSION: u32 = 0;

/// How a version-0 value becomes a version-1 value when its key is renamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueChange {
    /// Kept as written.
    Same,
    /// A boolean that means the opposite under the new name (`untie_…` → `tie_…`).
    Negate,
    /// Megatron's `learned_absolute` is the recipe format's `learned`.
    PositionEmbedding,
}

/// One key renamed by a migration step: the mapping it is in, its old and new name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rename {
    pub section: &'static str,
    pub old: &'static str,
    pub new: &'static str,
    pub value: ValueChange,
}

const fn rename(section: &'static str, old: &'static str, new: &'static str) -> Rename {
    Rename {
        section,
        old,
        new,
        value: ValueChange::Same,
    }
}

/// One migration step: from `from` to `from + 1`.
#[derive(Debug, Clone, Copy)]
pub struct Step {
    pub from: u32,
    pub summary: &'static str,
    pub renames: &'static [Rename],
    /// Values whose meaning changed, rewritten so the recipe trains as before.
    rewrite: Option<Rewrite>,
}

/// A step's value rewrites: edits on the parsed file, given what its `extends` chain sets.
type Rewrite = fn(&Node, &str, &[SourceFile], &Inherited) -> Result<Vec<Edit>, Vec<Problem>>;

/// Version 0 → 1: Megatron-LM argument names → recipe keys.
const V0_RENAMES: &[Rename] = &[
    rename("parallel", "tensor_model_parallel_size", "tensor"),
    rename("parallel", "pipeline_model_parallel_size", "pipeline"),
    rename(
        "parallel",
        "virtual_pipeline_model_parallel_size",
        "virtual_pipeline",
    ),
    rename("parallel", "context_parallel_size", "context"),
    rename("parallel", "expert_model_parallel_size", "expert"),
    rename("parallel", "expert_tensor_parallel_size", "expert_tensor"),
    rename("parallel", "data_parallel_size", "data"),
    rename(
        "parallel",
        "use_distributed_optimizer",
        "distributed_optimizer",
    ),
    Rename {
        section: "model",
        old: "position_embedding_type",
        new: "position_embedding",
        value: ValueChange::PositionEmbedding,
    },
    Rename {
        section: "model",
        old: "untie_embeddings_and_output_weights",
        new: "tie_embeddings",
        value: ValueChange::Negate,
    },
    rename("model.moe", "moe_router_topk", "router_topk"),
    rename("model.moe", "moe_aux_loss_coeff", "aux_loss_coeff"),
    rename("model.moe", "moe_z_loss_coeff", "z_loss_coeff"),
    rename("model.moe", "moe_token_dispatcher_type", "token_dispatcher"),
    rename("training.optimizer", "adam_beta1", "beta1"),
    rename("training.optimizer", "adam_beta2", "beta2"),
    rename("training.optimizer", "adam_eps", "eps"),
    rename("recompute", "recompute_granularity", "granularity"),
    rename("recompute", "recompute_method", "method"),
    rename("recompute", "recompute_num_layers", "num_layers"),
    rename("recompute", "recompute_modules", "modules"),
];

/// Every migration step, oldest first; `STEPS[i].from == OLDEST_FORMAT_VERSION + i` and the
/// last one ends at [`FORMAT_VERSION`].
pub const STEPS: &[Step] = &[
    Step {
        from: 0,
        summary: "Megatron-LM argument names become recipe keys",
        renames: V0_RENAMES,
        rewrite: None,
    },
    Step {
        from: 1,
        summary: "`training.schedule.decay_iters` counts from the start of training as \
                  Megatron's --lr-decay-iters (warmup included); a WSD schedule keeps its linear \
                  cool-down (`wsd_decay_style: linear`), as the new default is Megatron's \
                  exponential",
        renames: &[],
        rewrite: Some(v1_schedule::rewrite),
    },
];

/// The format version a parsed file declares: `Some(v)` for `version: v`, `None` when it has no
/// `version` key (or one that is not a non-negative integer, which the schema reports).
fn declared(root: &Node) -> Option<(u32, &Origin)> {
    let node = root.at("version")?;
    match node.value {
        NodeValue::Int(v) => u32::try_from(v).ok().map(|v| (v, &node.origin)),
        _ => None,
    }
}

fn old_format_help(file: &str) -> String {
    format!(
        "`recipe migrate {file}` shows the changes to format version {FORMAT_VERSION} as a diff; \
         `recipe migrate --write {file}` makes them (comments and key order are kept)"
    )
}

fn version_problem(version: u32, file: &str) -> Problem {
    if version > FORMAT_VERSION {
        Problem::error(
            codes::FORMAT_VERSION,
            format!(
                "`{file}` is in recipe format version {version}, newer than this build reads \
                 (version {FORMAT_VERSION})"
            ),
        )
        .with_label("newer format")
        .with_help(Some(
            "use a newer `recipe` (the one that wrote this file)".to_owned(),
        ))
    } else {
        Problem::error(
            codes::FORMAT_VERSION,
            format!(
                "`{file}` is in recipe format version {version}; this build reads version \
                 {FORMAT_VERSION}"
            ),
        )
        .with_label(format!("format version {version}"))
        .with_help(Some(old_format_help(file)))
    }
}

/// A file of an `extends` chain that declares a format other than the current one.
pub(crate) fn check_file(root: &Node, files: &[SourceFile], file: usize) -> Option<Problem> {
    let (version, origin) = declared(root)?;
    (version != FORMAT_VERSION).then(|| {
        version_problem(version, &files[file].name)
            .with_path("version")
            .at(origin, files)
    })
}

/// The merged recipe has no `version` at all (no file of the chain declares one): format 0.
pub(crate) fn check_merged(tree: &Node, files: &[SourceFile], top: usize) -> Option<Problem> {
    if tree.at("version").is_some() {
        return None;
    }
    let name = &files[top].name;
    Some(
        Problem::error(
            codes::FORMAT_VERSION,
            format!(
                "`{name}` has no `version:`, so it is read as recipe format version 0 (before \
                 versions); this build reads version {FORMAT_VERSION}"
            ),
        )
        .with_path("version")
        .with_label("no `version:` in this recipe or its bases")
        .with_help(Some(old_format_help(name)))
        .at(&tree.origin, files),
    )
}

/// What a file's `extends:` chain sets that migrating the file on its own needs to know.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Inherited {
    /// The format version of the first base that declares one: a file without `version:`
    /// inherits it, which is how `recipe migrate` tells a version-1 file that leaves `version:`
    /// to its base from a version-0 file.
    pub version: Option<u32>,
    /// `training.schedule.warmup_iters` as the nearest base that sets it sets it.
    pub warmup_iters: Option<u64>,
    /// `training.schedule.decay_iters` as the nearest base that sets it sets it.
    pub decay_iters: Option<InheritedDecay>,
}

/// A base's `decay_iters`, with what its meaning depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InheritedDecay {
    pub value: u64,
    /// The format that base is written in (its own `version:` or its chain's; 0 if none).
    pub version: u32,
    /// The `warmup_iters` that base's own chain sets (0 if none).
    pub warmup_iters: u64,
}

/// What the `extends:` chain of a file (whose text is `text`, at `path`) sets, read base by
/// base; empty when the file extends nothing or a base cannot be read (the loader reports that).
pub fn inherited(path: &std::path::Path, text: &str) -> Inherited {
    let bases = bases(path, text);
    let version_from = |i: usize| bases[i..].iter().find_map(|b| declared(b).map(|(v, _)| v));
    let warmup_from = |i: usize| {
        bases[i..]
            .iter()
            .find_map(|b| int_at(b, "training.schedule.warmup_iters"))
    };
    let decay = bases
        .iter()
        .position(|b| int_at(b, "training.schedule.decay_iters").is_some());
    Inherited {
        version: version_from(0),
        warmup_iters: warmup_from(0),
        decay_iters: decay.map(|i| InheritedDecay {
            value: int_at(&bases[i], "training.schedule.decay_iters").expect("found above"),
            version: version_from(i).unwrap_or(OLDEST_FORMAT_VERSION),
            warmup_iters: warmup_from(i).unwrap_or(0),
        }),
    }
}

/// A whole number at `path` of `node`, if one is there.
fn int_at(node: &Node, path: &str) -> Option<u64> {
    match node.at(path)?.value {
        NodeValue::Int(v) => u64::try_from(v).ok(),
        _ => None,
    }
}

/// The parsed bases of a file, nearest first (as far as they can be read, and no further than
/// the loader follows a chain).
fn bases(path: &std::path::Path, text: &str) -> Vec<Node> {
    let parse = |text: String| {
        let files = vec![SourceFile {
            name: String::new(),
            dir: std::path::PathBuf::new(),
            text: std::sync::Arc::new(text),
        }];
        crate::yaml::parse(&files, 0).0
    };
    let mut dir = path
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    let mut out = Vec::new();
    let Some(mut node) = parse(text.to_owned()) else {
        return out;
    };
    while out.len() < crate::limits::MAX_EXTENDS_DEPTH {
        let Some(NodeValue::Str(extends)) = node.at("extends").map(|n| &n.value) else {
            break;
        };
        let base = crate::loader::normalize(&dir.join(extends));
        let Some(base_node) = crate::loader::read_text(&base).ok().and_then(parse) else {
            break;
        };
        dir = base
            .parent()
            .map(std::path::Path::to_path_buf)
            .unwrap_or_default();
        out.push(base_node.clone());
        node = base_node;
    }
    out
}

/// One edit a migration made, for people: where (in the text before the migration) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub line: usize,
    pub column: usize,
    pub description: String,
}

/// The result of migrating one file's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// The format the text was in (0 when it declared none).
    pub from: u32,
    /// Always [`FORMAT_VERSION`].
    pub to: u32,
    pub text: String,
    pub changes: Vec<Change>,
}

impl Migration {
    pub fn is_unchanged(&self) -> bool {
        self.changes.is_empty()
    }
}

/// A byte-range replacement in the text.
pub(crate) struct Edit {
    start: usize,
    end: usize,
    text: String,
    change: Change,
}

/// Rewrite `text` (one recipe file, named `name` in diagnostics) from its format version to the
/// current one, step by step. A file without `version:` is format 0 unless its `extends` chain
/// (`inherited`, from [`inherited`]) declares a version. Fails with located problems when the
/// text does not parse, is newer than this build, or a rename would collide with a key that is
/// already there.
pub fn migrate_text(
    name: &str,
    text: &str,
    inherited: &Inherited,
) -> Result<Migration, RecipeErrors> {
    let parse = |text: &str| -> Result<(Vec<SourceFile>, Node), RecipeErrors> {
        let files = vec![SourceFile {
            name: name.to_owned(),
            dir: std::path::PathBuf::new(),
            text: std::sync::Arc::new(text.to_owned()),
        }];
        let (root, problems) = crate::yaml::parse(&files, 0);
        match root {
            Some(root) if problems.is_empty() => Ok((files, root)),
            _ => Err(RecipeErrors::new(name, problems)),
        }
    };
    let (files, root) = parse(text)?;
    let from = match declared(&root) {
        Some((v, _)) => v,
        None if root.at("version").is_some() => {
            return Err(RecipeErrors::new(
                name,
                vec![
                    Problem::error(
                        codes::FORMAT_VERSION,
                        "`version` must be a whole number (the format version)",
                    )
                    .with_path("version")
                    .at(&root.at("version").expect("present").origin, &files),
                ],
            ));
        }
        None => inherited.version.unwrap_or(OLDEST_FORMAT_VERSION),
    };
    if from > FORMAT_VERSION {
        let origin = root.at("version").map_or(&root.origin, |node| &node.origin);
        return Err(RecipeErrors::new(
            name,
            vec![version_problem(from, name).at(origin, &files)],
        ));
    }
    let mut current = text.to_owned();
    let mut changes = Vec::new();
    let mut version = from;
    let mut files = files;
    let mut root = root;
    while version < FORMAT_VERSION {
        let step = STEPS
            .iter()
            .find(|s| s.from == version)
            .expect("a step from every version below the current one");
        let edits = step_edits(step, &root, &current, &files, inherited)?;
        let (next, mut made) = apply(&current, edits);
        changes.append(&mut made);
        current = next;
        version += 1;
        (files, root) = parse(&current)?;
    }
    changes.sort_by_key(|c| (c.line, c.column));
    Ok(Migration {
        from,
        to: FORMAT_VERSION,
        text: current,
        changes,
    })
}

fn entries(node: &Node) -> &[Entry] {
    match &node.value {
        NodeValue::Map(entries) => entries,
        _ => &[],
    }
}

fn position(origin: &Origin) -> (usize, usize, usize, usize) {
    origin
        .position()
        .map_or((0, 0, 1, 1), |p| (p.offset, p.len, p.line, p.column))
}

/// The edits of one step on the parsed `root` of `text`.
fn step_edits(
    step: &Step,
    root: &Node,
    text: &str,
    files: &[SourceFile],
    inherited: &Inherited,
) -> Result<Vec<Edit>, RecipeErrors> {
    let name = &files[0].name;
    let mut edits = Vec::new();
    let mut problems = Vec::new();
    if let Some(rewrite) = step.rewrite {
        match rewrite(root, text, files, inherited) {
            Ok(mut made) => edits.append(&mut made),
            Err(mut found) => problems.append(&mut found),
        }
    }
    for rename in step.renames {
        let Some(section) = root.at(rename.section) else {
            continue;
        };
        let section_entries = entries(section);
        let Some(old) = section_entries.iter().find(|e| e.key == rename.old) else {
            continue;
        };
        let old_path = format!("{}.{}", rename.section, rename.old);
        let new_path = format!("{}.{}", rename.section, rename.new);
        if section_entries.iter().any(|e| e.key == rename.new) {
            problems.push(
                Problem::error(
                    codes::FORMAT_VERSION,
                    format!(
                        "both `{old_path}` (format {}) and `{new_path}` are set",
                        step.from
                    ),
                )
                .with_path(&old_path)
                .with_label(format!("becomes `{new_path}`"))
                .with_help(Some("keep only one of them, then migrate again".to_owned()))
                .at(&old.key_origin, files),
            );
            continue;
        }
        let (offset, len, line, column) = position(&old.key_origin);
        let written = &text[offset..offset + len];
        let quote = written.chars().next().filter(|c| matches!(c, '"' | '\''));
        let new_key = match quote {
            Some(q) => format!("{q}{}{q}", rename.new),
            None => rename.new.to_owned(),
        };
        edits.push(Edit {
            start: offset,
            end: offset + len,
            text: new_key,
            change: Change {
                line,
                column,
                description: format!("renamed `{old_path}` to `{new_path}`"),
            },
        });
        let value = &old.value;
        let (v_offset, v_len, v_line, v_column) = position(&value.origin);
        let replacement = match (rename.value, &value.value) {
            (ValueChange::Same, _) => None,
            (ValueChange::Negate, NodeValue::Bool(b)) => Some((!b).to_string()),
            (ValueChange::Negate, _) => {
                problems.push(
                    Problem::error(
                        codes::FORMAT_VERSION,
                        format!("`{old_path}` must be true or false to migrate"),
                    )
                    .with_path(&old_path)
                    .with_label("not a boolean")
                    .at(&value.origin, files),
                );
                None
            }
            (ValueChange::PositionEmbedding, NodeValue::Str(s)) if s == "learned_absolute" => {
                Some("learned".to_owned())
            }
            (ValueChange::PositionEmbedding, _) => None,
        };
        if let Some(replacement) = replacement {
            let before = text[v_offset..v_offset + v_len].to_owned();
            edits.push(Edit {
                start: v_offset,
                end: v_offset + v_len,
                text: replacement.clone(),
                change: Change {
                    line: v_line,
                    column: v_column,
                    description: format!(
                        "`{new_path}`: `{before}` became `{replacement}` ({})",
                        match rename.value {
                            ValueChange::Negate => "the new key means the opposite",
                            _ => "the recipe format's name for it",
                        }
                    ),
                },
            });
        }
    }
    // The version itself, once, by the last step: the line numbers of every step's changes
    // are then those of the file as written (renames and value edits never add lines).
    let to = step.from + 1;
    match root.at("version") {
        _ if to != FORMAT_VERSION => {}
        Some(node) => {
            let (offset, len, line, column) = position(&node.origin);
            edits.push(Edit {
                start: offset,
                end: offset + len,
                text: to.to_string(),
                change: Change {
                    line,
                    column,
                    description: format!(
                        "`version: {}` became `version: {to}`",
                        &text[offset..offset + len]
                    ),
                },
            });
        }
        // A file that inherits its version from its base keeps inheriting it.
        None if inherited.version.is_some() => {}
        None => match insert_version(root, text, to) {
            Some(edit) => edits.push(edit),
            None => problems.push(
                Problem::error(
                    codes::FORMAT_VERSION,
                    format!("cannot add `version: {to}` to `{name}`: its top level is not a block mapping"),
                )
                .with_help(Some(format!("add `version: {to}` by hand, then migrate again")))
                .at(&root.origin, files),
            ),
        },
    }
    if problems.is_empty() {
        Ok(edits)
    } else {
        Err(RecipeErrors::new(name.clone(), problems))
    }
}

/// A `version: N` line: after the `extends:` line when there is one (where the presets have
/// it), else before the first key (after the file's leading comments).
fn insert_version(root: &Node, text: &str, to: u32) -> Option<Edit> {
    let top = entries(root);
    let first = top.first()?;
    let (first_offset, _, first_line, first_column) = position(&first.key_origin);
    let line_start = |offset: usize| text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let (root_offset, ..) = position(&root.origin);
    if text[root_offset..].starts_with('{')
        || line_start(first_offset) + first_column - 1 != first_offset
    {
        return None;
    }
    let indent = " ".repeat(first_column - 1);
    let (at, line, prefix) = match top.iter().find(|e| e.key == "extends") {
        Some(extends) => {
            let (offset, len, line, _) = position(&extends.value.origin);
            match text[offset + len..].find('\n') {
                Some(i) => (offset + len + i + 1, line + 1, ""),
                None => (text.len(), line + 1, "\n"),
            }
        }
        None => (line_start(first_offset), first_line, ""),
    };
    Some(Edit {
        start: at,
        end: at,
        text: format!("{prefix}{indent}version: {to}\n"),
        change: Change {
            line,
            column: first_column,
            description: format!("added `version: {to}`"),
        },
    })
}

/// Apply non-overlapping edits (the latest first, so earlier offsets stay valid).
fn apply(text: &str, mut edits: Vec<Edit>) -> (String, Vec<Change>) {
    edits.sort_by_key(|e| (e.start, e.end));
    edits.dedup_by_key(|e| (e.start, e.end));
    let mut out = text.to_owned();
    for edit in edits.iter().rev() {
        out.replace_range(edit.start..edit.end, &edit.text);
    }
    let mut changes: Vec<Change> = edits.into_iter().map(|e| e.change).collect();
    changes.sort_by_key(|c| (c.line, c.column));
    (out, changes)
}

/// A unified diff of two texts (`---`/`+++` headers, `@@` hunks with three lines of context), as
/// `git apply` and `patch -p1` read it. Empty when the texts are equal.
pub fn unified_diff(old_name: &str, new_name: &str, old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    // Longest common subsequence of lines (recipes are short: the table is small).
    let mut lcs = vec![vec![0u32; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    #[derive(Clone, Copy, PartialEq)]
    enum Op {
        Keep,
        Remove,
        Add,
    }
    let mut ops: Vec<(Op, usize, usize)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((Op::Keep, i, j));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push((Op::Remove, i, j));
            i += 1;
        } else {
            ops.push((Op::Add, i, j));
            j += 1;
        }
    }
    if ops.iter().all(|(op, ..)| *op == Op::Keep) {
        return String::new();
    }
    const CONTEXT: usize = 3;
    let mut out = format!("--- {old_name}\n+++ {new_name}\n");
    let changed: Vec<usize> = (0..ops.len()).filter(|&k| ops[k].0 != Op::Keep).collect();
    let mut k = 0;
    while k < changed.len() {
        let start = changed[k].saturating_sub(CONTEXT);
        let mut end = (changed[k] + CONTEXT + 1).min(ops.len());
        while k + 1 < changed.len() && changed[k + 1] <= end + CONTEXT {
            k += 1;
            end = (changed[k] + CONTEXT + 1).min(ops.len());
        }
        k += 1;
        let hunk = &ops[start..end];
        let old_count = hunk.iter().filter(|(op, ..)| *op != Op::Add).count();
        let new_count = hunk.iter().filter(|(op, ..)| *op != Op::Remove).count();
        let old_start = hunk[0].1 + usize::from(old_count > 0);
        let new_start = hunk[0].2 + usize::from(new_count > 0);
        let _ = writeln!(
            out,
            "@@ -{old_start},{old_count} +{new_start},{new_count} @@"
        );
        for (op, i, j) in hunk {
            let _ = match op {
                Op::Keep => writeln!(out, " {}", a[*i]),
                Op::Remove => writeln!(out, "-{}", a[*i]),
                Op::Add => writeln!(out, "+{}", b[*j]),
            };
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const V0: &str = "# a comment that stays\nname: old # trailing comment\nparallel:\n  tensor_model_parallel_size: 2   # TP\n  use_distributed_optimizer: true\nmodel: {untie_embeddings_and_output_weights: true, position_embedding_type: learned_absolute}\n";

    #[test]
    fn version_0_becomes_the_current_version_in_place() {
        let migration = migrate_text("old.yaml", V0, &Inherited::default()).expect("migrates");
        assert_eq!(migration.from, 0);
        assert_eq!(
            migration.text,
            "# a comment that stays\nversion: 2\nname: old # trailing comment\nparallel:\n  tensor: 2   # TP\n  distributed_optimizer: true\nmodel: {tie_embeddings: false, position_embedding: learned}\n"
        );
        assert_eq!(migration.changes.len(), 7, "{:?}", migration.changes);
        let again =
            migrate_text("old.yaml", &migration.text, &Inherited::default()).expect("current");
        assert!(again.is_unchanged());
        assert_eq!(again.text, migration.text);
    }

    #[test]
    fn version_goes_after_extends_and_inherited_versions_are_kept() {
        let text = "extends: base.yaml\nparallel:\n  data_parallel_size: 4\n";
        let migrated = migrate_text("a.yaml", text, &Inherited::default()).expect("migrates");
        assert_eq!(
            migrated.text,
            "extends: base.yaml\nversion: 2\nparallel:\n  data: 4\n"
        );
        let inherited = migrate_text(
            "a.yaml",
            text,
            &Inherited {
                version: Some(FORMAT_VERSION),
                ..Inherited::default()
            },
        )
        .expect("current");
        assert!(inherited.is_unchanged());
    }

    #[test]
    fn collisions_and_newer_versions_are_refused() {
        let both = "parallel:\n  tensor: 1\n  tensor_model_parallel_size: 2\n";
        let errors = migrate_text("c.yaml", both, &Inherited::default()).expect_err("collision");
        assert_eq!(errors.problems()[0].file_position(), Some(("c.yaml", 3, 3)));
        let newer = migrate_text("n.yaml", "version: 9\nname: x\n", &Inherited::default())
            .expect_err("newer");
        assert!(newer.problems()[0].message().contains("newer"));
    }

    #[test]
    fn unified_diff_has_hunks_with_context() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\n";
        let new = "a\nb\nc\nD\ne\nf\ng\nh\n";
        assert_eq!(
            unified_diff("a/x", "b/x", old, new),
            "--- a/x\n+++ b/x\n@@ -1,7 +1,7 @@\n a\n b\n c\n-d\n+D\n e\n f\n g\n"
        );
        assert_eq!(unified_diff("a", "b", old, old), "");
        assert_eq!(
            unified_diff("a", "b", "x\n", "v\nx\n"),
            "--- a\n+++ b\n@@ -1,1 +1,2 @@\n+v\n x\n"
        );
    }
}
