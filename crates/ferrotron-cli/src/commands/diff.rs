//! `recipe diff OLD NEW`: what a recipe change does, for review. Each side is a file or
//! `REV:path` (read with `git show`, its `extends:` chain read from the same revision). Both
//! are resolved (extends, derived defaults) and compared field by field with the `file:line`
//! that set each side's value; then both are planned and the plan impact is tabled (world size,
//! degrees, memory per GPU, FLOPs, predicted step time and MFU, tokens per step and in total).
//! Changes that make resuming the old run's checkpoints unsafe are flagged.
//!
//! Exit 0 whether or not they differ; 1 when either recipe is invalid (its diagnostics printed at
//! their lines); 2 usage error or unreadable file / revision.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use crate::exit;
use ferrotron_plan::{Plan, PlanOptions};
use ferrotron_recipe::{LoadOptions, LoadedRecipe, Problem, Severity, SourceReader, load_with};
use serde_json::{Value, json};

use super::validate::{handler, render};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Text,
    Json,
    Markdown,
}

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The old recipe: a file, or `REV:path` read through `git show` (e.g. `main:recipes/a.yaml`).
    #[arg(value_name = "OLD")]
    old: String,
    /// The new recipe: a file, or `REV:path`.
    #[arg(value_name = "NEW")]
    new: String,
    /// Output: aligned text, JSON (for scripts), or markdown (a pull-request comment).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

/// Recipe files of one git revision: `path` is read as `git show REV:./path` (relative to the
/// current directory, as paths on the command line are).
struct GitRevision {
    rev: String,
}

impl GitRevision {
    fn spec(&self, path: &Path) -> io::Result<String> {
        let text = path.to_string_lossy().replace('\\', "/");
        if path.is_absolute() {
            let top = Command::new("git")
                .args(["rev-parse", "--show-toplevel"])
                .output()?;
            let top = PathBuf::from(String::from_utf8_lossy(&top.stdout).trim());
            let relative = path.strip_prefix(&top).map_err(|_| {
                io::Error::other(format!("{} is outside the git work tree", path.display()))
            })?;
            return Ok(format!("{}:{}", self.rev, relative.display()));
        }
        if text.starts_with("./") || text.starts_with("../") {
            Ok(format!("{}:{text}", self.rev))
        } else {
            Ok(format!("{}:./{text}", self.rev))
        }
    }
}

impl SourceReader for GitRevision {
    /// Reads `git show`'s output only up to the size limit of a recipe: a large blob named by
    /// mistake is refused without being read whole.
    fn read(&self, path: &Path) -> io::Result<String> {
        let spec = self.spec(path)?;
        let mut child = Command::new("git")
            .args(["show", &spec])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| io::Error::other("no pipe from `git show`"))?;
        let text = ferrotron_recipe::text_from(stdout);
        if text.is_err() {
            // Too large or not UTF-8: what git has left to write is not wanted.
            let _ = child.kill();
        }
        let output = child.wait_with_output()?;
        if !output.status.success() && text.is_ok() {
            let message = String::from_utf8_lossy(&output.stderr).trim().to_owned();
            return Err(io::Error::other(format!(
                "`git show {spec}` failed: {message}"
            )));
        }
        text.map_err(|e| io::Error::new(e.kind(), format!("`{spec}`: {e}")))
    }

    fn display_name(&self, path: &Path) -> String {
        format!("{}:{}", self.rev, path.display())
    }

    fn identity(&self, path: &Path) -> PathBuf {
        path.to_path_buf()
    }
}

/// One side of the diff: the argument as given, the path, and the revision when it is one.
fn split_side(arg: &str) -> (PathBuf, Option<GitRevision>) {
    if Path::new(arg).exists() {
        return (PathBuf::from(arg), None);
    }
    match arg.split_once(':') {
        Some((rev, path)) if !rev.is_empty() && !path.is_empty() => (
            PathBuf::from(path),
            Some(GitRevision {
                rev: rev.to_owned(),
            }),
        ),
        _ => (PathBuf::from(arg), None),
    }
}

enum Loaded {
    Ok(Box<LoadedRecipe>),
    /// Exit code 1 (invalid) or 2 (unreadable); diagnostics already printed.
    Failed(u8),
}

fn load_side(arg: &str) -> Loaded {
    let (path, revision) = split_side(arg);
    let opts = LoadOptions {
        overrides: &[],
        use_env: false,
    };
    let result = match &revision {
        Some(git) => load_with(&path, &opts, git),
        None => load_with(&path, &opts, &ferrotron_recipe::FileSystem),
    };
    let handler = handler();
    let print = |problems: &[Problem]| {
        for problem in problems {
            eprint!("{}", render(&handler, problem));
        }
    };
    match result {
        Ok(loaded) => {
            let findings =
                ferrotron_plan::check_layout(&loaded.recipe, loaded.recipe.cluster.as_ref());
            let problems = loaded.problems_for(&findings);
            if problems.iter().any(|p| p.severity() == Severity::Error) {
                print(&problems);
                eprintln!("invalid: {arg}");
                return Loaded::Failed(exit::FAILED);
            }
            Loaded::Ok(Box::new(loaded))
        }
        Err(errors) => {
            print(errors.problems());
            if errors.is_unreadable() {
                Loaded::Failed(exit::USAGE)
            } else {
                eprintln!("invalid: {errors}");
                Loaded::Failed(exit::FAILED)
            }
        }
    }
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let old = load_side(&args.old);
    let new = load_side(&args.new);
    let (old, new) = match (old, new) {
        (Loaded::Ok(old), Loaded::Ok(new)) => (old, new),
        (Loaded::Failed(a), Loaded::Failed(b)) => return Ok(exit::code(a.max(b))),
        (Loaded::Failed(code), _) | (_, Loaded::Failed(code)) => return Ok(exit::code(code)),
    };
    let report = Report::new(&args.old, &args.new, &old, &new);
    match args.format {
        Format::Text => print!("{}", report.text()),
        Format::Json => println!("{}", serde_json::to_string_pretty(&report.json())?),
        Format::Markdown => print!("{}", report.markdown()),
    }
    Ok(ExitCode::SUCCESS)
}

// ---------------------------------------------------------------------------------------------
// fields

/// Why changing the field at `path` makes resuming the old run's checkpoints unsafe.
fn resume_risk(path: &str) -> Option<&'static str> {
    // The fields of the checkpoint's model shape (`ferrotron-train`'s `ModelShape`): a
    // checkpoint of another shape is refused on resume.
    const SHAPE: &[&str] = &[
        "model.num_layers",
        "model.hidden_size",
        "model.ffn_hidden_size",
        "model.num_attention_heads",
        "model.num_query_groups",
        "model.kv_channels",
        "model.max_position_embeddings",
        "model.position_embedding",
        "model.normalization",
        "model.activation",
        "model.tie_embeddings",
        "model.add_bias_linear",
        "model.add_qkv_bias",
        "model.qk_layernorm",
        "model.moe",
        "model.moe.num_experts",
        "model.moe.layer_freq",
        "model.moe.ffn_hidden_size",
        "model.moe.shared_expert_ffn_hidden_size",
    ];
    if SHAPE.contains(&path) {
        return Some("model shape");
    }
    match path {
        "model.vocab_size" | "model.make_vocab_size_divisible_by" => Some("vocabulary"),
        "training.seed" => Some("seed"),
        "model.seq_length" => Some("data samples"),
        // a list's entries (`layer_freq`'s list form) and every MLA size are the shape's too
        _ if path.starts_with("model.window_size")
            || path.starts_with("model.rope_scaling")
            || path.starts_with("model.moe.layer_freq.")
            || path == "model.mla"
            || path.starts_with("model.mla.") =>
        {
            Some("model shape")
        }
        "data.split" | "data.json_key" => Some("data blend"),
        _ if path.starts_with("data.tokenizer") => Some("tokenizer"),
        _ if path == "data.blend" || path.starts_with("data.blend.") => Some("data blend"),
        _ => None,
    }
}

/// What each risk means, for the summary line.
fn risk_explanation(risk: &str) -> &'static str {
    match risk {
        "model shape" => "the checkpoint's tensors no longer fit the model (resume refuses it)",
        "vocabulary" => "the embedding and output layer change shape",
        "seed" => "data order and every step's randomness derive from it (resume refuses it)",
        "tokenizer" => "the same token ids would stand for other text",
        "data blend" => "the consumed-sample count would point into another data order",
        "data samples" => {
            "samples are cut differently, so the consumed-sample count points elsewhere"
        }
        _ => "",
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Changed,
    Added,
    Removed,
}

impl Kind {
    fn word(self) -> &'static str {
        match self {
            Kind::Changed => "changed",
            Kind::Added => "added",
            Kind::Removed => "removed",
        }
    }
}

struct FieldChange {
    path: String,
    kind: Kind,
    old: Option<Value>,
    new: Option<Value>,
    old_origin: Option<String>,
    new_origin: Option<String>,
    risk: Option<&'static str>,
}

/// Every leaf of a JSON value by dot path (list items by index; empty lists and maps are
/// leaves), in document order.
fn flatten(value: &Value, path: &str, out: &mut Vec<(String, Value)>) {
    let join = |key: &str| {
        if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        }
    };
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (key, inner) in map {
                flatten(inner, &join(key), out);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, inner) in items.iter().enumerate() {
                flatten(inner, &join(&i.to_string()), out);
            }
        }
        leaf => out.push((path.to_owned(), leaf.clone())),
    }
}

fn leaves(loaded: &LoadedRecipe) -> Vec<(String, Value)> {
    let value = serde_json::to_value(loaded.recipe.with_derived_defaults()).unwrap_or(Value::Null);
    let mut out = Vec::new();
    flatten(&value, "", &mut out);
    out
}

fn field_changes(old: &LoadedRecipe, new: &LoadedRecipe) -> Vec<FieldChange> {
    let a = leaves(old);
    let b = leaves(new);
    let mut changes = Vec::new();
    for (path, old_value) in &a {
        let new_value = b.iter().find(|(p, _)| p == path).map(|(_, v)| v);
        if new_value == Some(old_value) {
            continue;
        }
        changes.push(FieldChange {
            path: path.clone(),
            kind: if new_value.is_some() {
                Kind::Changed
            } else {
                Kind::Removed
            },
            old: Some(old_value.clone()),
            new: new_value.cloned(),
            old_origin: Some(old.origin_of(path)),
            new_origin: new_value.map(|_| new.origin_of(path)),
            risk: resume_risk(path),
        });
    }
    for (path, new_value) in &b {
        if a.iter().any(|(p, _)| p == path) {
            continue;
        }
        changes.push(FieldChange {
            path: path.clone(),
            kind: Kind::Added,
            old: None,
            new: Some(new_value.clone()),
            old_origin: None,
            new_origin: Some(new.origin_of(path)),
            risk: resume_risk(path),
        });
    }
    changes
}

fn show(value: Option<&Value>) -> String {
    match value {
        None => "(unset)".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) => "null".to_owned(),
        Some(other) => other.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// plan impact

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Count,
    Large,
    Bytes,
    Flops,
    Seconds,
    Rate,
    Percent,
}

struct Metric {
    key: &'static str,
    label: &'static str,
    unit: Unit,
    get: fn(&Plan) -> f64,
}

fn tokens_per_step(plan: &Plan) -> f64 {
    f64::from(plan.global_batch_size) * f64::from(plan.recipe.model.seq_length)
}

const METRICS: &[Metric] = &[
    Metric {
        key: "world_size",
        label: "world size",
        unit: Unit::Count,
        get: |p| f64::from(p.world_size),
    },
    Metric {
        key: "tp",
        label: "tensor parallel",
        unit: Unit::Count,
        get: |p| f64::from(p.degrees.tp),
    },
    Metric {
        key: "pp",
        label: "pipeline parallel",
        unit: Unit::Count,
        get: |p| f64::from(p.degrees.pp),
    },
    Metric {
        key: "vpp",
        label: "virtual pipeline",
        unit: Unit::Count,
        get: |p| f64::from(p.degrees.vpp),
    },
    Metric {
        key: "cp",
        label: "context parallel",
        unit: Unit::Count,
        get: |p| f64::from(p.degrees.cp),
    },
    Metric {
        key: "dp",
        label: "data parallel",
        unit: Unit::Count,
        get: |p| f64::from(p.degrees.dp),
    },
    Metric {
        key: "ep",
        label: "expert parallel",
        unit: Unit::Count,
        get: |p| f64::from(p.degrees.ep),
    },
    Metric {
        key: "etp",
        label: "expert tensor parallel",
        unit: Unit::Count,
        get: |p| f64::from(p.degrees.etp),
    },
    Metric {
        key: "edp",
        label: "expert data parallel",
        unit: Unit::Count,
        get: |p| f64::from(p.degrees.edp),
    },
    Metric {
        key: "micro_batch_size",
        label: "micro batch",
        unit: Unit::Count,
        get: |p| f64::from(p.micro_batch_size),
    },
    Metric {
        key: "num_microbatches",
        label: "microbatches",
        unit: Unit::Count,
        get: |p| f64::from(p.num_microbatches),
    },
    Metric {
        key: "parameters",
        label: "parameters",
        unit: Unit::Large,
        get: |p| p.parameters.total as f64,
    },
    Metric {
        key: "memory_per_gpu_bytes",
        label: "memory per GPU",
        unit: Unit::Bytes,
        get: |p| p.memory.per_gpu_bytes.total as f64,
    },
    Metric {
        key: "memory_limit_bytes",
        label: "GPU memory",
        unit: Unit::Bytes,
        get: |p| p.memory.limit_bytes as f64,
    },
    Metric {
        key: "flops_per_iteration",
        label: "FLOPs per iteration",
        unit: Unit::Flops,
        get: |p| p.flops_per_iteration,
    },
    Metric {
        key: "step_seconds",
        label: "predicted step time",
        unit: Unit::Seconds,
        get: |p| p.predicted.step_seconds,
    },
    Metric {
        key: "tokens_per_second_per_gpu",
        label: "tokens/s per GPU",
        unit: Unit::Rate,
        get: |p| p.predicted.tokens_per_second_per_gpu,
    },
    Metric {
        key: "mfu",
        label: "predicted MFU",
        unit: Unit::Percent,
        get: |p| p.predicted.mfu,
    },
    Metric {
        key: "tokens_per_step",
        label: "tokens per step",
        unit: Unit::Large,
        get: tokens_per_step,
    },
    Metric {
        key: "train_iters",
        label: "iterations",
        unit: Unit::Large,
        get: |p| p.train_iters as f64,
    },
    Metric {
        key: "total_tokens",
        label: "total tokens",
        unit: Unit::Large,
        get: |p| tokens_per_step(p) * p.train_iters as f64,
    },
];

fn large(x: f64) -> String {
    let a = x.abs();
    if a >= 1e12 {
        format!("{:.2} T", x / 1e12)
    } else if a >= 1e9 {
        format!("{:.2} B", x / 1e9)
    } else if a >= 1e6 {
        format!("{:.2} M", x / 1e6)
    } else {
        format!("{x:.0}")
    }
}

fn format_value(unit: Unit, x: f64) -> String {
    match unit {
        Unit::Count => format!("{x:.0}"),
        Unit::Large => large(x),
        Unit::Bytes => format!("{:.2} GiB", x / f64::from(1u32 << 30)),
        Unit::Flops => format!("{x:.4e}"),
        Unit::Seconds => format!("{x:.3} s"),
        Unit::Rate => format!("{x:.0}"),
        Unit::Percent => format!("{:.1}%", x * 100.0),
    }
}

fn format_change(unit: Unit, old: f64, new: f64) -> String {
    if old == new {
        return "same".to_owned();
    }
    let sign = |x: f64| if x > 0.0 { "+" } else { "" };
    let relative = || {
        if old == 0.0 {
            "new".to_owned()
        } else {
            let r = (new - old) / old * 100.0;
            format!("{}{r:.1}%", sign(r))
        }
    };
    match unit {
        Unit::Count => format!("{}{:.0}", sign(new - old), new - old),
        Unit::Percent => {
            let d = (new - old) * 100.0;
            format!("{}{d:.1} pp", sign(d))
        }
        _ => relative(),
    }
}

/// A side's plan, or why there is none (vocabulary unknown without the tokenizer, ...).
fn plan_of(loaded: &LoadedRecipe) -> Result<Plan, String> {
    let recipe = &loaded.recipe;
    let vocab_size = match recipe.model.vocab_size {
        Some(vocab) => vocab,
        None => ferrotron_data::tokenizer_vocab_size(&recipe.data.tokenizer).map_err(|e| {
            format!("model.vocab_size is not set and the tokenizer could not be loaded: {e}")
        })?,
    };
    let options = PlanOptions {
        cluster: None,
        vocab_size,
    };
    ferrotron_plan::plan(recipe, &options).map_err(|findings| {
        findings
            .iter()
            .map(|f| format!("{}: {}", f.path, f.message))
            .collect::<Vec<_>>()
            .join("; ")
    })
}

struct MetricRow {
    metric: &'static Metric,
    old: Option<f64>,
    new: Option<f64>,
}

impl MetricRow {
    fn old_text(&self) -> String {
        self.old
            .map_or_else(|| "n/a".to_owned(), |x| format_value(self.metric.unit, x))
    }

    fn new_text(&self) -> String {
        self.new
            .map_or_else(|| "n/a".to_owned(), |x| format_value(self.metric.unit, x))
    }

    fn change_text(&self) -> String {
        match (self.old, self.new) {
            (Some(a), Some(b)) => format_change(self.metric.unit, a, b),
            _ => "n/a".to_owned(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// the report

struct Report {
    old_name: String,
    new_name: String,
    fields: Vec<FieldChange>,
    rows: Vec<MetricRow>,
    old_plan_error: Option<String>,
    new_plan_error: Option<String>,
    old_fits: Option<bool>,
    new_fits: Option<bool>,
}

impl Report {
    fn new(old_name: &str, new_name: &str, old: &LoadedRecipe, new: &LoadedRecipe) -> Report {
        let old_plan = plan_of(old);
        let new_plan = plan_of(new);
        let rows = METRICS
            .iter()
            .map(|metric| MetricRow {
                metric,
                old: old_plan.as_ref().ok().map(metric.get),
                new: new_plan.as_ref().ok().map(metric.get),
            })
            .collect();
        Report {
            old_name: old_name.to_owned(),
            new_name: new_name.to_owned(),
            fields: field_changes(old, new),
            rows,
            old_fits: old_plan.as_ref().ok().map(|p| p.memory.fits),
            new_fits: new_plan.as_ref().ok().map(|p| p.memory.fits),
            old_plan_error: old_plan.err(),
            new_plan_error: new_plan.err(),
        }
    }

    /// The resume-unsafe risks, each once, in the order first seen, with their fields.
    fn risks(&self) -> Vec<(&'static str, Vec<&str>)> {
        let mut risks: Vec<(&'static str, Vec<&str>)> = Vec::new();
        for field in &self.fields {
            let Some(risk) = field.risk else { continue };
            match risks.iter_mut().find(|(r, _)| *r == risk) {
                Some((_, paths)) => paths.push(&field.path),
                None => risks.push((risk, vec![&field.path])),
            }
        }
        risks
    }

    fn count(&self, kind: Kind) -> usize {
        self.fields.iter().filter(|f| f.kind == kind).count()
    }

    fn field_summary(&self) -> String {
        if self.fields.is_empty() {
            return "the resolved recipes are identical".to_owned();
        }
        format!(
            "{} changed, {} added, {} removed",
            self.count(Kind::Changed),
            self.count(Kind::Added),
            self.count(Kind::Removed)
        )
    }

    fn resume_lines(&self) -> Vec<String> {
        let risks = self.risks();
        if risks.is_empty() {
            return vec![
                "resume-safe: no change to the model shape, vocabulary, tokenizer, seed or data"
                    .to_owned(),
            ];
        }
        let mut lines = vec![
            "RESUME-UNSAFE: checkpoints of the old recipe must not be resumed with the new one"
                .to_owned(),
        ];
        for (risk, paths) in risks {
            lines.push(format!(
                "  {risk} ({}): {}",
                paths.join(", "),
                risk_explanation(risk)
            ));
        }
        lines
    }

    fn plan_notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        for (side, error) in [("old", &self.old_plan_error), ("new", &self.new_plan_error)] {
            if let Some(error) = error {
                notes.push(format!("no plan for the {side} recipe: {error}"));
            }
        }
        for (side, fits) in [("old", self.old_fits), ("new", self.new_fits)] {
            if fits == Some(false) {
                notes.push(format!("the {side} layout does not fit in GPU memory"));
            }
        }
        notes
    }

    fn text(&self) -> String {
        let mut out = format!("recipe diff: {} → {}\n", self.old_name, self.new_name);
        out.push_str(&format!("fields: {}\n", self.field_summary()));
        if !self.fields.is_empty() {
            let mut table = vec![[
                "key".to_owned(),
                "old".to_owned(),
                "new".to_owned(),
                "old set by".to_owned(),
                "new set by".to_owned(),
                "resume".to_owned(),
            ]];
            for f in &self.fields {
                table.push([
                    f.path.clone(),
                    show(f.old.as_ref()),
                    show(f.new.as_ref()),
                    f.old_origin.clone().unwrap_or_else(|| "-".to_owned()),
                    f.new_origin.clone().unwrap_or_else(|| "-".to_owned()),
                    f.risk.map_or_else(String::new, |r| format!("UNSAFE: {r}")),
                ]);
            }
            out.push_str(&aligned(&table, &[false; 6]));
        }
        for line in self.resume_lines() {
            out.push_str(&line);
            out.push('\n');
        }
        out.push_str("plan impact\n");
        let mut table = vec![[
            "metric".to_owned(),
            "old".to_owned(),
            "new".to_owned(),
            "change".to_owned(),
        ]];
        for row in &self.rows {
            table.push([
                row.metric.label.to_owned(),
                row.old_text(),
                row.new_text(),
                row.change_text(),
            ]);
        }
        out.push_str(&aligned(&table, &[false, true, true, true]));
        for note in self.plan_notes() {
            out.push_str(&format!("note: {note}\n"));
        }
        out
    }

    fn markdown(&self) -> String {
        let cell = |s: &str| s.replace('|', "\\|").replace('\n', " ");
        let code = |s: &str| format!("`{}`", cell(s));
        let mut out = format!(
            "### Recipe diff: {} → {}\n\n",
            code(&self.old_name),
            code(&self.new_name)
        );
        let risks = self.risks();
        if risks.is_empty() {
            out.push_str("**Resume-safe**: no change to the model shape, vocabulary, tokenizer, seed or data.\n\n");
        } else {
            out.push_str(
                "> [!WARNING]\n> **Resume-unsafe**: checkpoints of the old recipe must not be resumed with the new one.\n",
            );
            for (risk, paths) in risks {
                let paths: Vec<String> = paths.iter().map(|p| code(p)).collect();
                out.push_str(&format!(
                    "> - {risk} ({}): {}\n",
                    paths.join(", "),
                    risk_explanation(risk)
                ));
            }
            out.push('\n');
        }
        out.push_str(&format!("**Fields**: {}\n\n", self.field_summary()));
        if !self.fields.is_empty() {
            out.push_str("| key | old | new | old set by | new set by | resume |\n");
            out.push_str("|---|---|---|---|---|---|\n");
            for f in &self.fields {
                out.push_str(&format!(
                    "| {} | {} | {} | {} | {} | {} |\n",
                    code(&f.path),
                    cell(&show(f.old.as_ref())),
                    cell(&show(f.new.as_ref())),
                    f.old_origin.as_deref().map_or_else(|| "–".to_owned(), code),
                    f.new_origin.as_deref().map_or_else(|| "–".to_owned(), code),
                    f.risk.map_or_else(String::new, |r| format!("⚠️ {r}")),
                ));
            }
            out.push('\n');
        }
        out.push_str("#### Plan impact\n\n| | old | new | change |\n|---|---:|---:|---:|\n");
        for row in &self.rows {
            out.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                row.metric.label,
                row.old_text(),
                row.new_text(),
                row.change_text()
            ));
        }
        for note in self.plan_notes() {
            out.push_str(&format!("\n_{}_\n", cell(&note)));
        }
        out
    }

    fn json(&self) -> Value {
        let fields: Vec<Value> = self
            .fields
            .iter()
            .map(|f| {
                json!({
                    "path": f.path,
                    "change": f.kind.word(),
                    "old": f.old,
                    "new": f.new,
                    "old_origin": f.old_origin,
                    "new_origin": f.new_origin,
                    "resume_unsafe": f.risk.is_some(),
                    "resume_risk": f.risk,
                })
            })
            .collect();
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                json!({
                    "metric": r.metric.key,
                    "label": r.metric.label,
                    "old": r.old,
                    "new": r.new,
                    "change": match (r.old, r.new) {
                        (Some(a), Some(b)) => json!(b - a),
                        _ => Value::Null,
                    },
                    "relative_change": match (r.old, r.new) {
                        (Some(a), Some(b)) if a != 0.0 => json!((b - a) / a),
                        _ => Value::Null,
                    },
                    "display": { "old": r.old_text(), "new": r.new_text(), "change": r.change_text() },
                })
            })
            .collect();
        let risks: Vec<Value> = self
            .risks()
            .into_iter()
            .map(|(risk, paths)| {
                json!({ "risk": risk, "paths": paths, "why": risk_explanation(risk) })
            })
            .collect();
        json!({
            "old": self.old_name,
            "new": self.new_name,
            "identical": self.fields.is_empty(),
            "resume_safe": risks.is_empty(),
            "resume_risks": risks,
            "fields": fields,
            "plan": {
                "old_error": self.old_plan_error,
                "new_error": self.new_plan_error,
                "old_fits": self.old_fits,
                "new_fits": self.new_fits,
                "metrics": rows,
            },
        })
    }
}

/// Columns padded to their widest cell (`right`: right-aligned), two spaces apart, indented.
fn aligned<const N: usize>(rows: &[[String; N]], right: &[bool; N]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::from("  ");
        for (i, cell) in row.iter().enumerate() {
            let pad = widths[i] - cell.chars().count();
            if right[i] {
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            }
            if i + 1 < N {
                line.push_str("  ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_formatted_by_unit() {
        assert_eq!(format_change(Unit::Count, 8.0, 16.0), "+8");
        assert_eq!(format_change(Unit::Count, 4.0, 2.0), "-2");
        assert_eq!(format_change(Unit::Seconds, 2.0, 3.0), "+50.0%");
        assert_eq!(format_change(Unit::Percent, 0.5, 0.45), "-5.0 pp");
        assert_eq!(format_change(Unit::Bytes, 1.0, 1.0), "same");
        assert_eq!(large(2.5e12), "2.50 T");
        assert_eq!(large(4096.0), "4096");
    }

    #[test]
    fn resume_risks_follow_the_checkpoint_rules() {
        assert_eq!(resume_risk("model.hidden_size"), Some("model shape"));
        assert_eq!(resume_risk("data.tokenizer.vocab_file"), Some("tokenizer"));
        assert_eq!(resume_risk("data.blend.1.weight"), Some("data blend"));
        assert_eq!(resume_risk("model.moe.layer_freq.3"), Some("model shape"));
        assert_eq!(resume_risk("model.mla.kv_lora_rank"), Some("model shape"));
        assert_eq!(resume_risk("model.moe.router_topk_scaling_factor"), None);
        assert_eq!(resume_risk("training.seed"), Some("seed"));
        assert_eq!(resume_risk("parallel.tensor"), None);
        assert_eq!(resume_risk("training.optimizer.lr"), None);
    }
}
