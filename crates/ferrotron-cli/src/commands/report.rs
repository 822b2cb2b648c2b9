//! `recipe report`: charts and a markdown summary of finished (or running) runs, read from their
//! metrics files. A sweep directory stands for all of its members.

use std::path::PathBuf;
use std::process::ExitCode;

use ferrotron_sweep::{collect_runs, write_report};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Run directories (holding `metrics.jsonl`) or sweep directories (whose members do).
    #[arg(required = true, value_name = "RUN_DIR")]
    pub run_dirs: Vec<PathBuf>,
    /// Where the PNGs and report.md go (default: `<first RUN_DIR>/report`).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let runs = collect_runs(&args.run_dirs)?;
    let out = args.out.unwrap_or_else(|| args.run_dirs[0].join("report"));
    let written = write_report(&runs, &out)?;
    for path in &written {
        println!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
