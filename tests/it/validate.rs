//! End-to-end tests of `recipe validate`, `recipe show` and `recipe schema` (the real binary,
//! real files). Each broken fixture under tests/fixtures/ is snapshotted twice: as people read it
//! (miette, no colour, width 100) and as CI tools read it (JSON), so a regression in the line,
//! column, message or fix of any diagnostic shows up as a diff.

use std::process::Command;

use crate::common::{recipe, repo, shipped_recipes, stdout};

fn validate_fixture(name: &str) -> (i32, String, serde_json::Value) {
    let path = format!("tests/fixtures/{name}.yaml");
    let human = recipe(&["validate", &path]);
    let json = recipe(&["validate", "--format", "json", &path]);
    assert_eq!(human.status.code(), json.status.code());
    let parsed = serde_json::from_slice(&json.stdout).expect("--format json prints JSON");
    (human.status.code().unwrap_or(-1), stdout(&human), parsed)
}

macro_rules! broken_fixture {
    ($test:ident, $name:literal, $expect:expr) => {
        #[test]
        fn $test() {
            let (code, human, json) = validate_fixture($name);
            assert_eq!(code, 1, "{human}");
            let expect: &[(&str, usize, usize)] = $expect;
            let found: Vec<(String, usize, usize)> = json
                .as_array()
                .expect("a list")
                .iter()
                .map(|d| {
                    (
                        d["code"].as_str().unwrap_or_default().to_owned(),
                        d["line"].as_u64().unwrap_or(0) as usize,
                        d["column"].as_u64().unwrap_or(0) as usize,
                    )
                })
                .collect();
            let expect: Vec<(String, usize, usize)> = expect
                .iter()
                .map(|(c, l, col)| (c.to_string(), *l, *col))
                .collect();
            assert_eq!(found, expect, "{human}");
            insta::assert_snapshot!(concat!($name, "-human"), human);
            insta::assert_json_snapshot!(concat!($name, "-json"), json);
        }
    };
}

broken_fixture!(
    bad_types,
    "bad-types",
    &[
        ("schema::type", 4, 16),
        ("schema::type", 5, 19),
        ("schema::value", 6, 19),
        ("schema::value", 8, 11),
        ("schema::value", 9, 13),
        ("schema::value", 11, 21),
        ("schema::type", 13, 5),
    ]
);
broken_fixture!(
    unknown_keys,
    "unknown-keys",
    &[
        ("schema::unknown-key", 4, 3),
        ("schema::unknown-key", 5, 3),
        ("schema::unknown-key", 7, 3),
        ("schema::unknown-key", 8, 1),
        ("schema::unknown-key", 12, 5),
    ]
);
broken_fixture!(
    bad_enums,
    "bad-enums",
    &[
        ("schema::value", 4, 18),
        ("schema::value", 5, 23),
        ("schema::value", 8, 12),
        ("schema::value", 10, 12),
    ]
);
broken_fixture!(
    missing_keys,
    "missing-keys",
    &[
        ("schema::missing-key", 3, 1),
        ("schema::missing-key", 3, 1),
        ("schema::missing-key", 6, 1),
        // The rules run on stand-ins for the missing keys, so what else is wrong shows too.
        ("tokenizer::missing-file", 9, 1),
        ("tokenizer::missing-file", 9, 1),
        ("data::empty-blend", 10, 3),
    ]
);
broken_fixture!(
    impossible_values,
    "impossible-values",
    &[
        ("model::hidden-divisible-by-heads", 5, 24),
        ("model::heads-divisible-by-query-groups", 6, 21),
        ("moe::topk-exceeds-experts", 10, 18),
        ("moe::groups-divide-experts", 11, 17),
        ("moe::group-topk-exceeds-groups", 12, 17),
        ("training::global-batch-divisible-by-micro", 14, 22),
        ("training::one-length", 15, 17),
        ("training::min-lr-above-lr", 18, 13),
        ("recompute::only-with-full", 22, 11),
        ("data::split-syntax", 24, 10),
        ("data::non-positive-weight", 27, 15),
        ("tokenizer::missing-file", 28, 3),
        ("model::seq-length-exceeds-positions", 7, 15),
        ("tokenizer::foreign-field", 15, 17),
        ("tokenizer::foreign-field", 16, 17),
        ("schedule::warmup-too-long", 20, 19),
    ]
);
// Schema errors, the model rule and the layout rules in one round: the rules run on what parsed
// (see crates/ferrotron-recipe/src/partial.rs), and none judges the broken `lr` or enum.
broken_fixture!(
    all_at_once,
    "all-at-once",
    &[
        ("schema::unknown-key", 4, 3),
        ("model::heads-divisible-by-query-groups", 6, 21),
        ("schema::value", 8, 18),
        ("schema::type", 11, 9),
        ("layout::world-divisible-by-model-parallel", 13, 11),
        ("layout::heads-divisible-by-tp", 13, 11),
        ("layout::ffn-divisible-by-tp", 13, 11),
    ]
);
// Issue 42: `recipes/llama3-8b.yaml` with five mistakes, one of them a typo in the required
// `hidden_size`. The missing key gets stand-ins like a broken value, so the model and layout
// rules still run; none of them judges the stand-in.
broken_fixture!(
    five_mistakes,
    "five-mistakes",
    &[
        ("schema::missing-key", 8, 1),
        ("schema::unknown-key", 10, 3),
        ("model::heads-divisible-by-query-groups", 13, 21),
        ("schema::value", 14, 18),
        ("layout::world-divisible-by-model-parallel", 17, 11),
        ("layout::heads-divisible-by-tp", 17, 11),
        ("layout::ffn-divisible-by-tp", 17, 11),
        ("schema::type", 26, 9),
    ]
);

#[test]
fn a_missing_required_key_hides_no_other_error() {
    let (_, human, json) = validate_fixture("five-mistakes");
    let problems = json.as_array().expect("a list");
    assert!(problems.len() >= 6, "{human}");
    let help_of = |path: &str| {
        problems
            .iter()
            .find(|p| p["path"] == path)
            .map(|p| p["help"].as_str().unwrap_or_default().to_owned())
    };
    assert_eq!(
        help_of("model.hiden_size").as_deref(),
        Some("did you mean `hidden_size`?")
    );
    assert_eq!(
        help_of("model.hidden_size").as_deref(),
        Some("add `model.hidden_size`")
    );
    for path in [
        "training.optimizer.lr",
        "model.normalization",
        "model.num_query_groups",
        "parallel.tensor",
    ] {
        assert!(help_of(path).is_some(), "nothing blames `{path}`:\n{human}");
    }
    // The stand-in for `hidden_size` (1, then 2) divides neither 32 heads nor tensor 3, and no
    // rule said so.
    assert!(
        !problems.iter().any(|p| p["message"]
            .as_str()
            .is_some_and(|m| m.contains("hidden_size "))),
        "{human}"
    );
}

broken_fixture!(
    extends_missing,
    "extends-missing",
    &[("recipe::extends", 1, 10)]
);
broken_fixture!(extends_cycle, "cycle-a", &[("recipe::extends", 1, 10)]);
broken_fixture!(
    error_in_base,
    "error-in-base",
    &[("model::hidden-divisible-by-heads", 5, 24)]
);
broken_fixture!(syntax_error, "syntax-error", &[("yaml::syntax", 6, 9)]);
broken_fixture!(
    duplicate_keys,
    "duplicate-keys",
    &[("yaml::duplicate-key", 6, 3), ("yaml::duplicate-key", 9, 1),]
);
broken_fixture!(
    many_errors,
    "many-errors",
    &[
        ("schema::value", 4, 15),
        ("yaml::duplicate-key", 6, 3),
        ("model::hidden-divisible-by-heads", 7, 24),
        ("schema::unknown-key", 8, 3),
        ("training::global-batch-divisible-by-micro", 10, 22),
        ("schema::type", 13, 9),
        ("data::split-syntax", 17, 10),
        ("schedule::warmup-too-long", 15, 19),
    ]
);
// Issue 46: multi-latent attention with the fused QKV projection's switches. Its head sizes are
// its own, so 64 / 3 heads (an odd, fractional kv_channels) is not refused.
broken_fixture!(
    mla_mistakes,
    "mla-mistakes",
    &[
        ("mla::no-query-groups", 5, 21),
        ("mla::needs-rope", 6, 23),
        ("mla::no-qkv-bias", 8, 17),
        ("mla::odd-rotary-dim", 13, 26),
    ]
);

// Megatron's list form of `--moe-layer-freq`: an entry other than 0/1 is pointed at itself; a
// pattern (here Megatron's string form) of the wrong length at the key, with how many to add.
broken_fixture!(
    moe_layer_freq,
    "moe-layer-freq",
    &[
        ("moe::layer-freq-value", 7, 24),
        ("moe::zero-topk-scaling-factor", 8, 33),
    ]
);

broken_fixture!(
    moe_layer_freq_length,
    "moe-layer-freq-length",
    &[("moe::layer-freq-length", 7, 17)]
);

#[test]
fn diagnostics_in_a_base_name_the_base_file() {
    let (_, _, json) = validate_fixture("error-in-base");
    assert_eq!(json[0]["file"], "tests/fixtures/base/bad-value.yaml");
    assert_eq!(json[0]["recipe"], "tests/fixtures/error-in-base.yaml");
    assert_eq!(json[0]["path"], "model.num_attention_heads");
}

#[test]
fn every_shipped_recipe_is_valid() {
    let mut args = vec!["validate".to_owned()];
    let files = shipped_recipes();
    assert!(files.len() >= 9, "{files:?}");
    args.extend(files.iter().cloned());
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = recipe(&refs);
    let out = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{out}");
    for file in &files {
        assert!(out.contains(&format!("ok: {file}")), "{out}");
    }
}

#[test]
fn abstract_bases_validate_as_fragments_and_do_not_run() {
    let mut args = vec!["validate".to_owned()];
    let mut files: Vec<String> = std::fs::read_dir(repo().join("recipes/base"))
        .expect("recipes/base/")
        .filter_map(|e| e.ok())
        .map(|e| format!("recipes/base/{}", e.file_name().to_string_lossy()))
        .collect();
    files.sort();
    args.extend(files.iter().cloned());
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = recipe(&refs);
    let out = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{out}");
    for file in &files {
        assert!(
            out.contains(&format!("ok: {file} (abstract fragment)")),
            "{out}"
        );
    }
    // What a fragment does set is still checked, rules included.
    let (code, human, _) = validate_fixture("base/abstract-bad");
    assert_eq!(code, 1, "{human}");
    insta::assert_snapshot!("abstract-bad-human", human);
    // A fragment is not a recipe to run.
    let run = recipe(&["plan", "recipes/base/gpt.yaml"]);
    assert_eq!(run.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&run.stderr).contains("recipe::abstract"),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

#[test]
fn check_files_reports_missing_data_at_its_line_with_the_nearest_name() {
    let output = recipe(&[
        "validate",
        "--check-files",
        "tests/fixtures/missing-data.yaml",
    ]);
    assert_eq!(output.status.code(), Some(1));
    insta::assert_snapshot!("missing-data-human", stdout(&output));
    // Without the flag, only the recipe is checked (presets validate without their data).
    let plain = recipe(&["validate", "tests/fixtures/missing-data.yaml"]);
    assert_eq!(plain.status.code(), Some(0), "{}", stdout(&plain));
    let shipped = recipe(&["validate", "--check-files", "recipes/shakespeare-tiny.yaml"]);
    assert_eq!(shipped.status.code(), Some(0), "{}", stdout(&shipped));
}

#[test]
fn several_files_report_each_and_fail_together() {
    let output = recipe(&[
        "validate",
        "tests/fixtures/valid.yaml",
        "tests/fixtures/bad-enums.yaml",
    ]);
    let out = stdout(&output);
    assert_eq!(output.status.code(), Some(1));
    assert!(out.contains("ok: tests/fixtures/valid.yaml"), "{out}");
    assert!(
        out.contains("invalid: tests/fixtures/bad-enums.yaml (4 errors)"),
        "{out}"
    );
}

#[test]
fn unreadable_files_and_bad_usage_exit_2() {
    let missing = recipe(&["validate", "tests/fixtures/no-such-recipe.yaml"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(stdout(&missing).contains("cannot read `tests/fixtures/no-such-recipe.yaml`"));
    assert_eq!(recipe(&["validate"]).status.code(), Some(2));
    assert_eq!(
        recipe(&["validate", "--format", "xml", "x.yaml"])
            .status
            .code(),
        Some(2)
    );
}

/// `recipe ARGS` with the time it took; killed (and the test failed) after 20 s, which is what
/// reading `/dev/zero` until memory runs out would otherwise take from the suite.
fn timed_recipe(args: &[&str]) -> (std::process::Output, std::time::Duration) {
    let started = std::time::Instant::now();
    let mut child = Command::new(crate::common::RECIPE)
        .args(args)
        .current_dir(repo())
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the recipe binary runs");
    while child.try_wait().expect("wait").is_none() {
        if started.elapsed() > std::time::Duration::from_secs(20) {
            child.kill().expect("kill");
            panic!("`recipe {}` still reading after 20 s", args.join(" "));
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let elapsed = started.elapsed();
    (child.wait_with_output().expect("output"), elapsed)
}

// Issue 42: `/dev/zero` was read until memory ran out, a 3 GB file read whole before the size
// limit applied. A file that is no regular file, or too large, is refused before it is read.
// (2 s allows for a loaded machine; each takes milliseconds.)
#[test]
fn endless_and_huge_files_are_refused_without_being_read() {
    let quick = std::time::Duration::from_secs(2);
    let (output, took) = timed_recipe(&["validate", "/dev/zero"]);
    assert_eq!(output.status.code(), Some(2), "{}", stdout(&output));
    assert!(took < quick, "{took:?}");
    assert!(
        stdout(&output)
            .contains("cannot read `/dev/zero`: it is a character device, not a regular file"),
        "{}",
        stdout(&output)
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let huge = dir.path().join("huge.yaml");
    // Sparse: 3 GB long, no disk used.
    std::fs::File::create(&huge)
        .and_then(|f| f.set_len(3 << 30))
        .expect("sparse file");
    let huge = huge.to_str().expect("utf-8 path");
    let (output, took) = timed_recipe(&["validate", "--format", "json", huge]);
    assert_eq!(output.status.code(), Some(2), "{}", stdout(&output));
    assert!(took < quick, "{took:?}");
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(
        json[0]["message"],
        format!(
            "cannot read `{huge}`: it is 3221225472 bytes; a recipe file may have at most 1048576"
        ),
        "{json}"
    );

    // Through `extends:` the base is a mistake of the recipe, at its line: exit 1, as for a
    // base that does not exist.
    for base in ["/dev/zero", huge] {
        let top = dir.path().join("top.yaml");
        std::fs::write(&top, format!("extends: {base}\nname: t\n")).expect("write");
        let (output, took) = timed_recipe(&[
            "validate",
            "--format",
            "json",
            top.to_str().expect("utf-8 path"),
        ]);
        assert_eq!(output.status.code(), Some(1), "{}", stdout(&output));
        assert!(took < quick, "{took:?}");
        let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
        assert_eq!(json[0]["code"], "recipe::extends", "{json}");
        assert_eq!(
            (json[0]["line"].as_u64(), json[0]["column"].as_u64()),
            (Some(1), Some(10))
        );
        assert!(
            json[0]["message"].as_str().is_some_and(
                |m| m.starts_with(&format!("cannot read base recipe `{base}`: it is "))
            ),
            "{json}"
        );
    }

    // The other commands that read recipe-like files read them the same way.
    for args in [
        &["show", "/dev/zero"][..],
        &["migrate", "/dev/zero"],
        &["diff", "/dev/zero", "recipes/gpt2-124m.yaml"],
        &["sweep", "--dry-run", "/dev/zero"],
    ] {
        let (output, took) = timed_recipe(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(took < quick, "{args:?}: {took:?}");
    }
}

#[test]
fn overrides_are_checked_and_blamed() {
    let output = recipe(&[
        "validate",
        "--format",
        "json",
        "tests/fixtures/valid.yaml",
        "--set",
        "model.num_attention_heads=three",
        "--set",
        "parallel.tensr=2",
    ]);
    assert_eq!(output.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    insta::assert_json_snapshot!("set-overrides-json", json);
    let ok = recipe(&[
        "validate",
        "tests/fixtures/valid.yaml",
        "--set",
        "model.hidden_size=128",
    ]);
    assert_eq!(ok.status.code(), Some(0), "{}", stdout(&ok));
}

#[test]
fn environment_overrides_apply_unless_disabled() {
    let run = |no_env: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_recipe"));
        command
            .current_dir(repo())
            .env("FERROTRON_MODEL__NUM_ATTENTION_HEADS", "3");
        command.args(["validate", "--format", "json", "tests/fixtures/valid.yaml"]);
        if no_env {
            command.arg("--no-env");
        }
        command.output().expect("runs")
    };
    let with_env = run(false);
    assert_eq!(with_env.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&with_env.stdout).expect("json");
    assert_eq!(
        json[0]["origin"],
        "env FERROTRON_MODEL__NUM_ATTENTION_HEADS"
    );
    assert_eq!(run(true).status.code(), Some(0));
    // Every command that reads recipes takes --no-env.
    for command in [&["plan"][..], &["show"], &["run", "--dry-run"]] {
        let run = |no_env: bool| {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_recipe"));
            cmd.current_dir(repo())
                .env("FERROTRON_MODEL__NUM_ATTENTION_HEADS", "7")
                .args(command)
                .arg("recipes/shakespeare-tiny.yaml");
            if no_env {
                cmd.arg("--no-env");
            }
            cmd.output().expect("runs").status.code()
        };
        assert_eq!(run(false), Some(1), "{command:?} reads the environment");
        assert_eq!(run(true), Some(0), "{command:?} --no-env ignores it");
    }
}

#[test]
fn show_prints_the_resolved_recipe_with_origins() {
    let mut command = Command::new(env!("CARGO_BIN_EXE_recipe"));
    command
        .current_dir(repo())
        .env("FERROTRON_TRAINING__SEED", "7")
        .env("FERROTRON_LOG", "ignored: not a recipe section")
        .args(["show", "--origin", "tests/fixtures/valid.yaml"])
        .args([
            "--set",
            "training.train_iters=50",
            "--set",
            "checkpoint.dir=out/ckpt",
        ]);
    let output = command.output().expect("runs");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let out = stdout(&output);
    let line = |key: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(key))
            .unwrap_or("")
    };
    assert!(
        line("seed:").ends_with("# env FERROTRON_TRAINING__SEED"),
        "{out}"
    );
    assert!(
        line("train_iters:").ends_with("# --set training.train_iters=50"),
        "{out}"
    );
    assert!(
        line("vocab_file:").contains("tests/fixtures/base/vocab.json"),
        "{out}"
    );
    insta::assert_snapshot!("show-valid-origin", out);
}

#[test]
fn show_output_is_itself_a_valid_recipe() {
    let output = recipe(&["show", "recipes/mixtral-8x7b.yaml"]);
    assert_eq!(output.status.code(), Some(0));
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("resolved.yaml");
    std::fs::write(&file, &output.stdout).expect("write");
    let again = recipe(&["validate", file.to_str().expect("utf-8 path")]);
    assert_eq!(again.status.code(), Some(0), "{}", stdout(&again));
}

#[test]
fn show_reports_errors_like_validate() {
    let output = recipe(&["show", "tests/fixtures/bad-enums.yaml"]);
    assert_eq!(output.status.code(), Some(1));
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(err.contains("did you mean `rmsnorm`?"), "{err}");
}

#[test]
fn schema_command_matches_the_committed_schema() {
    let output = recipe(&["schema"]);
    assert_eq!(output.status.code(), Some(0));
    let committed = std::fs::read_to_string(repo().join("schema/recipe.schema.json"))
        .expect("committed schema");
    assert!(
        stdout(&output) == committed,
        "schema/recipe.schema.json is stale: run `recipe schema > schema/recipe.schema.json`"
    );
}

#[test]
fn a_closed_pipe_ends_output_quietly() {
    for args in [
        &["schema"][..],
        &["completions", "bash"],
        &["show", "recipes/gpt2-124m.yaml"],
    ] {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let output = Command::new(env!("CARGO_BIN_EXE_recipe"))
            .args(args)
            .current_dir(repo())
            .stdout(writer)
            .output()
            .expect("the recipe binary runs");
        let err = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn help_lists_every_subcommand_and_completions_cover_them() {
    let help = stdout(&recipe(&["--help"]));
    insta::assert_snapshot!("top-level-help", help);
    for shell in ["bash", "zsh", "fish"] {
        let script = recipe(&["completions", shell]);
        assert_eq!(script.status.code(), Some(0), "{shell}");
        let text = stdout(&script);
        for sub in ["validate", "plan", "run", "sweep", "report", "completions"] {
            assert!(text.contains(sub), "{shell} completion lacks {sub}");
        }
        assert!(
            text.contains("check-files"),
            "{shell} completion lacks flags"
        );
    }
}
