//! End-to-end tests of what recipes need in CI and review: `recipe validate --format
//! github|sarif`, the pre-commit hook definition run by `pre-commit` itself, `recipe diff`
//! (files and `REV:path`) and `recipe migrate` of a version-0 recipe. The real binary on real
//! files; outputs are snapshotted so a change in any line, column, escape or number shows up.

use std::path::Path;
use std::process::{Command, Output};

use crate::common::{recipe, recipe_in, repo, shipped_recipes, stderr, stdout};

const CI_FILES: [&str; 3] = [
    "tests/fixtures/review/ci-annotations.yaml",
    "tests/fixtures/review/ci-warning.yaml",
    "tests/fixtures/error-in-base.yaml",
];

// ---------------------------------------------------------------------------------------------
// validate --format github | sarif

#[test]
fn github_format_prints_escaped_workflow_commands() {
    let mut args = vec!["validate", "--format", "github"];
    args.extend(CI_FILES);
    let output = recipe(&args);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let out = stdout(&output);
    let lines: Vec<&str> = out.lines().collect();
    // One command per diagnostic, the same diagnostics `--format json` reports.
    let mut json_args = vec!["validate", "--format", "json"];
    json_args.extend(CI_FILES);
    let json: serde_json::Value = serde_json::from_slice(&recipe(&json_args).stdout).expect("json");
    let json = json.as_array().expect("a list");
    assert_eq!(lines.len(), json.len(), "{out}");
    for (line, diagnostic) in lines.iter().zip(json) {
        let severity = diagnostic["severity"].as_str().expect("severity");
        assert!(line.starts_with(&format!("::{severity} file=")), "{line}");
        let file = diagnostic["file"].as_str().expect("file");
        assert!(
            line.contains(&format!(
                "file={file},line={},",
                diagnostic["line"].as_u64().expect("line")
            )),
            "{line}"
        );
        // `title=schema%3A%3Aunknown-key`: `:` escaped in a property; the message after `::`.
        let code = diagnostic["code"]
            .as_str()
            .expect("code")
            .replace(':', "%3A");
        assert!(line.contains(&format!(",title={code}::")), "{line}");
        assert!(!line.contains('\n') && !line.contains('\r'));
    }
    // The warning is a warning, the `%` of a value is escaped, the fix is on its own line, and a
    // span over two lines has no columns (GitHub refuses them there).
    assert!(out.contains("::warning file=tests/fixtures/review/ci-warning.yaml,line=5,col=13,endLine=5,endColumn=16,title=checkpoint%3A%3Ano-dir::"), "{out}");
    assert!(out.contains("found a string `\"50%25\"`"), "{out}");
    assert!(
        out.contains("%0Ahelp: did you mean `hidden_size`?"),
        "{out}"
    );
    assert!(
        out.contains("file=tests/fixtures/review/ci-annotations.yaml,line=8,endLine=9,title="),
        "{out}"
    );
    assert!(
        out.contains("file=tests/fixtures/base/bad-value.yaml,line=5,"),
        "{out}"
    );
    insta::assert_snapshot!("github-annotations", out);
}

#[test]
fn github_format_names_the_recipe_when_a_problem_has_no_line() {
    let output = recipe(&[
        "validate",
        "--format",
        "github",
        "tests/fixtures/valid.yaml",
        "--set",
        "parallel.tensr=2",
    ]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        stdout(&output),
        "::error file=tests/fixtures/valid.yaml,title=schema%3A%3Aunknown-key::unknown key \
         `tensr` in `parallel` (set by --set parallel.tensr=2)%0Ahelp: did you mean `tensor`?\n"
    );
    let ok = recipe(&[
        "validate",
        "--format",
        "github",
        "tests/fixtures/valid.yaml",
    ]);
    assert_eq!(ok.status.code(), Some(0));
    assert_eq!(stdout(&ok), "");
}

#[test]
fn sarif_format_is_a_sarif_2_1_0_log() {
    let mut args = vec!["validate", "--format", "sarif"];
    args.extend(CI_FILES);
    let output = recipe(&args);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let mut log: serde_json::Value = serde_json::from_slice(&output.stdout).expect("SARIF is JSON");
    assert_eq!(log["version"], "2.1.0");
    let run = &log["runs"][0];
    assert_eq!(run["tool"]["driver"]["name"], "recipe");
    let rules = run["tool"]["driver"]["rules"].as_array().expect("rules");
    let results = run["results"].as_array().expect("results");
    assert_eq!(results.len(), 5, "{log:#}");
    for result in results {
        // Every result names a rule of the driver, by id and index.
        let index = result["ruleIndex"].as_u64().expect("ruleIndex") as usize;
        assert_eq!(rules[index]["id"], result["ruleId"]);
        assert!(["error", "warning"].contains(&result["level"].as_str().expect("level")));
        let location = &result["locations"][0]["physicalLocation"];
        let uri = location["artifactLocation"]["uri"].as_str().expect("uri");
        assert!(
            uri.starts_with("tests/fixtures/"),
            "relative to the working directory: {uri}"
        );
        let region = &location["region"];
        assert!(region["startLine"].as_u64() <= region["endLine"].as_u64());
    }
    // Rules are unique.
    let mut ids: Vec<&str> = rules.iter().filter_map(|r| r["id"].as_str()).collect();
    let count = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), count);
    let unknown = results
        .iter()
        .find(|r| r["ruleId"] == "schema::unknown-key")
        .expect("the unknown key");
    assert_eq!(
        unknown["locations"][0]["physicalLocation"]["region"],
        serde_json::json!({ "startLine": 6, "startColumn": 3, "endLine": 6, "endColumn": 13 })
    );
    assert_eq!(unknown["properties"]["help"], "did you mean `hidden_size`?");
    // The tool version changes with every release; the rest is the snapshot.
    log["runs"][0]["tool"]["driver"]["version"] = "(version)".into();
    insta::assert_json_snapshot!("sarif", log);
}

// ---------------------------------------------------------------------------------------------
// the pre-commit hook

fn git(dir: &Path, args: &[&str]) -> Output {
    let mut command = Command::new("git");
    command
        .args([
            "-c",
            "user.name=ferrotron-test",
            "-c",
            "user.email=test@example.invalid",
        ])
        .args([
            "-c",
            "init.defaultBranch=main",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .current_dir(dir);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("GIT_") {
            command.env_remove(key);
        }
    }
    let output = command.output().expect("git runs");
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

const GOOD_RECIPE: &str = "version: 2\nname: good\nmodel: {num_layers: 2, hidden_size: 64, num_attention_heads: 4, seq_length: 32}\ntraining: {micro_batch_size: 2, global_batch_size: 8, train_iters: 10}\ndata:\n  tokenizer: {type: gpt2-bpe, vocab_file: v.json, merge_file: m.txt}\n  blend: [{path: d.jsonl}]\n";

/// Runs the repository's `.pre-commit-hooks.yaml` with `pre-commit` against a fixture project:
/// a hook repository holding exactly that file (committed, as pre-commit needs), a project whose
/// `.pre-commit-config.yaml` uses the hook as shipped, and the built `recipe` on PATH (what the
/// documented install step gives).
#[test]
fn pre_commit_hook_validates_recipes_in_a_project() {
    let version = Command::new("pre-commit").arg("--version").output();
    if !version.as_ref().is_ok_and(|o| o.status.success()) {
        panic!(
            "`pre-commit` is not installed, and this test runs the hook definition with it: \
             install it with `python3 -m pip install pre-commit` (or `pipx install pre-commit`)"
        );
    }
    let temp = tempfile::tempdir().expect("tempdir");
    let hooks = temp.path().join("hooks");
    let project = temp.path().join("project");
    std::fs::create_dir_all(&hooks).expect("mkdir");
    std::fs::create_dir_all(project.join("recipes")).expect("mkdir");
    std::fs::copy(
        repo().join(".pre-commit-hooks.yaml"),
        hooks.join(".pre-commit-hooks.yaml"),
    )
    .expect("the repository has .pre-commit-hooks.yaml");
    git(&hooks, &["init", "-q"]);
    git(&hooks, &["add", "."]);
    git(&hooks, &["commit", "-q", "-m", "hooks"]);
    let rev = String::from_utf8(git(&hooks, &["rev-parse", "HEAD"]).stdout).expect("utf-8");

    git(&project, &["init", "-q"]);
    std::fs::write(
        project.join(".pre-commit-config.yaml"),
        format!(
            "repos:\n  - repo: {}\n    rev: {}\n    hooks:\n      - id: recipe-validate\n",
            hooks.display(),
            rev.trim()
        ),
    )
    .expect("write");
    std::fs::write(project.join("recipes/good.yaml"), GOOD_RECIPE).expect("write");
    std::fs::write(project.join("notes.txt"), "not: [yaml, nor a recipe\n").expect("write");
    git(&project, &["add", "."]);

    let bin_dir = Path::new(env!("CARGO_BIN_EXE_recipe"))
        .parent()
        .expect("bin dir")
        .to_owned();
    let path = std::env::join_paths(std::iter::once(bin_dir).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .expect("PATH");
    let run = || {
        let mut command = Command::new("pre-commit");
        command
            .args(["run", "--all-files", "--color", "never"])
            .current_dir(&project)
            .env("PATH", &path)
            .env("PRE_COMMIT_HOME", temp.path().join("cache"))
            .env("NO_COLOR", "1");
        for (key, _) in std::env::vars_os() {
            let key_text = key.to_string_lossy();
            if key_text.starts_with("GIT_") || key_text.starts_with("FERROTRON_") {
                command.env_remove(key);
            }
        }
        let output = command.output().expect("pre-commit runs");
        let text = format!("{}{}", stdout(&output), stderr(&output));
        (output.status.code(), text)
    };

    let (code, out) = run();
    assert_eq!(code, Some(0), "a valid recipe passes:\n{out}");
    assert!(out.contains("recipe validate"), "{out}");
    assert!(out.contains("Passed"), "{out}");

    let bad = GOOD_RECIPE.replace("hidden_size: 64", "hiden_size: 64");
    std::fs::write(project.join("recipes/bad.yaml"), bad).expect("write");
    git(&project, &["add", "."]);
    let (code, out) = run();
    assert_eq!(code, Some(1), "an invalid recipe fails:\n{out}");
    assert!(out.contains("Failed"), "{out}");
    assert!(out.contains("schema::unknown-key"), "{out}");
    assert!(out.contains("recipes/bad.yaml:3:"), "{out}");
    assert!(out.contains("did you mean `hidden_size`?"), "{out}");
    assert!(out.contains("ok: recipes/good.yaml"), "{out}");
    // Only recipes are passed: not the text file, not pre-commit's own YAML.
    assert!(!out.contains("notes.txt"), "{out}");
    assert!(!out.contains(".pre-commit-config.yaml"), "{out}");
}

// ---------------------------------------------------------------------------------------------
// recipe diff

const DIFF_OLD: &str = "tests/fixtures/review/diff-old.yaml";
const DIFF_NEW: &str = "tests/fixtures/review/diff-new.yaml";

#[test]
fn diff_text_compares_fields_with_origins_and_the_plan() {
    let output = recipe(&["diff", DIFF_OLD, DIFF_NEW]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let out = stdout(&output);
    let line = |key: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(key))
            .unwrap_or_else(|| panic!("no line for {key}:\n{out}"))
            .to_owned()
    };
    let hidden = line("model.hidden_size ");
    assert!(
        hidden.contains("tests/fixtures/review/diff-base.yaml:5:16"),
        "{hidden}"
    );
    assert!(
        hidden.contains("tests/fixtures/review/diff-new.yaml:4:16"),
        "{hidden}"
    );
    assert!(hidden.contains("UNSAFE: model shape"), "{hidden}");
    let lr = line("training.optimizer.lr ");
    assert!(!lr.contains("UNSAFE"), "{lr}");
    assert!(line("training.seed ").contains("default"), "{out}");
    assert!(out.contains("RESUME-UNSAFE"), "{out}");
    let cells = |key: &str| {
        line(key)
            .split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(cells("world size "), ["world", "size", "8", "16", "+8"]);
    assert_eq!(
        cells("tensor parallel "),
        ["tensor", "parallel", "1", "2", "+1"]
    );
    assert_eq!(
        cells("data parallel "),
        ["data", "parallel", "8", "8", "same"]
    );
    assert_eq!(
        cells("total tokens "),
        ["total", "tokens", "1.31", "B", "2.62", "B", "+100.0%"]
    );
    insta::assert_snapshot!("diff-text", out);
}

#[test]
fn diff_json_and_markdown() {
    let json = recipe(&["diff", "--format", "json", DIFF_OLD, DIFF_NEW]);
    assert_eq!(json.status.code(), Some(0), "{}", stderr(&json));
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).expect("json");
    assert_eq!(value["identical"], false);
    assert_eq!(value["resume_safe"], false);
    let risks: Vec<&str> = value["resume_risks"]
        .as_array()
        .expect("risks")
        .iter()
        .filter_map(|r| r["risk"].as_str())
        .collect();
    assert_eq!(risks, ["model shape", "seed"]);
    let metric = |key: &str| {
        value["plan"]["metrics"]
            .as_array()
            .expect("metrics")
            .iter()
            .find(|m| m["metric"] == key)
            .cloned()
            .unwrap_or_else(|| panic!("no metric {key}"))
    };
    assert_eq!(metric("world_size")["old"], 8.0);
    assert_eq!(metric("world_size")["new"], 16.0);
    assert_eq!(metric("tokens_per_step")["old"], 256.0 * 1024.0);
    assert_eq!(metric("total_tokens")["new"], 10000.0 * 256.0 * 1024.0);
    insta::assert_json_snapshot!("diff-json", value);

    let markdown = recipe(&["diff", "--format", "markdown", DIFF_OLD, DIFF_NEW]);
    assert_eq!(markdown.status.code(), Some(0));
    let out = stdout(&markdown);
    assert!(
        out.contains("| `model.hidden_size` | 768 | 1024 |"),
        "{out}"
    );
    assert!(out.contains("**Resume-unsafe**"), "{out}");
    assert!(out.contains("| world size | 8 | 16 | +8 |"), "{out}");
    insta::assert_snapshot!("diff-markdown", out);
}

#[test]
fn diff_of_a_recipe_with_itself_is_identical_and_safe() {
    let output = recipe(&["diff", "--format", "json", DIFF_OLD, DIFF_OLD]);
    assert_eq!(output.status.code(), Some(0));
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(value["identical"], true);
    assert_eq!(value["resume_safe"], true);
    assert!(
        value["plan"]["metrics"]
            .as_array()
            .expect("metrics")
            .iter()
            .all(|m| m["display"]["change"] == "same")
    );
}

#[test]
fn diff_exit_codes() {
    let invalid = recipe(&["diff", DIFF_OLD, "tests/fixtures/bad-enums.yaml"]);
    assert_eq!(invalid.status.code(), Some(1));
    let err = stderr(&invalid);
    assert!(err.contains("tests/fixtures/bad-enums.yaml:4:18"), "{err}");
    assert!(stdout(&invalid).is_empty());
    let other = recipe(&["diff", DIFF_OLD, "recipes/gpt2-124m.yaml"]);
    assert_eq!(other.status.code(), Some(0), "{}", stderr(&other));
    let missing = recipe(&["diff", DIFF_OLD, "tests/fixtures/review/no-such.yaml"]);
    assert_eq!(missing.status.code(), Some(2));
    assert_eq!(recipe(&["diff", DIFF_OLD]).status.code(), Some(2));
}

/// `REV:path` reads the recipe and its `extends:` base from the revision, not the work tree.
#[test]
fn diff_reads_a_git_revision_with_its_bases() {
    let temp = tempfile::tempdir().expect("tempdir");
    let dir = temp.path();
    std::fs::create_dir_all(dir.join("recipes/base")).expect("mkdir");
    let base =
        std::fs::read_to_string(repo().join("tests/fixtures/review/diff-base.yaml")).expect("base");
    std::fs::write(dir.join("recipes/base/gpt.yaml"), &base).expect("write");
    std::fs::write(
        dir.join("recipes/run.yaml"),
        "extends: base/gpt.yaml\nname: run\n",
    )
    .expect("write");
    git(dir, &["init", "-q"]);
    git(dir, &["add", "."]);
    git(dir, &["commit", "-q", "-m", "first"]);
    // In the work tree only: the base's layer count and the recipe's learning rate.
    std::fs::write(
        dir.join("recipes/base/gpt.yaml"),
        base.replace("num_layers: 12", "num_layers: 24"),
    )
    .expect("write");
    std::fs::write(
        dir.join("recipes/run.yaml"),
        "extends: base/gpt.yaml\nname: run\ntraining:\n  optimizer: {lr: 1.0e-4}\n",
    )
    .expect("write");

    let output = recipe_in(
        dir,
        &[
            "diff",
            "--format",
            "json",
            "HEAD:recipes/run.yaml",
            "recipes/run.yaml",
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    let fields = value["fields"].as_array().expect("fields");
    let layers = fields
        .iter()
        .find(|f| f["path"] == "model.num_layers")
        .expect("num_layers differs: the base was read from HEAD");
    assert_eq!(layers["old"], 12);
    assert_eq!(layers["new"], 24);
    assert_eq!(layers["old_origin"], "HEAD:recipes/base/gpt.yaml:4:15");
    assert_eq!(layers["new_origin"], "recipes/base/gpt.yaml:4:15");
    assert_eq!(layers["resume_risk"], "model shape");
    let lr = fields
        .iter()
        .find(|f| f["path"] == "training.optimizer.lr")
        .expect("lr differs");
    assert_eq!(lr["old_origin"], "default");
    assert_eq!(lr["new_origin"], "recipes/run.yaml:4:19");

    let bad_rev = recipe_in(
        dir,
        &["diff", "no-such-rev:recipes/run.yaml", "recipes/run.yaml"],
    );
    assert_eq!(bad_rev.status.code(), Some(2));
    assert!(
        stderr(&bad_rev).contains("git show no-such-rev:./recipes/run.yaml"),
        "{}",
        stderr(&bad_rev)
    );
}

// ---------------------------------------------------------------------------------------------
// format versions and recipe migrate

const V0: &str = "tests/fixtures/review/v0-megatron.yaml";

#[test]
fn validate_says_a_file_is_old_and_that_migrate_exists() {
    let output = recipe(&["validate", V0]);
    assert_eq!(output.status.code(), Some(1));
    let out = stdout(&output);
    assert!(out.contains("recipe::format-version"), "{out}");
    assert!(out.contains("recipe migrate"), "{out}");
    // One diagnostic, not one per renamed key.
    assert!(out.contains("(1 error)"), "{out}");
    insta::assert_snapshot!("validate-v0", out);

    let current = recipe(&["validate", "tests/fixtures/valid.yaml"]);
    assert!(
        stdout(&current).contains("ok: tests/fixtures/valid.yaml (format version 2)"),
        "{}",
        stdout(&current)
    );
    let json = recipe(&["validate", "--format", "json", V0]);
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("json");
    assert_eq!(json[0]["code"], "recipe::format-version");
    assert_eq!(json[0]["path"], "version");
    assert_eq!(
        json[0]["line"], 5,
        "the first key, after the leading comments"
    );
    let message = json[0]["message"].as_str().expect("message");
    assert!(
        message.contains("read as recipe format version 0"),
        "{message}"
    );
    let help = json[0]["help"].as_str().expect("help");
    assert!(
        help.contains(&format!("`recipe migrate --write {V0}`")),
        "{help}"
    );
}

#[test]
fn validate_refuses_a_newer_format() {
    let temp = tempfile::tempdir().expect("tempdir");
    let file = temp.path().join("future.yaml");
    std::fs::write(&file, GOOD_RECIPE.replace("version: 2", "version: 3")).expect("write");
    let output = recipe(&[
        "validate",
        "--format",
        "json",
        file.to_str().expect("utf-8"),
    ]);
    assert_eq!(output.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(json[0]["code"], "recipe::format-version");
    assert_eq!(json[0]["line"], 1);
    assert!(
        json[0]["message"]
            .as_str()
            .expect("message")
            .contains("newer than this build")
    );
}

/// The version is per file of an `extends` chain: a base that declares an old format is named,
/// at its own `version:` line; a file without `version:` inherits its base's.
#[test]
fn an_old_base_is_reported_in_the_base_and_versions_are_inherited() {
    let temp = tempfile::tempdir().expect("tempdir");
    let dir = temp.path();
    let base = GOOD_RECIPE.replace("name: good\n", "");
    std::fs::write(
        dir.join("old-base.yaml"),
        base.replace("version: 2", "version: 0"),
    )
    .expect("write");
    std::fs::write(dir.join("base.yaml"), &base).expect("write");
    std::fs::write(
        dir.join("top.yaml"),
        "extends: old-base.yaml\nversion: 2\nname: top\n",
    )
    .expect("write");
    std::fs::write(
        dir.join("inherits.yaml"),
        "extends: base.yaml\nname: inherits\n",
    )
    .expect("write");
    let output = recipe_in(
        dir,
        &["validate", "--format", "json", "top.yaml", "inherits.yaml"],
    );
    assert_eq!(output.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    let json = json.as_array().expect("list");
    assert_eq!(json.len(), 1, "{json:?}");
    assert_eq!(json[0]["code"], "recipe::format-version");
    assert_eq!(json[0]["file"], "old-base.yaml");
    assert_eq!(json[0]["line"], 1);
    assert_eq!(json[0]["recipe"], "top.yaml");
    let ok = recipe_in(dir, &["validate", "inherits.yaml"]);
    assert!(
        stdout(&ok).contains("ok: inherits.yaml (format version 2)"),
        "{}",
        stdout(&ok)
    );
    // migrate leaves an inheriting file alone and fixes the old base in place.
    let inherits = recipe_in(dir, &["migrate", "--check", "inherits.yaml"]);
    assert_eq!(inherits.status.code(), Some(0), "{}", stderr(&inherits));
    let fixed = recipe_in(dir, &["migrate", "--write", "old-base.yaml"]);
    assert_eq!(fixed.status.code(), Some(0), "{}", stderr(&fixed));
    assert!(
        std::fs::read_to_string(dir.join("old-base.yaml"))
            .expect("read")
            .starts_with("version: 2\n")
    );
    assert_eq!(
        recipe_in(dir, &["validate", "top.yaml"]).status.code(),
        Some(0)
    );
}

#[test]
fn migrate_shows_a_diff_then_writes_a_valid_recipe() {
    let original = std::fs::read_to_string(repo().join(V0)).expect("fixture");
    let shown = recipe(&["migrate", V0]);
    assert_eq!(shown.status.code(), Some(0), "{}", stderr(&shown));
    let diff = stdout(&shown);
    assert!(
        diff.starts_with(&format!("--- a/{V0}\n+++ b/{V0}\n")),
        "{diff}"
    );
    assert!(
        diff.contains("\n-  tensor_model_parallel_size: 2    # --tensor-model-parallel-size\n"),
        "{diff}"
    );
    assert!(
        diff.contains("\n+  tensor: 2    # --tensor-model-parallel-size\n"),
        "{diff}"
    );
    assert!(diff.contains("\n+version: 2\n"), "{diff}");
    assert_eq!(
        std::fs::read_to_string(repo().join(V0)).expect("fixture"),
        original,
        "without --write nothing changes"
    );
    insta::assert_snapshot!("migrate-diff", diff);
    insta::assert_snapshot!("migrate-changes", stderr(&shown));

    let temp = tempfile::tempdir().expect("tempdir");
    let copy = temp.path().join("v0.yaml");
    std::fs::write(&copy, &original).expect("write");
    let copy_arg = copy.to_str().expect("utf-8");
    let check = recipe(&["migrate", "--check", copy_arg]);
    assert_eq!(check.status.code(), Some(1), "--check fails on an old file");
    let written = recipe(&["migrate", "--write", copy_arg]);
    assert_eq!(written.status.code(), Some(0), "{}", stderr(&written));
    assert!(stdout(&written).is_empty());
    let migrated = std::fs::read_to_string(&copy).expect("migrated");
    // Comments and key order survive: every line of the original that no rule touches is there
    // unchanged, in the same order.
    for kept in [
        "# A recipe in format version 0",
        "seq_length: 64",
        "    - path: corpus.jsonl",
    ] {
        assert!(migrated.contains(kept), "{migrated}");
    }
    insta::assert_snapshot!("migrate-written", migrated);
    // The printed diff is a real patch: `git apply` of it gives what `--write` wrote.
    let patched = temp.path().join("patched");
    let target = patched.join(V0);
    std::fs::create_dir_all(target.parent().expect("dir")).expect("mkdir");
    std::fs::write(&target, &original).expect("write");
    let mut apply = Command::new("git")
        .args(["apply", "-"])
        .current_dir(&patched)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("git apply runs");
    std::io::Write::write_all(&mut apply.stdin.take().expect("stdin"), diff.as_bytes())
        .expect("diff written");
    assert!(apply.wait().expect("git apply").success());
    assert_eq!(std::fs::read_to_string(&target).expect("patched"), migrated);
    let valid = recipe(&["validate", copy_arg]);
    assert_eq!(valid.status.code(), Some(0), "{}", stdout(&valid));
    assert!(stdout(&valid).contains("(format version 2)"));
    // Migrating again changes nothing.
    let again = recipe(&["migrate", "--check", copy_arg]);
    assert_eq!(again.status.code(), Some(0));
    assert!(
        stderr(&again).contains("nothing to migrate"),
        "{}",
        stderr(&again)
    );
    // And the migrated recipe is the recipe the version-0 file meant.
    let show = recipe(&["show", copy_arg]);
    let shown = stdout(&show);
    for expected in [
        "  tensor: 2\n",
        "  tie_embeddings: false\n",
        "  position_embedding: learned\n",
        "  granularity: full\n",
        "  beta2: 0.95\n",
        "  distributed_optimizer: true\n",
    ] {
        assert!(shown.contains(expected), "{expected:?} in\n{shown}");
    }
}

const V1: &str = "tests/fixtures/review/v1-schedule.yaml";

/// Format 1 → 2: `decay_iters` counted after warmup becomes Megatron's end counted from the
/// start, and WSD keeps format 1's linear cool-down; the migrated file validates and shows the
/// same schedule.
#[test]
fn migrate_gives_a_format_1_schedule_megatrons_meaning() {
    let refused = recipe(&["validate", V1]);
    assert_eq!(refused.status.code(), Some(1));
    let shown = recipe(&["migrate", V1]);
    assert_eq!(shown.status.code(), Some(0), "{}", stderr(&shown));
    insta::assert_snapshot!("migrate-v1-diff", stdout(&shown));
    insta::assert_snapshot!("migrate-v1-changes", stderr(&shown));
    let temp = tempfile::tempdir().expect("tempdir");
    let copy = temp.path().join("v1.yaml");
    std::fs::copy(repo().join(V1), &copy).expect("copy");
    let copy_arg = copy.to_str().expect("utf-8");
    assert_eq!(
        recipe(&["migrate", "--write", copy_arg]).status.code(),
        Some(0)
    );
    assert_eq!(recipe(&["validate", copy_arg]).status.code(), Some(0));
    let show = stdout(&recipe(&["show", copy_arg]));
    for expected in [
        "    warmup_iters: 2000\n",
        "    decay_iters: 10000\n",
        "    wsd_decay_iters: 1000\n",
        "    wsd_decay_style: linear\n",
    ] {
        assert!(show.contains(expected), "{expected:?} in\n{show}");
    }
}

#[test]
fn every_shipped_recipe_is_already_current() {
    let files = shipped_recipes();
    let mut args = vec!["migrate", "--check"];
    args.extend(files.iter().map(String::as_str));
    let output = recipe(&args);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        stderr(&output).matches("nothing to migrate").count(),
        files.len()
    );
}
