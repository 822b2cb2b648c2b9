//! `recipe sweep`: expand a sweep file into member recipes, show their plans (`--dry-run`) or run
//! them as child processes of this executable, then print the results table.
//!
//! The sweep crate does the work; this edge picks the output directory, renders invalid members'
//! diagnostics with miette and maps the outcome to an exit code (0 all good, 1 some member
//! invalid or failed, 2 bad usage).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::exit;
use ferrotron_sweep::{
    Invalid, MemberStatus, RunnerOptions, SweepSpec, plan_line, render_markdown, resolve,
    result_rows, run_members, write_results,
};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The sweep file (`sweep: {name, base, set, grid, zip, seeds}`).
    pub sweep: PathBuf,
    /// List the members with their plans (and invalid ones with their diagnostics); run nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Members to run at once.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub parallel: u16,
    /// The sweep directory (default: `runs/<sweep name>/`).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Submit the members as one Slurm job array instead of running them here.
    #[arg(long)]
    pub submit: bool,
    #[command(flatten)]
    pub slurm: super::submit::SlurmArgs,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let spec = SweepSpec::load(&args.sweep)?;
    let cwd = std::env::current_dir().context("reading the current directory")?;
    let members = resolve(&spec, &cwd);
    let invalid = members.iter().filter(|m| m.resolution.is_err()).count();
    println!(
        "sweep {}: {} member{} from {}{}",
        spec.name,
        members.len(),
        if members.len() == 1 { "" } else { "s" },
        spec.base.display(),
        if invalid > 0 {
            format!(", {invalid} invalid")
        } else {
            String::new()
        }
    );
    for member in &members {
        match &member.resolution {
            Ok(valid) => println!(
                "  {} [{}] {}",
                member.spec.name,
                member.short_hash().unwrap_or("-"),
                plan_line(&valid.plan)
            ),
            Err(why) => {
                println!("  {} INVALID", member.spec.name);
                match why {
                    Invalid::Recipe(errors) => {
                        println!("{:?}", miette::Report::new(errors.clone()));
                    }
                    Invalid::Other(message) => println!("    {message}"),
                }
            }
        }
    }
    if args.dry_run {
        return Ok(if invalid > 0 {
            exit::code(exit::FAILED)
        } else {
            ExitCode::SUCCESS
        });
    }

    let out_dir = args
        .out
        .unwrap_or_else(|| PathBuf::from("runs").join(&spec.name));
    std::fs::create_dir_all(&out_dir)
        .with_context(|| format!("creating the sweep directory {}", out_dir.display()))?;
    // A copy of the sweep file beside its results (unless it already is that file).
    let copy = out_dir.join("sweep.yaml");
    if std::fs::canonicalize(&copy).ok() != std::fs::canonicalize(&args.sweep).ok() {
        std::fs::copy(&args.sweep, &copy)
            .with_context(|| format!("copying the sweep file into {}", out_dir.display()))?;
    }
    if args.submit {
        return super::submit::sweep(&spec, &members, &out_dir, &args.slurm);
    }
    let options = RunnerOptions {
        program: std::env::current_exe().context("finding this executable to run members")?,
        out_dir: out_dir.clone(),
        parallel: usize::from(args.parallel),
        run_args: Vec::new(),
    };
    let statuses = run_members(&members, &options, &|line| eprintln!("{line}"))?;
    let rows = result_rows(&members, &statuses, &out_dir);
    write_results(&out_dir, &rows)?;
    println!();
    print!("{}", render_markdown(&rows));
    println!(
        "\nresults: {} and {}",
        out_dir.join(ferrotron_sweep::RESULTS_MD).display(),
        out_dir.join(ferrotron_sweep::RESULTS_CSV).display()
    );
    let all_good = statuses
        .iter()
        .all(|s| matches!(s, MemberStatus::Finished | MemberStatus::Skipped));
    Ok(if all_good {
        ExitCode::SUCCESS
    } else {
        exit::code(exit::FAILED)
    })
}
