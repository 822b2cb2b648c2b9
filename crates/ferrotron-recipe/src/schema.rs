//! The JSON Schema of the recipe format, generated from the types (schemars) so it cannot drift
//! from them, and the schema check of a loaded tree.
//!
//! The check uses the independent `jsonschema` validator rather than serde: serde stops at the
//! first problem, the validator reports every type, enum, range, missing-key and unknown-key
//! problem with its instance path, which the tree turns into a line and column. Its raw messages
//! are rewritten here into rustc-style ones with a concrete fix (nearest valid key or value).

use std::sync::LazyLock;

use jsonschema::error::{TypeKind, ValidationErrorKind};
use jsonschema::paths::LocationSegment;
use jsonschema::{ValidationError, Validator};
use serde_json::Value;

use crate::Recipe;
use crate::diagnostic::{Problem, codes};
use crate::node::Node;
use crate::source::SourceFile;

/// The recipe format's JSON Schema (draft 2020-12).
pub fn json_schema() -> Value {
    let mut schema = schemars::schema_for!(Recipe).as_value().clone();
    add_integer_maxima(&mut schema);
    schema
}

/// schemars marks `u32` fields with `"format": "uint32"`, which validators ignore; state the
/// upper bound as a `maximum` so a too-large value is a located schema error (and an editor
/// squiggle), not a serde failure after validation.
fn add_integer_maxima(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            let maximum = match map.get("format").and_then(Value::as_str) {
                Some("uint8") => Some(u64::from(u8::MAX)),
                Some("uint16") => Some(u64::from(u16::MAX)),
                Some("uint32") => Some(u64::from(u32::MAX)),
                Some("uint64") => Some(u64::MAX),
                _ => None,
            };
            if let Some(maximum) = maximum {
                map.entry("maximum").or_insert(Value::from(maximum));
            }
            map.values_mut().for_each(add_integer_maxima);
        }
        Value::Array(items) => items.iter_mut().for_each(add_integer_maxima),
        _ => {}
    }
}

/// The schema as committed at `schema/recipe.schema.json` (pretty, with a final newline).
pub fn json_schema_pretty() -> String {
    let mut text = serde_json::to_string_pretty(&json_schema()).unwrap_or_default();
    text.push('\n');
    text
}

static SCHEMA: LazyLock<Value> = LazyLock::new(json_schema);

static VALIDATOR: LazyLock<Result<Validator, String>> =
    LazyLock::new(|| jsonschema::validator_for(&SCHEMA).map_err(|e| e.to_string()));

/// Every schema problem of `instance` (the JSON form of `tree`), located in `tree`.
pub(crate) fn check(tree: &Node, instance: &Value, files: &[SourceFile]) -> Vec<Problem> {
    let validator = match &*VALIDATOR {
        Ok(validator) => validator,
        Err(e) => {
            return vec![Problem::error(
                codes::VALUE,
                format!("internal: bad schema: {e}"),
            )];
        }
    };
    let mut problems = Vec::new();
    for error in validator.iter_errors(instance) {
        describe(&error, tree, files, &mut problems);
    }
    problems
}

fn dot_path(location: &jsonschema::paths::Location) -> String {
    location
        .into_iter()
        .map(|segment| match segment {
            LocationSegment::Property(p) => p.into_owned(),
            LocationSegment::Index(i) => i.to_string(),
        })
        .collect::<Vec<_>>()
        .join(".")
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

fn show_value(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 40 {
        let short: String = text.chars().take(37).collect();
        format!("{short}...")
    } else {
        text
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a number",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

fn type_name(kind: jsonschema::JsonType) -> &'static str {
    use jsonschema::JsonType as T;
    match kind {
        T::Array => "a list",
        T::Boolean => "a boolean",
        T::Integer => "an integer",
        T::Null => "null",
        T::Number => "a number",
        T::Object => "a mapping",
        T::String => "a string",
    }
}

fn expected_types(kind: &TypeKind) -> String {
    match kind {
        TypeKind::Single(t) => type_name(*t).to_owned(),
        TypeKind::Multiple(set) => set.iter().map(type_name).collect::<Vec<_>>().join(" or "),
    }
}

fn options_list(options: &Value) -> Vec<String> {
    match options {
        Value::Array(items) => items
            .iter()
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
            .collect(),
        other => vec![other.to_string()],
    }
}

/// What the schema accepts at a dot path, in words (`an integer ≥ 1 or `auto``), for values
/// that failed every branch of an `anyOf`.
fn expectation_at(path: &str) -> Option<String> {
    let (parent, key) = path.rsplit_once('.').unwrap_or(("", path));
    let property = object_schema_at(parent)?.get("properties")?.get(key)?;
    let wanted = describe_schema(resolve(property), 0);
    (!wanted.is_empty()).then_some(wanted)
}

fn describe_schema(schema: &Value, depth: usize) -> String {
    let schema = resolve(schema);
    if depth > 4 {
        return String::new();
    }
    if let Some(branches) = schema
        .get("anyOf")
        .or_else(|| schema.get("oneOf"))
        .and_then(Value::as_array)
    {
        let parts: Vec<String> = branches
            .iter()
            .map(|b| describe_schema(b, depth + 1))
            .filter(|p| !p.is_empty() && p != "null")
            .collect();
        return parts.join(" or ");
    }
    if let Some(options) = schema.get("enum") {
        return options_list(options)
            .iter()
            .map(|o| format!("`{o}`"))
            .collect::<Vec<_>>()
            .join(", ");
    }
    let kind = match schema.get("type").and_then(Value::as_str) {
        Some("integer") => "an integer",
        Some("number") => "a number",
        Some("string") => "a string",
        Some("boolean") => "a boolean",
        Some("array") => "a list",
        Some("object") => "a mapping",
        Some("null") => "null",
        _ => return String::new(),
    };
    match schema.get("minimum") {
        Some(min) => format!("{kind} ≥ {min}"),
        None => kind.to_owned(),
    }
}

fn describe(
    error: &ValidationError<'_>,
    tree: &Node,
    files: &[SourceFile],
    out: &mut Vec<Problem>,
) {
    let path = dot_path(error.instance_path());
    let value: &Value = error.instance();
    let at = |path: &str, key_only: bool| tree.locate(path, key_only).origin.clone();
    let shown = || format!("found {} `{}`", json_type(value), show_value(value));
    let problem = match error.kind() {
        ValidationErrorKind::AdditionalProperties { unexpected } => {
            for key in unexpected {
                let key_path = join(&path, key);
                let (message_scope, help) = unknown_key_help(&path, key);
                out.push(
                    Problem::error(
                        codes::UNKNOWN_KEY,
                        format!("unknown key `{key}`{message_scope}"),
                    )
                    .with_path(&key_path)
                    .with_label("unknown key")
                    .with_help(Some(help))
                    .at(&at(&key_path, true), files),
                );
            }
            return;
        }
        ValidationErrorKind::Required { property } => {
            let key = property
                .as_str()
                .map_or_else(|| property.to_string(), str::to_owned);
            let key_path = join(&path, &key);
            let scope = if path.is_empty() {
                "the recipe".to_owned()
            } else {
                format!("`{path}`")
            };
            // The path is the missing key's, so that `crate::partial` gives it a stand-in and the
            // rules still run; the diagnostic points at the mapping that lacks it.
            out.push(
                Problem::error(
                    codes::MISSING_KEY,
                    format!("missing required key `{key}` in {scope}"),
                )
                .with_path(&key_path)
                .with_label(format!("`{key}` is missing"))
                .with_help(Some(match property_description(&key_path) {
                    Some(doc) => format!("add `{key_path}` ({doc})"),
                    None => format!("add `{key_path}`"),
                }))
                .at(&at(&path, true), files),
            );
            return;
        }
        ValidationErrorKind::Type { kind } => Problem::error(
            codes::TYPE,
            format!("`{path}` must be {}, {}", expected_types(kind), shown()),
        )
        .with_label(format!("expected {}", expected_types(kind))),
        ValidationErrorKind::Enum { options } => {
            let options = options_list(options);
            let listed = options
                .iter()
                .map(|o| format!("`{o}`"))
                .collect::<Vec<_>>()
                .join(", ");
            let help = value
                .as_str()
                .and_then(|v| nearest(v, options.iter().map(String::as_str)))
                .map_or_else(
                    || format!("use one of {listed}"),
                    |n| format!("did you mean `{n}`?"),
                );
            Problem::error(
                codes::VALUE,
                format!("`{path}` must be one of {listed}, {}", shown()),
            )
            .with_label("not a valid choice")
            .with_help(Some(help))
        }
        ValidationErrorKind::AnyOf { context } | ValidationErrorKind::OneOfNotValid { context } => {
            // Only one branch got past the value's own type (Option<Struct>): its errors are the
            // real ones. Otherwise list what each branch would have accepted.
            let fails_at_value = |branch: &Vec<ValidationError<'static>>| {
                branch.iter().any(|e| {
                    dot_path(e.instance_path()) == path
                        && matches!(
                            e.kind(),
                            ValidationErrorKind::Type { .. }
                                | ValidationErrorKind::Enum { .. }
                                | ValidationErrorKind::Constant { .. }
                                | ValidationErrorKind::Minimum { .. }
                                | ValidationErrorKind::Maximum { .. }
                        )
                })
            };
            let viable: Vec<_> = context.iter().filter(|b| !fails_at_value(b)).collect();
            if let [branch] = viable.as_slice() {
                for inner in branch.iter() {
                    describe(inner, tree, files, out);
                }
                return;
            }
            let wanted = expectation_at(&path).unwrap_or_else(|| "a different value".to_owned());
            Problem::error(
                codes::VALUE,
                format!("`{path}` must be {wanted}, {}", shown()),
            )
            .with_label(format!("expected {wanted}"))
            .with_help(match value.as_str().and_then(|v| nearest(v, ["auto"])) {
                Some(near) => Some(format!("did you mean `{near}`?")),
                None if wanted.contains("`auto`") => {
                    Some("use a positive integer, or `auto` to let the planner choose".to_owned())
                }
                None => None,
            })
        }
        ValidationErrorKind::Minimum { limit } => range_problem(&path, "≥", limit, &shown()),
        ValidationErrorKind::Maximum { limit } => range_problem(&path, "≤", limit, &shown()),
        ValidationErrorKind::ExclusiveMinimum { limit } => {
            range_problem(&path, ">", limit, &shown())
        }
        ValidationErrorKind::ExclusiveMaximum { limit } => {
            range_problem(&path, "<", limit, &shown())
        }
        ValidationErrorKind::MinLength { .. } => {
            Problem::error(codes::VALUE, format!("`{path}` must not be empty")).with_label("empty")
        }
        _ => Problem::error(codes::VALUE, format!("`{path}`: {error}")),
    };
    let key_only = matches!(value, Value::Object(_) | Value::Array(_));
    out.push(problem.with_path(&path).at(&at(&path, key_only), files));
}

fn range_problem(path: &str, op: &str, limit: &Value, shown: &str) -> Problem {
    Problem::error(
        codes::VALUE,
        format!("`{path}` must be {op} {limit}, {shown}"),
    )
    .with_label(format!("must be {op} {limit}"))
}

/// The closest candidate to a misspelt `word`, if one is close enough to be the likely intent.
/// Megatron flag spellings (`hidden-size`) map to their recipe key (`hidden_size`).
pub(crate) fn nearest<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let normalized = word.replace('-', "_").to_lowercase();
    let mut best: Option<(&str, f64)> = None;
    for candidate in candidates {
        if candidate == normalized {
            return Some(candidate);
        }
        let score = strsim::jaro_winkler(&normalized, candidate).max(
            strsim::normalized_damerau_levenshtein(&normalized, candidate),
        );
        if best.is_none_or(|(_, s)| score > s) {
            best = Some((candidate, score));
        }
    }
    best.filter(|(_, score)| *score >= 0.8).map(|(c, _)| c)
}

/// Megatron on/off switches whose recipe form is a section of settings: the flag, the section,
/// an example of it.
const SWITCH_SECTIONS: [(&str, &str, &str); 1] = [(
    "multi_latent_attention",
    "model.mla",
    "mla: {q_lora_rank: 1536, kv_lora_rank: 512}",
)];

/// Scope words and a fix for an unknown `key` under `parent`: the nearest sibling, else the
/// section where that key does belong, else the list of valid keys.
fn unknown_key_help(parent: &str, key: &str) -> (String, String) {
    let scope = if parent.is_empty() {
        " at the top level".to_owned()
    } else {
        format!(" in `{parent}`")
    };
    let siblings = allowed_keys(parent);
    if let Some(near) = nearest(key, siblings.iter().map(String::as_str)) {
        return (scope, format!("did you mean `{near}`?"));
    }
    let normalized = key.replace('-', "_");
    let elsewhere: Vec<String> = all_key_paths()
        .iter()
        .filter(|p| p.rsplit('.').next() == Some(normalized.as_str()))
        .cloned()
        .collect();
    if let Some(first) = elsewhere.first() {
        return (scope, format!("`{normalized}` belongs at `{first}`"));
    }
    if let Some((_, section, example)) = SWITCH_SECTIONS
        .iter()
        .find(|(switch, _, _)| *switch == normalized)
    {
        return (
            scope,
            format!("Megatron's switch is the section `{section}` here, e.g. `{example}`"),
        );
    }
    let listed = siblings
        .iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ");
    (scope, format!("valid keys here: {listed}"))
}

/// Follow `$ref`s to the schema that actually describes a value.
pub(crate) fn resolve(schema: &Value) -> &Value {
    let mut current = schema;
    for _ in 0..16 {
        match current.get("$ref").and_then(Value::as_str) {
            Some(reference) => {
                let pointer = reference.trim_start_matches('#');
                match SCHEMA.pointer(pointer) {
                    Some(target) => current = target,
                    None => break,
                }
            }
            None => break,
        }
    }
    current
}

/// The object schema for the value at a dot path (through `$ref`, `anyOf` and `items`).
pub(crate) fn object_schema_at(path: &str) -> Option<&'static Value> {
    let mut schema = object_branch(resolve(&SCHEMA))?;
    for segment in crate::node::split_path(path) {
        let next = match schema.get("properties").and_then(|p| p.get(segment)) {
            Some(property) => property,
            None => schema.get("items")?,
        };
        let next = resolve(next);
        schema = object_branch(next).or_else(|| {
            let items = resolve(next.get("items")?);
            object_branch(items)
        })?;
        if segment.parse::<usize>().is_ok() {
            continue;
        }
    }
    Some(schema)
}

fn object_branch(schema: &Value) -> Option<&Value> {
    let schema = resolve(schema);
    if schema.get("properties").is_some() || schema.get("items").is_some() {
        return Some(schema);
    }
    ["anyOf", "oneOf"].iter().find_map(|keyword| {
        schema
            .get(keyword)?
            .as_array()?
            .iter()
            .map(resolve)
            .find(|branch| branch.get("properties").is_some() || branch.get("items").is_some())
    })
}

/// The keys a mapping at `path` may hold.
pub(crate) fn allowed_keys(path: &str) -> Vec<String> {
    object_schema_at(path)
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}

fn property_description(path: &str) -> Option<String> {
    let (parent, key) = path.rsplit_once('.').unwrap_or(("", path));
    let property = object_schema_at(parent)?.get("properties")?.get(key)?;
    let described = property
        .get("description")
        .or_else(|| resolve(property).get("description"))?;
    let first_sentence = described
        .as_str()?
        .split(". ")
        .next()?
        .trim_end_matches('.');
    Some(first_sentence.to_owned())
}

static KEY_PATHS: LazyLock<Vec<String>> = LazyLock::new(|| {
    let mut paths = Vec::new();
    collect_paths(&SCHEMA, "", &mut paths, 0);
    paths
});

fn all_key_paths() -> &'static [String] {
    &KEY_PATHS
}

fn collect_paths(schema: &Value, prefix: &str, out: &mut Vec<String>, depth: usize) {
    if depth > 8 {
        return;
    }
    let Some(object) = object_branch(schema) else {
        return;
    };
    if let Some(properties) = object.get("properties").and_then(Value::as_object) {
        for (key, property) in properties {
            let path = join(prefix, key);
            out.push(path.clone());
            collect_paths(property, &path, out, depth + 1);
        }
    } else if let Some(items) = object.get("items") {
        collect_paths(items, &join(prefix, "N"), out, depth + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_keys_follow_refs_and_options() {
        assert!(allowed_keys("").contains(&"model".to_owned()));
        assert!(allowed_keys("model").contains(&"hidden_size".to_owned()));
        assert!(allowed_keys("model.moe").contains(&"num_experts".to_owned()));
        assert!(allowed_keys("data.blend.0").contains(&"weight".to_owned()));
        assert!(allowed_keys("training.optimizer").contains(&"lr".to_owned()));
    }

    #[test]
    fn nearest_key_handles_typos_and_megatron_flag_spelling() {
        let keys = ["hidden_size", "num_layers", "seq_length"];
        assert_eq!(nearest("hiden_size", keys), Some("hidden_size"));
        assert_eq!(nearest("num-layers", keys), Some("num_layers"));
        assert_eq!(nearest("tokenizer", keys), None);
    }

    #[test]
    fn misplaced_keys_are_found_in_their_section() {
        let (_, help) = unknown_key_help("training", "lr");
        assert_eq!(help, "`lr` belongs at `training.optimizer.lr`");
        let (_, help) = unknown_key_help("model", "multi-latent-attention");
        assert_eq!(
            help,
            "Megatron's switch is the section `model.mla` here, e.g. \
             `mla: {q_lora_rank: 1536, kv_lora_rank: 512}`"
        );
    }
}
