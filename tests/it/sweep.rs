//! End-to-end tests of `recipe sweep`: the real binary expanding the shipped sweep files (dry
//! run, plans and diagnostics), stable member hashes, and tiny members trained as real child
//! runs (skip on re-run, invalid members reported, bit-identical losses run to run).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::common::{stderr, stdout};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

fn recipe(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_recipe"))
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .output()
        .expect("run the recipe binary")
}

/// `(member name, short hash)` of every valid member line of a dry run.
fn member_hashes(out: &str) -> Vec<(String, String)> {
    out.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let name = words.next()?;
            let hash = words.next()?.strip_prefix('[')?.strip_suffix(']')?;
            Some((name.to_owned(), hash.to_owned()))
        })
        .collect()
}

#[test]
fn dry_run_expands_grid_zip_and_seeds_in_order_with_plans() {
    let out = recipe(
        &repo_root(),
        &["sweep", "recipes/sweeps/lr-scan.yaml", "--dry-run"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    // 2 learning rates × 2 zipped sizes × 2 seeds, seeds innermost, grid outermost.
    let names: Vec<String> = member_hashes(&text).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "lr-scan-000-lr3e-4-L2-h64-s1",
            "lr-scan-001-lr3e-4-L2-h64-s2",
            "lr-scan-002-lr3e-4-L4-h128-s1",
            "lr-scan-003-lr3e-4-L4-h128-s2",
            "lr-scan-004-lr1e-3-L2-h64-s1",
            "lr-scan-005-lr1e-3-L2-h64-s2",
            "lr-scan-006-lr1e-3-L4-h128-s1",
            "lr-scan-007-lr1e-3-L4-h128-s2",
        ],
        "{text}"
    );
    // Every member line carries its plan: degrees, memory, predicted step time and MFU.
    for line in text.lines().skip(1) {
        assert!(
            line.contains("world 1 (tp1 pp1 cp1 ep1 dp1)")
                && line.contains("GiB/GPU")
                && line.contains("| step ")
                && line.contains("| MFU "),
            "{line}"
        );
    }
    assert!(
        text.starts_with("sweep lr-scan: 8 members from recipes/sweeps/../shakespeare-tiny.yaml\n"),
        "{text}"
    );
}

#[test]
fn dry_run_reports_invalid_members_with_their_diagnostics() {
    let out = recipe(
        &repo_root(),
        &["sweep", "recipes/sweeps/layout-scan.yaml", "--dry-run"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("6 members") && text.contains("2 invalid"),
        "{text}"
    );
    assert!(text.contains("layout-scan-004-tp8-pp1 INVALID"), "{text}");
    assert!(
        text.contains("does not divide num_attention_heads"),
        "{text}"
    );
    insta::assert_snapshot!("sweep_dry_run_layout_scan", text);
}

#[test]
fn member_hashes_are_stable_and_independent_of_where_the_sweep_is_started() {
    let root = repo_root();
    let from_root = recipe(
        &root,
        &["sweep", "recipes/sweeps/lr-scan.yaml", "--dry-run"],
    );
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let absolute = root.join("recipes/sweeps/lr-scan.yaml");
    let from_elsewhere = recipe(
        elsewhere.path(),
        &["sweep", absolute.to_str().expect("utf-8 path"), "--dry-run"],
    );
    let a = member_hashes(&stdout(&from_root));
    let b = member_hashes(&stdout(&from_elsewhere));
    assert_eq!(a.len(), 8);
    assert_eq!(
        a, b,
        "the same members must hash the same from any directory"
    );
    let mut hashes: Vec<_> = a.iter().map(|(_, h)| h.clone()).collect();
    hashes.sort();
    hashes.dedup();
    assert_eq!(
        hashes.len(),
        8,
        "every member (even seeds) has its own hash"
    );
    // And a second expansion gives the same hashes again.
    let again = recipe(
        &root,
        &["sweep", "recipes/sweeps/lr-scan.yaml", "--dry-run"],
    );
    assert_eq!(member_hashes(&stdout(&again)), a);
}

#[test]
fn a_broken_sweep_file_is_a_usage_error_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("s.yaml"),
        "sweep:\n  name: z\n  base: b.yaml\n  zip: { a.b: [1, 2], c.d: [1] }\n",
    )
    .expect("write sweep");
    let out = recipe(dir.path(), &["sweep", "s.yaml", "--dry-run"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("s.yaml") && err.contains("same length"),
        "{err}"
    );
}

/// A directory with a small corpus, a tiny base recipe and a sweep over it.
struct TinySweep {
    dir: tempfile::TempDir,
}

impl TinySweep {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = repo_root();
        let corpus = std::fs::read_to_string(root.join("recipes/data/shakespeare.jsonl"))
            .expect("the shipped corpus exists");
        let slice: String = corpus.lines().take(12).map(|l| format!("{l}\n")).collect();
        std::fs::write(dir.path().join("corpus.jsonl"), slice).expect("write corpus");
        let gpt2 = root.join("recipes/data/gpt2");
        let base = format!(
            r#"version: 2
name: sweep-test
model:
  num_layers: 1
  hidden_size: 16
  num_attention_heads: 2
  seq_length: 16
  hidden_dropout: 0.1
  attention_dropout: 0.1
precision:
  dtype: fp32
training:
  micro_batch_size: 2
  global_batch_size: 4
  train_iters: 4
  log_interval: 1
  eval_interval: 2
  eval_iters: 1
  optimizer:
    lr: 0.003
  schedule:
    decay: cosine
    warmup_iters: 1
data:
  tokenizer:
    type: gpt2-bpe
    vocab_file: {}
    merge_file: {}
  blend:
    - path: corpus.jsonl
  split: "90,10,0"
checkpoint:
  interval: 100
logging:
  tensorboard: tb
runtime:
  backend: cpu
"#,
            gpt2.join("vocab.json").display(),
            gpt2.join("merges.txt").display()
        );
        std::fs::write(dir.path().join("base.yaml"), base).expect("write base");
        std::fs::write(
            dir.path().join("sweep.yaml"),
            "sweep:\n  name: tiny\n  base: base.yaml\n  set: { training.train_iters: 4 }\n  \
             grid: { training.optimizer.lr: [3.0e-3, fast] }\n  seeds: [7]\n",
        )
        .expect("write sweep");
        TinySweep { dir }
    }

    fn run(&self, out: &str) -> Output {
        recipe(
            self.dir.path(),
            &["sweep", "sweep.yaml", "--out", out, "--parallel", "2"],
        )
    }

    fn member(&self, out: &str) -> PathBuf {
        self.dir.path().join(out).join("tiny-000-lr3e-3-s7")
    }
}

fn manifest(member: &Path) -> Value {
    let text = std::fs::read_to_string(member.join("manifest.json")).expect("manifest.json");
    serde_json::from_str(&text).expect("manifest is JSON")
}

/// `(step, value bits)` pairs.
type Steps = Vec<(u64, u64)>;

/// `(step, loss bits)` and `(step, eval loss bits)` of a metrics file.
fn losses(member: &Path) -> (Steps, Steps) {
    let text = std::fs::read_to_string(member.join("metrics.jsonl")).expect("metrics.jsonl");
    let mut train = Vec::new();
    let mut eval = Vec::new();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).expect("JSON line");
        let step = v["step"].as_u64().expect("step");
        if let Some(loss) = v.get("loss").and_then(Value::as_f64) {
            train.push((step, loss.to_bits()));
        }
        if let Some(loss) = v.get("eval_loss").and_then(Value::as_f64) {
            eval.push((step, loss.to_bits()));
        }
    }
    (train, eval)
}

#[test]
fn members_run_are_skipped_when_finished_and_reproduce_bit_for_bit() {
    let sweep = TinySweep::new();

    // First invocation: the valid member trains, the invalid one is reported, exit code 1.
    let first = sweep.run("out-a");
    assert_eq!(first.status.code(), Some(1), "{}", stderr(&first));
    let text = stdout(&first);
    assert!(text.contains("tiny-001-lrfast-s7 INVALID"), "{text}");
    assert!(text.contains("must be a number"), "{text}");
    let member = sweep.member("out-a");
    let record = manifest(&member);
    assert_eq!(record["status"], "finished", "{record}");
    assert_eq!(record["exit_code"], 0);
    assert_eq!(record["seed"], 7);
    assert_eq!(record["recipe"]["name"], "tiny-000-lr3e-3-s7");
    assert!(record["program"]["git_commit"].is_string());
    let keys = record["data_cache_keys"]
        .as_array()
        .expect("data cache keys");
    assert!(
        !keys.is_empty()
            && keys
                .iter()
                .all(|key| key.as_str().is_some_and(|k| k.contains('-'))),
        "{keys:?}"
    );
    assert!(member.join("member.yaml").is_file());
    assert!(member.join("run.log").is_file());
    // The base's TensorBoard directory becomes one per member, beside its metrics.
    let events = std::fs::read_dir(member.join("tensorboard"))
        .expect("the member's tensorboard directory")
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("events.out.tfevents.")
        })
        .count();
    assert_eq!(events, 1, "one event file in {}", member.display());
    assert!(
        !sweep.dir.path().join("tb").exists(),
        "the base's own directory stays unused"
    );
    let (train, eval) = losses(&member);
    assert_eq!(train.len(), 4, "one line per step");
    assert_eq!(eval.len(), 2, "an evaluation every 2 steps");
    let csv = std::fs::read_to_string(sweep.dir.path().join("out-a/results.csv")).expect("csv");
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows.len(), 3, "{csv}");
    assert!(
        rows[1].starts_with("tiny-000-lr3e-3-s7,") && rows[1].ends_with(",finished"),
        "{csv}"
    );
    assert!(rows[2].ends_with(",invalid"), "{csv}");
    let md = std::fs::read_to_string(sweep.dir.path().join("out-a/results.md")).expect("md");
    assert!(md.contains("| tiny-000-lr3e-3-s7 |"), "{md}");

    // Second invocation: the finished member is skipped, its files untouched.
    let started = record["started_at"].clone();
    let second = sweep.run("out-a");
    assert!(
        stderr(&second).contains("already finished: skipped"),
        "{}",
        stderr(&second)
    );
    assert!(stdout(&second).contains("finished (earlier)"));
    assert_eq!(manifest(&member)["started_at"], started);
    assert_eq!(losses(&member), (train.clone(), eval.clone()));

    // The same member in a fresh directory trains to bit-identical losses.
    let third = sweep.run("out-b");
    assert_eq!(third.status.code(), Some(1), "{}", stderr(&third));
    let again = sweep.member("out-b");
    assert_eq!(losses(&again), (train, eval));
    // Same member, same hash, wherever it runs.
    let hash = |out: &str| {
        let csv = std::fs::read_to_string(sweep.dir.path().join(out).join("results.csv"))
            .expect("results.csv");
        csv.lines()
            .nth(1)
            .and_then(|row| row.split(',').nth(1))
            .map(str::to_owned)
    };
    assert_eq!(hash("out-a"), hash("out-b"));
    assert_eq!(hash("out-a").map(|h| h.len()), Some(12));
}
