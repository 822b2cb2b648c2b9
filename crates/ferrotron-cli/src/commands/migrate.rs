//! `recipe migrate FILE... [--write]`: rewrite recipes written in an older format version into
//! the current one, step by step (`ferrotron_recipe::STEPS`). The rewrite is a text edit on the
//! located YAML (keys renamed where they stand, values replaced in place, `version:` added or
//! bumped), so comments, key order and layout survive. Without `--write` it prints the change
//! as a unified diff (`git apply` reads it) and touches nothing.
//!
//! Exit 0: migrated, shown, or already current; 1: a file cannot be migrated (its problems are
//! printed at their lines), or `--check` found a file in an old format; 2: unreadable file.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::exit;
use ferrotron_recipe::{FORMAT_VERSION, inherited, migrate_text, unified_diff};

use super::validate::{handler, render};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Recipe files to migrate (each file is migrated on its own; bases are not followed).
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Rewrite the files in place (otherwise print the change as a diff).
    #[arg(long, conflicts_with = "check")]
    write: bool,
    /// Change nothing, print nothing on stdout; exit 1 when some file is in an old format.
    #[arg(long)]
    check: bool,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut failed = false;
    let mut unreadable = false;
    let mut outdated = false;
    let handler = handler();
    for path in &args.files {
        let name = path.display().to_string();
        let text = match ferrotron_recipe::read_text(path) {
            Ok(text) => text,
            Err(e) => {
                eprintln!("error: cannot read `{name}`: {e}");
                unreadable = true;
                continue;
            }
        };
        let migration = match migrate_text(&name, &text, &inherited(path, &text)) {
            Ok(migration) => migration,
            Err(errors) => {
                for problem in errors.problems() {
                    eprint!("{}", render(&handler, problem));
                }
                eprintln!("cannot migrate: {errors}");
                failed = true;
                continue;
            }
        };
        if migration.is_unchanged() {
            eprintln!("{name}: format version {FORMAT_VERSION}, nothing to migrate");
            continue;
        }
        outdated = true;
        let count = migration.changes.len();
        let verb = if args.write {
            "migrated"
        } else {
            "would migrate"
        };
        eprintln!(
            "{verb} {name}: format version {} → {} ({count} change{})",
            migration.from,
            migration.to,
            if count == 1 { "" } else { "s" }
        );
        for change in &migration.changes {
            eprintln!(
                "  {name}:{}:{}: {}",
                change.line, change.column, change.description
            );
        }
        if args.write {
            write_atomically(path, &migration.text)?;
        } else if !args.check {
            print!(
                "{}",
                unified_diff(
                    &format!("a/{name}"),
                    &format!("b/{name}"),
                    &text,
                    &migration.text
                )
            );
        }
    }
    Ok(if unreadable {
        exit::code(exit::USAGE)
    } else if failed || (args.check && outdated) {
        exit::code(exit::FAILED)
    } else {
        ExitCode::SUCCESS
    })
}

/// Replace `path` by a temporary file renamed into place, so an interrupted write leaves the old
/// recipe whole.
fn write_atomically(path: &Path, text: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temporary = dir.map_or_else(
        || PathBuf::from(format!(".{file_name}.migrate.tmp")),
        |d| d.join(format!(".{file_name}.migrate.tmp")),
    );
    std::fs::write(&temporary, text)
        .with_context(|| format!("cannot write {}", temporary.display()))?;
    std::fs::rename(&temporary, path)
        .with_context(|| format!("cannot replace {}", path.display()))?;
    Ok(())
}
