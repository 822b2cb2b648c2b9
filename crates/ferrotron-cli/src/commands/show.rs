//! `recipe show FILE`: the recipe exactly as the run will see it (extends, environment, `--set`
//! and derived defaults applied, paths resolved), optionally with where each value came from.

use std::path::PathBuf;
use std::process::ExitCode;

use ferrotron_recipe::{LoadOptions, load};

use crate::exit;

use super::validate::{handler, render};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The recipe file.
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// Override a key, e.g. `--set model.hidden_size=2048` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Annotate every value with its origin: file:line:col, --set, env, or default.
    #[arg(long)]
    origin: bool,
    /// Ignore `FERROTRON_SECTION__KEY` environment overrides.
    #[arg(long)]
    no_env: bool,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let opts = LoadOptions {
        overrides: &args.set,
        use_env: !args.no_env,
    };
    match load(&args.file, &opts) {
        Ok(loaded) => {
            let handler = handler();
            for warning in loaded.warnings() {
                eprint!("{}", render(&handler, warning));
            }
            print!("{}", loaded.to_yaml(args.origin));
            Ok(ExitCode::SUCCESS)
        }
        Err(errors) => {
            let handler = handler();
            for problem in errors.problems() {
                eprint!("{}", render(&handler, problem));
            }
            eprintln!("{errors}");
            Ok(exit::code(if errors.is_unreadable() {
                exit::USAGE
            } else {
                exit::FAILED
            }))
        }
    }
}
