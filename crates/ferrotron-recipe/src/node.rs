//! The recipe as a tree of YAML nodes that remember their origin. Merging `extends:` layers and
//! overrides happens on this tree rather than on `serde_json::Value` or on the typed `Recipe`,
//! because only here can the winner of every key keep its file, line and column.

use crate::source::Origin;

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub value: NodeValue,
    pub origin: Origin,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum NodeValue {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<Entry>),
}

/// A mapping entry; the key keeps its own origin so "unknown key" points at the key itself.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    pub key: String,
    pub key_origin: Origin,
    pub value: Node,
}

/// What a lookup by dot path found: the node itself, or the closest present ancestor.
pub(crate) struct Located<'a> {
    pub origin: &'a Origin,
    pub exact: bool,
}

impl Node {
    /// The node at a dot path (`data.blend.1.weight`), if present.
    pub(crate) fn at(&self, path: &str) -> Option<&Node> {
        split_path(path).try_fold(self, |node, segment| node.child(segment).map(|(_, n)| n))
    }

    fn child(&self, segment: &str) -> Option<(&Origin, &Node)> {
        match &self.value {
            NodeValue::Map(entries) => entries
                .iter()
                .find(|e| e.key == segment)
                .map(|e| (&e.key_origin, &e.value)),
            NodeValue::Seq(items) => {
                let item = items.get(segment.parse::<usize>().ok()?)?;
                Some((&item.origin, item))
            }
            _ => None,
        }
    }

    /// Where a finding about `path` should point. A present value points at the value; an
    /// absent key points at the key of its nearest present ancestor (`model:` for a missing
    /// `model.num_layers`); `key_only` points at the key rather than its value (unknown keys).
    pub(crate) fn locate(&self, path: &str, key_only: bool) -> Located<'_> {
        let mut origin = &self.origin;
        let mut node = self;
        for segment in split_path(path) {
            match node.child(segment) {
                Some((key_origin, child)) => {
                    origin = key_origin;
                    node = child;
                }
                None => {
                    return Located {
                        origin,
                        exact: false,
                    };
                }
            }
        }
        if !key_only && !matches!(node.value, NodeValue::Map(_) | NodeValue::Seq(_)) {
            origin = &node.origin;
        }
        Located {
            origin,
            exact: true,
        }
    }

    /// Convert to JSON for schema validation and typed deserialization.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        use serde_json::Value;
        match &self.value {
            NodeValue::Null => Value::Null,
            NodeValue::Bool(b) => Value::Bool(*b),
            NodeValue::Int(i) => {
                if let Ok(v) = i64::try_from(*i) {
                    Value::from(v)
                } else if let Ok(v) = u64::try_from(*i) {
                    Value::from(v)
                } else {
                    // Out of every integer range the recipe uses; the schema will reject it.
                    Value::from(*i as f64)
                }
            }
            NodeValue::Float(f) => serde_json::Number::from_f64(*f)
                .map(Value::Number)
                .unwrap_or(Value::Null),
            NodeValue::Str(s) => Value::String(s.clone()),
            NodeValue::Seq(items) => Value::Array(items.iter().map(Node::to_json).collect()),
            NodeValue::Map(entries) => Value::Object(
                entries
                    .iter()
                    .map(|e| (e.key.clone(), e.value.to_json()))
                    .collect(),
            ),
        }
    }

    /// Remove a top-level key, returning its node.
    pub(crate) fn remove(&mut self, key: &str) -> Option<Entry> {
        match &mut self.value {
            NodeValue::Map(entries) => {
                let index = entries.iter().position(|e| e.key == key)?;
                Some(entries.remove(index))
            }
            _ => None,
        }
    }
}

pub(crate) fn split_path(path: &str) -> impl Iterator<Item = &str> {
    path.split('.').filter(|s| !s.is_empty())
}

/// Deep merge: mappings merge key by key (the upper layer wins and keeps its origin); anything
/// else (scalars, sequences such as `data.blend`) is replaced whole, as Megatron users expect
/// from "the child recipe says so".
pub(crate) fn merge(base: Node, upper: Node) -> Node {
    match (base.value, upper.value) {
        (NodeValue::Map(mut entries), NodeValue::Map(upper_entries)) => {
            for entry in upper_entries {
                match entries.iter_mut().find(|e| e.key == entry.key) {
                    Some(existing) => {
                        let old = std::mem::replace(
                            &mut existing.value,
                            Node {
                                value: NodeValue::Null,
                                origin: entry.value.origin.clone(),
                            },
                        );
                        existing.value = merge(old, entry.value);
                        existing.key_origin = entry.key_origin;
                    }
                    None => entries.push(entry),
                }
            }
            Node {
                value: NodeValue::Map(entries),
                origin: upper.origin,
            }
        }
        (_, value) => Node {
            value,
            origin: upper.origin,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(tag: &str) -> Origin {
        Origin::Set(tag.to_owned())
    }

    fn scalar(value: NodeValue, tag: &str) -> Node {
        Node {
            value,
            origin: origin(tag),
        }
    }

    fn map(entries: Vec<(&str, Node)>, tag: &str) -> Node {
        Node {
            value: NodeValue::Map(
                entries
                    .into_iter()
                    .map(|(k, v)| Entry {
                        key: k.to_owned(),
                        key_origin: origin(tag),
                        value: v,
                    })
                    .collect(),
            ),
            origin: origin(tag),
        }
    }

    #[test]
    fn merge_keeps_base_keys_and_lets_upper_win_with_its_origin() {
        let base = map(
            vec![(
                "model",
                map(
                    vec![
                        ("a", scalar(NodeValue::Int(1), "base")),
                        ("b", scalar(NodeValue::Int(2), "base")),
                    ],
                    "base",
                ),
            )],
            "base",
        );
        let upper = map(
            vec![(
                "model",
                map(vec![("b", scalar(NodeValue::Int(3), "upper"))], "upper"),
            )],
            "upper",
        );
        let merged = merge(base, upper);
        assert_eq!(
            merged.at("model.a").map(|n| &n.value),
            Some(&NodeValue::Int(1))
        );
        let b = merged.at("model.b").expect("b present");
        assert_eq!(b.value, NodeValue::Int(3));
        assert_eq!(b.origin, origin("upper"));
        assert_eq!(
            merged.at("model.a").map(|n| &n.origin),
            Some(&origin("base"))
        );
    }

    #[test]
    fn sequences_are_replaced_not_concatenated() {
        let seq = |n: i128, tag| scalar(NodeValue::Seq(vec![scalar(NodeValue::Int(n), tag)]), tag);
        let merged = merge(
            map(vec![("l", seq(1, "base"))], "base"),
            map(vec![("l", seq(2, "up"))], "up"),
        );
        assert_eq!(merged.at("l.0").map(|n| &n.value), Some(&NodeValue::Int(2)));
        assert!(merged.at("l.1").is_none());
    }

    #[test]
    fn locate_falls_back_to_the_nearest_present_parent_key() {
        // `map` gives keys the origin of the mapping that holds them: `model:` is tagged "root".
        let tree = map(vec![("model", map(vec![], "inner"))], "root");
        let located = tree.locate("model.num_layers", false);
        assert!(!located.exact);
        assert_eq!(located.origin, &origin("root"));
        let located = tree.locate("model", false);
        assert!(located.exact);
    }
}
