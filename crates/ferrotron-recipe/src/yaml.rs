//! YAML text → [`Node`] tree with a position on every key and value.
//!
//! Built directly on the event parser that `serde-saphyr` uses (`granit-parser`, re-exported by
//! it) instead of deserializing: a recipe is merged, overridden and validated as a tree before it
//! becomes typed, and every step must still know the line and column of each value. Scalars are
//! resolved with the YAML 1.2 core schema (plus `_` digit separators in integers, which people
//! write for token budgets); quoted scalars are always strings. The core schema's own tags
//! (`!!str 4`, `!!int "8"`) are honoured; any other tag is refused rather than ignored, since
//! ignoring it would give the value a meaning its author did not ask for. Size, depth and alias
//! expansion are bounded ([`crate::limits`]).

use std::collections::HashMap;

use serde_saphyr::granit_parser::{
    ErrorKind, Event, Marker, Options, Parser, ScalarStyle, Span, Tag,
};

use crate::diagnostic::{Problem, codes};
use crate::limits::{MAX_DEPTH, MAX_INPUT_BYTES, MAX_NODES};
use crate::node::{Entry, Node, NodeValue};
use crate::source::{Origin, Position, SourceFile};

/// Parse one file of `files`. A syntax error stops the parse (nothing after it can be trusted)
/// and yields no tree; duplicate keys are reported and the parse goes on with the first
/// occurrence, so one run reports them together with the problems found later.
pub(crate) fn parse(files: &[SourceFile], file: usize) -> (Option<Node>, Vec<Problem>) {
    let text = files[file].text.as_str();
    if text.len() > MAX_INPUT_BYTES {
        let origin = Origin::File(Position {
            file,
            offset: 0,
            len: 0,
            line: 1,
            column: 1,
        });
        let problem = Problem::error(
            codes::LIMIT,
            format!(
                "the file is {} bytes; a recipe may have at most {MAX_INPUT_BYTES}",
                text.len()
            ),
        )
        .with_help(Some(
            "a recipe describes a run; data belongs in the files it names".to_owned(),
        ))
        .at(&origin, files);
        return (None, vec![problem]);
    }
    let mut options = Options::default();
    options.emit_comments = false;
    let mut builder = Builder {
        files,
        file,
        text,
        parser: Parser::new_from_str_with_options(text, options),
        anchors: HashMap::new(),
        problems: Vec::new(),
        path: Vec::new(),
        nodes: 0,
        depth: 0,
    };
    match builder.document() {
        Ok(root) => (Some(root), builder.problems),
        Err(problems) => (None, problems),
    }
}

struct Builder<'a> {
    files: &'a [SourceFile],
    file: usize,
    text: &'a str,
    parser: Parser<'a, serde_saphyr::granit_parser::StrInput<'a>>,
    /// Anchored nodes with the number of nodes each holds (what an alias of it adds).
    anchors: HashMap<usize, (Node, usize)>,
    problems: Vec<Problem>,
    /// Keys from the root to the mapping being read, for the key path of duplicate keys.
    path: Vec<String>,
    /// Nodes built so far, aliases expanded.
    nodes: usize,
    /// Mappings and sequences open around the node being read.
    depth: usize,
}

impl<'a> Builder<'a> {
    fn next(&mut self) -> Result<(Event<'a>, Span), Vec<Problem>> {
        match self.parser.next_event() {
            Some(Ok(event)) => Ok(event),
            Some(Err(err)) => {
                let marker = *err.marker();
                let origin = self.origin(marker, marker);
                let mut problems = std::mem::take(&mut self.problems);
                if matches!(err.kind(), ErrorKind::RecursionLimitExceeded) {
                    // The parser's own bound on flow nesting (`[[[[...`), met before ours.
                    problems.push(too_deep(&origin, self.files));
                    return Err(problems);
                }
                problems.push(
                    Problem::error(codes::SYNTAX, format!("YAML syntax error: {}", err.kind()))
                        .with_label("here")
                        .with_help(Some(
                            "the usual cause is an unclosed `[`, `{` or quote before this point, \
                             or a line indented differently from its siblings"
                                .to_owned(),
                        ))
                        .at(&origin, self.files),
                );
                Err(problems)
            }
            None => Err(vec![
                Problem::error(codes::SYNTAX, "unexpected end of YAML input")
                    .at(&self.end_origin(), self.files),
            ]),
        }
    }

    fn document(&mut self) -> Result<Node, Vec<Problem>> {
        let mut root = None;
        loop {
            let (event, span) = self.next()?;
            match event {
                Event::StreamStart | Event::DocumentEnd => {}
                Event::DocumentStart(..) => {
                    if root.is_some() {
                        return Err(vec![
                            Problem::error(
                                codes::UNSUPPORTED,
                                "a recipe file holds one YAML document, found a second",
                            )
                            .with_help(Some("split the documents into separate files".to_owned()))
                            .at(&self.origin(span.start, span.end), self.files),
                        ]);
                    }
                    let (event, span) = self.next()?;
                    root = Some(self.node(event, span)?);
                }
                Event::StreamEnd => break,
                other => {
                    let node = self.node(other, span)?;
                    root.get_or_insert(node);
                }
            }
        }
        let empty = || Node {
            value: NodeValue::Null,
            origin: self.end_origin(),
        };
        Ok(root.unwrap_or_else(empty))
    }

    fn node(&mut self, event: Event<'a>, span: Span) -> Result<Node, Vec<Problem>> {
        let origin = self.origin(span.start, span.end);
        let first = self.nodes;
        self.count(1, &origin)?;
        let (node, anchor) = match event {
            Event::Scalar(text, style, anchor, tag) => {
                let value = match tag {
                    Some(tag) => self.tagged_scalar(&text, style, &tag, &origin),
                    None => resolve_scalar(&text, style),
                };
                (Node { value, origin }, anchor)
            }
            Event::SequenceStart(_, anchor, tag) => {
                self.check_collection_tag(tag.as_deref(), "seq", &origin);
                self.enter(&origin)?;
                let mut items = Vec::new();
                loop {
                    let (event, span) = self.next()?;
                    if matches!(event, Event::SequenceEnd) {
                        break;
                    }
                    items.push(self.node(event, span)?);
                }
                self.depth -= 1;
                (
                    Node {
                        value: NodeValue::Seq(items),
                        origin,
                    },
                    anchor,
                )
            }
            Event::MappingStart(_, anchor, tag) => {
                self.check_collection_tag(tag.as_deref(), "map", &origin);
                self.enter(&origin)?;
                let node = self.mapping(origin)?;
                self.depth -= 1;
                (node, anchor)
            }
            Event::Alias(id) => {
                let Some((anchored, size)) = self.anchors.get(&id) else {
                    return Ok(Node {
                        value: NodeValue::Null,
                        origin,
                    });
                };
                let (mut node, size) = (anchored.clone(), *size);
                // The alias itself was counted as one node; its copy adds the rest.
                self.count(size.saturating_sub(1), &origin)?;
                node.origin = origin;
                return Ok(node);
            }
            _ => {
                return Err(vec![
                    Problem::error(codes::SYNTAX, "unexpected YAML structure")
                        .at(&origin, self.files),
                ]);
            }
        };
        if anchor != 0 {
            self.anchors
                .insert(anchor, (node.clone(), self.nodes - first));
        }
        Ok(node)
    }

    /// Count `more` nodes, refusing the input when that passes [`MAX_NODES`].
    fn count(&mut self, more: usize, origin: &Origin) -> Result<(), Vec<Problem>> {
        self.nodes = self.nodes.saturating_add(more);
        if self.nodes <= MAX_NODES {
            return Ok(());
        }
        let mut problems = std::mem::take(&mut self.problems);
        problems.push(
            Problem::error(
                codes::LIMIT,
                format!("the recipe expands to more than {MAX_NODES} YAML nodes"),
            )
            .with_label("the limit is passed here")
            .with_help(Some(
                "aliases (`*name`) copy what their anchor holds, and aliases of aliases multiply; \
                 write the values out or use `extends:`"
                    .to_owned(),
            ))
            .at(origin, self.files),
        );
        Err(problems)
    }

    /// Open a mapping or sequence, refusing nesting deeper than [`MAX_DEPTH`].
    fn enter(&mut self, origin: &Origin) -> Result<(), Vec<Problem>> {
        self.depth += 1;
        if self.depth <= MAX_DEPTH {
            return Ok(());
        }
        let mut problems = std::mem::take(&mut self.problems);
        problems.push(too_deep(origin, self.files));
        Err(problems)
    }

    /// A scalar with an explicit tag: the core schema's tags say what it is; others are refused.
    fn tagged_scalar(
        &mut self,
        text: &str,
        style: ScalarStyle,
        tag: &Tag,
        origin: &Origin,
    ) -> NodeValue {
        let plain = resolve_plain(text);
        let kind = core_tag(tag);
        let value = match (kind, &plain) {
            (Some("str"), _) => Some(NodeValue::Str(text.to_owned())),
            (Some("int"), NodeValue::Int(_))
            | (Some("float"), NodeValue::Float(_))
            | (Some("bool"), NodeValue::Bool(_))
            | (Some("null"), NodeValue::Null) => Some(plain.clone()),
            (Some("float"), NodeValue::Int(i)) => Some(NodeValue::Float(*i as f64)),
            _ => None,
        };
        if let Some(value) = value {
            return value;
        }
        let (message, help) = match kind {
            Some(kind @ ("int" | "float" | "bool" | "null")) => {
                let what = match kind {
                    "int" => "an integer",
                    "float" => "a number",
                    "bool" => "`true` or `false`",
                    _ => "`null`",
                };
                (
                    format!("`{text}` is tagged `!!{kind}` but is not {what}"),
                    format!("remove the tag, or write {what}"),
                )
            }
            _ => (
                format!("the tag `{}` is not supported", written(tag)),
                "recipes use plain YAML values; only the core tags (`!!str`, `!!int`, \
                 `!!float`, `!!bool`, `!!null`) are understood"
                    .to_owned(),
            ),
        };
        self.problems.push(
            Problem::error(codes::UNSUPPORTED, message)
                .with_label("this tag")
                .with_help(Some(help))
                .at(origin, self.files),
        );
        resolve_scalar(text, style)
    }

    fn check_collection_tag(&mut self, tag: Option<&Tag>, expected: &str, origin: &Origin) {
        let Some(tag) = tag else { return };
        if core_tag(tag) == Some(expected) {
            return;
        }
        self.problems.push(
            Problem::error(
                codes::UNSUPPORTED,
                format!("the tag `{}` is not supported here", written(tag)),
            )
            .with_label("this tag")
            .with_help(Some(format!("remove it; a {expected} needs no tag")))
            .at(origin, self.files),
        );
    }

    fn mapping(&mut self, origin: Origin) -> Result<Node, Vec<Problem>> {
        let mut entries: Vec<Entry> = Vec::new();
        loop {
            let (event, span) = self.next()?;
            let key_origin = self.origin(span.start, span.end);
            let key = match event {
                Event::MappingEnd => break,
                Event::Scalar(text, ..) => Some(text.into_owned()),
                other => {
                    // A complex key: read it to stay in step, then report it.
                    self.node(other, span)?;
                    self.problems.push(
                        Problem::error(codes::UNSUPPORTED, "mapping keys must be plain strings")
                            .at(&key_origin, self.files),
                    );
                    None
                }
            };
            let (event, span) = self.next()?;
            self.path.push(key.clone().unwrap_or_default());
            let value = self.node(event, span);
            self.path.pop();
            let value = value?;
            let Some(key) = key else { continue };
            if let Some(first) = entries.iter().find(|e| e.key == key) {
                let first_line = first.key_origin.position().map_or(0, |p| p.line);
                self.problems.push(
                    Problem::error(codes::DUPLICATE_KEY, format!("duplicate key `{key}`"))
                        .with_path(
                            self.path
                                .iter()
                                .chain([&key])
                                .cloned()
                                .collect::<Vec<_>>()
                                .join("."),
                        )
                        .with_label("set again here")
                        .with_help(Some(format!(
                            "`{key}` is already set on line {first_line}; keep only one of them"
                        )))
                        .at(&key_origin, self.files),
                );
                continue;
            }
            entries.push(Entry {
                key,
                key_origin,
                value,
            });
        }
        Ok(Node {
            value: NodeValue::Map(entries),
            origin,
        })
    }

    fn byte_offset(&self, marker: Marker) -> usize {
        marker.byte_offset().unwrap_or_else(|| {
            self.text
                .char_indices()
                .nth(marker.index())
                .map_or(self.text.len(), |(i, _)| i)
        })
    }

    fn origin(&self, start: Marker, end: Marker) -> Origin {
        let offset = self.byte_offset(start).min(self.text.len());
        let end = self.byte_offset(end).clamp(offset, self.text.len());
        Origin::File(Position {
            file: self.file,
            offset,
            len: end - offset,
            line: start.line().max(1),
            column: start.col() + 1,
        })
    }

    fn end_origin(&self) -> Origin {
        let line = self.text.lines().count().max(1);
        Origin::File(Position {
            file: self.file,
            offset: self.text.len(),
            len: 0,
            line,
            column: 1,
        })
    }
}

fn too_deep(origin: &Origin, files: &[SourceFile]) -> Problem {
    Problem::error(
        codes::LIMIT,
        format!("mappings and sequences nest more than {MAX_DEPTH} deep"),
    )
    .with_label("too deep")
    .with_help(Some(
        "a recipe needs four levels (`data.blend.0.path`)".to_owned(),
    ))
    .at(origin, files)
}

/// The core-schema kind (`str`, `int`, ...) a tag names, if it is one of YAML's own.
fn core_tag(tag: &Tag) -> Option<&str> {
    (tag.handle() == "tag:yaml.org,2002:").then(|| tag.suffix())
}

/// A tag as its author wrote it.
fn written(tag: &Tag) -> String {
    match core_tag(tag) {
        Some(kind) => format!("!!{kind}"),
        None => format!("{}{}", tag.handle(), tag.suffix()),
    }
}

/// YAML 1.2 core-schema resolution of a scalar.
fn resolve_scalar(text: &str, style: ScalarStyle) -> NodeValue {
    if style == ScalarStyle::Plain {
        resolve_plain(text)
    } else {
        NodeValue::Str(text.to_owned())
    }
}

/// What an unquoted scalar means.
pub(crate) fn resolve_plain(text: &str) -> NodeValue {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return NodeValue::Null,
        "true" | "True" | "TRUE" => return NodeValue::Bool(true),
        "false" | "False" | "FALSE" => return NodeValue::Bool(false),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return NodeValue::Float(f64::INFINITY);
        }
        "-.inf" | "-.Inf" | "-.INF" => return NodeValue::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return NodeValue::Float(f64::NAN),
        _ => {}
    }
    if let Some(int) = parse_int(text) {
        return NodeValue::Int(int);
    }
    if is_core_float(text)
        && let Ok(float) = text.parse::<f64>()
    {
        return NodeValue::Float(float);
    }
    NodeValue::Str(text.to_owned())
}

fn parse_int(text: &str) -> Option<i128> {
    if let Some(hex) = text.strip_prefix("0x") {
        return i128::from_str_radix(hex, 16).ok();
    }
    if let Some(oct) = text.strip_prefix("0o") {
        return i128::from_str_radix(oct, 8).ok();
    }
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    let well_formed = !digits.is_empty()
        && digits.starts_with(|c: char| c.is_ascii_digit())
        && digits.ends_with(|c: char| c.is_ascii_digit())
        && digits.chars().all(|c| c.is_ascii_digit() || c == '_')
        && !digits.contains("__");
    if !well_formed {
        return None;
    }
    text.replace('_', "").parse().ok()
}

/// `[-+]? ( \. [0-9]+ | [0-9]+ ( \. [0-9]* )? ) ( [eE] [-+]? [0-9]+ )?`
fn is_core_float(text: &str) -> bool {
    let body = text.strip_prefix(['-', '+']).unwrap_or(text);
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(i) => (&body[..i], Some(&body[i + 1..])),
        None => (body, None),
    };
    let (int, frac) = match mantissa.split_once('.') {
        Some((int, frac)) => (int, Some(frac)),
        None => (mantissa, None),
    };
    let digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
    let mantissa_ok = match frac {
        None => !int.is_empty() && digits(int),
        Some(frac) => digits(int) && digits(frac) && !(int.is_empty() && frac.is_empty()),
    };
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['-', '+']).unwrap_or(e);
        !e.is_empty() && digits(e)
    });
    mantissa_ok && exponent_ok
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Arc;

    use super::*;

    fn files(text: &str) -> Vec<SourceFile> {
        vec![SourceFile {
            name: "t.yaml".to_owned(),
            dir: PathBuf::new(),
            text: Arc::new(text.to_owned()),
        }]
    }

    #[test]
    fn scalars_follow_the_core_schema() {
        assert_eq!(resolve_scalar("12", ScalarStyle::Plain), NodeValue::Int(12));
        assert_eq!(
            resolve_scalar("1_000", ScalarStyle::Plain),
            NodeValue::Int(1000)
        );
        assert_eq!(
            resolve_scalar("1.0e-5", ScalarStyle::Plain),
            NodeValue::Float(1e-5)
        );
        assert_eq!(
            resolve_scalar("3e-4", ScalarStyle::Plain),
            NodeValue::Float(3e-4)
        );
        assert_eq!(
            resolve_scalar(".5", ScalarStyle::Plain),
            NodeValue::Float(0.5)
        );
        assert_eq!(
            resolve_scalar("true", ScalarStyle::Plain),
            NodeValue::Bool(true)
        );
        assert_eq!(resolve_scalar("~", ScalarStyle::Plain), NodeValue::Null);
        assert_eq!(
            resolve_scalar("12", ScalarStyle::DoubleQuoted),
            NodeValue::Str("12".into())
        );
        assert_eq!(
            resolve_scalar("1e", ScalarStyle::Plain),
            NodeValue::Str("1e".into())
        );
        assert_eq!(
            resolve_scalar("yes", ScalarStyle::Plain),
            NodeValue::Str("yes".into())
        );
        assert_eq!(
            resolve_scalar("_1", ScalarStyle::Plain),
            NodeValue::Str("_1".into())
        );
        assert_eq!(
            resolve_scalar("969,30,1", ScalarStyle::Plain),
            NodeValue::Str("969,30,1".into())
        );
    }

    #[test]
    fn positions_are_one_based_lines_and_columns() {
        let files = files("model:\n  hidden_size: 768\n");
        let root = parse(&files, 0).0.expect("valid yaml");
        let node = root.at("model.hidden_size").expect("present");
        assert_eq!(node.value, NodeValue::Int(768));
        let p = node.origin.position().expect("file origin");
        assert_eq!((p.line, p.column, p.offset, p.len), (2, 16, 22, 3));
    }

    #[test]
    fn duplicate_keys_are_reported_at_the_second_occurrence() {
        let files = files("a: 1\nb: 2\na: 3\n");
        let (root, problems) = parse(&files, 0);
        assert_eq!(
            root.and_then(|r| r.at("a").map(|n| n.value.clone())),
            Some(NodeValue::Int(1))
        );
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].code(), codes::DUPLICATE_KEY);
        assert_eq!(problems[0].file_position(), Some(("t.yaml", 3, 1)));
    }

    #[test]
    fn syntax_errors_point_at_their_position() {
        let files = files("a: [1, 2\nb: 3\n");
        let (root, problems) = parse(&files, 0);
        assert!(root.is_none());
        assert_eq!(problems[0].code(), codes::SYNTAX);
        assert!(problems[0].file_position().is_some());
    }

    #[test]
    fn aliases_copy_the_anchored_value() {
        let files = files("a: &x {k: 1}\nb: *x\n");
        let root = parse(&files, 0).0.expect("valid");
        assert_eq!(root.at("b.k").map(|n| &n.value), Some(&NodeValue::Int(1)));
    }
}
