//! Progress for long preprocessing runs: a live bar on a terminal, a plain line every few
//! seconds otherwise (CI logs and `| tee` should not fill with carriage returns).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{HumanBytes, HumanCount, ProgressBar, ProgressStyle};

/// How to show progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// A bar when stderr is a terminal, plain lines otherwise.
    Auto,
    /// Nothing.
    Hidden,
}

const PLAIN_EVERY: Duration = Duration::from_secs(5);

pub(super) struct ProgressReporter {
    mode: Mode,
    started: Instant,
    total_bytes: u64,
}

enum Mode {
    Bar(ProgressBar),
    Plain { last: Instant },
    Hidden,
}

impl ProgressReporter {
    pub(super) fn new(progress: Progress, total_bytes: u64) -> Self {
        let mode = match progress {
            Progress::Hidden => Mode::Hidden,
            Progress::Auto if std::io::stderr().is_terminal() => {
                let bar = ProgressBar::new(total_bytes);
                let style = ProgressStyle::with_template(
                    "{elapsed_precise} [{bar:30}] {bytes}/{total_bytes} {msg}",
                )
                .map(|s| s.progress_chars("=> "))
                .unwrap_or_else(|_| ProgressStyle::default_bar());
                bar.set_style(style);
                Mode::Bar(bar)
            }
            Progress::Auto => Mode::Plain {
                last: Instant::now(),
            },
        };
        ProgressReporter {
            mode,
            started: Instant::now(),
            total_bytes,
        }
    }

    pub(super) fn update(&mut self, bytes: u64, documents: u64, tokens: u64) {
        let line = self.describe(documents, tokens);
        match &mut self.mode {
            Mode::Bar(bar) => {
                bar.set_position(bytes);
                bar.set_message(line);
            }
            Mode::Plain { last } if last.elapsed() >= PLAIN_EVERY => {
                *last = Instant::now();
                eprintln!(
                    "preprocess: {}/{} {line}",
                    HumanBytes(bytes),
                    HumanBytes(self.total_bytes)
                );
            }
            Mode::Plain { .. } | Mode::Hidden => {}
        }
    }

    pub(super) fn finish(&mut self, bytes: u64, documents: u64, tokens: u64) {
        if let Mode::Bar(bar) = &self.mode {
            bar.set_position(bytes);
            bar.finish_with_message(self.describe(documents, tokens));
        }
    }

    fn describe(&self, documents: u64, tokens: u64) -> String {
        let seconds = self.started.elapsed().as_secs_f64().max(1e-3);
        format!(
            "{} docs, {} tokens, {} tokens/s",
            HumanCount(documents),
            HumanCount(tokens),
            HumanCount((tokens as f64 / seconds) as u64)
        )
    }
}
