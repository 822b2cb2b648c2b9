//! Diagnostics for CI: GitHub Actions workflow commands (`::error file=..,line=..::message`,
//! which annotate the lines of a pull request's diff) and SARIF 2.1.0 (code-scanning tools,
//! GitHub's code scanning among them). Both take the same located [`Problem`]s that
//! `recipe validate` prints for people, so the three outputs cannot disagree.

use std::path::Path;

use serde_json::{Value, json};

use crate::{Problem, Severity};

/// The problems of one validated recipe: the recipe as named on the command line (used when a
/// problem points into no file, e.g. an unreadable file or a bad `--set`) and its problems.
#[derive(Debug, Clone, Copy)]
pub struct Checked<'a> {
    pub recipe: &'a str,
    pub problems: &'a [Problem],
}

/// GitHub's escaping of a workflow command's message (`::error ...::MESSAGE`).
pub fn github_escape_data(text: &str) -> String {
    text.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

/// GitHub's escaping of a workflow command's property value (`file=VALUE,line=..`).
pub fn github_escape_property(text: &str) -> String {
    github_escape_data(text)
        .replace(':', "%3A")
        .replace(',', "%2C")
}

/// The message a CI tool shows: the problem (with the `--set`/env layer that set the value,
/// when not a file) and, on the next line, the fix.
fn message_with_help(problem: &Problem) -> String {
    match problem.help_text() {
        Some(help) => format!("{problem}\nhelp: {help}"),
        None => problem.to_string(),
    }
}

/// A path as CI tools want it: relative to `cwd` when it is an absolute path inside it, with
/// `/` separators.
pub fn relative_path(name: &str, cwd: &Path) -> String {
    let path = Path::new(name);
    let relative = if path.is_absolute() {
        path.strip_prefix(cwd).unwrap_or(path)
    } else {
        path
    };
    let text = relative.to_string_lossy().replace('\\', "/");
    text.strip_prefix("./").map_or(text.clone(), str::to_owned)
}

/// One workflow command per problem: `::error` or `::warning`, with the file, the start line
/// and column and the end line (and end column when the span is on one line: GitHub refuses
/// columns for multi-line spans), titled with the diagnostic code.
pub fn github_annotations(checked: &[Checked<'_>], cwd: &Path) -> String {
    let mut out = String::new();
    for recipe in checked {
        for problem in recipe.problems {
            let command = match problem.severity() {
                Severity::Error => "error",
                Severity::Warning => "warning",
            };
            let mut properties = Vec::new();
            match problem.location() {
                Some(at) => {
                    properties.push(format!(
                        "file={}",
                        github_escape_property(&relative_path(&at.file, cwd))
                    ));
                    properties.push(format!("line={}", at.line));
                    if at.line == at.end_line {
                        properties.push(format!("col={}", at.column));
                    }
                    properties.push(format!("endLine={}", at.end_line));
                    if at.line == at.end_line {
                        properties.push(format!("endColumn={}", at.end_column));
                    }
                }
                None => properties.push(format!(
                    "file={}",
                    github_escape_property(&relative_path(recipe.recipe, cwd))
                )),
            }
            properties.push(format!("title={}", github_escape_property(problem.code())));
            out.push_str(&format!(
                "::{command} {}::{}\n",
                properties.join(","),
                github_escape_data(&message_with_help(problem))
            ));
        }
    }
    out
}

/// A relative path as a URI reference: unreserved characters and `/` as they are, every other
/// byte percent-encoded.
fn uri_reference(path: &str) -> String {
    let mut out = String::new();
    for byte in path.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// What a family of diagnostic codes checks (the part before `::`), for SARIF's rule list.
fn rule_description(code: &str) -> String {
    let family = code.split("::").next().unwrap_or(code);
    let what = match family {
        "yaml" => "YAML syntax and structure (one document, plain keys, no duplicate keys)",
        "schema" => "the recipe schema: types, allowed values, ranges, required and unknown keys",
        "recipe" => "reading the recipe: files, `extends`, overrides and the format version",
        "model" => "model shape arithmetic (heads, groups, FFN and position sizes)",
        "moe" => "Mixture-of-Experts settings",
        "training" => "batch arithmetic, run length and optimizer settings",
        "schedule" => "the learning-rate schedule",
        "recompute" => "activation recomputation settings",
        "precision" => "numeric precision settings",
        "data" => "data blend and split",
        "tokenizer" => "tokenizer fields",
        "layout" => "Megatron's parallel-layout rules on the recipe's cluster",
        "plan" => "planning the run",
        "checkpoint" => "checkpoint settings",
        _ => "a recipe rule",
    };
    format!("`{code}`: {what}")
}

/// A SARIF 2.1.0 log of every problem: one run of the `recipe` tool, one rule per diagnostic
/// code (in order of first appearance), one result per problem with its physical location
/// (URI relative to `cwd`, start and end line and column) and the key path as its logical
/// location. The fix is part of the message text (SARIF's `fixes` need concrete byte edits,
/// which a hint such as "did you mean `hidden_size`?" is not) and is kept as `properties.help`.
pub fn sarif_log(checked: &[Checked<'_>], tool_version: &str, cwd: &Path) -> Value {
    let mut rule_ids: Vec<&str> = Vec::new();
    let mut rules = Vec::new();
    let mut results = Vec::new();
    for recipe in checked {
        for problem in recipe.problems {
            let code = problem.code();
            let index = match rule_ids.iter().position(|id| *id == code) {
                Some(index) => index,
                None => {
                    rule_ids.push(code);
                    rules.push(json!({
                        "id": code,
                        "shortDescription": { "text": rule_description(code) },
                        "defaultConfiguration": { "level": level(problem.severity()) },
                    }));
                    rule_ids.len() - 1
                }
            };
            let mut location = match problem.location() {
                Some(at) => json!({
                    "physicalLocation": {
                        "artifactLocation": {
                            "uri": uri_reference(&relative_path(&at.file, cwd)),
                            "uriBaseId": "%SRCROOT%",
                        },
                        "region": {
                            "startLine": at.line,
                            "startColumn": at.column,
                            "endLine": at.end_line,
                            "endColumn": at.end_column,
                        },
                    }
                }),
                None => json!({
                    "physicalLocation": {
                        "artifactLocation": {
                            "uri": uri_reference(&relative_path(recipe.recipe, cwd)),
                            "uriBaseId": "%SRCROOT%",
                        },
                    }
                }),
            };
            if let (Some(path), Some(object)) = (problem.path(), location.as_object_mut()) {
                object.insert(
                    "logicalLocations".to_owned(),
                    json!([{ "fullyQualifiedName": path, "kind": "member" }]),
                );
            }
            let mut result = json!({
                "ruleId": code,
                "ruleIndex": index,
                "level": level(problem.severity()),
                "message": { "text": message_with_help(problem) },
                "locations": [location],
            });
            let mut properties = serde_json::Map::new();
            properties.insert(
                "recipe".to_owned(),
                relative_path(recipe.recipe, cwd).into(),
            );
            if let Some(help) = problem.help_text() {
                properties.insert("help".to_owned(), help.into());
            }
            if let Some(layer) = problem.layer() {
                properties.insert("setBy".to_owned(), layer.into());
            }
            if let Some(object) = result.as_object_mut() {
                object.insert("properties".to_owned(), Value::Object(properties));
            }
            results.push(result);
        }
    }
    json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {
                "driver": {
                    "name": "recipe",
                    "fullName": "recipe validate (Ferrotron)",
                    "version": tool_version,
                    "rules": rules,
                }
            },
            "columnKind": "unicodeCodePoints",
            "results": results,
        }]
    })
}

fn level(severity: Severity) -> &'static str {
    match severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LoadOptions, load_str};

    #[test]
    fn github_escaping_follows_the_runner_rules() {
        assert_eq!(
            github_escape_data("50% a\r\nb: c, d"),
            "50%25 a%0D%0Ab: c, d"
        );
        assert_eq!(
            github_escape_property("a:b,c%\n"),
            "a%3Ab%2Cc%25%0A".to_owned()
        );
    }

    #[test]
    fn uris_are_relative_and_encoded() {
        let cwd = Path::new("/repo");
        assert_eq!(relative_path("/repo/recipes/a.yaml", cwd), "recipes/a.yaml");
        assert_eq!(relative_path("./recipes/a.yaml", cwd), "recipes/a.yaml");
        assert_eq!(relative_path("/elsewhere/a.yaml", cwd), "/elsewhere/a.yaml");
        assert_eq!(
            uri_reference("my recipes/a#1.yaml"),
            "my%20recipes/a%231.yaml"
        );
    }

    #[test]
    fn annotations_carry_the_span_and_the_fix() {
        let text = "version: 2\nname: t\nmodel: {num_layers: 2, hiden_size: 64, num_attention_heads: 4, seq_length: 32}\ntraining: {micro_batch_size: 2, global_batch_size: 8, train_iters: 10}\n";
        let errors = load_str("dir/t.yaml", text, &LoadOptions::default()).expect_err("invalid");
        let checked = [Checked {
            recipe: "dir/t.yaml",
            problems: errors.problems(),
        }];
        let out = github_annotations(&checked, Path::new("/nowhere"));
        let unknown = out
            .lines()
            .find(|l| l.contains("title=schema%3A%3Aunknown-key"))
            .expect("the unknown key is annotated");
        assert!(
            unknown.starts_with("::error file=dir/t.yaml,line=3,col=24,endLine=3,endColumn=34,"),
            "{unknown}"
        );
        assert!(
            unknown.ends_with(
                "::unknown key `hiden_size` in `model`%0Ahelp: did you mean `hidden_size`?"
            ),
            "{unknown}"
        );
        let sarif = sarif_log(&checked, "0.0.0", Path::new("/nowhere"));
        let results = sarif["runs"][0]["results"].as_array().expect("results");
        assert_eq!(results.len(), errors.problems().len());
        let rules = sarif["runs"][0]["tool"]["driver"]["rules"]
            .as_array()
            .expect("rules");
        for result in results {
            let index = result["ruleIndex"].as_u64().expect("index") as usize;
            assert_eq!(rules[index]["id"], result["ruleId"]);
        }
    }
}
