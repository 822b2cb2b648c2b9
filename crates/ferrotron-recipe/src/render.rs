//! The resolved recipe as YAML, optionally with each value's origin as a trailing comment.
//! Hand-written rather than through a serializer because the comments must sit on the line of
//! the value they describe, and the output must read back as the same recipe.

use serde_json::Value;

use crate::LoadedRecipe;
use crate::node::NodeValue;

const COMMENT_COLUMN: usize = 48;

impl LoadedRecipe {
    /// The fully resolved recipe (extends, overrides, derived defaults applied) as YAML.
    /// With `origins`, every value carries `# file:line:col`, `# --set ..`, `# env ..` or
    /// `# default`.
    pub fn to_yaml(&self, origins: bool) -> String {
        let value =
            serde_json::to_value(self.recipe.with_derived_defaults()).unwrap_or(Value::Null);
        let mut out = String::new();
        if let Value::Object(map) = &value {
            let origin = |path: &str| origins.then(|| self.origin_of(path));
            write_map(map, "", 0, None, &origin, &mut out);
        }
        out
    }
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

fn line(out: &mut String, text: String, origin: Option<String>) {
    match origin {
        Some(origin) => {
            let pad = COMMENT_COLUMN.saturating_sub(text.chars().count()).max(1);
            out.push_str(&format!("{text}{:pad$}# {origin}\n", ""));
        }
        None => {
            out.push_str(&text);
            out.push('\n');
        }
    }
}

/// Write mapping entries at `indent`; `first_prefix` replaces the indentation of the first line
/// (`- ` for a mapping inside a list).
fn write_map(
    map: &serde_json::Map<String, Value>,
    path: &str,
    indent: usize,
    first_prefix: Option<String>,
    origin: &dyn Fn(&str) -> Option<String>,
    out: &mut String,
) {
    let mut prefix = first_prefix;
    for (key, value) in map {
        let lead = prefix.take().unwrap_or_else(|| " ".repeat(indent));
        let child = join(path, key);
        match value {
            Value::Object(inner) if !inner.is_empty() => {
                line(out, format!("{lead}{key}:"), None);
                write_map(inner, &child, indent + 2, None, origin, out);
            }
            Value::Array(items) if !items.is_empty() => {
                line(out, format!("{lead}{key}:"), None);
                write_seq(items, &child, indent + 2, origin, out);
            }
            scalar => line(
                out,
                format!("{lead}{key}: {}", scalar_text(scalar)),
                origin(&child),
            ),
        }
    }
}

fn write_seq(
    items: &[Value],
    path: &str,
    indent: usize,
    origin: &dyn Fn(&str) -> Option<String>,
    out: &mut String,
) {
    let pad = " ".repeat(indent);
    for (i, item) in items.iter().enumerate() {
        let child = join(path, &i.to_string());
        match item {
            Value::Object(inner) if !inner.is_empty() => {
                write_map(
                    inner,
                    &child,
                    indent + 2,
                    Some(format!("{pad}- ")),
                    origin,
                    out,
                );
            }
            Value::Array(inner) if !inner.is_empty() => {
                line(out, format!("{pad}-"), None);
                write_seq(inner, &child, indent + 2, origin, out);
            }
            scalar => line(
                out,
                format!("{pad}- {}", scalar_text(scalar)),
                origin(&child),
            ),
        }
    }
}

fn scalar_text(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) if n.is_f64() => float_text(&n.to_string()),
        Value::Number(n) => n.to_string(),
        Value::String(s) if is_plain_safe(s) => s.clone(),
        Value::String(s) => serde_json::to_string(s).unwrap_or_default(),
        Value::Array(_) => "[]".to_owned(),
        Value::Object(_) => "{}".to_owned(),
    }
}

/// A float as every YAML reader takes it for one: YAML 1.1 readers (PyYAML) need a dot in the
/// mantissa and a sign in the exponent, so `1e-8` (a string to them) is written `1.0e-8`.
fn float_text(shortest: &str) -> String {
    let (mantissa, exponent) = match shortest.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e)),
        None => (shortest, None),
    };
    let mut out = mantissa.to_owned();
    if !out.contains('.') {
        out.push_str(".0");
    }
    if let Some(exponent) = exponent {
        out.push('e');
        if !exponent.starts_with(['-', '+']) {
            out.push('+');
        }
        out.push_str(exponent);
    }
    out
}

/// A string that reads back as the same string when written without quotes.
fn is_plain_safe(s: &str) -> bool {
    let first_ok = s
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/'));
    let rest_ok = s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-' | '+'));
    first_ok && rest_ok && matches!(crate::yaml::resolve_plain(s), NodeValue::Str(_))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LoadOptions, load_str};

    const TEXT: &str = "version: 2\nname: t\nmodel: {num_layers: 2, hidden_size: 64, num_attention_heads: 4, seq_length: 32}\ntraining: {micro_batch_size: 2, global_batch_size: 8, train_iters: 10}\ndata:\n  tokenizer: {type: gpt2-bpe, vocab_file: v.json, merge_file: m.txt}\n  blend: [{path: d.jsonl, weight: 2}]\n  split: '98,2,0'\n";

    #[test]
    fn output_reads_back_as_the_same_recipe() {
        let loaded = load_str("t.yaml", TEXT, &LoadOptions::default()).expect("valid");
        let yaml = loaded.to_yaml(false);
        let again = load_str("again.yaml", &yaml, &LoadOptions::default()).expect("round trip");
        assert_eq!(again.recipe, loaded.recipe.with_derived_defaults());
    }

    #[test]
    fn origins_are_annotated() {
        let loaded = load_str("t.yaml", TEXT, &LoadOptions::default()).expect("valid");
        let yaml = loaded.to_yaml(true);
        assert!(yaml.contains("  hidden_size: 64"), "{yaml}");
        let hidden = yaml
            .lines()
            .find(|l| l.contains("hidden_size:"))
            .expect("line");
        assert!(hidden.ends_with("# t.yaml:3:37"), "{hidden}");
        let rotary = yaml
            .lines()
            .find(|l| l.contains("rotary_base:"))
            .expect("line");
        assert!(rotary.ends_with("# default"), "{rotary}");
        assert!(yaml.contains("  split: \"98,2,0\""), "{yaml}");
        assert!(yaml.contains("    - path: d.jsonl"), "{yaml}");
    }

    #[test]
    fn floats_have_a_dot_and_a_signed_exponent() {
        let text = |f: f64| scalar_text(&Value::from(f));
        assert_eq!(text(1e-8), "1.0e-8");
        assert_eq!(text(3e-4), "0.0003");
        assert_eq!(text(1e20), "1.0e+20");
        assert_eq!(text(2.5e-7), "2.5e-7");
        assert_eq!(text(0.9), "0.9");
        assert_eq!(text(500000.0), "500000.0");
        assert_eq!(scalar_text(&Value::from(3)), "3");
    }

    #[test]
    fn ambiguous_strings_are_quoted() {
        assert_eq!(scalar_text(&Value::String("true".into())), "\"true\"");
        assert_eq!(scalar_text(&Value::String("12".into())), "\"12\"");
        assert_eq!(scalar_text(&Value::String("".into())), "\"\"");
        assert_eq!(scalar_text(&Value::String("a: b".into())), "\"a: b\"");
        assert_eq!(scalar_text(&Value::String("gpt2-bpe".into())), "gpt2-bpe");
    }
}
