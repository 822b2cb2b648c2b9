//! `recipe`: the one command-line entry point. Each subcommand lives in its own module under
//! `commands/` and turns library errors into miette diagnostics or anyhow context at this edge.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod commands;
mod exit;
mod failure;
mod nccl_env;

mod allocator;

/// Train GPT and Mixture-of-Experts models from declarative YAML recipes.
#[derive(Debug, Parser)]
#[command(name = "recipe", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check recipes against the schema and every semantic rule; all problems at once.
    Validate(commands::validate::Args),
    /// Print the fully resolved recipe (extends, overrides and defaults applied).
    Show(commands::show::Args),
    /// Print the JSON Schema of the recipe format.
    Schema(commands::schema::Args),
    /// Resolve the parallel layout: rank grid, groups, stages, memory, FLOPs, predicted time.
    Plan(commands::plan::Args),
    /// Tokenize JSONL text into Megatron-compatible `.bin/.idx` files.
    Preprocess(commands::preprocess::Args),
    /// Train a recipe.
    Run(commands::run::Args),
    /// Generate text from a checkpoint.
    Sample(commands::sample::Args),
    /// Write the sbatch script for a recipe's plan and submit it to Slurm (or print it).
    Submit(commands::submit::Args),
    /// Expand a sweep file into member recipes and run them (or list their plans).
    Sweep(commands::sweep::Args),
    /// Draw charts and a markdown summary of runs from their metrics files.
    Report(commands::report::Args),
    /// Compare two recipes (files or `REV:path`) field by field, with the plan impact.
    Diff(commands::diff::Args),
    /// Rewrite recipes in an older format version into the current one.
    Migrate(commands::migrate::Args),
    /// Export a checkpoint (any parallel layout) as a Hugging Face transformers model folder.
    Export(commands::hf_export::Args),
    /// Import a Hugging Face transformers model folder as a checkpoint to train from.
    Import(commands::hf_import::Args),
    /// Write a checkpoint's logits for given token ids (for comparisons with other code).
    Logits(commands::logits::Args),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(CompletionsArgs),
}

#[derive(Debug, clap::Args)]
struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

fn main() -> ExitCode {
    allocator::keep_freed_memory();
    // Before any thread exists: it changes the process environment (see the module).
    nccl_env::set_defaults();
    quiet_on_broken_pipe();
    // A panicking rank of a process world tells its peers at once (nothing outside one).
    ferrotron_dist::watchdog::abort_on_panic(ferrotron_dist::watchdog::global());
    let _faults = ferrotron_train::FaultInjection::from_env();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Validate(args) => commands::validate::run(args),
        Command::Show(args) => commands::show::run(args),
        Command::Schema(args) => commands::schema::run(args),
        Command::Plan(args) => commands::plan::run(args),
        Command::Preprocess(args) => commands::preprocess::run(args),
        Command::Run(args) => commands::run::run(args),
        Command::Sample(args) => commands::sample::run(args),
        Command::Submit(args) => commands::submit::run(args),
        Command::Sweep(args) => commands::sweep::run(args),
        Command::Report(args) => commands::report::run(args),
        Command::Diff(args) => commands::diff::run(args),
        Command::Migrate(args) => commands::migrate::run(args),
        Command::Export(args) => commands::hf_export::run(args),
        Command::Import(args) => commands::hf_import::run(args),
        Command::Logits(args) => commands::logits::run(args),
        Command::Completions(args) => {
            use clap::CommandFactory;
            clap_complete::generate(
                args.shell,
                &mut Cli::command(),
                "recipe",
                &mut std::io::stdout(),
            );
            Ok(ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        // Errors that reach here come before any work: arguments, unreadable files.
        Err(err) => {
            eprintln!("error: {}", failure::describe(&err));
            exit::code(exit::USAGE)
        }
    }
}

/// `recipe show x.yaml | head` closes the pipe early; `print!` then panics on the broken pipe.
/// The reader has what it wanted, so stop quietly with success, as `cat` would be killed by the
/// signal Rust ignores. Any other panic keeps the default report.
fn quiet_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        let file = info.location().map(|l| l.file()).unwrap_or_default();
        if stdout_was_closed(message, file) {
            std::process::exit(0);
        }
        default(info);
    }));
}

/// Whether a panic is a write to a closed stdout: `print!`'s own message, or clap_complete's
/// writer reporting the io::Error. Not any "Broken pipe": a rank whose peer died reports one
/// from its socket, and that run failed.
fn stdout_was_closed(message: &str, file: &str) -> bool {
    message.contains("Broken pipe")
        && (message.starts_with("failed printing to stdout") || file.contains("clap_complete"))
}

#[cfg(test)]
mod tests {
    use super::stdout_was_closed;

    #[test]
    fn only_a_closed_stdout_is_a_quiet_exit() {
        assert!(stdout_was_closed(
            "failed printing to stdout: Broken pipe (os error 32)",
            "library/std/src/io/stdio.rs"
        ));
        assert!(stdout_was_closed(
            "failed to write completion file: Os { code: 32, kind: BrokenPipe, message: \"Broken pipe\" }",
            "/cargo/registry/src/clap_complete-4.6.12/src/aot/generator/mod.rs"
        ));
        assert!(!stdout_was_closed(
            "all_reduce (gather) on group tp[0,1] aborted: the connection to rank 1 failed: Broken pipe (os error 32)",
            "crates/ferrotron-parallel/src/host.rs"
        ));
        assert!(!stdout_was_closed(
            "failed printing to stderr: Broken pipe (os error 32)",
            "library/std/src/io/stdio.rs"
        ));
    }
}
