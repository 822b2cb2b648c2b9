//! Layout equivalence through the real `recipe` binary: a tiny GPT (and a tiny MoE) trained on
//! one rank and on N thread ranks (`recipe run --world-size N`) of a parallel layout must give
//! the same losses step by step, the same gradient norms and the same final weights; a run
//! saved under one layout and resumed under another must continue the one-rank curve.
//!
//! Every layout is also trained twice at the same moment (`deterministic::<layout>`): on the CPU
//! the same recipe, seed and layout must give bit-identical losses, gradient norms and
//! checkpoint bytes whatever the thread timing, so a difference between layouts is arithmetic,
//! never noise.
//!
//! The fixtures (tests/fixtures/parallel/) are sized so every layout divides them and so the
//! padded vocabulary is the same for tp 1 and 2. Each test trains its own one-rank reference:
//! tests run as separate processes, and the reference costs less than a second.
//!
//! # Tolerances, and why they are not zero
//!
//! The parallel runs do the same arithmetic as the one-rank run, split up, but not always in
//! the same order: a row-parallel matmul adds tp partial sums instead of one long dot product,
//! data and context parallelism average the loss and the gradients of sub-batches instead of
//! accumulating microbatch by microbatch, vocabulary-parallel cross-entropy takes its max and
//! sums over pieces. fp32 addition is not associative, so results differ in the last bits
//! (relative ~1e-7 per operation), and training compounds that over steps. The tolerances sit
//! about 25× above the largest differences measured on these fixtures (every layout below, 6
//! steps), and far below what any real mistake does (a missing gradient reduction, a wrong
//! shard or scale, a dropped microbatch change the loss or the norm in the 4th digit or earlier;
//! expert gradients scaled 2× moved the norm by 1.3e-4):
//!
//! - losses (`loss`, `lm_loss`) and gradient norms: |a − b| ≤ 1e-5 · max(1, |a|) at every step
//!   ([`LOSS_RTOL`]); measured ≤ 4e-8 for losses, ≤ 4e-7 for norms (the norm sums squares of
//!   every gradient element in another order on every layout);
//! - final weights: |a − b| ≤ 5e-5 + 1e-4 · |a| element-wise ([`WEIGHT_ATOL`],
//!   [`WEIGHT_RTOL`]); measured ≤ 2.2e-6 (tp2·cp2·pp2), ≤ 5e-7 without tensor parallelism. Adam
//!   divides by √v, so an element whose gradient is tiny moves by a visible fraction of lr even
//!   when its gradient differs only by rounding: weights need an absolute floor.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ferrotron_train::NamedTensor;
use ferrotron_train::checkpoint::{ShardKind, ShardedCheckpoint};
use serde_json::Value;

use crate::common::DIVERGE;

mod faults;

/// Relative tolerance of losses and gradient norms, per step (see the module docs).
const LOSS_RTOL: f64 = 1e-5;
/// Absolute part of the weight tolerance.
const WEIGHT_ATOL: f32 = 5e-5;
/// Relative part of the weight tolerance.
const WEIGHT_RTOL: f32 = 1e-4;
/// Iterations every fixture trains.
const STEPS: u64 = 6;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parallel")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Model {
    Gpt,
    Moe,
}

impl Model {
    fn recipe(self) -> &'static str {
        match self {
            Model::Gpt => "gpt.yaml",
            Model::Moe => "moe.yaml",
        }
    }
}

/// A layout: the world size and the recipe overrides that ask for it.
#[derive(Debug, Clone, Copy)]
struct Layout {
    world: u32,
    set: &'static [&'static str],
}

const ONE_RANK: Layout = Layout { world: 1, set: &[] };

/// One step's record from the metrics JSONL.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Step {
    loss: f64,
    lm_loss: f64,
    grad_norm: f64,
}

/// A run directory: a private copy of the fixtures, where `recipe run` is started.
struct RunDir {
    dir: tempfile::TempDir,
    model: Model,
}

impl RunDir {
    fn new(model: Model) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        for file in [model.recipe(), "tokenizer.json", "corpus.jsonl"] {
            std::fs::copy(fixtures().join(file), dir.path().join(file))
                .unwrap_or_else(|e| panic!("copy fixture {file}: {e}"));
        }
        RunDir { dir, model }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The `recipe run` command for `layout`, extra arguments after it, with the caller's
    /// launcher and Ferrotron variables removed (they would change the world or the recipe).
    fn command(&self, layout: Layout, extra: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_recipe"));
        command
            .current_dir(self.path())
            .args(["run", self.model.recipe(), "--backend", "cpu"])
            .args(["--world-size", &layout.world.to_string()]);
        for set in layout.set {
            command.args(["--set", set]);
        }
        command.args(extra);
        for (key, _) in std::env::vars() {
            if key.starts_with("FERROTRON_")
                || key == "RUST_LOG"
                || key.starts_with("SLURM_")
                || [
                    "RANK",
                    "WORLD_SIZE",
                    "LOCAL_RANK",
                    "MASTER_ADDR",
                    "MASTER_PORT",
                ]
                .contains(&key.as_str())
            {
                command.env_remove(key);
            }
        }
        command
    }

    /// `recipe run` with `layout`; extra arguments after it. Panics with the output on failure.
    fn run(&self, layout: Layout, extra: &[&str]) -> Output {
        let output = self
            .command(layout, extra)
            .output()
            .expect("the recipe binary runs");
        self.check(layout, &output);
        output
    }

    fn check(&self, layout: Layout, output: &Output) {
        assert!(
            output.status.success(),
            "recipe run {} --world-size {} {:?} failed:\n{}",
            self.model.recipe(),
            layout.world,
            layout.set,
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// The metrics file's lines (none before the first run).
    fn metric_lines(&self) -> Vec<String> {
        std::fs::read_to_string(self.path().join("metrics.jsonl"))
            .map(|text| text.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// The training records of the metrics file by step (a resumed run's later lines win).
    fn steps(&self) -> BTreeMap<u64, Step> {
        train_records(&self.metric_lines())
    }

    /// The global parameters of the checkpoint at `iteration`, assembled from its shards.
    fn weights(&self, iteration: u64) -> HashMap<String, NamedTensor> {
        let folder = self.path().join(format!("ckpt/iter_{iteration:07}"));
        let checkpoint = ShardedCheckpoint::open(&folder)
            .unwrap_or_else(|e| panic!("open {}: {e}", folder.display()));
        checkpoint
            .global_tensors(ShardKind::Model)
            .unwrap_or_else(|e| panic!("assemble {}: {e}", folder.display()))
    }

    /// blake3 of every safetensors file of the checkpoint at `iteration` (model and optimizer
    /// shards), by file name.
    fn checkpoint_hashes(&self, iteration: u64) -> BTreeMap<String, String> {
        let folder = self.path().join(format!("ckpt/iter_{iteration:07}"));
        let entries =
            std::fs::read_dir(&folder).unwrap_or_else(|e| panic!("list {}: {e}", folder.display()));
        let hashes: BTreeMap<String, String> = entries
            .map(|entry| entry.expect("a directory entry").path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "safetensors"))
            .map(|path| {
                let bytes =
                    std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
                let name = path.file_name().expect("a file name").to_string_lossy();
                (name.into_owned(), blake3::hash(&bytes).to_hex().to_string())
            })
            .collect();
        assert!(!hashes.is_empty(), "{} holds no tensors", folder.display());
        hashes
    }

    /// Runs `layout` as a world of processes on this machine, one rank each with torchrun's
    /// variables, `per_rank` adding to each rank's command; their outputs by rank, whatever
    /// their exit.
    fn torchrun_world(&self, layout: Layout, per_rank: impl Fn(u32, &mut Command)) -> Vec<Output> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port()
            .to_string();
        let size = layout.world.to_string();
        let children: Vec<_> = (0..layout.world)
            .map(|rank| {
                let mut command = self.command(layout, &[]);
                per_rank(rank, &mut command);
                let rank = rank.to_string();
                command
                    .envs([
                        ("RANK", rank.as_str()),
                        ("LOCAL_RANK", rank.as_str()),
                        ("WORLD_SIZE", size.as_str()),
                        ("LOCAL_WORLD_SIZE", size.as_str()),
                        ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", port.as_str()),
                    ])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("the recipe binary starts")
            })
            .collect();
        children
            .into_iter()
            .map(|child| child.wait_with_output().expect("the rank exits"))
            .collect()
    }

    fn manifest(&self, iteration: u64) -> Value {
        let path = self
            .path()
            .join(format!("ckpt/iter_{iteration:07}/manifest.json"));
        let text = std::fs::read_to_string(&path).expect("the checkpoint has a manifest");
        serde_json::from_str(&text).expect("the manifest is JSON")
    }
}

/// The training records among `lines` by step (later lines win).
fn train_records(lines: &[String]) -> BTreeMap<u64, Step> {
    let mut steps = BTreeMap::new();
    for line in lines {
        let record: Value = serde_json::from_str(line).expect("every JSONL line is JSON");
        if record["kind"] != "train" {
            continue;
        }
        let number = |key: &str| {
            record[key]
                .as_f64()
                .unwrap_or_else(|| panic!("{key} is a number in {record}"))
        };
        let step = record["step"].as_u64().expect("step is an integer");
        steps.insert(
            step,
            Step {
                loss: number("loss"),
                lm_loss: number("lm_loss"),
                grad_norm: number("grad_norm"),
            },
        );
    }
    steps
}

/// A finished run: its per-step records and final global weights.
struct Trained {
    steps: BTreeMap<u64, Step>,
    weights: HashMap<String, NamedTensor>,
}

fn train(model: Model, layout: Layout) -> (RunDir, Trained) {
    let run = RunDir::new(model);
    run.run(layout, &[]);
    let trained = Trained {
        steps: run.steps(),
        weights: run.weights(STEPS),
    };
    (run, trained)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= LOSS_RTOL * a.abs().max(1.0)
}

/// Every step of `reference` is in `candidate` and agrees within the tolerance.
fn assert_same_curve(what: &str, reference: &BTreeMap<u64, Step>, candidate: &BTreeMap<u64, Step>) {
    let steps: Vec<u64> = reference.keys().copied().collect();
    assert_eq!(steps, (1..=STEPS).collect::<Vec<_>>(), "reference steps");
    let got: Vec<u64> = candidate.keys().copied().collect();
    assert_eq!(got, steps, "{what}: logged steps");
    for (step, want) in reference {
        let have = candidate[step];
        for (field, a, b) in [
            ("loss", want.loss, have.loss),
            ("lm_loss", want.lm_loss, have.lm_loss),
            ("grad_norm", want.grad_norm, have.grad_norm),
        ] {
            assert!(
                close(a, b),
                "{what}: step {step} {field}: one rank {a}, parallel {b} (difference {:.3e})",
                (a - b).abs()
            );
        }
    }
}

fn assert_same_weights(
    what: &str,
    reference: &HashMap<String, NamedTensor>,
    candidate: &HashMap<String, NamedTensor>,
) {
    let mut names: Vec<&String> = reference.keys().collect();
    names.sort();
    let mut got: Vec<&String> = candidate.keys().collect();
    got.sort();
    assert_eq!(got, names, "{what}: the checkpoints hold different tensors");
    for name in names {
        let (want, have) = (&reference[name], &candidate[name]);
        assert_eq!(have.shape, want.shape, "{what}: {name} shape");
        let worst = want
            .values
            .iter()
            .zip(&have.values)
            .map(|(a, b)| ((a - b).abs(), *a, *b))
            .filter(|(d, a, _)| *d > WEIGHT_ATOL + WEIGHT_RTOL * a.abs())
            .max_by(|x, y| x.0.total_cmp(&y.0));
        if let Some((diff, a, b)) = worst {
            panic!("{what}: {name}: one rank {a}, parallel {b} (difference {diff:.3e})");
        }
    }
}

/// Train `layout` twice, both runs at the same time (thread ranks of two processes competing
/// for the cores, so every run sees other timings): the two must agree bit for bit — every
/// step's loss, LM loss and gradient norm, and every byte of the final checkpoint's tensors
/// (model and optimizer).
fn train_twice(what: &str, model: Model, layout: Layout) {
    let runs = [RunDir::new(model), RunDir::new(model)];
    let children: Vec<_> = runs
        .iter()
        .map(|run| {
            run.command(layout, &[])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("the recipe binary starts")
        })
        .collect();
    for (run, child) in runs.iter().zip(children) {
        let output = child.wait_with_output().expect("the recipe binary runs");
        run.check(layout, &output);
    }
    let [first, second] = runs;
    let (steps, again) = (first.steps(), second.steps());
    assert_eq!(steps.len(), STEPS as usize, "{what}: every step is logged");
    for (step, a) in &steps {
        assert_eq!(
            Some(a),
            again.get(step),
            "{what}: step {step} differs between two runs of the same layout and seed"
        );
    }
    assert_eq!(
        first.checkpoint_hashes(STEPS),
        second.checkpoint_hashes(STEPS),
        "{what}: the final checkpoints of two runs of the same layout and seed differ"
    );
}

/// Train `model` on one rank and on `layout`; losses, norms and final weights must agree.
fn check_equivalent(what: &str, model: Model, layout: Layout) {
    let (_reference_dir, reference) = train(model, ONE_RANK);
    let (run, parallel) = train(model, layout);
    assert_same_curve(what, &reference.steps, &parallel.steps);
    assert_same_weights(what, &reference.weights, &parallel.weights);
    // Rank 0 records the world it ran in.
    let manifest = run.manifest(STEPS);
    assert_eq!(manifest["layout"]["world_size"], layout.world, "{what}");
}

/// Every layout of the suite, as two tests each: `equivalent::<name>` (one rank against the
/// layout, within the tolerances) and `deterministic::<name>` (the layout against itself, bit for
/// bit, two runs at once).
macro_rules! layouts {
    ($($name:ident: $model:expr, $what:literal, $layout:expr;)*) => {
        mod equivalent {
            use super::*;
            $(#[test]
            fn $name() {
                check_equivalent($what, $model, $layout);
            })*
        }
        mod deterministic {
            use super::*;
            $(#[test]
            fn $name() {
                train_twice($what, $model, $layout);
            })*
        }
    };
}

layouts! {
    gpt_tp2: Model::Gpt, "tp2",
        Layout { world: 2, set: &["parallel.tensor=2"] };
    gpt_tp2_sequence_parallel: Model::Gpt, "tp2+sp",
        Layout { world: 2, set: &["parallel.tensor=2", "parallel.sequence_parallel=true"] };
    gpt_pp2: Model::Gpt, "pp2",
        Layout { world: 2, set: &["parallel.pipeline=2"] };
    gpt_pp4_interleaved: Model::Gpt, "pp4 vpp2",
        Layout { world: 4, set: &["parallel.pipeline=4", "parallel.virtual_pipeline=2"] };
    gpt_dp2: Model::Gpt, "dp2",
        Layout { world: 2, set: &["parallel.data=2"] };
    gpt_dp2_distributed_optimizer: Model::Gpt, "dp2 + distributed optimizer",
        Layout { world: 2, set: &["parallel.data=2", "parallel.distributed_optimizer=true"] };
    gpt_cp2: Model::Gpt, "cp2",
        Layout { world: 2, set: &["parallel.context=2"] };
    moe_ep2: Model::Moe, "ep2",
        Layout { world: 2, set: &["parallel.expert=2"] };
    // MoE with tensor parallelism needs sequence parallelism (Megatron's rule).
    moe_ep2_etp2: Model::Moe, "ep2 + etp2",
        Layout { world: 4, set: &[
            "parallel.tensor=2", "parallel.sequence_parallel=true",
            "parallel.expert=2", "parallel.expert_tensor=2",
        ] };
    gpt_tp2_pp2_dp2: Model::Gpt, "tp2·pp2·dp2",
        Layout { world: 8, set: &["parallel.tensor=2", "parallel.pipeline=2", "parallel.data=2"] };
    gpt_tp2_cp2_pp2: Model::Gpt, "tp2·cp2·pp2",
        Layout { world: 8, set: &[
            "parallel.tensor=2", "parallel.context=2", "parallel.pipeline=2",
        ] };
    moe_ep4_dp2: Model::Moe, "ep4·dp2",
        Layout { world: 8, set: &["parallel.expert=4"] };
}

const TP2: Layout = Layout {
    world: 2,
    set: &["parallel.tensor=2"],
};
const TP2_PP2: Layout = Layout {
    world: 4,
    set: &["parallel.tensor=2", "parallel.pipeline=2"],
};
const TP1_DP4: Layout = Layout {
    world: 4,
    set: &["parallel.data=4"],
};
const TP2_DP2: Layout = Layout {
    world: 4,
    set: &["parallel.tensor=2", "parallel.data=2"],
};

/// Train `segments` in one run directory, each (layout, stop after this iteration) resuming
/// from the previous one's checkpoint with `checkpoint.resume: auto`; the stitched curve and
/// the final weights must be the uninterrupted one-rank run's.
fn check_resharded_resume(what: &str, segments: &[(Layout, u64)]) {
    check_resharded_resume_of(Model::Gpt, what, segments);
}

fn check_resharded_resume_of(model: Model, what: &str, segments: &[(Layout, u64)]) {
    let (_reference_dir, reference) = train(model, ONE_RANK);
    let run = RunDir::new(model);
    let mut steps = BTreeMap::new();
    let mut from = 0;
    for &(layout, until) in segments {
        let stop = until.to_string();
        let extra: Vec<&str> = if until < STEPS {
            vec!["--exit-interval", &stop]
        } else {
            Vec::new()
        };
        let before = run.metric_lines();
        run.run(layout, &extra);
        let after = run.metric_lines();
        // The segment's own lines: appended after the earlier ones, or a fresh file.
        let new_lines = if after.len() >= before.len() && after[..before.len()] == before[..] {
            &after[before.len()..]
        } else {
            &after[..]
        };
        let segment = train_records(new_lines);
        let logged: Vec<u64> = segment.keys().copied().collect();
        assert_eq!(
            logged,
            (from + 1..=until).collect::<Vec<_>>(),
            "{what}: the segment after iteration {from} must resume there and stop at {until}"
        );
        steps.extend(segment);
        assert_eq!(
            run.manifest(until)["layout"]["world_size"],
            layout.world,
            "{what}: checkpoint {until} records its layout"
        );
        from = until;
    }
    assert_same_curve(what, &reference.steps, &steps);
    assert_same_weights(what, &reference.weights, &run.weights(STEPS));
}

#[test]
fn resume_tp2_pp2_as_tp1_dp4() {
    check_resharded_resume("tp2·pp2 → tp1·dp4", &[(TP2_PP2, 3), (TP1_DP4, STEPS)]);
}

#[test]
fn resume_tp1_dp4_as_tp2_pp2() {
    check_resharded_resume("tp1·dp4 → tp2·pp2", &[(TP1_DP4, 3), (TP2_PP2, STEPS)]);
}

#[test]
fn resume_one_rank_into_four_and_back() {
    check_resharded_resume(
        "1 → tp2·dp2 → 1",
        &[(ONE_RANK, 2), (TP2_DP2, 4), (ONE_RANK, STEPS)],
    );
}

/// The distributed optimizer holds each moment as a flat slice of a data-parallel shard; its
/// checkpoints still hold moments per global tensor, in both directions.
#[test]
fn resume_distributed_optimizer_as_tp2_and_back() {
    const ZERO1: Layout = Layout {
        world: 2,
        set: &["parallel.data=2", "parallel.distributed_optimizer=true"],
    };
    check_resharded_resume(
        "dp2 + distributed optimizer → tp2 → dp2 + distributed optimizer",
        &[(ZERO1, 2), (TP2, 4), (ZERO1, STEPS)],
    );
}

/// Experts saved by their expert-parallel owners (global expert index in the name) come back on
/// one rank, and one rank's experts are split over ep4·dp2.
#[test]
fn resume_moe_ep2_as_one_rank_and_ep4_dp2() {
    check_resharded_resume_of(
        Model::Moe,
        "ep2 → 1 → ep4·dp2",
        &[
            (
                Layout {
                    world: 2,
                    set: &["parallel.expert=2"],
                },
                2,
            ),
            (ONE_RANK, 4),
            (
                Layout {
                    world: 8,
                    set: &["parallel.expert=4"],
                },
                STEPS,
            ),
        ],
    );
}

/// Pipeline stages hold layers under local paths; the checkpoint's global names are what let
/// a stage's layers come back as tensor-parallel shards.
#[test]
fn resume_pp2_as_tp2() {
    check_resharded_resume(
        "pp2 → tp2",
        &[
            (
                Layout {
                    world: 2,
                    set: &["parallel.pipeline=2"],
                },
                3,
            ),
            (
                Layout {
                    world: 2,
                    set: &["parallel.tensor=2"],
                },
                STEPS,
            ),
        ],
    );
}

/// tp2 pads this vocabulary (38 tokens) to 128 rows when `make_vocab_size_divisible_by` is 64,
/// one rank to 64: the checkpoint's rows are re-padded on load instead of the run being refused
/// as another model. (The padding rows enter the softmax, so the curve is not the one-rank one;
/// what is checked is that it resumes where it stopped and keeps training.)
#[test]
fn resume_across_vocabulary_padding() {
    const PADDING: &str = "model.make_vocab_size_divisible_by=64";
    let run = RunDir::new(Model::Gpt);
    run.run(
        Layout {
            world: 2,
            set: &["parallel.tensor=2", PADDING],
        },
        &["--exit-interval", "3"],
    );
    assert_eq!(run.manifest(3)["shape"]["padded_vocab_size"], 128);
    let before = run.metric_lines().len();
    run.run(
        Layout {
            world: 1,
            set: &[PADDING],
        },
        &[],
    );
    let lines = run.metric_lines();
    let resumed = train_records(&lines[before.min(lines.len())..]);
    assert_eq!(resumed.keys().copied().collect::<Vec<_>>(), [4, 5, 6]);
    assert_eq!(run.manifest(STEPS)["shape"]["padded_vocab_size"], 64);
    let first = run.steps()[&3].loss;
    assert!(
        resumed
            .values()
            .all(|s| s.loss.is_finite() && s.loss < first + 0.5),
        "{resumed:?} after {first}"
    );
}

/// Under a launcher (torchrun's variables here; srun's work the same way) every process runs ONE
/// rank over TCP: two processes of a tp2 world train the same curve as one rank, and only rank 0
/// writes the metrics.
#[test]
fn process_world_matches_one_rank() {
    let (_reference_dir, reference) = train(Model::Gpt, ONE_RANK);
    let run = RunDir::new(Model::Gpt);
    for (rank, output) in run.torchrun_world(TP2, |_, _| {}).iter().enumerate() {
        assert!(
            output.status.success(),
            "rank {rank} failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    // Rank 0 alone logs: one line per step, not two.
    assert_eq!(run.metric_lines().len() as u64, STEPS);
    assert_same_curve("tp2 over TCP", &reference.steps, &run.steps());
    assert_same_weights("tp2 over TCP", &reference.weights, &run.weights(STEPS));
}

/// Ranks of a process world that planned different runs (here rank 1 got another `--set`)
/// stop before building any group: every rank exits unsuccessfully at once, naming the
/// differing rank and both plan hashes.
#[test]
fn ranks_with_different_plans_refuse_to_train() {
    let run = RunDir::new(Model::Gpt);
    let started = std::time::Instant::now();
    let outputs = run.torchrun_world(TP2, |rank, command| {
        command.args(["--set", &format!("training.seed={}", 1 + rank)]);
    });
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "the ranks waited {:?} instead of stopping at once",
        started.elapsed()
    );
    let hash = |line: &str, who: &str| -> String {
        let at = line.find(who).expect("the line names the rank") + who.len();
        line[at..].chars().take(64).collect()
    };
    let mut hashes = Vec::new();
    for (rank, output) in outputs.iter().enumerate() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "rank {rank}: {stderr}");
        let line = stderr
            .lines()
            .find(|line| line.contains("plan hash differs across the ranks"))
            .unwrap_or_else(|| panic!("rank {rank} names the mismatch: {stderr}"));
        assert!(line.contains("the ranks planned different runs"), "{line}");
        assert!(
            line.ends_with("(all that differ from rank 0: rank 1)"),
            "{line}"
        );
        hashes.push((hash(line, "rank 1 has "), hash(line, "rank 0 has ")));
    }
    assert_eq!(hashes[0], hashes[1], "both ranks name the same hashes");
    let (theirs, ours) = &hashes[0];
    assert_eq!(theirs.len(), 64);
    assert_ne!(theirs, ours);
    assert!(
        !run.path().join("ckpt").exists(),
        "nothing was trained or saved"
    );
}

/// `parallel.distributed_timeout_minutes` is the deadline of the process world's collectives:
/// with 0.01 minutes, a rank stalled for seconds (an injected sleep at step 2) makes its peer
/// fail after 600 ms in the tensor-parallel group, not after the default ten minutes.
#[test]
fn the_recipes_distributed_timeout_is_the_worlds_deadline() {
    let run = RunDir::new(Model::Gpt);
    let started = std::time::Instant::now();
    let outputs = run.torchrun_world(TP2, |rank, command| {
        command.args(["--set", "parallel.distributed_timeout_minutes=0.01"]);
        if rank == 1 {
            command.env("FAILPOINTS", "train-step=1*off->sleep(4000)");
        }
    });
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "the world took {:?}; rank 0: {}; rank 1: {}",
        started.elapsed(),
        String::from_utf8_lossy(&outputs[0].stderr),
        String::from_utf8_lossy(&outputs[1].stderr)
    );
    let stderr = String::from_utf8_lossy(&outputs[0].stderr);
    assert!(!outputs[0].status.success(), "{stderr}");
    assert!(stderr.contains("timed out after 600ms"), "{stderr}");
    assert!(!outputs[1].status.success(), "rank 1 is told");
}

/// Without `--world-size` the recipe's `cluster` section sizes the world (here 1 × 2: two thread
/// ranks of tp2), and both the run manifest and the checkpoint record the layout.
#[test]
fn world_size_defaults_to_the_recipes_cluster() {
    let run = RunDir::new(Model::Gpt);
    let output = Command::new(env!("CARGO_BIN_EXE_recipe"))
        .current_dir(run.path())
        .args(["run", "gpt.yaml", "--backend", "cpu", "--run-dir", "run"])
        .args([
            "--set",
            "cluster.gpus_per_node=2",
            "--set",
            "parallel.tensor=2",
        ])
        .env_remove("RANK")
        .env_remove("SLURM_STEP_ID")
        .output()
        .expect("the recipe binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("layout: world 2 (tp 2 pp 1"), "{stderr}");
    assert_eq!(run.manifest(STEPS)["layout"]["world_size"], 2);
    let text = std::fs::read_to_string(run.path().join("run/manifest.json"))
        .expect("the run manifest exists");
    let manifest: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(manifest["world"]["world_size"], 2);
    assert_eq!(manifest["world"]["degrees"]["tp"], 2);
}

/// A checkpoint with a shard file missing or cut short is refused naming the file and the
/// rank that wrote it, not with a tensor error deep in the load.
#[test]
fn damaged_shards_are_named() {
    let run = RunDir::new(Model::Gpt);
    run.run(TP2_DP2, &["--exit-interval", "3"]);
    let folder = run.path().join("ckpt/iter_0000003");
    let shard = folder.join("model-00002-of-00004.safetensors");
    let bytes = std::fs::read(&shard).expect("rank 1 wrote a model shard");

    std::fs::write(&shard, &bytes[..bytes.len() / 2]).expect("truncate");
    let output = resume_expecting_failure(&run);
    assert!(
        output.contains("model-00002-of-00004.safetensors (written by rank 1 of 4) is truncated"),
        "{output}"
    );

    std::fs::remove_file(&shard).expect("remove");
    let output = resume_expecting_failure(&run);
    assert!(
        output.contains("model-00002-of-00004.safetensors (written by rank 1 of 4) is missing"),
        "{output}"
    );
}

/// A diverging layout stops every rank before the update and exits with the diverged code.
#[test]
fn diverging_thread_world_exits_three() {
    let run = RunDir::new(Model::Gpt);
    let output = run
        .command(TP2_DP2, &DIVERGE)
        .output()
        .expect("the recipe binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("is NaN") || stderr.contains("is inf"),
        "{stderr}"
    );
}

/// Resuming another model's checkpoint is refused field by field.
#[test]
fn another_models_checkpoint_is_refused() {
    let run = RunDir::new(Model::Gpt);
    run.run(TP2_DP2, &["--exit-interval", "3"]);
    let output = Command::new(env!("CARGO_BIN_EXE_recipe"))
        .current_dir(run.path())
        .args(["run", "gpt.yaml", "--backend", "cpu", "--world-size", "4"])
        .args(["--set", "parallel.data=4", "--set", "model.hidden_size=32"])
        .output()
        .expect("the recipe binary runs");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("was written for a different model")
            && stderr.contains("hidden_size: checkpoint 16, recipe 32"),
        "{stderr}"
    );
}

fn resume_expecting_failure(run: &RunDir) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_recipe"))
        .current_dir(run.path())
        .args(["run", "gpt.yaml", "--backend", "cpu", "--world-size", "4"])
        .args(["--set", "parallel.data=4"])
        .output()
        .expect("the recipe binary runs");
    assert_eq!(
        output.status.code(),
        Some(1),
        "a damaged checkpoint fails the run"
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `recipe sample` reads a sharded checkpoint (it assembles the one-rank model).
#[test]
fn sample_reads_a_sharded_checkpoint() {
    let run = RunDir::new(Model::Gpt);
    run.run(TP2_DP2, &["--exit-interval", "3"]);
    let output = Command::new(env!("CARGO_BIN_EXE_recipe"))
        .current_dir(run.path())
        .args([
            "sample",
            "ckpt",
            "--prompt",
            "to be",
            "--max-tokens",
            "8",
            "--seed",
            "1",
        ])
        .output()
        .expect("the recipe binary runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.starts_with("to be") && text.trim_end().len() > "to be".len(),
        "{text}"
    );
}

/// `recipe run --nproc-per-node N` starts N processes of one rank each (torchrun's variables,
/// TCP between them): they train exactly what N thread ranks of the same layout train.
#[test]
fn nproc_per_node_trains_what_the_thread_world_trains() {
    for (what, layout) in [("tp2", TP2), ("tp2 pp2", TP2_PP2)] {
        let (_threads_dir, threads) = train(Model::Gpt, layout);
        let processes = RunDir::new(Model::Gpt);
        let nproc = layout.world.to_string();
        let output = processes.run(layout, &["--nproc-per-node", &nproc]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(&format!("layout: world {}", layout.world)),
            "rank 0's brief is relayed: {stderr}"
        );
        assert_eq!(
            processes.metric_lines().len() as u64,
            STEPS,
            "{what}: rank 0 alone logs"
        );
        assert_eq!(
            processes.steps(),
            threads.steps,
            "{what}: processes and threads differ"
        );
        assert_eq!(
            processes
                .weights(STEPS)
                .keys()
                .collect::<std::collections::BTreeSet<_>>(),
            threads.weights.keys().collect(),
        );
        assert_same_weights(what, &threads.weights, &processes.weights(STEPS));
    }
}

/// The ranks a `--nproc-per-node` launch starts run with NVLink multicast off
/// (`NCCL_NVLS_ENABLE=0`, which the lent GPU hosts need) unless the user chose a value, which
/// they keep. Each rank says at debug level what NCCL will read.
#[test]
fn launched_ranks_keep_nvls_off_unless_the_user_chose() {
    let run = RunDir::new(Model::Gpt);
    for (chosen, expected) in [(None, "0"), (Some("1"), "1")] {
        let mut command = run.command(TP2, &["--nproc-per-node", "2", "--dry-run"]);
        command.env("RUST_LOG", "ferrotron::nccl=debug");
        match chosen {
            Some(value) => command.env("NCCL_NVLS_ENABLE", value),
            None => command.env_remove("NCCL_NVLS_ENABLE"),
        };
        let output = command.output().expect("the recipe binary runs");
        run.check(TP2, &output);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let lines: Vec<&str> = stderr
            .lines()
            .filter(|line| line.contains("NCCL_NVLS_ENABLE="))
            .collect();
        assert_eq!(lines.len(), 2, "one line per rank: {stderr}");
        for line in lines {
            assert!(
                line.ends_with(&format!("NCCL_NVLS_ENABLE={expected}")),
                "{chosen:?}: {line}"
            );
        }
    }
}

/// A `--nproc-per-node` launch with many steps left, and its rank processes by rank.
struct LocalWorld {
    run: RunDir,
    launcher: std::process::Child,
}

impl LocalWorld {
    fn start(nproc: u32) -> Self {
        Self::start_with(nproc, &[])
    }

    /// [`LocalWorld::start`] with recipe overrides.
    fn start_with(nproc: u32, set: &[&str]) -> Self {
        let run = RunDir::new(Model::Gpt);
        let mut command = run.command(
            Layout {
                world: nproc,
                set: &["parallel.tensor=2", "training.train_iters=100000"],
            },
            &["--nproc-per-node", &nproc.to_string()],
        );
        for extra in set {
            command.args(["--set", extra]);
        }
        let launcher = command
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the recipe binary starts");
        let world = LocalWorld { run, launcher };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while world.run.metric_lines().len() < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "the world did not train two steps"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        world
    }

    /// The pid of the launcher's child whose environment says `RANK=rank`.
    fn rank_pid(&self, rank: u32) -> String {
        let id = self.launcher.id();
        let children = std::fs::read_to_string(format!("/proc/{id}/task/{id}/children"))
            .expect("the launcher's children are listed");
        children
            .split_whitespace()
            .find(|pid| {
                std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                    env.split(|&b| b == 0)
                        .any(|var| var == format!("RANK={rank}").as_bytes())
                })
            })
            .unwrap_or_else(|| panic!("no child of the launcher is rank {rank}: {children}"))
            .to_owned()
    }

    fn signal(pid: &str, signal: &str) {
        let status = Command::new("kill")
            .args([signal, pid])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// The launcher's exit status and stderr, failing the test if it takes over `limit`.
    fn wait(mut self, limit: std::time::Duration) -> (std::process::ExitStatus, String, RunDir) {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.launcher.try_wait().expect("wait works") {
                let mut stderr = String::new();
                std::io::Read::read_to_string(
                    &mut self.launcher.stderr.take().expect("piped"),
                    &mut stderr,
                )
                .expect("stderr reads");
                return (status, stderr, self.run);
            }
            if std::time::Instant::now() > deadline {
                let _ = self.launcher.kill();
                panic!("the launcher did not exit within {limit:?}");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

#[test]
fn a_killed_rank_ends_the_local_world_with_its_error() {
    let world = LocalWorld::start(2);
    LocalWorld::signal(&world.rank_pid(1), "-KILL");
    let started = std::time::Instant::now();
    let (status, stderr, _run) = world.wait(std::time::Duration::from_secs(60));
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("error: rank 1 was killed by signal 9; then rank 0 exited with code 1"),
        "{stderr}"
    );
    assert!(
        stderr.contains("rank 1 closed its connection"),
        "rank 0 names the lost peer: {stderr}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "the other rank ended within seconds, not at a timeout"
    );
}

#[test]
fn sigterm_to_the_launcher_saves_on_every_rank() {
    let world = LocalWorld::start(2);
    LocalWorld::signal(&world.launcher.id().to_string(), "-TERM");
    let (status, stderr, run) = world.wait(std::time::Duration::from_secs(120));
    assert!(status.success(), "{stderr}");
    let logged = *run.steps().keys().last().expect("steps were logged");
    let saved = run.manifest(logged);
    let shard_ranks: std::collections::BTreeSet<u64> = saved["shards"]
        .as_array()
        .expect("the checkpoint lists its shards")
        .iter()
        .filter_map(|shard| shard["rank"].as_u64())
        .collect();
    assert_eq!(
        shard_ranks,
        [0, 1].into(),
        "both ranks saved their shards at the last step, {logged}: {saved}"
    );
    assert!(
        run.path()
            .join(format!("ckpt/iter_{logged:07}/COMMITTED"))
            .is_file()
    );
}

#[test]
fn the_ranks_of_a_killed_launcher_save_and_exit() {
    let world = LocalWorld::start(2);
    let ranks = [world.rank_pid(0), world.rank_pid(1)];
    LocalWorld::signal(&world.launcher.id().to_string(), "-KILL");
    let (_status, _stderr, run) = world.wait(std::time::Duration::from_secs(10));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while ranks
        .iter()
        .any(|pid| Path::new(&format!("/proc/{pid}/environ")).exists())
    {
        assert!(
            std::time::Instant::now() < deadline,
            "ranks {ranks:?} outlived their launcher by a minute"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let logged = *run.steps().keys().last().expect("steps were logged");
    assert!(
        run.path()
            .join(format!("ckpt/iter_{logged:07}/COMMITTED"))
            .is_file(),
        "the ranks saved step {logged} as they stopped"
    );
}
