//! `recipe report`: PNG charts of runs (several overlaid for a sweep) and a short markdown
//! summary.
//!
//! The summary shows what differs between the runs: the recipe keys whose values are not the
//! same in every run's `manifest.json` (run outputs left out), one column each, so a sweep's
//! axes read as columns without the sweep file. When the seed is among them, the runs that
//! differ only in the seed are grouped and their final numbers given as mean ± standard
//! deviation, because one seed's difference between two points is often noise.
//!
//! `--smooth W` draws TensorBoard's smoothing: an exponential moving average with weight `W`,
//! debiased so the first points are not pulled towards zero, bold over the raw values drawn
//! faint. The learning rate is a schedule, not a noisy measurement, and is never smoothed.
//!
//! Text is drawn with plotters' pure-Rust `ab_glyph` path and a font shipped in this crate
//! (DejaVu Sans, Bitstream Vera licence, `assets/`), embedded in the binary: no system fonts, no
//! fontconfig, so CI machines without fonts draw the same labels.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Once;

use ferrotron_telemetry::MANIFEST_FILE;
use plotters::prelude::*;
use plotters::style::FontStyle;
use serde_json::Value;

use crate::SweepError;
use crate::metrics_log::{MetricsLog, StepPoint};
use crate::resolve::METRICS_FILE;
use crate::spec::SEED_KEY;

const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
const FONT_FAMILY: &str = "sans-serif";
const SIZE: (u32, u32) = (1000, 560);

/// Okabe and Ito's palette, told apart with every common colour-vision deficiency (its yellow is
/// left out: too faint on white). Plotters' default palette puts red beside green.
const OKABE_ITO: [RGBColor; 7] = [
    RGBColor(0, 114, 178),
    RGBColor(230, 159, 0),
    RGBColor(0, 158, 115),
    RGBColor(213, 94, 0),
    RGBColor(86, 180, 233),
    RGBColor(204, 121, 167),
    RGBColor(0, 0, 0),
];

/// Room kept right of the last step, as a share of the steps drawn, for the legend to sit in:
/// it then never covers the curves' ends, which are what a reader looks at.
const LEGEND_ROOM: f64 = 0.28;
/// Curves with at most this many points get a marker on each.
const SPARSE_POINTS: usize = 40;
/// Opacity of the raw values under a smoothed curve.
const RAW_ALPHA: f64 = 0.25;

/// One `(step, value)` curve per run.
type Curves = Vec<Vec<(f64, f64)>>;

/// Recipe keys that name a run's outputs: they differ between any two runs and say nothing
/// about the training.
const OUTPUT_KEYS: [&str; 4] = [
    "name",
    "checkpoint.dir",
    "logging.jsonl",
    "logging.tensorboard",
];

/// A run to report on: a label, its metrics and, where its directory has a manifest, its
/// recipe.
#[derive(Debug, Clone)]
pub struct RunMetrics {
    pub label: String,
    pub log: MetricsLog,
    /// The resolved recipe from the run's `manifest.json`, as JSON.
    pub recipe: Option<Value>,
}

/// How to draw a report.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ReportOptions {
    /// TensorBoard-style smoothing weight in `[0, 1)`; `None` (or 0) draws the raw values only.
    pub smooth: Option<f64>,
}

/// What one chart shows.
#[derive(Debug, Clone, Copy)]
struct Series {
    file: &'static str,
    title: &'static str,
    y_label: &'static str,
    /// Curves that fall keep the upper right free for the legend; others the lower right.
    falling: bool,
    /// Noisy measurements, which `--smooth` smooths.
    smoothable: bool,
}

const LOSS: Series = Series {
    file: "loss.png",
    title: "training loss",
    y_label: "loss",
    falling: true,
    smoothable: true,
};
const EVAL: Series = Series {
    file: "eval_loss.png",
    title: "validation loss",
    y_label: "loss",
    falling: true,
    smoothable: true,
};
const LR: Series = Series {
    file: "lr.png",
    title: "learning rate",
    y_label: "lr",
    falling: false,
    smoothable: false,
};
const GRAD_NORM: Series = Series {
    file: "grad_norm.png",
    title: "gradient norm (before clipping)",
    y_label: "grad norm",
    falling: true,
    smoothable: true,
};
const TOKENS: Series = Series {
    file: "tokens_per_second.png",
    title: "throughput",
    y_label: "tokens/s",
    falling: false,
    smoothable: true,
};
const MFU: Series = Series {
    file: "mfu.png",
    title: "model FLOPs utilisation",
    y_label: "MFU %",
    falling: false,
    smoothable: true,
};

/// The runs under `dirs`: a directory with a metrics file is one run; a directory without one
/// (a sweep directory) contributes each subdirectory that has one, in name order.
pub fn collect_runs(dirs: &[PathBuf]) -> Result<Vec<RunMetrics>, SweepError> {
    let mut runs = Vec::new();
    for dir in dirs {
        let direct = dir.join(METRICS_FILE);
        if direct.is_file() {
            runs.push(RunMetrics {
                label: label_of(dir),
                log: MetricsLog::read(&direct)?,
                recipe: manifest_recipe(dir),
            });
            continue;
        }
        let entries = std::fs::read_dir(dir).map_err(|source| SweepError::Read {
            path: dir.clone(),
            source,
        })?;
        let mut members: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.join(METRICS_FILE).is_file())
            .collect();
        if members.is_empty() {
            return Err(SweepError::NoMetrics(format!(
                "{} has no {METRICS_FILE}, nor any subdirectory with one",
                dir.display()
            )));
        }
        members.sort();
        for member in members {
            runs.push(RunMetrics {
                label: label_of(&member),
                log: MetricsLog::read(&member.join(METRICS_FILE))?,
                recipe: manifest_recipe(&member),
            });
        }
    }
    Ok(runs)
}

/// The `recipe` of `dir`'s manifest, read tolerantly (a run without one, or an older layout,
/// only has no varied values to show).
fn manifest_recipe(dir: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(dir.join(MANIFEST_FILE)).ok()?;
    let mut manifest: Value = serde_json::from_str(&text).ok()?;
    Some(manifest.get_mut("recipe")?.take()).filter(Value::is_object)
}

fn label_of(dir: &Path) -> String {
    dir.canonicalize()
        .ok()
        .as_deref()
        .unwrap_or(dir)
        .file_name()
        .map_or_else(
            || dir.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
}

/// Draws the charts into `out_dir` and writes `report.md`; returns the files written.
pub fn write_report(
    runs: &[RunMetrics],
    out_dir: &Path,
    options: &ReportOptions,
) -> Result<Vec<PathBuf>, SweepError> {
    let smooth = options.smooth.filter(|&w| w > 0.0);
    std::fs::create_dir_all(out_dir).map_err(|source| SweepError::Write {
        path: out_dir.to_path_buf(),
        source,
    })?;
    let step_series = |f: fn(&StepPoint) -> Option<f64>| -> Curves {
        runs.iter()
            .map(|r| {
                r.log
                    .steps
                    .iter()
                    .filter_map(|s| f(s).map(|v| (s.step as f64, v)))
                    .collect()
            })
            .collect()
    };
    let charts: Vec<(Series, Curves)> = vec![
        (LOSS, step_series(|s| Some(s.loss))),
        (
            EVAL,
            runs.iter()
                .map(|r| r.log.evals.iter().map(|&(s, l)| (s as f64, l)).collect())
                .collect(),
        ),
        (LR, step_series(|s| s.lr)),
        (GRAD_NORM, step_series(|s| s.grad_norm)),
        (TOKENS, step_series(|s| s.tokens_per_second)),
        (MFU, step_series(|s| s.mfu.map(|m| m * 100.0))),
    ];
    let labels: Vec<&str> = runs.iter().map(|r| r.label.as_str()).collect();
    let mut written = Vec::new();
    let mut drawn = Vec::new();
    for (series, data) in &charts {
        if data.iter().all(|points| finite(points).next().is_none()) {
            continue;
        }
        let path = out_dir.join(series.file);
        draw_chart(
            &path,
            series,
            &labels,
            data,
            smooth.filter(|_| series.smoothable),
        )?;
        drawn.push(*series);
        written.push(path);
    }
    let summary_path = out_dir.join("report.md");
    let text = summary(runs, &drawn, smooth);
    std::fs::write(&summary_path, text).map_err(|source| SweepError::Write {
        path: summary_path.clone(),
        source,
    })?;
    written.push(summary_path);
    Ok(written)
}

/// The markdown summary: one row per run with its varied values, runs that differ only in the
/// seed as mean ± std, then the charts.
fn summary(runs: &[RunMetrics], drawn: &[Series], smooth: Option<f64>) -> String {
    let varied = varied_keys(runs);
    let mut out = String::from("# Training report\n\n");
    let _ = writeln!(
        out,
        "{} run{}.\n",
        runs.len(),
        if runs.len() == 1 { "" } else { "s" }
    );
    let headers = ["logged steps", "last step"]
        .into_iter()
        .chain(METRIC_HEADERS)
        .map(str::to_owned);
    table_head(&mut out, "run", &varied, headers);
    for run in runs {
        let log = &run.log;
        let finals = final_metrics(log);
        let cells = [
            log.steps.len().to_string(),
            log.steps
                .last()
                .map_or_else(|| "-".to_owned(), |s| s.step.to_string()),
        ]
        .into_iter()
        .chain(
            finals
                .iter()
                .zip(METRIC_DIGITS)
                .map(|(v, digits)| num(*v, digits)),
        );
        table_row(&mut out, &run.label, &run_values(run, &varied), cells);
    }
    let best = runs
        .iter()
        .filter_map(|r| r.log.best_eval_loss().map(|l| (l, &r.label)))
        .min_by(|a, b| a.0.total_cmp(&b.0));
    if let Some((loss, label)) = best {
        let _ = writeln!(out, "\nBest validation loss: {loss:.4} ({label}).");
    }
    seed_groups(&mut out, runs, &varied);
    let skipped: usize = runs.iter().map(|r| r.log.skipped_lines).sum();
    if skipped > 0 {
        let _ = writeln!(out, "\n{skipped} unreadable metrics line(s) skipped.");
    }
    if let Some(weight) = smooth {
        let _ = writeln!(
            out,
            "\nCurves smoothed as TensorBoard does (debiased exponential moving average, weight \
             {weight}); the raw values are drawn faint. The learning rate is not smoothed."
        );
    }
    out.push('\n');
    for series in drawn {
        let _ = writeln!(out, "![{}]({})", series.title, series.file);
    }
    out
}

/// The final numbers of a run, in [`METRIC_HEADERS`] order (MFU in per cent).
const METRIC_HEADERS: [&str; 4] = [
    "last interval loss",
    "best validation loss",
    "tokens/s",
    "MFU %",
];
const METRIC_DIGITS: [usize; 4] = [4, 4, 0, 2];

fn final_metrics(log: &MetricsLog) -> [Option<f64>; 4] {
    [
        log.last_interval_loss(),
        log.best_eval_loss(),
        log.mean_tokens_per_second(),
        log.mean_mfu().map(|m| m * 100.0),
    ]
}

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
}

fn table_head(
    out: &mut String,
    first: &str,
    varied: &[String],
    rest: impl Iterator<Item = String>,
) {
    let headers: Vec<String> = std::iter::once(first.to_owned())
        .chain(varied.iter().map(|k| format!("`{k}`")))
        .chain(rest)
        .collect();
    let _ = writeln!(out, "| {} |", headers.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(headers.len()));
}

fn table_row(out: &mut String, label: &str, values: &[String], rest: impl Iterator<Item = String>) {
    let cells: Vec<String> = std::iter::once(label.to_owned())
        .chain(values.iter().cloned())
        .chain(rest)
        .collect();
    let _ = writeln!(out, "| {} |", cells.join(" | "));
}

/// The recipe's leaves as `(dot.path, value)`, in the recipe's order; lists are leaves.
fn leaves(recipe: &Value) -> Vec<(String, &Value)> {
    fn walk<'a>(prefix: &str, value: &'a Value, out: &mut Vec<(String, &'a Value)>) {
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    let path = if prefix.is_empty() {
                        key.clone()
                    } else {
                        format!("{prefix}.{key}")
                    };
                    walk(&path, child, out);
                }
            }
            leaf => out.push((prefix.to_owned(), leaf)),
        }
    }
    let mut out = Vec::new();
    walk("", recipe, &mut out);
    out
}

/// The recipe keys whose values are not the same in every run that has a recipe (a key a run
/// lacks counts as a value of its own), outputs left out, in first-seen order. Fewer than two
/// recipes vary nothing.
fn varied_keys(runs: &[RunMetrics]) -> Vec<String> {
    let recipes: Vec<Vec<(String, &Value)>> = runs
        .iter()
        .filter_map(|r| r.recipe.as_ref().map(leaves))
        .collect();
    if recipes.len() < 2 {
        return Vec::new();
    }
    let mut keys: Vec<String> = Vec::new();
    for (key, _) in recipes.iter().flatten() {
        if !keys.contains(key) && !OUTPUT_KEYS.contains(&key.as_str()) {
            keys.push(key.clone());
        }
    }
    keys.retain(|key| {
        let first = lookup(&recipes[0], key);
        recipes[1..].iter().any(|r| lookup(r, key) != first)
    });
    keys
}

fn lookup<'a>(recipe: &[(String, &'a Value)], key: &str) -> Option<&'a Value> {
    recipe.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
}

/// A run's values of `keys`, as table cells (`-` where unknown or absent).
fn run_values(run: &RunMetrics, keys: &[String]) -> Vec<String> {
    keys.iter()
        .map(|key| {
            run.recipe
                .as_ref()
                .and_then(|r| r.pointer(&format!("/{}", key.replace('.', "/"))))
                .map_or_else(|| "-".to_owned(), cell_value)
        })
        .collect()
}

/// A recipe value as a table cell: `3e-4`, `128`, `cosine`, JSON for the rest.
fn cell_value(value: &Value) -> String {
    crate::expand::value_text(value).replace('|', "\\|")
}

/// When the seed varies: one row per point (the other varied values), with the number of
/// seeds and the mean ± sample standard deviation of each final number over them. Nothing
/// when no point has two seeds.
fn seed_groups(out: &mut String, runs: &[RunMetrics], varied: &[String]) {
    if !varied.iter().any(|k| k == SEED_KEY) {
        return;
    }
    let others: Vec<String> = varied.iter().filter(|k| *k != SEED_KEY).cloned().collect();
    let mut groups: Vec<(Vec<String>, Vec<&RunMetrics>)> = Vec::new();
    for run in runs.iter().filter(|r| r.recipe.is_some()) {
        let point = run_values(run, &others);
        match groups.iter_mut().find(|(p, _)| *p == point) {
            Some((_, members)) => members.push(run),
            None => groups.push((point, vec![run])),
        }
    }
    if groups.iter().all(|(_, members)| members.len() < 2) {
        return;
    }
    let _ = writeln!(
        out,
        "\n## Across seeds\n\nMean ± standard deviation (sample, n − 1) over the runs that \
         differ only in `{SEED_KEY}`.\n"
    );
    let headers = std::iter::once("seeds".to_owned()).chain(METRIC_HEADERS.map(str::to_owned));
    table_head(out, "runs", &others, headers);
    for (point, members) in &groups {
        let seeds: Vec<String> = run_values_of(members, SEED_KEY);
        let finals: Vec<[Option<f64>; 4]> = members.iter().map(|r| final_metrics(&r.log)).collect();
        let stats = (0..METRIC_HEADERS.len()).map(|i| {
            let values: Vec<f64> = finals.iter().filter_map(|f| f[i]).collect();
            mean_std(&values, METRIC_DIGITS[i])
        });
        let label = members
            .iter()
            .map(|r| r.label.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        table_row(
            out,
            &label,
            point,
            std::iter::once(format!("{} ({})", seeds.len(), seeds.join(", "))).chain(stats),
        );
    }
}

fn run_values_of(runs: &[&RunMetrics], key: &str) -> Vec<String> {
    let key = [key.to_owned()];
    runs.iter().flat_map(|r| run_values(r, &key)).collect()
}

/// `mean ± std` (sample standard deviation); the mean alone for one value, `-` for none.
fn mean_std(values: &[f64], digits: usize) -> String {
    let n = values.len();
    if n == 0 {
        return "-".to_owned();
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    if n == 1 {
        return format!("{mean:.digits$}");
    }
    let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    format!("{mean:.digits$} ± {:.digits$}", variance.sqrt())
}

/// TensorBoard's smoothing of a curve: an exponential moving average with `weight`, divided by
/// `1 - weight^n` so the start is not biased towards zero. Non-finite points, and constant
/// curves, stay as they are.
pub fn smoothed(points: &[(f64, f64)], weight: f64) -> Vec<(f64, f64)> {
    let constant = points.windows(2).all(|w| w[0].1 == w[1].1);
    let mut last = 0.0;
    let mut count = 0;
    points
        .iter()
        .map(|&(x, y)| {
            if constant || !y.is_finite() {
                return (x, y);
            }
            last = last * weight + (1.0 - weight) * y;
            count += 1;
            let debias = 1.0 - weight.powi(count);
            (x, last / debias)
        })
        .collect()
}

fn finite(points: &[(f64, f64)]) -> impl Iterator<Item = &(f64, f64)> {
    points
        .iter()
        .filter(|(x, y)| x.is_finite() && y.is_finite())
}

fn register_font() {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        // The font is compiled in and known to parse; a failure would only lose the labels.
        if plotters::style::register_font(FONT_FAMILY, FontStyle::Normal, FONT).is_err() {
            eprintln!("warning: the embedded report font could not be loaded");
        }
    });
}

fn padded(lo: f64, hi: f64) -> (f64, f64) {
    if hi > lo {
        let pad = (hi - lo) * 0.05;
        (lo - pad, hi + pad)
    } else {
        let pad = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
        (lo - pad, hi + pad)
    }
}

fn draw_chart(
    path: &Path,
    series: &Series,
    labels: &[&str],
    data: &[Vec<(f64, f64)>],
    smooth: Option<f64>,
) -> Result<(), SweepError> {
    register_font();
    let err = |e: &dyn std::fmt::Display| SweepError::Plot {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let all: Vec<(f64, f64)> = data.iter().flat_map(|p| finite(p).copied()).collect();
    let fold = |f: fn(&(f64, f64)) -> f64| {
        all.iter()
            .map(f)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            })
    };
    let (x_lo, x_hi) = padded_x(fold(|p| p.0));
    let x_hi = x_hi + (x_hi - x_lo) * LEGEND_ROOM;
    let (y_lo, y_hi) = {
        let (lo, hi) = fold(|p| p.1);
        padded(lo, hi)
    };
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let caption = match smooth {
        Some(weight) => format!("{} (smoothed {weight})", series.title),
        None => series.title.to_owned(),
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, (FONT_FAMILY, 26))
        .margin(16)
        .margin_right(32)
        .x_label_area_size(44)
        .y_label_area_size(80)
        .build_cartesian_2d(x_lo..x_hi, y_lo..y_hi)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc(series.y_label)
        .label_style((FONT_FAMILY, 15))
        .axis_desc_style((FONT_FAMILY, 17))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| compact(*v))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, (points, label)) in data.iter().zip(labels).enumerate() {
        let color = OKABE_ITO[i % OKABE_ITO.len()].to_rgba();
        let points: Vec<(f64, f64)> = finite(points).copied().collect();
        if points.is_empty() {
            continue;
        }
        let style = ShapeStyle::from(color).stroke_width(2);
        // Smoothed: the raw values faint and thin underneath, the average bold on top.
        let (raw_style, line) = match smooth {
            Some(weight) => (
                ShapeStyle::from(color.mix(RAW_ALPHA)).stroke_width(1),
                smoothed(&points, weight),
            ),
            None => (style, points.clone()),
        };
        if smooth.is_some() {
            chart
                .draw_series(LineSeries::new(points.iter().copied(), raw_style))
                .map_err(|e| err(&e))?;
        }
        // Sparse curves (evaluations, short runs) show where the measurements are.
        if points.len() <= SPARSE_POINTS {
            chart
                .draw_series(
                    points
                        .iter()
                        .map(|&p| Circle::new(p, 3, raw_style.filled())),
                )
                .map_err(|e| err(&e))?;
        }
        let drawn = chart
            .draw_series(LineSeries::new(line, style))
            .map_err(|e| err(&e))?;
        drawn
            .label(label.to_string())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
    }
    chart
        .configure_series_labels()
        .label_font((FONT_FAMILY, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(if series.falling {
            SeriesLabelPosition::UpperRight
        } else {
            SeriesLabelPosition::LowerRight
        })
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

fn padded_x((lo, hi): (f64, f64)) -> (f64, f64) {
    if hi > lo {
        (lo, hi)
    } else {
        (lo - 1.0, hi + 1.0)
    }
}

/// Axis numbers that stay short: `3e-4`, `1200`, `4.25`.
fn compact(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".to_owned()
    } else if !(1e-2..1e5).contains(&a) {
        format!("{v:.1e}")
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_numbers_are_short() {
        assert_eq!(compact(0.0003), "3.0e-4");
        assert_eq!(compact(4.25), "4.25");
        assert_eq!(compact(1234.5), "1234");
        assert_eq!(compact(0.0), "0");
    }

    #[test]
    fn smoothing_is_tensorboards_debiased_average() {
        let points = [(1.0, 1.0), (2.0, 0.0), (3.0, f64::NAN), (4.0, 1.0)];
        let got = smoothed(&points, 0.5);
        // 0.5 / 0.5, 0.25 / 0.75, NaN kept, (0.125 + 0.5) / 0.875: TensorBoard's values.
        assert_eq!(got[0], (1.0, 1.0));
        assert!((got[1].1 - 1.0 / 3.0).abs() < 1e-12, "{got:?}");
        assert!(got[2].1.is_nan());
        assert!((got[3].1 - 0.625 / 0.875).abs() < 1e-12, "{got:?}");
        assert_eq!(
            smoothed(&points, 0.0)[1],
            (2.0, 0.0),
            "weight 0 is the raw curve"
        );
        let flat = [(1.0, 2.0), (2.0, 2.0)];
        assert_eq!(smoothed(&flat, 0.9), flat);
    }

    #[test]
    fn mean_and_sample_std() {
        assert_eq!(mean_std(&[1.0, 2.0, 3.0], 2), "2.00 ± 1.00");
        assert_eq!(mean_std(&[4.0], 1), "4.0");
        assert_eq!(mean_std(&[], 1), "-");
    }

    #[test]
    fn varied_keys_leave_out_outputs_and_equal_values() {
        let run = |lr: f64, seed: u64, name: &str| RunMetrics {
            label: name.to_owned(),
            log: MetricsLog::default(),
            recipe: Some(serde_json::json!({
                "name": name,
                "training": {"seed": seed, "optimizer": {"lr": lr, "min_lr": 0.0}},
                "logging": {"jsonl": format!("{name}/metrics.jsonl")},
            })),
        };
        let runs = [run(3e-4, 1, "a"), run(3e-4, 2, "b"), run(1e-3, 1, "c")];
        assert_eq!(
            varied_keys(&runs),
            ["training.seed", "training.optimizer.lr"]
        );
        assert_eq!(run_values(&runs[0], &varied_keys(&runs)), ["1", "3e-4"]);
        assert!(varied_keys(&runs[..1]).is_empty(), "one run varies nothing");
    }

    #[test]
    fn flat_ranges_get_room() {
        assert_eq!(padded(2.0, 2.0), (1.8, 2.2));
        assert_eq!(padded(0.0, 0.0), (-1.0, 1.0));
        assert_eq!(padded_x((5.0, 5.0)), (4.0, 6.0));
    }
}
