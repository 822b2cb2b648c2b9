//! The rules on a recipe that failed its schema check, so one `recipe validate` reports every
//! problem at once instead of schema errors first, the model rules next round, the layout rules
//! the round after.
//!
//! A recipe with broken values has no typed form, and the rules need one. So the broken values
//! are replaced by stand-ins (the default where the key may be absent, else a value of the
//! schema's type) and unknown keys dropped. A stand-in must not invent a problem: a rule whose
//! input is broken would judge the stand-in. Rather than make every rule in every crate declare
//! its inputs, the rules run twice, with two different stand-ins for every broken value, and only
//! findings that come out the same both times are kept — a finding that depends on a broken
//! value changes (or disappears) when that value does. A missing required key gets stand-ins the
//! same way (so a typo in `hidden_size` does not hide the layout errors), and no finding is kept
//! that blames a key whose value is a stand-in: it would judge what the author never wrote. Of an
//! `abstract: true` fragment only findings about keys it sets are kept: what it leaves out (the
//! run length, the data) is for the recipes that extend it to set.

use serde_json::Value;

use crate::diagnostic::{Problem, codes};
use crate::node::{Node, split_path};
use crate::source::SourceFile;
use crate::{Finding, Recipe};

/// Two stand-in typed forms of a recipe whose schema check failed, with the tree and files that
/// locate findings about it.
#[derive(Debug, Clone)]
pub(crate) struct Partial {
    variants: Box<[Recipe; 2]>,
    /// The dot paths whose values are stand-ins.
    stood_in: Vec<String>,
    /// Keep only findings about keys the recipe sets (a fragment's).
    set_keys_only: bool,
    tree: Node,
    files: Vec<SourceFile>,
}

impl Partial {
    /// Stand-ins for the values `problems` blame; `None` when the recipe cannot be repaired
    /// (a broken mapping, a required key with no usable stand-in).
    pub(crate) fn new(tree: &Node, files: &[SourceFile], problems: &[Problem]) -> Option<Partial> {
        let json = tree.to_json();
        let mut first = json.clone();
        let mut second = json;
        let mut stood_in = Vec::new();
        for problem in problems {
            let Some(path) = problem.path() else {
                continue;
            };
            match problem.code() {
                codes::UNKNOWN_KEY => {
                    set(&mut first, path, None);
                    set(&mut second, path, None);
                }
                codes::MISSING_KEY | codes::TYPE | codes::VALUE => {
                    let candidates = stand_ins(path);
                    let a = candidates.first()?.clone();
                    let b = candidates.get(1).cloned().unwrap_or_else(|| a.clone());
                    set(&mut first, path, a);
                    set(&mut second, path, b);
                    stood_in.push(path.to_owned());
                }
                _ => {}
            }
        }
        let first: Recipe = serde_json::from_value(first).ok()?;
        let second: Recipe = serde_json::from_value(second).ok()?;
        Some(Partial {
            variants: Box::new([first, second]),
            stood_in,
            set_keys_only: false,
            tree: tree.clone(),
            files: files.to_vec(),
        })
    }

    /// For an `abstract: true` fragment: findings about keys it leaves out are dropped.
    pub(crate) fn of_fragment(mut self) -> Self {
        self.set_keys_only = true;
        self
    }

    /// The findings of `rules` that do not depend on a broken or missing value, located.
    pub(crate) fn check(&self, rules: &dyn Fn(&Recipe) -> Vec<Finding>) -> Vec<Problem> {
        let [first, second] = &*self.variants;
        let again = rules(second);
        let blames_stand_in = |f: &Finding| {
            self.stood_in.iter().any(|p| {
                f.path
                    .strip_prefix(p.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
            })
        };
        let stable: Vec<Finding> = rules(first)
            .into_iter()
            .filter(|f| again.contains(f) && !blames_stand_in(f))
            .filter(|f| !self.set_keys_only || self.tree.locate(&f.path, false).exact)
            .collect();
        crate::loader::locate(&stable, &self.tree, &self.files)
    }
}

/// Put `value` at a dot path of `json` (`None` removes the key), creating nothing on the way.
fn set(json: &mut Value, path: &str, value: Option<Value>) {
    let segments: Vec<&str> = split_path(path).collect();
    let Some((last, parents)) = segments.split_last() else {
        return;
    };
    let mut node = json;
    for segment in parents {
        let next = match node {
            Value::Object(map) => map.get_mut(*segment),
            Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get_mut(i)),
            _ => None,
        };
        let Some(next) = next else {
            return;
        };
        node = next;
    }
    match (node, value) {
        (Value::Object(map), Some(value)) => {
            map.insert((*last).to_owned(), value);
        }
        (Value::Object(map), None) => {
            map.shift_remove(*last);
        }
        (Value::Array(items), Some(value)) => {
            if let Some(item) = last.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                *item = value;
            }
        }
        _ => {}
    }
}

/// Values that may stand in for a broken one at a dot path, most natural first: absence (the
/// default) where the key is optional, the schema's default, its enum values, then a value of
/// each type it accepts. `None` means "leave the key out".
fn stand_ins(path: &str) -> Vec<Option<Value>> {
    let (parent, key) = path.rsplit_once('.').unwrap_or(("", path));
    let Some(parent_schema) = crate::schema::object_schema_at(parent) else {
        return Vec::new();
    };
    let required = parent_schema
        .get("required")
        .and_then(Value::as_array)
        .is_some_and(|r| r.iter().any(|k| k == key));
    let mut out: Vec<Option<Value>> = Vec::new();
    if !required {
        out.push(None);
    }
    if let Some(property) = parent_schema
        .get("properties")
        .and_then(|p| p.get(key))
        .or_else(|| parent_schema.get("items"))
    {
        collect_stand_ins(property, &mut out, 0);
        if !required {
            // Absence already is the default; a second stand-in must differ from it.
            let defaults = [
                property.get("default"),
                crate::schema::resolve(property).get("default"),
            ];
            out.retain(|c| c.is_none() || !defaults.contains(&c.as_ref()));
        }
    }
    let mut unique = Vec::new();
    for candidate in out {
        if !unique.contains(&candidate) {
            unique.push(candidate);
        }
    }
    unique
}

fn collect_stand_ins(schema: &Value, out: &mut Vec<Option<Value>>, depth: usize) {
    if depth > 4 {
        return;
    }
    if let Some(default) = schema.get("default") {
        out.push(Some(default.clone()));
    }
    let schema = crate::schema::resolve(schema);
    if let Some(default) = schema.get("default") {
        out.push(Some(default.clone()));
    }
    if let Some(value) = schema.get("const") {
        out.push(Some(value.clone()));
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        out.extend(values.iter().cloned().map(Some));
    }
    for keyword in ["anyOf", "oneOf"] {
        for branch in schema
            .get(keyword)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            collect_stand_ins(branch, out, depth + 1);
        }
    }
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    for kind in types {
        match kind {
            "integer" => out.extend([Some(Value::from(1)), Some(Value::from(2))]),
            "number" => out.extend([Some(Value::from(0.5)), Some(Value::from(0.25))]),
            "boolean" => out.extend([Some(Value::Bool(false)), Some(Value::Bool(true))]),
            "string" => out.extend([Some(Value::from("a")), Some(Value::from("b"))]),
            _ => {}
        }
    }
}
