//! Numbers a recipe cannot mean: `.nan`, `.inf` and literals beyond `f64` (`1e400` reads as
//! infinity). JSON has no such numbers, so the schema would see `null` and say "found null";
//! this check names the value for what it is, wherever it came from (a file, `--set`, the
//! environment).

use crate::diagnostic::{Problem, codes};
use crate::node::{Node, NodeValue};
use crate::source::SourceFile;

/// One error per non-finite number in `tree`, at its key path and origin.
pub(crate) fn check(tree: &Node, files: &[SourceFile]) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut pending = vec![(tree, String::new())];
    while let Some((node, path)) = pending.pop() {
        match &node.value {
            NodeValue::Map(entries) => pending.extend(
                entries
                    .iter()
                    .rev()
                    .map(|e| (&e.value, join(&path, &e.key))),
            ),
            NodeValue::Seq(items) => pending.extend(
                items
                    .iter()
                    .enumerate()
                    .rev()
                    .map(|(i, item)| (item, join(&path, &i.to_string()))),
            ),
            NodeValue::Float(value) if !value.is_finite() => {
                let reads_as = if value.is_nan() {
                    ".nan"
                } else if *value > 0.0 {
                    ".inf"
                } else {
                    "-.inf"
                };
                problems.push(
                    Problem::error(
                        codes::VALUE,
                        format!("`{path}` is not a finite number (it reads as `{reads_as}`)"),
                    )
                    .with_path(&path)
                    .with_label("not a finite number")
                    .with_help(Some(
                        "write a finite number; a literal beyond ±1.8e308 reads as infinity"
                            .to_owned(),
                    ))
                    .at(&node.origin, files),
                );
            }
            _ => {}
        }
    }
    problems
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}
