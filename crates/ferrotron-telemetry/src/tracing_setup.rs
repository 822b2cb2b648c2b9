//! Process-wide log set-up.
//!
//! Logs go to stderr (stdout is kept for command output such as `recipe show`). They are written
//! through the active progress bar, if any, so a log line never tears the bar apart on a terminal.

use std::io::{self, IsTerminal, Write};

use ferrotron_recipe::LogFormat;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

use crate::progress;

/// The filter used when `RUST_LOG` is unset or unparsable.
const DEFAULT_FILTER: &str = "info";

/// Installs the global subscriber: human-readable or one JSON object per line, filtered by
/// `RUST_LOG` (default `info`). Only the first call in a process has an effect.
pub fn init_tracing(format: LogFormat) {
    let (filter, bad_filter) = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => match EnvFilter::try_new(&spec) {
            Ok(filter) => (filter, None),
            Err(error) => (EnvFilter::new(DEFAULT_FILTER), Some((spec, error))),
        },
        _ => (EnvFilter::new(DEFAULT_FILTER), None),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(ProgressAwareStderr)
        // Colour codes only for a terminal: logs redirected to a file (a sweep member's run.log)
        // stay plain text.
        .with_ansi(io::stderr().is_terminal())
        // A log line that cannot be written is dropped. The default reports it with `eprint!`,
        // which panics when stderr itself is the broken pipe: a run whose log reader went away
        // (a `| tee` that died, a launcher that was killed) would end mid-step, unsaved.
        .log_internal_errors(false);
    let installed = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    if installed.is_ok()
        && let Some((spec, error)) = bad_filter
    {
        tracing::warn!(rust_log = %spec, %error, "ignoring invalid RUST_LOG; logging at info");
    }
}

/// Stderr, with the progress bar (if one is drawn) hidden while a log line is written.
#[derive(Debug, Clone, Copy)]
struct ProgressAwareStderr;

impl<'a> MakeWriter<'a> for ProgressAwareStderr {
    type Writer = Self;

    fn make_writer(&'a self) -> Self::Writer {
        *self
    }
}

impl Write for ProgressAwareStderr {
    /// The fmt layer hands over each formatted event in one call, so the bar is
    /// suspended once per log line.
    fn write(&mut self, buffer: &[u8]) -> io::Result<usize> {
        progress::suspend_active_bar(|| io::stderr().lock().write_all(buffer))?;
        Ok(buffer.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initialising_twice_does_not_panic() {
        init_tracing(LogFormat::Json);
        init_tracing(LogFormat::Human);
        tracing::info!("still logging after a second init");
    }
}
