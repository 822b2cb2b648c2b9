//! `recipe validate FILE...`: every problem of every file at once, for people (rustc-style
//! snippets) and for CI (JSON, GitHub Actions annotations, SARIF). Exit 0: all valid; 1: some
//! invalid; 2: usage or unreadable file.
//!
//! The recipe crate checks the schema and its own semantic rules while loading; the planner's
//! layout rules run here on the loaded recipe and come back located through the same source map.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::exit;
use ferrotron_recipe::{Checked, LoadOptions, Problem, Severity, load};
use miette::{GraphicalReportHandler, GraphicalTheme};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Recipe files to check.
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Override a key before checking, e.g. `--set model.hidden_size=2048` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Output: rustc-style diagnostics, one JSON object per diagnostic, GitHub Actions workflow
    /// commands (`::error file=..,line=..::..`, annotating a pull request), or a SARIF 2.1.0 log.
    #[arg(long, value_enum, default_value_t = Format::Human)]
    format: Format,
    /// Ignore `FERROTRON_SECTION__KEY` environment overrides.
    #[arg(long)]
    no_env: bool,
    /// Also check that every data file, blend prefix (`.bin` and `.idx`) and tokenizer file the
    /// recipe names exists and is readable (`recipe run` always does).
    #[arg(long)]
    check_files: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Human,
    Json,
    Github,
    Sarif,
}

/// What checking one file gave.
struct Outcome {
    file: String,
    problems: Vec<Problem>,
    unreadable: bool,
    /// The recipe's format version, when it loaded.
    version: Option<u32>,
    /// An `abstract: true` fragment with nothing wrong in what it sets.
    fragment: bool,
}

impl Outcome {
    fn errors(&self) -> usize {
        self.problems
            .iter()
            .filter(|p| p.severity() == Severity::Error)
            .count()
    }
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let opts = LoadOptions {
        overrides: &args.set,
        use_env: !args.no_env,
    };
    let outcomes: Vec<Outcome> = args
        .files
        .iter()
        .map(|f| check_file(f, &opts, args.check_files))
        .collect();
    match args.format {
        Format::Human => print_human(&outcomes),
        Format::Json => print_json(&outcomes)?,
        Format::Github | Format::Sarif => {
            let checked: Vec<Checked<'_>> = outcomes
                .iter()
                .map(|o| Checked {
                    recipe: &o.file,
                    problems: &o.problems,
                })
                .collect();
            let cwd = std::env::current_dir().unwrap_or_default();
            if args.format == Format::Github {
                print!("{}", ferrotron_recipe::github_annotations(&checked, &cwd));
            } else {
                let log = ferrotron_recipe::sarif_log(&checked, env!("CARGO_PKG_VERSION"), &cwd);
                println!("{}", serde_json::to_string_pretty(&log)?);
            }
        }
    }
    Ok(if outcomes.iter().any(|o| o.unreadable) {
        exit::code(exit::USAGE)
    } else if outcomes.iter().any(|o| o.errors() > 0) {
        exit::code(exit::FAILED)
    } else {
        ExitCode::SUCCESS
    })
}

fn check_file(path: &std::path::Path, opts: &LoadOptions, files: bool) -> Outcome {
    let file = path.display().to_string();
    match load(path, opts) {
        Ok(loaded) => {
            let mut findings =
                ferrotron_plan::check_layout(&loaded.recipe, loaded.recipe.cluster.as_ref());
            findings.extend(token_ids(&loaded.recipe));
            let mut problems = loaded.warnings().to_vec();
            problems.extend(loaded.problems_for(&findings));
            if files {
                problems.extend(loaded.check_files());
            }
            problems.sort_by_key(|p| p.severity());
            Outcome {
                file,
                problems,
                unreadable: false,
                version: Some(loaded.recipe.version),
                fragment: false,
            }
        }
        Err(mut errors) => {
            errors.check_partial(&|recipe| {
                ferrotron_plan::check_layout(recipe, recipe.cluster.as_ref())
            });
            let fragment = errors.is_valid_fragment();
            let problems = errors
                .problems()
                .iter()
                // Being a fragment is what `validate` was asked to accept, not a problem.
                .filter(|p| p.code() != "recipe::abstract")
                .cloned()
                .collect();
            Outcome {
                file,
                unreadable: errors.is_unreadable(),
                problems,
                version: None,
                fragment,
            }
        }
    }
}

/// The token ids of every blend entry that is an indexed dataset on disk, against the model's
/// vocabulary (the recipe's, else the tokenizer's when it loads). A missing file is not an
/// error here: data often lives only where the run happens. JSONL entries are tokenized at
/// run time and checked then.
fn token_ids(recipe: &ferrotron_recipe::Recipe) -> Vec<ferrotron_recipe::Finding> {
    let vocab = recipe
        .model
        .vocab_size
        .or_else(|| ferrotron_data::tokenizer_vocab_size(&recipe.data.tokenizer).ok());
    let Some(vocab) = vocab else {
        return Vec::new();
    };
    let cache_dir = std::path::PathBuf::from(
        recipe
            .data
            .cache_dir
            .as_deref()
            .unwrap_or(ferrotron_data::DEFAULT_CACHE_DIR),
    );
    let mut findings = Vec::new();
    for (i, entry) in recipe.data.blend.iter().enumerate() {
        let path = std::path::Path::new(&entry.path);
        let prefix = match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl" | "json") => continue,
            Some("bin" | "idx") => path.with_extension(""),
            _ => path.to_path_buf(),
        };
        let Ok(dataset) = ferrotron_data::IndexedDataset::open(&prefix) else {
            continue;
        };
        if let Err(err) = ferrotron_data::check_vocabulary(&dataset, &cache_dir, vocab) {
            findings.push(
                ferrotron_recipe::Finding::error(
                    "data::vocabulary",
                    format!("data.blend.{i}.path"),
                    err.to_string(),
                )
                .with_help("tokenize the data with the model's tokenizer, or fix model.vocab_size"),
            );
        }
    }
    findings
}

/// The graphical handler used for every human-readable diagnostic of the CLI: colour only on a
/// terminal (and not under `NO_COLOR`), a fixed width so output does not depend on the terminal.
pub(crate) fn handler() -> GraphicalReportHandler {
    let colour = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let theme = if colour {
        GraphicalTheme::unicode()
    } else {
        GraphicalTheme::unicode_nocolor()
    };
    GraphicalReportHandler::new_themed(theme).with_width(100)
}

pub(crate) fn render(handler: &GraphicalReportHandler, problem: &Problem) -> String {
    let mut out = String::new();
    if handler.render_report(&mut out, problem).is_err() {
        out = format!("{problem}\n");
    }
    out
}

fn print_human(outcomes: &[Outcome]) {
    let handler = handler();
    for outcome in outcomes {
        for problem in &outcome.problems {
            print!("{}", render(&handler, problem));
            println!();
        }
        let errors = outcome.errors();
        let warnings = outcome.problems.len() - errors;
        let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
        let version = match outcome.version {
            Some(v) => format!("format version {v}"),
            None if outcome.fragment => "abstract fragment".to_owned(),
            None => String::new(),
        };
        match (errors, warnings) {
            (0, 0) => println!("ok: {} ({version})", outcome.file),
            (0, w) => println!("ok: {} ({version}, {})", outcome.file, plural(w, "warning")),
            (e, 0) => println!("invalid: {} ({})", outcome.file, plural(e, "error")),
            (e, w) => println!(
                "invalid: {} ({}, {})",
                outcome.file,
                plural(e, "error"),
                plural(w, "warning")
            ),
        }
    }
}

fn print_json(outcomes: &[Outcome]) -> anyhow::Result<()> {
    let mut all = Vec::new();
    for outcome in outcomes {
        for problem in &outcome.problems {
            let mut value = problem.to_json();
            if let Some(object) = value.as_object_mut() {
                object.insert("recipe".to_owned(), outcome.file.clone().into());
                if object.get("file").is_some_and(serde_json::Value::is_null) {
                    object.insert("file".to_owned(), outcome.file.clone().into());
                }
            }
            all.push(value);
        }
    }
    println!("{}", serde_json::to_string_pretty(&all)?);
    Ok(())
}
