//! `recipe report`: charts and a markdown summary of finished (or running) runs, read from their
//! metrics files. A sweep directory stands for all of its members.

use std::path::PathBuf;
use std::process::ExitCode;

use ferrotron_sweep::{ReportOptions, collect_runs, write_report};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Run directories (holding `metrics.jsonl`) or sweep directories (whose members do).
    #[arg(required = true, value_name = "RUN_DIR")]
    pub run_dirs: Vec<PathBuf>,
    /// Where the PNGs and report.md go (default: `<first RUN_DIR>/report`).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Smooth the noisy curves as TensorBoard does (debiased moving average with this weight,
    /// 0 ≤ W < 1; e.g. 0.6), the raw values drawn faint underneath.
    #[arg(long, value_name = "W", value_parser = smoothing_weight)]
    pub smooth: Option<f64>,
}

fn smoothing_weight(text: &str) -> Result<f64, String> {
    let weight: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number"))?;
    if (0.0..1.0).contains(&weight) {
        Ok(weight)
    } else {
        Err(format!(
            "{weight} is outside 0 ≤ W < 1 (0 draws the raw values, 0.99 smooths a lot)"
        ))
    }
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let runs = collect_runs(&args.run_dirs)?;
    let out = args.out.unwrap_or_else(|| args.run_dirs[0].join("report"));
    let options = ReportOptions {
        smooth: args.smooth,
    };
    let written = write_report(&runs, &out, &options)?;
    for path in &written {
        println!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
