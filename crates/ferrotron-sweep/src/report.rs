//! `recipe report`: PNG charts of runs (several overlaid for a sweep) and a short markdown
//! summary.
//!
//! Text is drawn with plotters' pure-Rust `ab_glyph` path and a font shipped in this crate
//! (DejaVu Sans, Bitstream Vera licence, `assets/`), embedded in the binary: no system fonts, no
//! fontconfig, so CI machines without fonts draw the same labels.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::SweepError;
use crate::metrics_log::{MetricsLog, StepPoint};
use crate::resolve::METRICS_FILE;

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

/// One `(step, value)` curve per run.
type Curves = Vec<Vec<(f64, f64)>>;

/// A run to report on: a label and its metrics.
#[derive(Debug, Clone)]
pub struct RunMetrics {
    pub label: String,
    pub log: MetricsLog,
}

/// What one chart shows.
#[derive(Debug, Clone, Copy)]
struct Series {
    file: &'static str,
    title: &'static str,
    y_label: &'static str,
    /// Curves that fall keep the upper right free for the legend; others the lower right.
    falling: bool,
}

const LOSS: Series = Series {
    file: "loss.png",
    title: "training loss",
    y_label: "loss",
    falling: true,
};
const EVAL: Series = Series {
    file: "eval_loss.png",
    title: "validation loss",
    y_label: "loss",
    falling: true,
};
const LR: Series = Series {
    file: "lr.png",
    title: "learning rate",
    y_label: "lr",
    falling: false,
};
const GRAD_NORM: Series = Series {
    file: "grad_norm.png",
    title: "gradient norm (before clipping)",
    y_label: "grad norm",
    falling: true,
};
const TOKENS: Series = Series {
    file: "tokens_per_second.png",
    title: "throughput",
    y_label: "tokens/s",
    falling: false,
};
const MFU: Series = Series {
    file: "mfu.png",
    title: "model FLOPs utilisation",
    y_label: "MFU %",
    falling: false,
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
            });
        }
    }
    Ok(runs)
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
pub fn write_report(runs: &[RunMetrics], out_dir: &Path) -> Result<Vec<PathBuf>, SweepError> {
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
        draw_chart(&path, series, &labels, data)?;
        drawn.push(*series);
        written.push(path);
    }
    let summary_path = out_dir.join("report.md");
    std::fs::write(&summary_path, summary(runs, &drawn)).map_err(|source| SweepError::Write {
        path: summary_path.clone(),
        source,
    })?;
    written.push(summary_path);
    Ok(written)
}

/// The markdown summary: one row per run, then the charts.
fn summary(runs: &[RunMetrics], drawn: &[Series]) -> String {
    let num = |v: Option<f64>, digits: usize| {
        v.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
    };
    let mut out = String::from("# Training report\n\n");
    let _ = writeln!(
        out,
        "{} run{}.\n",
        runs.len(),
        if runs.len() == 1 { "" } else { "s" }
    );
    out.push_str(
        "| run | logged steps | last step | last interval loss | best validation loss | tokens/s | MFU % |\n",
    );
    out.push_str("|---|---|---|---|---|---|---|\n");
    for run in runs {
        let log = &run.log;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            run.label,
            log.steps.len(),
            log.steps
                .last()
                .map_or_else(|| "-".to_owned(), |s| s.step.to_string()),
            num(log.last_interval_loss(), 4),
            num(log.best_eval_loss(), 4),
            num(log.mean_tokens_per_second(), 0),
            num(log.mean_mfu().map(|m| m * 100.0), 2),
        );
    }
    let best = runs
        .iter()
        .filter_map(|r| r.log.best_eval_loss().map(|l| (l, &r.label)))
        .min_by(|a, b| a.0.total_cmp(&b.0));
    if let Some((loss, label)) = best {
        let _ = writeln!(out, "\nBest validation loss: {loss:.4} ({label}).");
    }
    let skipped: usize = runs.iter().map(|r| r.log.skipped_lines).sum();
    if skipped > 0 {
        let _ = writeln!(out, "\n{skipped} unreadable metrics line(s) skipped.");
    }
    out.push('\n');
    for series in drawn {
        let _ = writeln!(out, "![{}]({})", series.title, series.file);
    }
    out
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
    let mut chart = ChartBuilder::on(&root)
        .caption(series.title, (FONT_FAMILY, 26))
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
        let drawn = chart
            .draw_series(LineSeries::new(points.iter().copied(), style))
            .map_err(|e| err(&e))?;
        drawn
            .label(label.to_string())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
        // Sparse curves (evaluations, short runs) show where the measurements are.
        if points.len() <= SPARSE_POINTS {
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 3, style.filled())))
                .map_err(|e| err(&e))?;
        }
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
    fn flat_ranges_get_room() {
        assert_eq!(padded(2.0, 2.0), (1.8, 2.2));
        assert_eq!(padded(0.0, 0.0), (-1.0, 1.0));
        assert_eq!(padded_x((5.0, 5.0)), (4.0, 6.0));
    }
}
