//! End-to-end tests of `recipe run` and `recipe sample` (the real binary, real files, a tiny
//! model on a slice of the shipped Shakespeare corpus).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{DIVERGE, repo, stderr};

/// A run folder with a small corpus (the first plays of the shipped one) and a tiny recipe.
struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new(extra_yaml: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let corpus = std::fs::read_to_string(repo().join("recipes/data/shakespeare.jsonl"))
            .expect("the shipped corpus exists");
        let slice: String = corpus.lines().take(12).map(|l| format!("{l}\n")).collect();
        std::fs::write(dir.path().join("corpus.jsonl"), slice).expect("write corpus");
        let gpt2 = repo().join("recipes/data/gpt2");
        let recipe = format!(
            r#"version: 2
name: run-test
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
  train_iters: 6
  log_interval: 1
  eval_interval: 3
  eval_iters: 1
  optimizer:
    lr: 0.003
  schedule:
    decay: cosine
    warmup_iters: 1
data:
  tokenizer:
    type: gpt2-bpe
    vocab_file: {vocab}
    merge_file: {merges}
  blend:
    - path: corpus.jsonl
  split: "90,10,0"
  cache_dir: cache
checkpoint:
  dir: ckpt
  interval: 3
  keep_last: 2
logging:
  jsonl: metrics.jsonl
runtime:
  backend: cpu
{extra_yaml}"#,
            vocab = gpt2.join("vocab.json").display(),
            merges = gpt2.join("merges.txt").display(),
        );
        std::fs::write(dir.path().join("recipe.yaml"), recipe).expect("write recipe");
        Fixture { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn command(&self, subcommand: &str) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_recipe"));
        command.current_dir(self.dir.path()).arg(subcommand);
        for (key, _) in std::env::vars() {
            if key.starts_with("FERROTRON_") || key == "RUST_LOG" {
                command.env_remove(key);
            }
        }
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command("run")
            .arg("recipe.yaml")
            .args(args)
            .output()
            .expect("the recipe binary runs")
    }

    fn spawn(&self, args: &[&str]) -> Child {
        self.command("run")
            .arg("recipe.yaml")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the recipe binary starts")
    }

    /// Writes the corpus's last four documents as `held-out.jsonl` and returns the overrides
    /// that make it the validation and the test data (the split gives them no share).
    fn held_out_data(&self) -> [&'static str; 6] {
        let corpus = std::fs::read_to_string(self.path("corpus.jsonl")).expect("corpus");
        let held_out: String = corpus
            .lines()
            .rev()
            .take(4)
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(self.path("held-out.jsonl"), held_out).expect("held-out corpus");
        [
            "--set",
            "data.valid_blend=[{path: held-out.jsonl}]",
            "--set",
            "data.test_blend=[{path: held-out.jsonl}]",
            "--set",
            "data.split=100,0,0",
        ]
    }

    fn records(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.path("metrics.jsonl")).unwrap_or_default();
        text.lines()
            .map(|line| serde_json::from_str(line).expect("every JSONL line is JSON"))
            .collect()
    }

    /// (step, loss bits) of the training records.
    fn train_losses(&self) -> Vec<(u64, u64)> {
        self.records()
            .iter()
            .filter(|r| r["kind"] == "train")
            .map(|r| {
                let loss = r["loss"].as_f64().expect("loss is a number");
                (r["step"].as_u64().expect("step"), loss.to_bits())
            })
            .collect()
    }

    fn manifest(&self, folder: &str) -> Value {
        let text = std::fs::read_to_string(self.path("ckpt").join(folder).join("manifest.json"))
            .expect("manifest exists");
        serde_json::from_str(&text).expect("manifest is JSON")
    }
}

fn assert_success(output: &Output) {
    assert!(
        output.status.success(),
        "recipe run failed:\n{}",
        stderr(output)
    );
}

fn committed(fixture: &Fixture) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(fixture.path("ckpt"))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.path().join("COMMITTED").is_file())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Wait for `child` to exit, killing it after `limit`.
fn wait_with_limit(mut child: Child, limit: Duration) -> (std::process::ExitStatus, String) {
    let mut err = child.stderr.take().expect("stderr is piped");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = err.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait works") {
            return (status, reader.join().expect("reader thread"));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("recipe run did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_for(limit: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ready() {
        assert!(
            Instant::now() < deadline,
            "condition not reached within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn send_sigterm(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -TERM failed");
}

#[test]
fn run_writes_metrics_run_dir_and_checkpoints() {
    let fixture = Fixture::new("");
    let output = fixture.run(&["--run-dir", "run"]);
    assert_success(&output);
    let records = fixture.records();
    let train: Vec<&Value> = records.iter().filter(|r| r["kind"] == "train").collect();
    assert_eq!(train.len(), 6, "one record per logged step");
    for (i, record) in train.iter().enumerate() {
        assert_eq!(record["step"], i as u64 + 1);
        for field in [
            "loss",
            "lr",
            "grad_norm",
            "tokens_per_second",
            "step_seconds",
        ] {
            let value = record[field].as_f64().unwrap_or(f64::NAN);
            assert!(value.is_finite(), "{field} in {record}");
        }
        // A CPU rank has only the planner's nominal peak: no utilisation is claimed.
        assert!(record.get("mfu").is_none(), "no MFU on the CPU: {record}");
    }
    let evals: Vec<u64> = records
        .iter()
        .filter(|r| r["kind"] == "eval")
        .map(|r| {
            assert!(r["eval_loss"].as_f64().is_some_and(f64::is_finite), "{r}");
            r["step"].as_u64().expect("step")
        })
        .collect();
    assert_eq!(evals, [3, 6]);
    assert!(fixture.path("run/plan.json").is_file());
    assert!(fixture.path("run/recipe.yaml").is_file());
    // interval 3 and the end: iterations 3 and 6, both kept (keep_last 2)
    assert_eq!(committed(&fixture), ["iter_0000003", "iter_0000006"]);
    let manifest = fixture.manifest("iter_0000006");
    assert_eq!(manifest["iteration"], 6);
    assert_eq!(manifest["consumed_samples"], 24);
    for file in [
        "model.safetensors",
        "optimizer.safetensors",
        "plan.json",
        "recipe.yaml",
    ] {
        assert!(
            fixture.path("ckpt/iter_0000006").join(file).is_file(),
            "{file}"
        );
    }

    // `recipe sample` from the checkpoint directory: deterministic for a seed.
    let sample = |seed: &str| {
        let output = fixture
            .command("sample")
            .args([
                "ckpt",
                "--prompt",
                "ROMEO:",
                "--max-tokens",
                "8",
                "--seed",
                seed,
            ])
            .output()
            .expect("sample runs");
        assert!(
            output.status.success(),
            "sample failed: {}",
            stderr(&output)
        );
        String::from_utf8(output.stdout).expect("utf-8")
    };
    let first = sample("3");
    assert!(first.starts_with("ROMEO:"), "{first}");
    assert_eq!(first, sample("3"));
}

/// A format-1 recipe (`decay_iters` counted after warmup) migrated by `recipe migrate` trains
/// with format 1's rates, each iteration at Megatron's position (iteration − 1): warmup 2 and
/// decay 3 end the decay at iteration 5 counted from the start.
#[test]
fn a_migrated_format_1_schedule_trains_with_its_old_rates() {
    let fixture = Fixture::new("");
    let text = std::fs::read_to_string(fixture.path("recipe.yaml")).expect("recipe");
    let v1 = text.replacen("version: 2", "version: 1", 1).replace(
        "    decay: cosine\n    warmup_iters: 1\n",
        "    decay: linear\n    warmup_iters: 2\n    decay_iters: 3\n",
    );
    assert!(
        v1.contains("decay_iters: 3"),
        "the fixture's schedule changed"
    );
    std::fs::write(fixture.path("recipe.yaml"), &v1).expect("write");
    assert_eq!(
        fixture.run(&[]).status.code(),
        Some(1),
        "format 1 is refused"
    );
    let migrated = fixture
        .command("migrate")
        .args(["--write", "recipe.yaml"])
        .output()
        .expect("migrate runs");
    assert_success(&migrated);
    let text = std::fs::read_to_string(fixture.path("recipe.yaml")).expect("recipe");
    assert!(
        text.contains("version: 2") && text.contains("    decay_iters: 5\n"),
        "{text}"
    );
    assert_success(&fixture.run(&[]));
    let rates: Vec<f64> = fixture
        .records()
        .iter()
        .filter_map(|r| r.get("lr").and_then(Value::as_f64))
        .collect();
    // Format 1's rate at position p: warmup to 0.003 over 2, linear to 0 over the next 3.
    let format_1 = |p: f64| {
        if p <= 2.0 {
            0.003 * p / 2.0
        } else {
            0.003 * (1.0 - (p - 2.0) / 3.0)
        }
    };
    let expected: Vec<f64> = (1..=6).map(|k| format_1(f64::from(k) - 1.0)).collect();
    assert_eq!(rates.len(), expected.len(), "{rates:?}");
    for (ours, theirs) in rates.iter().zip(&expected) {
        assert!(
            (ours - theirs).abs() <= 1e-15,
            "{rates:?} against {expected:?}"
        );
    }
}

#[test]
fn resumed_run_is_bit_identical() {
    let straight = Fixture::new("");
    assert_success(&straight.run(&[]));

    let split = Fixture::new("");
    let first = split.run(&["--exit-interval", "3"]);
    assert_success(&first);
    assert!(
        stderr(&first).contains("stopped at the exit interval at iteration 3"),
        "{}",
        stderr(&first)
    );
    assert_eq!(committed(&split), ["iter_0000003"]);
    let second = split.run(&[]);
    assert_success(&second);
    assert!(
        stderr(&second).contains("resumed from"),
        "{}",
        stderr(&second)
    );

    let expected = straight.train_losses();
    assert_eq!(expected.len(), 6);
    assert_eq!(split.train_losses(), expected, "losses differ after resume");
}

#[test]
fn sigterm_finishes_the_step_saves_and_exits_zero() {
    let fixture = Fixture::new("");
    let child = fixture.spawn(&[
        "--set",
        "training.train_iters=100000",
        "--set",
        "training.eval_interval=0",
    ]);
    wait_for(Duration::from_secs(120), || {
        !fixture.train_losses().is_empty()
    });
    send_sigterm(&child);
    let (status, err) = wait_with_limit(child, Duration::from_secs(120));
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(err.contains("stop requested (signal)"), "{err}");
    let saved = committed(&fixture);
    let last = saved.last().expect("a checkpoint was committed");
    let iteration = fixture.manifest(last)["iteration"]
        .as_u64()
        .expect("iteration");
    let logged = fixture.train_losses().last().map(|(step, _)| *step);
    assert_eq!(
        Some(iteration),
        logged,
        "the checkpoint is the last finished step"
    );
}

#[test]
fn non_finite_loss_stops_with_a_clear_error_and_saves_nothing() {
    let fixture = Fixture::new("");
    let output = fixture.run(&[&DIVERGE[..], &["--set", "checkpoint.interval=1000"]].concat());
    assert_eq!(
        output.status.code(),
        Some(3),
        "diverged has its own exit code: {}",
        stderr(&output)
    );
    let err = stderr(&output);
    assert!(err.contains("iteration 2: the loss is NaN"), "{err}");
    assert!(err.contains("before the optimizer step"), "{err}");
    assert!(committed(&fixture).is_empty(), "nothing may be saved");
}

/// A run's provenance and its checkpoints name the recipe by one hash.
#[test]
fn run_and_checkpoint_manifests_agree_on_the_recipe_hash() {
    let fixture = Fixture::new("");
    assert_success(&fixture.run(&["--set", "training.train_iters=2"]));
    // `checkpoint.dir: ckpt` has no parent, so the run directory is runs/<name>/
    let runs = std::fs::read_dir(fixture.path("runs")).expect("the runs folder");
    let run_dir = runs
        .map(|entry| entry.expect("an entry").path())
        .next()
        .expect("one run directory");
    let run: Value = serde_json::from_str(
        &std::fs::read_to_string(run_dir.join("manifest.json")).expect("the run manifest"),
    )
    .expect("JSON");
    let saved = committed(&fixture);
    let checkpoint = fixture.manifest(saved.last().expect("a checkpoint"));
    let hash = run["recipe_hash"].as_str().expect("a recipe hash");
    assert_eq!(hash.len(), 64, "{hash}");
    assert_eq!(checkpoint["recipe_hash"].as_str(), Some(hash));
}

/// The exit-code table (README, `recipe` command): 1 an invalid recipe, 2 unreadable input or
/// bad usage; 0 and 3 are checked by the runs above.
#[test]
fn run_exit_codes_follow_the_table() {
    let fixture = Fixture::new("");
    let missing = fixture
        .command("run")
        .arg("no-such-recipe.yaml")
        .output()
        .expect("the recipe binary runs");
    assert_eq!(missing.status.code(), Some(2), "{}", stderr(&missing));
    let invalid = fixture.run(&["--set", "training.train_iters=-4"]);
    assert_eq!(invalid.status.code(), Some(1), "{}", stderr(&invalid));
    let usage = fixture
        .command("run")
        .args(["recipe.yaml", "--no-such-flag"])
        .output()
        .expect("the recipe binary runs");
    assert_eq!(usage.status.code(), Some(2), "{}", stderr(&usage));
}

#[test]
fn missing_data_fails_before_training_naming_the_recipe_key() {
    let fixture = Fixture::new("");
    let output = fixture.run(&["--set", "data.blend.0.path=corpus.json"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(
        err.contains("`data.blend.0.path`: `corpus.json` does not exist"),
        "{err}"
    );
    assert!(err.contains("did you mean `corpus.jsonl`?"), "{err}");
    assert!(!err.contains("os error"), "{err}");
    assert!(!fixture.path("metrics.jsonl").exists(), "nothing trained");
}

#[test]
fn the_summary_names_each_loss_as_the_logs_and_metrics_do() {
    let fixture = Fixture::new("");
    let output = fixture.run(&["--set", "training.log_interval=3"]);
    assert_success(&output);
    let err = stderr(&output);
    let last = fixture
        .records()
        .into_iter()
        .rfind(|r| r["kind"] == "train")
        .expect("a train record");
    let interval = last["loss"].as_f64().expect("loss");
    assert!(err.contains("last-step loss "), "{err}");
    assert!(
        err.contains(&format!(
            "interval loss {interval:.4} (mean of the last 3 steps)"
        )),
        "{err}"
    );
    assert!(
        err.contains("interval loss") && err.contains("(mean of 3)"),
        "{err}"
    );
}

#[test]
fn separate_validation_and_test_data_with_a_test_evaluation_at_the_end() {
    let fixture = Fixture::new("");
    let output = fixture.run(&fixture.held_out_data());
    assert_success(&output);
    let records = fixture.records();
    let tests: Vec<&Value> = records.iter().filter(|r| r["kind"] == "test").collect();
    assert_eq!(tests.len(), 1, "one test evaluation, at the end");
    assert_eq!(tests[0]["step"], 6);
    let test_loss = tests[0]["test_loss"].as_f64().expect("test_loss");
    assert!(test_loss.is_finite());
    assert!(
        records.iter().any(|r| r["kind"] == "eval"),
        "validation ran on valid_blend though the split gives it no share"
    );
    assert!(
        stderr(&output).contains(&format!("test loss {test_loss:.4}")),
        "{}",
        stderr(&output)
    );
    let missing = fixture.run(&["--dry-run", "--set", "data.test_blend=[{path: nope.jsonl}]"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        stderr(&missing).contains("`data.test_blend.0.path`"),
        "{}",
        stderr(&missing)
    );
}

#[test]
fn dry_run_plans_and_checks_files_but_trains_nothing() {
    let fixture = Fixture::new("");
    let output = fixture.run(&["--dry-run"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("run run-test:"),
        "{}",
        stderr(&output)
    );
    assert!(!fixture.path("metrics.jsonl").exists(), "nothing trained");
    assert!(!fixture.path("ckpt").exists(), "nothing saved");
    let missing = fixture.run(&["--dry-run", "--set", "data.blend.0.path=corpus.json"]);
    assert_eq!(missing.status.code(), Some(1), "{}", stderr(&missing));
}

#[test]
fn checkpoint_of_another_model_is_refused_with_the_fields() {
    let fixture = Fixture::new("");
    assert_success(&fixture.run(&[
        "--set",
        "training.train_iters=2",
        "--set",
        "model.hidden_size=32",
    ]));
    let output = fixture.run(&["--set", "training.train_iters=4"]);
    assert_eq!(output.status.code(), Some(1));
    let err = stderr(&output);
    assert!(err.contains("was written for a different model"), "{err}");
    let fields: Vec<&str> = err
        .lines()
        .skip_while(|line| !line.contains("was written for a different model"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .collect();
    insta::assert_snapshot!("run_mismatched_checkpoint_fields", fields.join("\n"));
}

#[test]
fn prometheus_metrics_are_served_during_the_run() {
    let fixture = Fixture::new("");
    let mut child = fixture.spawn(&[
        "--set",
        "logging.prometheus={port: 0}",
        "--set",
        "training.train_iters=100000",
        "--set",
        "training.eval_interval=0",
    ]);
    let stderr = child.stderr.take().expect("stderr is piped");
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(address) = line.split("prometheus metrics at http://").nth(1) {
                let _ = sender.send(address.trim_end_matches("/metrics").to_owned());
            }
        }
    });
    let address = receiver
        .recv_timeout(Duration::from_secs(120))
        .expect("the exporter address is printed");
    assert!(address.starts_with("127.0.0.1:"), "{address}");
    wait_for(Duration::from_secs(120), || {
        !fixture.train_losses().is_empty()
    });
    let body = scrape(&address);
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    for metric in [
        "ferrotron_iteration",
        "ferrotron_train_loss",
        "ferrotron_learning_rate",
        "ferrotron_grad_norm",
        "ferrotron_tokens_per_second",
        "ferrotron_mfu_ratio",
        "ferrotron_step_seconds",
        "ferrotron_memory_bytes",
        "ferrotron_steps_total",
        "ferrotron_tokens_total",
        "ferrotron_samples_total",
        "ferrotron_build_info",
    ] {
        assert!(body.contains(metric), "{metric} missing from\n{body}");
    }
    assert!(
        !body.contains("ferrotron_eval_loss"),
        "no evaluation ran, so no eval series:\n{body}"
    );
    let loss_line = body
        .lines()
        .find(|l| l.starts_with("ferrotron_train_loss{"))
        .expect("a train loss sample");
    assert!(
        loss_line.contains(r#"run="run-test""#) && loss_line.contains(r#"rank="0""#),
        "{loss_line}"
    );
    let mfu_line = body
        .lines()
        .find(|l| l.starts_with("ferrotron_mfu_ratio{"))
        .expect("an MFU sample");
    assert!(mfu_line.ends_with(" NaN"), "no MFU on the CPU: {mfu_line}");
}

fn scrape(address: &str) -> String {
    let mut stream = TcpStream::connect(address).expect("the exporter accepts");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout sets");
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .expect("request sends");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .expect("response reads");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
}

#[test]
fn burn_cuda_without_its_cargo_feature_is_refused() {
    if cfg!(feature = "burn-cuda") {
        return;
    }
    let fixture = Fixture::new("");
    let output = fixture.run(&["--backend", "burn-cuda"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("--features burn-cuda"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn cuda_without_a_gpu_fails_naming_the_device() {
    if ferrotron_cuda::device_count().unwrap_or(0) > 0 {
        return; // a GPU is here: the GPU scripts under tools/ cover training on it
    }
    let fixture = Fixture::new("");
    let output = fixture.run(&["--backend", "cuda"]);
    assert_eq!(output.status.code(), Some(1), "a missing GPU fails the run");
    assert!(
        stderr(&output).contains("opening CUDA device 0"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn fp8_on_the_cpu_backend_is_refused_before_training() {
    let fixture = Fixture::new("");
    // a head of 16 channels: the fp8 GEMM shapes are valid, only the backend is not
    let output = fixture.run(&[
        "--set",
        "precision.fp8=hybrid",
        "--set",
        "precision.dtype=bf16",
        "--set",
        "model.num_attention_heads=1",
    ]);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{err}");
    // The plan of a CPU run says so, at the key; the runtime's own refusal (a backend or GPU
    // without fp8 GEMMs, `ferrotron_train`'s fp8 tests) stands behind it.
    assert!(
        err.contains("precision::fp8-needs-hardware")
            && err.contains("cpu has no fp8 tensor cores"),
        "{err}"
    );
    assert!(committed(&fixture).is_empty(), "nothing was trained");
}

// ---------------------------------------------------------------------------------------------
// Hostile input and damaged state (issue 19)

/// The one model shard file of a checkpoint folder.
fn model_shard(fixture: &Fixture, folder: &str) -> PathBuf {
    std::fs::read_dir(fixture.path("ckpt").join(folder))
        .expect("checkpoint folder")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            name.starts_with("model") && name.ends_with(".safetensors")
        })
        .expect("a model shard")
}

/// Zeroes `len` bytes in the middle of `path`, keeping its size (what a bad disk or a torn copy
/// leaves, and what the size check cannot see).
fn zero_middle(path: &Path, len: usize) {
    let mut bytes = std::fs::read(path).expect("read");
    let start = bytes.len() / 2 - len / 2;
    bytes[start..start + len].iter_mut().for_each(|b| *b = 0);
    std::fs::write(path, bytes).expect("write");
}

fn run_manifest(fixture: &Fixture) -> Value {
    let text = std::fs::read_to_string(fixture.path("runs/run-test/manifest.json"))
        .expect("run manifest exists");
    serde_json::from_str(&text).expect("run manifest is JSON")
}

#[test]
fn a_damaged_checkpoint_is_named_and_the_one_before_resumes() {
    let fixture = Fixture::new("");
    assert_success(&fixture.run(&[]));
    assert_eq!(committed(&fixture), ["iter_0000003", "iter_0000006"]);
    let shard = model_shard(&fixture, "iter_0000006");
    zero_middle(&shard, 4096);
    let output = fixture.run(&["--set", "training.train_iters=9"]);
    assert_success(&output);
    let err = stderr(&output);
    let file = shard.file_name().and_then(|n| n.to_str()).expect("name");
    assert!(err.contains(&format!("{file} is damaged")), "{err}");
    assert!(
        err.contains("resuming from the newest intact checkpoint") && err.contains("iter_0000003"),
        "{err}"
    );
    // The steps the first run logged after iteration 3 were replayed: each is in the file once.
    let steps: Vec<u64> = fixture.train_losses().iter().map(|(s, _)| *s).collect();
    assert_eq!(steps, (1..=9).collect::<Vec<_>>());
}

#[test]
fn checkpoint_verify_false_skips_the_checksums() {
    let fixture = Fixture::new("");
    assert_success(&fixture.run(&[]));
    zero_middle(&model_shard(&fixture, "iter_0000006"), 64);
    let output = fixture.run(&[
        "--set",
        "training.train_iters=7",
        "--set",
        "checkpoint.verify=false",
    ]);
    assert_success(&output);
    let err = stderr(&output);
    assert!(!err.contains("damaged"), "{err}");
    assert!(
        err.contains("iter_0000006"),
        "resumed from the newest: {err}"
    );
}

#[test]
fn a_plan_that_does_not_fit_is_refused_before_allocating() {
    let fixture = Fixture::new("");
    let big = [
        "--set",
        "model.hidden_size=16384",
        "--set",
        "model.num_attention_heads=128",
        "--set",
        "model.num_layers=64",
    ];
    let output = fixture.run(&big);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(err.contains("the plan does not fit"), "{err}");
    assert!(
        err.contains("GiB available") && err.contains("--force"),
        "{err}"
    );
    assert!(committed(&fixture).is_empty());
    assert!(!fixture.path("runs/run-test/manifest.json").exists());
}

#[test]
fn token_ids_past_the_vocabulary_fail_the_run_before_training() {
    let fixture = Fixture::new("");
    let output = fixture.run(&["--set", "model.vocab_size=1000"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(err.contains("_text_document.bin: token id"), "{err}");
    assert!(
        err.contains("outside the model's vocabulary of 1000"),
        "{err}"
    );
    assert!(
        !err.contains("finished at step"),
        "no contradictory closing line: {err}"
    );
    let manifest = run_manifest(&fixture);
    assert_eq!(manifest["status"], "failed");
    assert_eq!(manifest["exit_code"], 1);
    let message = manifest["error"].as_str().expect("the error is recorded");
    assert!(message.contains("vocabulary of 1000"), "{message}");
}

#[test]
fn validate_checks_the_token_ids_of_data_files_that_exist() {
    let fixture = Fixture::new("");
    let gpt2 = repo().join("recipes/data/gpt2");
    let preprocess = fixture
        .command("preprocess")
        .args(["--input", "corpus.jsonl", "--output-prefix", "corpus", "-q"])
        .arg("--vocab-file")
        .arg(gpt2.join("vocab.json"))
        .arg("--merge-file")
        .arg(gpt2.join("merges.txt"))
        .output()
        .expect("preprocess runs");
    assert_success(&preprocess);
    let validate = |vocab: &str| {
        fixture
            .command("validate")
            .args(["recipe.yaml", "--format", "json"])
            .args(["--set", "data.blend.0.path=corpus_text_document"])
            .args(["--set", &format!("model.vocab_size={vocab}")])
            .output()
            .expect("validate runs")
    };
    assert_success(&validate("50257"));
    let refused = validate("1000");
    assert_eq!(refused.status.code(), Some(1));
    let out = String::from_utf8_lossy(&refused.stdout);
    assert!(
        out.contains("data::vocabulary") && out.contains("vocabulary of 1000"),
        "{out}"
    );
}

#[test]
fn an_unreadable_tokenizer_is_exit_2_for_plan_and_run() {
    let fixture = Fixture::new("");
    for command in ["plan", "run"] {
        let output = fixture
            .command(command)
            .args([
                "recipe.yaml",
                "--set",
                "data.tokenizer.vocab_file=missing.json",
            ])
            .output()
            .expect("the recipe binary runs");
        assert_eq!(
            output.status.code(),
            Some(2),
            "{command}: {}",
            stderr(&output)
        );
    }
}

#[test]
fn a_bad_jsonl_line_during_run_offers_what_run_accepts() {
    let fixture = Fixture::new("");
    let mut corpus = std::fs::read_to_string(fixture.path("corpus.jsonl")).expect("corpus");
    corpus.push_str("{\"text\": \"unclosed\n");
    std::fs::write(fixture.path("corpus.jsonl"), corpus).expect("write");
    let output = fixture.run(&[]);
    assert_eq!(output.status.code(), Some(1));
    let err = stderr(&output);
    assert!(err.contains("corpus.jsonl:13:"), "{err}");
    assert!(err.contains("recipe preprocess --input"), "{err}");
    assert!(!err.contains("(pass --skip-bad-lines"), "{err}");
}

#[test]
fn sample_refuses_a_temperature_that_is_not_a_number() {
    let fixture = Fixture::new("");
    for temperature in ["nan", "inf", "-1"] {
        let output = fixture
            .command("sample")
            .args(["ckpt", "--prompt", "ROMEO:"])
            .arg(format!("--temperature={temperature}"))
            .output()
            .expect("the recipe binary runs");
        assert_eq!(output.status.code(), Some(2), "{temperature}");
        assert!(stderr(&output).contains("not a finite number of 0 or more"));
    }
}

/// The newest committed checkpoint's iteration (0 for none).
fn newest_iteration(fixture: &Fixture) -> u64 {
    committed(fixture)
        .last()
        .and_then(|name| name.strip_prefix("iter_")?.parse().ok())
        .unwrap_or(0)
}

/// The arguments of the SIGKILL tests: a checkpoint every step, synchronous or asynchronous.
fn checkpoint_every_step(async_save: bool) -> Vec<String> {
    [
        "training.train_iters=12".to_owned(),
        "checkpoint.interval=1".to_owned(),
        "training.eval_interval=0".to_owned(),
        format!("checkpoint.async_save={async_save}"),
    ]
    .into_iter()
    .flat_map(|set| ["--set".to_owned(), set])
    .collect()
}

#[test]
fn sigkill_right_after_checkpoints_resumes_bit_identically() {
    sigkill_right_after_checkpoints(false);
}

#[test]
fn sigkill_right_after_async_checkpoints_resumes_bit_identically() {
    sigkill_right_after_checkpoints(true);
}

fn sigkill_right_after_checkpoints(async_save: bool) {
    let args = checkpoint_every_step(async_save);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let straight = Fixture::new("");
    assert_success(&straight.run(&args));

    let killed = Fixture::new("");
    let mut kills = 0;
    for _ in 0..3 {
        let before = newest_iteration(&killed);
        let mut child = killed.spawn(&args);
        // SIGKILL as soon as this run has committed a checkpoint of its own: the process is then
        // anywhere in the next step, its metrics row or its next checkpoint write.
        wait_for(Duration::from_secs(120), || {
            newest_iteration(&killed) > before || child.try_wait().ok().flatten().is_some()
        });
        if child.try_wait().expect("wait works").is_none() {
            child.kill().expect("SIGKILL");
            kills += 1;
        }
        let _ = child.wait();
    }
    assert_eq!(kills, 3, "a run finished before it could be killed");
    assert_success(&killed.run(&args));
    assert_eq!(
        killed.train_losses(),
        straight.train_losses(),
        "after {kills} SIGKILLs the losses differ from an uninterrupted run"
    );
}

/// The entries of the checkpoint folder's temporary (uncommitted) folders, by name.
fn temp_folders(fixture: &Fixture) -> Vec<(String, usize)> {
    let Ok(entries) = std::fs::read_dir(fixture.path("ckpt")) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let files = std::fs::read_dir(e.path()).ok()?.count();
            name.starts_with(".tmp-iter_").then_some((name, files))
        })
        .collect()
}

#[test]
fn sigkill_in_the_middle_of_checkpoint_writes_resumes_bit_identically() {
    sigkill_in_the_middle_of_checkpoint_writes(false);
}

#[test]
fn sigkill_in_the_middle_of_async_checkpoint_writes_resumes_bit_identically() {
    sigkill_in_the_middle_of_checkpoint_writes(true);
}

fn sigkill_in_the_middle_of_checkpoint_writes(async_save: bool) {
    let args = checkpoint_every_step(async_save);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let straight = Fixture::new("");
    assert_success(&straight.run(&args));
    let files_per_checkpoint = std::fs::read_dir(straight.path("ckpt/iter_0000012"))
        .expect("the last checkpoint exists")
        .count();

    // Each attempt waits until a new temporary checkpoint folder holds `n` files (n cycles from
    // an empty folder to one that only lacks its rename) and kills the run at once. What is left
    // on disk after the process is gone says where the kill landed: a temporary folder still
    // there was killed mid-write, since only the commit's rename removes it.
    let killed = Fixture::new("");
    let mut phases = std::collections::BTreeSet::new();
    let mut mid_write = 0;
    for attempt in 0..16 {
        if mid_write >= 4 && phases.len() >= 3 {
            break;
        }
        let files_before_kill = attempt % files_per_checkpoint;
        let leftovers: Vec<String> = temp_folders(&killed).into_iter().map(|(n, _)| n).collect();
        let mut child = killed.spawn(&args);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let writing = temp_folders(&killed)
                .into_iter()
                .any(|(name, files)| !leftovers.contains(&name) && files >= files_before_kill);
            if writing || child.try_wait().expect("wait works").is_some() {
                break;
            }
            assert!(Instant::now() < deadline, "no checkpoint write began");
            std::thread::yield_now();
        }
        let _ = child.kill();
        let _ = child.wait();
        for (name, files) in temp_folders(&killed) {
            if !leftovers.contains(&name) {
                mid_write += 1;
                phases.insert(files);
            }
        }
    }
    eprintln!("{mid_write} kills inside checkpoint writes, at {phases:?} files written");
    assert!(
        mid_write >= 4 && phases.len() >= 3,
        "only {mid_write} kills landed inside a checkpoint write, at {phases:?} files written"
    );
    assert_success(&killed.run(&args));
    assert_eq!(
        killed.train_losses(),
        straight.train_losses(),
        "after {mid_write} SIGKILLs inside checkpoint writes ({phases:?} files written) the \
         losses differ from an uninterrupted run"
    );
}

#[test]
fn a_panic_inside_a_step_ends_the_run_failed_with_its_message() {
    let fixture = Fixture::new("");
    // The fault point panics as an engine error inside an op would: burn's ops cannot return one.
    let output = fixture
        .command("run")
        .arg("recipe.yaml")
        .env("FAILPOINTS", "train-step=2*off->panic(an engine error)")
        .output()
        .expect("the recipe binary runs");
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(
        err.contains("error: the run panicked: an engine error"),
        "{err}"
    );
    assert!(!err.contains("finished at step"), "no closing line: {err}");
    let steps: Vec<u64> = fixture.train_losses().iter().map(|(s, _)| *s).collect();
    assert_eq!(steps, [1, 2], "the two steps before the panic are logged");
    let manifest = run_manifest(&fixture);
    assert_eq!(manifest["status"], "failed");
    assert_eq!(manifest["exit_code"], 1);
    assert_eq!(manifest["error"], "the run panicked: an engine error");
}

#[test]
fn a_run_whose_log_reader_goes_away_keeps_training_and_stops_cleanly() {
    let fixture = Fixture::new("");
    let mut child = fixture.spawn(&["--set", "training.train_iters=100000"]);
    // Read the brief, then close the pipe: every later log line meets a broken pipe.
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr is piped"));
    let mut line = String::new();
    stderr.read_line(&mut line).expect("the brief arrives");
    drop(stderr);
    let closed_at = fixture.train_losses().len();
    wait_for(Duration::from_secs(120), || {
        fixture.train_losses().len() >= closed_at + 3 || child.try_wait().ok().flatten().is_some()
    });
    assert!(
        child.try_wait().expect("wait works").is_none(),
        "the run ended when its stderr went away"
    );
    send_sigterm(&child);
    let status = child.wait().expect("the run exits");
    let last = fixture.train_losses().last().expect("steps were logged").0;
    assert!(status.success(), "{status}");
    assert_eq!(
        newest_iteration(&fixture),
        last,
        "the stop saved step {last}"
    );
    assert_eq!(run_manifest(&fixture)["status"], "stopped");
}

/// The TensorBoard tags and the metrics.jsonl fields they carry, by record kind (`mfu` too on a
/// GPU; these runs are on the CPU, which has none).
const TENSORBOARD_TAGS: [(&str, &str, &str); 12] = [
    ("train", "lm loss", "lm_loss"),
    ("train", "loss", "loss"),
    ("train", "learning-rate", "lr"),
    ("train", "grad-norm", "grad_norm"),
    ("train", "throughput/tokens_per_s", "tokens_per_second"),
    ("train", "throughput/tflops_per_gpu", "tflops_per_gpu"),
    ("train", "iteration-time", "step_seconds"),
    ("train", "memory/bytes", "memory_bytes"),
    ("eval", "validation loss", "eval_loss"),
    ("eval", "validation ppl", "eval_perplexity"),
    ("test", "test loss", "test_loss"),
    ("test", "test ppl", "test_perplexity"),
];

/// `tools/tb-read.py` on `dir`: TensorBoard's own event reader, as JSON.
fn read_tensorboard(dir: &Path) -> Value {
    let Ok(python_path) = std::env::var("FERROTRON_TENSORBOARD_PYTHONPATH") else {
        panic!(
            "FERROTRON_TENSORBOARD_PYTHONPATH is not set: this test reads the event files with the \
             `tensorboard` Python package; run tools/test.sh, which installs it, or \
             `python3 -m pip install --target DIR tensorboard` and set the variable to DIR"
        );
    };
    let output = Command::new("python3")
        .arg(repo().join("tools/tb-read.py"))
        .arg(dir)
        .env("PYTHONPATH", python_path)
        .output()
        .expect("python3 runs");
    assert!(
        output.status.success(),
        "tools/tb-read.py failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("tb-read.py prints JSON")
}

#[test]
#[ignore = "needs the tensorboard Python package: tools/test.sh installs it and runs this test"]
fn tensorboard_reads_the_same_scalars_as_metrics_jsonl_after_a_resume() {
    let fixture = Fixture::new("");
    let mut args = vec!["--set", "logging.tensorboard=tb"];
    args.extend(fixture.held_out_data());
    assert_success(&fixture.run(&args));
    // As if the process had died after logging step 6 but before committing its checkpoint: the
    // next run resumes from iteration 3 and logs steps 4 to 6 again, with other timings.
    std::fs::remove_dir_all(fixture.path("ckpt/iter_0000006")).expect("remove a checkpoint");
    let resumed = fixture.run(&args);
    assert_success(&resumed);
    assert!(
        stderr(&resumed).contains("resumed from"),
        "{}",
        stderr(&resumed)
    );

    let read = read_tensorboard(&fixture.path("tb"));
    assert_eq!(read["files"], 2, "one event file per run start: {read}");
    assert!(
        read["scalars"]["mfu"].is_null(),
        "no MFU on the CPU: {read}"
    );
    let records = fixture.records();
    for (kind, tag, field) in TENSORBOARD_TAGS {
        let expected: Vec<(u64, f32)> = records
            .iter()
            .filter(|r| r["kind"] == kind)
            .map(|r| {
                let value = r[field]
                    .as_f64()
                    .unwrap_or_else(|| panic!("{field} in {r}"));
                (r["step"].as_u64().expect("step"), value as f32)
            })
            .collect();
        assert!(!expected.is_empty(), "metrics.jsonl has no {field}");
        let got: Vec<(u64, f32)> = read["scalars"][tag]
            .as_array()
            .unwrap_or_else(|| panic!("TensorBoard has no `{tag}`: {read}"))
            .iter()
            .map(|point| {
                let step = point[0].as_u64().expect("step");
                (step, point[1].as_f64().expect("value") as f32)
            })
            .collect();
        // Steps 4 to 6 are in both files; TensorBoard keeps the resumed run's, as the JSONL does.
        assert_eq!(
            got, expected,
            "`{tag}` in TensorBoard against `{field}` in metrics.jsonl"
        );
    }
}

#[test]
fn an_unwritable_output_path_is_named_with_its_recipe_key() {
    let fixture = Fixture::new("");
    std::fs::write(fixture.path("a-file"), "not a directory").expect("write");
    for (set, expected) in [
        (
            "logging.jsonl=a-file/metrics.jsonl",
            "the metrics file (logging.jsonl)",
        ),
        (
            "logging.tensorboard=a-file/tb",
            "the TensorBoard log (logging.tensorboard)",
        ),
        (
            "checkpoint.dir=a-file/ckpt",
            "(--run-dir; by default the parent of checkpoint.dir",
        ),
    ] {
        let output = fixture.run(&["--set", set, "--set", "training.train_iters=2"]);
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{set}: {err}");
        assert!(err.contains(expected), "{set}: {err}");
        assert!(err.contains("a-file/"), "{set} names the path: {err}");
    }
}
