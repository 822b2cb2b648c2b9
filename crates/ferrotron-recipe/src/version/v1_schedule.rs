//! Format 1 → 2: the learning-rate schedule's lengths take Megatron-LM's meaning.
//!
//! In format 1, `training.schedule.decay_iters` was the length of the decay after warmup; in
//! format 2 it is Megatron's `--lr-decay-iters`, the iteration where decay ends counted from the
//! start (warmup included). A file keeps training as before when its decay end moves by the
//! warmup that applies to it: its own `warmup_iters`, else its bases'. A file that sets its own
//! warmup over a base's `decay_iters` gets its old end written out, as the base's migration
//! moves the base's end by the base's warmup, not this file's. Format 1's WSD cool-down was
//! always linear; format 2 defaults to Megatron's exponential one, so a file that chooses WSD
//! keeps `wsd_decay_style: linear`.

use super::{Edit, Inherited, int_at, position};
use crate::diagnostic::{Problem, codes};
use crate::node::{Entry, Node, NodeValue};
use crate::source::SourceFile;
use crate::version::Change;

/// The edits of step 1 → 2 on the parsed `root` of `text`.
pub(super) fn rewrite(
    root: &Node,
    text: &str,
    files: &[SourceFile],
    inherited: &Inherited,
) -> Result<Vec<Edit>, Vec<Problem>> {
    let Some(schedule) = root.at("training.schedule") else {
        return Ok(Vec::new());
    };
    let entries = match &schedule.value {
        NodeValue::Map(entries) => entries.as_slice(),
        _ => return Ok(Vec::new()),
    };
    let entry = |key: &str| entries.iter().find(|e| e.key == key);
    let own_warmup = int_at(root, "training.schedule.warmup_iters");
    let warmup = own_warmup.or(inherited.warmup_iters).unwrap_or(0);
    let mut edits = Vec::new();
    let mut problems = Vec::new();
    if let Some(decay) = entry("decay_iters") {
        if let (Some(length), true) = (int_at(root, "training.schedule.decay_iters"), warmup > 0) {
            let end = length + warmup;
            let (offset, len, line, column) = position(&decay.value.origin);
            edits.push(Edit {
                start: offset,
                end: offset + len,
                text: end.to_string(),
                change: Change {
                    line,
                    column,
                    description: format!(
                        "`training.schedule.decay_iters`: `{length}` became `{end}` (decay now \
                         ends at an iteration counted from the start, as Megatron's \
                         --lr-decay-iters; {warmup} of warmup come before the {length} of decay)"
                    ),
                },
            });
        }
    } else if let (Some(own), Some(base)) = (own_warmup, inherited.decay_iters) {
        let length = if base.version <= 1 {
            base.value
        } else {
            base.value.saturating_sub(base.warmup_iters)
        };
        // What the base means once migrated, against what this file meant over it.
        if length + own != length + base.warmup_iters {
            let warmup_entry = entry("warmup_iters").expect("own warmup is set");
            let end = length + own;
            match insert_after(warmup_entry, text, &format!("decay_iters: {end}")) {
                Some((at, insertion, line, column)) => edits.push(Edit {
                    start: at,
                    end: at,
                    text: insertion,
                    change: Change {
                        line,
                        column,
                        description: format!(
                            "added `training.schedule.decay_iters: {end}`: the base's decay of \
                             {length} iterations after this file's warmup of {own}, as format 1 \
                             read it"
                        ),
                    },
                }),
                None => problems.push(not_block(
                    warmup_entry,
                    files,
                    &format!("decay_iters: {end}"),
                )),
            }
        }
    }
    let chooses_wsd = entry("decay").is_some_and(|e| e.value.value == NodeValue::Str("wsd".into()));
    if chooses_wsd && entry("wsd_decay_style").is_none() {
        let decay_entry = entry("decay").expect("checked above");
        match insert_after(decay_entry, text, "wsd_decay_style: linear") {
            Some((at, insertion, line, column)) => edits.push(Edit {
                start: at,
                end: at,
                text: insertion,
                change: Change {
                    line,
                    column,
                    description: "added `training.schedule.wsd_decay_style: linear` (format 1's \
                                  WSD cool-down; the default is now Megatron's exponential one)"
                        .to_owned(),
                },
            }),
            None => problems.push(not_block(decay_entry, files, "wsd_decay_style: linear")),
        }
    }
    if problems.is_empty() {
        Ok(edits)
    } else {
        Err(problems)
    }
}

/// Where and what to insert so `key_value` becomes the entry after `entry` in its mapping: a
/// line of its own at the entry's indentation in a block mapping, `, key: value` after the value
/// in a flow mapping. Returns (offset, text, line, column) of the insertion; `None` where the
/// entry's value spans lines in a way a one-line insertion cannot follow.
fn insert_after(
    entry: &Entry,
    text: &str,
    key_value: &str,
) -> Option<(usize, String, usize, usize)> {
    let (key_offset, _, key_line, key_column) = position(&entry.key_origin);
    let (value_offset, value_len, value_line, value_column) = position(&entry.value.origin);
    let line_start = text[..key_offset].rfind('\n').map_or(0, |i| i + 1);
    let block = text[line_start..key_offset].chars().all(|c| c == ' ');
    if !block {
        let at = value_offset + value_len;
        return Some((
            at,
            format!(", {key_value}"),
            value_line,
            value_column + value_len,
        ));
    }
    if value_line != key_line {
        return None;
    }
    let indent = " ".repeat(key_column - 1);
    let end = value_offset + value_len;
    Some(match text[end..].find('\n') {
        Some(i) => (
            end + i + 1,
            format!("{indent}{key_value}\n"),
            key_line + 1,
            key_column,
        ),
        None => (
            text.len(),
            format!("\n{indent}{key_value}"),
            key_line + 1,
            key_column,
        ),
    })
}

fn not_block(entry: &Entry, files: &[SourceFile], key_value: &str) -> Problem {
    Problem::error(
        codes::FORMAT_VERSION,
        format!(
            "cannot add `{key_value}` after `training.schedule.{}` here",
            entry.key
        ),
    )
    .with_path(format!("training.schedule.{}", entry.key))
    .with_help(Some(format!(
        "add `{key_value}` to `training.schedule` by hand, then migrate again"
    )))
    .at(&entry.key_origin, files)
}

#[cfg(test)]
mod tests {
    use crate::version::{Inherited, InheritedDecay, migrate_text};

    fn migrated(text: &str, inherited: &Inherited) -> String {
        migrate_text("r.yaml", text, inherited)
            .expect("migrates")
            .text
    }

    #[test]
    fn decay_iters_moves_by_the_warmup_before_it() {
        let v1 = "version: 1\ntraining:\n  schedule:\n    warmup_iters: 20   # warm\n    decay_iters: 30\n";
        assert_eq!(
            migrated(v1, &Inherited::default()),
            "version: 2\ntraining:\n  schedule:\n    warmup_iters: 20   # warm\n    decay_iters: 50\n"
        );
        let no_warmup = "version: 1\ntraining: {schedule: {decay_iters: 30}}\n";
        assert_eq!(
            migrated(no_warmup, &Inherited::default()),
            "version: 2\ntraining: {schedule: {decay_iters: 30}}\n"
        );
        let base_warmup = Inherited {
            version: Some(1),
            warmup_iters: Some(5),
            decay_iters: None,
        };
        let child = "extends: b.yaml\ntraining:\n  schedule: {decay_iters: 30}\n";
        assert_eq!(
            migrated(child, &base_warmup),
            "extends: b.yaml\ntraining:\n  schedule: {decay_iters: 35}\n"
        );
    }

    #[test]
    fn an_own_warmup_over_a_bases_decay_keeps_its_old_end() {
        let child = "extends: b.yaml\nversion: 1\ntraining:\n  schedule:\n    warmup_iters: 10\n";
        let base = |version| Inherited {
            version: Some(version),
            warmup_iters: Some(2),
            decay_iters: Some(InheritedDecay {
                value: if version == 1 { 100 } else { 102 },
                version,
                warmup_iters: 2,
            }),
        };
        let expected = "extends: b.yaml\nversion: 2\ntraining:\n  schedule:\n    warmup_iters: 10\n    decay_iters: 110\n";
        assert_eq!(migrated(child, &base(1)), expected);
        assert_eq!(migrated(child, &base(2)), expected);
        let same_warmup = child.replace("warmup_iters: 10", "warmup_iters: 2");
        assert_eq!(
            migrated(&same_warmup, &base(1)),
            same_warmup.replace("version: 1", "version: 2")
        );
    }

    #[test]
    fn wsd_keeps_its_linear_cool_down() {
        let block = "version: 1\ntraining:\n  schedule:\n    decay: wsd\n    wsd_decay_iters: 10\n";
        assert_eq!(
            migrated(block, &Inherited::default()),
            "version: 2\ntraining:\n  schedule:\n    decay: wsd\n    wsd_decay_style: linear\n    wsd_decay_iters: 10\n"
        );
        let flow = "version: 1\ntraining: {schedule: {decay: wsd, wsd_decay_iters: 10}}\n";
        assert_eq!(
            migrated(flow, &Inherited::default()),
            "version: 2\ntraining: {schedule: {decay: wsd, wsd_decay_style: linear, wsd_decay_iters: 10}}\n"
        );
        let again = migrate_text(
            "r.yaml",
            &migrated(block, &Inherited::default()),
            &Inherited::default(),
        )
        .expect("current");
        assert!(again.is_unchanged());
    }
}
