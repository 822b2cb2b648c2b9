//! The override layers above the files: environment variables (read through figment's `Env`
//! provider, `FERROTRON_MODEL__HIDDEN_SIZE=2048`) and `--set model.hidden_size=2048`.
//! Values are parsed as YAML so `--set data.blend='[{path: a.jsonl}]'` works, and every node
//! they create remembers the layer that made it.

use std::path::PathBuf;
use std::sync::Arc;

use figment::providers::Env;

use crate::diagnostic::{Problem, codes};
use crate::node::{Entry, Node, NodeValue, split_path};
use crate::source::{Origin, SourceFile};

/// Environment variables with this prefix override recipe keys (`__` separates path segments).
pub const ENV_PREFIX: &str = "FERROTRON_";

/// One override: a dot path and its value's text, with the layer it came from.
pub(crate) struct Override {
    pub path: String,
    pub value: String,
    pub origin: Origin,
}

/// Parse `--set` arguments (`dot.path=value`).
pub(crate) fn from_args(args: &[String]) -> (Vec<Override>, Vec<Problem>) {
    let mut overrides = Vec::new();
    let mut problems = Vec::new();
    for arg in args {
        match arg.split_once('=') {
            Some((path, value)) if !path.trim().is_empty() => overrides.push(Override {
                path: path.trim().to_owned(),
                value: value.to_owned(),
                origin: Origin::Set(arg.clone()),
            }),
            _ => problems.push(
                Problem::error(
                    codes::OVERRIDE,
                    format!("`--set {arg}` is not of the form key=value"),
                )
                .with_help(Some("write e.g. `--set model.hidden_size=2048`".to_owned())),
            ),
        }
    }
    (overrides, problems)
}

/// Environment overrides whose first segment names a recipe section; other `FERROTRON_*`
/// variables belong to other parts of the program and are left alone.
pub(crate) fn from_env(sections: &[String]) -> Vec<Override> {
    let mut overrides: Vec<Override> = Env::prefixed(ENV_PREFIX)
        .split("__")
        .iter()
        .filter(|(key, _)| {
            let first = key.as_str().split('.').next().unwrap_or_default();
            sections.iter().any(|s| s == first)
        })
        .map(|(key, value)| {
            let var = format!(
                "{ENV_PREFIX}{}",
                key.as_str().replace('.', "__").to_uppercase()
            );
            Override {
                path: key.as_str().to_owned(),
                value,
                origin: Origin::Env(var),
            }
        })
        .collect();
    // The environment has no order; make the result independent of it.
    overrides.sort_by(|a, b| a.path.cmp(&b.path));
    overrides
}

/// Apply overrides onto the merged tree, in order.
pub(crate) fn apply(
    tree: &mut Node,
    overrides: Vec<Override>,
    files: &[SourceFile],
) -> Vec<Problem> {
    let mut problems = Vec::new();
    for o in overrides {
        let value = match parse_value(&o) {
            Ok(value) => value,
            Err(message) => {
                problems.push(
                    Problem::error(codes::OVERRIDE, message)
                        .with_path(&o.path)
                        .with_help(Some(
                            "quote strings that contain `:`, `#`, `[` or `{`".to_owned(),
                        ))
                        .at(&o.origin, files),
                );
                continue;
            }
        };
        let segments: Vec<&str> = split_path(&o.path).collect();
        let result = if segments.first() == Some(&"extends") {
            Err("`extends` is resolved before overrides apply; edit the file instead".to_owned())
        } else {
            set(tree, &segments, value, &o.origin)
        };
        if let Err(message) = result {
            problems.push(
                Problem::error(
                    codes::OVERRIDE,
                    format!("cannot set `{}`: {message}", o.path),
                )
                .with_path(&o.path)
                .at(&o.origin, files),
            );
        }
    }
    problems
}

fn parse_value(o: &Override) -> Result<Node, String> {
    let scratch = [SourceFile {
        name: o.origin.describe(&[]),
        dir: PathBuf::new(),
        text: Arc::new(o.value.clone()),
    }];
    let (root, parse_problems) = crate::yaml::parse(&scratch, 0);
    match (root, parse_problems.first()) {
        (Some(mut node), None) => {
            relabel(&mut node, &o.origin);
            Ok(node)
        }
        (_, first) => Err(format!(
            "the value of `{}` is not valid YAML{}",
            o.path,
            first
                .map(|p| format!(": {}", p.message()))
                .unwrap_or_default()
        )),
    }
}

fn relabel(node: &mut Node, origin: &Origin) {
    node.origin = origin.clone();
    match &mut node.value {
        NodeValue::Seq(items) => items.iter_mut().for_each(|n| relabel(n, origin)),
        NodeValue::Map(entries) => entries.iter_mut().for_each(|e| {
            e.key_origin = origin.clone();
            relabel(&mut e.value, origin);
        }),
        _ => {}
    }
}

fn set(node: &mut Node, segments: &[&str], value: Node, origin: &Origin) -> Result<(), String> {
    let Some((first, rest)) = segments.split_first() else {
        let old = std::mem::replace(node, value.clone());
        *node = crate::node::merge(old, value);
        return Ok(());
    };
    if matches!(node.value, NodeValue::Null) {
        node.value = NodeValue::Map(Vec::new());
    }
    match &mut node.value {
        NodeValue::Map(entries) => {
            let index = match entries.iter().position(|e| e.key == *first) {
                Some(index) => index,
                None => {
                    entries.push(Entry {
                        key: (*first).to_owned(),
                        key_origin: origin.clone(),
                        value: Node {
                            value: NodeValue::Null,
                            origin: origin.clone(),
                        },
                    });
                    entries.len() - 1
                }
            };
            set(&mut entries[index].value, rest, value, origin)
        }
        NodeValue::Seq(items) => {
            let len = items.len();
            let item = first
                .parse::<usize>()
                .ok()
                .and_then(|i| items.get_mut(i))
                .ok_or_else(|| format!("`{first}` is not an index of this list of {len}"))?;
            set(item, rest, value, origin)
        }
        _ => Err(format!("`{first}` is inside a value that is not a mapping")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> Node {
        let files = [SourceFile {
            name: "t.yaml".into(),
            dir: PathBuf::new(),
            text: Arc::new("model: {hidden_size: 64}\ndata: {blend: [{path: a}]}\n".into()),
        }];
        crate::yaml::parse(&files, 0).0.expect("valid")
    }

    #[test]
    fn set_replaces_creates_and_indexes() {
        let mut t = tree();
        let args = [
            "model.hidden_size=128".to_owned(),
            "model.moe.num_experts=8".to_owned(),
            "data.blend.0.weight=0.5".to_owned(),
        ];
        let (overrides, problems) = from_args(&args);
        assert!(problems.is_empty());
        assert!(apply(&mut t, overrides, &[]).is_empty());
        assert_eq!(
            t.at("model.hidden_size").map(|n| &n.value),
            Some(&NodeValue::Int(128))
        );
        assert_eq!(
            t.at("model.moe.num_experts").map(|n| &n.value),
            Some(&NodeValue::Int(8))
        );
        assert_eq!(
            t.at("data.blend.0.weight").map(|n| &n.value),
            Some(&NodeValue::Float(0.5))
        );
        assert_eq!(
            t.at("model.hidden_size").map(|n| n.origin.clone()),
            Some(Origin::Set("model.hidden_size=128".into()))
        );
    }

    #[test]
    fn bad_overrides_are_reported() {
        let mut t = tree();
        let (_, problems) = from_args(&["novalue".to_owned()]);
        assert_eq!(problems.len(), 1);
        let (overrides, _) = from_args(&[
            "data.blend.3.path=x".to_owned(),
            "model.hidden_size.x=1".to_owned(),
            "model.name=[unclosed".to_owned(),
        ]);
        let problems = apply(&mut t, overrides, &[]);
        assert_eq!(problems.len(), 3);
    }
}
