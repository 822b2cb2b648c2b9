//! What a person (or a CI log) sees while training runs.
//!
//! On a terminal: one indicatif bar with ETA and the latest loss, redrawn in place. Anywhere else
//! (CI, pipes, files) redrawing a bar would fill the log with control codes, so each update becomes
//! one plain log line instead, with its own ETA from the mean step time of this process. The bar
//! being drawn is registered process-wide so that log lines are written around it, not through it.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::metrics::StepMetrics;

const BAR_TEMPLATE: &str =
    "{spinner:.green} [{elapsed_precise}] {wide_bar:.cyan/blue} {pos}/{len} eta {eta} {msg}";
const LOG_TARGET: &str = "ferrotron::progress";

/// The bar currently drawn on the terminal, with the id of the `Progress` that owns it.
static ACTIVE_BAR: Mutex<Option<(u64, ProgressBar)>> = Mutex::new(None);
static NEXT_PROGRESS_ID: AtomicU64 = AtomicU64::new(0);

/// Runs `write` with the active progress bar (if any) cleared from the screen.
pub(crate) fn suspend_active_bar<R>(write: impl FnOnce() -> R) -> R {
    let bar = ACTIVE_BAR
        .lock()
        .map(|active| active.as_ref().map(|(_, bar)| bar.clone()))
        .unwrap_or(None);
    match bar {
        Some(bar) => bar.suspend(write),
        None => write(),
    }
}

/// Training progress: a bar on a terminal, plain log lines otherwise.
#[derive(Debug)]
pub struct Progress {
    id: u64,
    display: Display,
    total_steps: u64,
    start_step: u64,
    last_step: AtomicU64,
    started: Instant,
}

#[derive(Debug)]
enum Display {
    Bar(ProgressBar),
    Lines,
}

impl Progress {
    /// A display for a run of `total_steps` iterations resuming after `start_step` (0 when fresh).
    pub fn new(total_steps: u64, start_step: u64) -> Self {
        let display = if std::io::stderr().is_terminal() {
            Display::Bar(new_bar(total_steps, start_step))
        } else {
            Display::Lines
        };
        Self::with_display(total_steps, start_step, display)
    }

    fn with_display(total_steps: u64, start_step: u64, display: Display) -> Self {
        let id = NEXT_PROGRESS_ID.fetch_add(1, Ordering::Relaxed);
        if let Display::Bar(bar) = &display
            && let Ok(mut active) = ACTIVE_BAR.lock()
        {
            *active = Some((id, bar.clone()));
        }
        Self {
            id,
            display,
            total_steps,
            start_step,
            last_step: AtomicU64::new(start_step),
            started: Instant::now(),
        }
    }

    /// Shows the step just finished. Call it every logged step: in line mode each call is a line.
    pub fn update(&self, m: &StepMetrics) {
        let interval = m
            .step
            .saturating_sub(self.last_step.swap(m.step, Ordering::Relaxed));
        let eta = estimate_eta(
            m.step.saturating_sub(self.start_step),
            self.started.elapsed(),
            self.total_steps.saturating_sub(m.step),
        );
        let line = progress_line(m, interval, self.total_steps, eta);
        match &self.display {
            // The line goes above the bar too, so the logged steps stay in the scrollback.
            Display::Bar(bar) => {
                bar.println(line);
                bar.set_position(m.step);
                bar.set_message(bar_message(m, interval));
            }
            Display::Lines => tracing::info!(target: LOG_TARGET, "{line}"),
        }
    }

    /// Prints `line` above the bar, or as a plain log line when there is no bar.
    pub fn message(&self, line: &str) {
        match &self.display {
            Display::Bar(bar) => bar.println(line),
            Display::Lines => tracing::info!(target: LOG_TARGET, "{line}"),
        }
    }

    /// Leaves the bar at its final state (or logs the total time) and stops redrawing.
    pub fn finish(&self) {
        match &self.display {
            // `abandon`, not `finish`: after a stop the bar shows the step reached, not the end.
            Display::Bar(bar) => bar.abandon(),
            Display::Lines => tracing::info!(
                target: LOG_TARGET,
                "finished at step {} of {} ({} steps in {})",
                self.last_step.load(Ordering::Relaxed),
                self.total_steps,
                self.last_step
                    .load(Ordering::Relaxed)
                    .saturating_sub(self.start_step),
                format_duration(self.started.elapsed())
            ),
        }
        self.deactivate();
    }

    /// Stops the bar where it is, with no closing line: the run failed, and "finished at
    /// step N" printed before the error would contradict it.
    pub fn abandon(&self) {
        if let Display::Bar(bar) = &self.display {
            bar.abandon();
        }
        self.deactivate();
    }

    fn deactivate(&self) {
        if let Ok(mut active) = ACTIVE_BAR.lock()
            && active.as_ref().is_some_and(|(id, _)| *id == self.id)
        {
            *active = None;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.deactivate();
    }
}

fn new_bar(total_steps: u64, start_step: u64) -> ProgressBar {
    let style = ProgressStyle::with_template(BAR_TEMPLATE)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    let bar = ProgressBar::new(total_steps)
        .with_style(style)
        .with_position(start_step);
    // Record the resume point, then forget the rate: the ETA counts only steps run by this process.
    bar.tick();
    bar.reset_eta();
    bar
}

fn bar_message(m: &StepMetrics, interval: u64) -> String {
    format!(
        "interval loss {:.4} (mean of {interval}) lr {:.2e} {:.0} tok/s{}",
        m.loss,
        m.lr,
        m.tokens_per_second,
        m.mfu
            .map_or_else(String::new, |mfu| format!(" mfu {:.1}%", mfu * 100.0))
    )
}

/// Remaining time at the mean pace of the steps run so far; `None` before the first step.
fn estimate_eta(steps_done: u64, elapsed: Duration, steps_left: u64) -> Option<Duration> {
    if steps_done == 0 {
        return None;
    }
    let seconds_per_step = elapsed.as_secs_f64() / steps_done as f64;
    Duration::try_from_secs_f64(seconds_per_step * steps_left as f64).ok()
}

/// One logged step. `loss` is the interval loss: the mean over the `interval` steps since the
/// previous line (Megatron's convention), named so it is not taken for the last step's loss.
fn progress_line(
    m: &StepMetrics,
    interval: u64,
    total_steps: u64,
    eta: Option<Duration>,
) -> String {
    let percent = if total_steps == 0 {
        100.0
    } else {
        m.step as f64 * 100.0 / total_steps as f64
    };
    let eta = eta.map_or_else(|| "unknown".to_owned(), format_duration);
    format!(
        "step {}/{} ({percent:.1}%) interval loss {:.4} (mean of {interval}) lr {:.3e} grad_norm {:.3} tokens/s {:.0} \
         TFLOP/s/GPU {:.2}{} step {:.3}s mem {} eta {eta}",
        m.step,
        total_steps,
        m.loss,
        m.lr,
        m.grad_norm,
        m.tokens_per_second,
        m.tflops_per_gpu,
        m.mfu
            .map_or_else(String::new, |mfu| format!(" MFU {:.1}%", mfu * 100.0)),
        m.step_seconds,
        format_bytes(m.memory_bytes),
    )
}

fn format_duration(duration: Duration) -> String {
    let seconds = duration.as_secs();
    match (seconds / 3600, seconds / 60 % 60, seconds % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, s) => format!("{h}h{m:02}m{s:02}s"),
    }
}

fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Captured {
        fn write(&mut self, buffer: &[u8]) -> io::Result<usize> {
            self.0
                .lock()
                .expect("capture lock")
                .extend_from_slice(buffer);
            Ok(buffer.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn captured_logs(body: impl FnOnce()) -> String {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, body);
        let bytes = captured.0.lock().expect("capture lock").clone();
        String::from_utf8(bytes).expect("utf-8 logs")
    }

    fn step(step: u64) -> StepMetrics {
        StepMetrics {
            step,
            loss: 2.5,
            lr: 3e-4,
            grad_norm: 0.75,
            tokens_per_second: 8192.0,
            tflops_per_gpu: 1.25,
            mfu: Some(0.5),
            step_seconds: 0.125,
            memory_bytes: 3 << 29,
        }
    }

    #[test]
    fn eta_follows_the_mean_step_time() {
        assert_eq!(estimate_eta(0, Duration::from_secs(5), 10), None);
        assert_eq!(
            estimate_eta(4, Duration::from_secs(8), 10),
            Some(Duration::from_secs(20))
        );
        assert_eq!(
            estimate_eta(4, Duration::from_secs(8), 0),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn a_progress_line_carries_every_number() {
        let line = progress_line(&step(25), 5, 100, Some(Duration::from_secs(3725)));
        assert_eq!(
            line,
            "step 25/100 (25.0%) interval loss 2.5000 (mean of 5) lr 3.000e-4 grad_norm 0.750 tokens/s 8192 \
             TFLOP/s/GPU 1.25 MFU 50.0% step 0.125s mem 1.50 GiB eta 1h02m05s"
        );
        let cpu = StepMetrics {
            mfu: None,
            ..step(25)
        };
        let line = progress_line(&cpu, 5, 100, None);
        assert!(
            line.contains("TFLOP/s/GPU 1.25 step 0.125s") && !line.contains("MFU"),
            "{line}"
        );
        assert!(progress_line(&step(1), 1, 10, None).ends_with("eta unknown"));
    }

    #[test]
    fn durations_and_sizes_read_naturally() {
        assert_eq!(format_duration(Duration::from_secs(9)), "9s");
        assert_eq!(format_duration(Duration::from_secs(65)), "1m05s");
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1536), "1.50 KiB");
    }

    #[test]
    fn without_a_terminal_each_update_is_one_log_line() {
        let logs = captured_logs(|| {
            let progress = Progress::with_display(4, 1, Display::Lines);
            progress.update(&step(2));
            progress.message("eval loss 2.4000");
            progress.update(&step(3));
            progress.finish();
        });
        let lines: Vec<&str> = logs.lines().collect();
        assert_eq!(lines.len(), 4, "{logs}");
        assert!(
            lines[0].contains("step 2/4 (50.0%) interval loss 2.5000 (mean of 1)"),
            "{logs}"
        );
        assert!(lines[1].contains("eval loss 2.4000"), "{logs}");
        assert!(lines[2].contains("step 3/4"), "{logs}");
        assert!(
            lines[3].contains("finished at step 3 of 4 (2 steps in"),
            "{logs}"
        );
        assert!(lines.iter().all(|line| line.contains(LOG_TARGET)), "{logs}");
    }

    #[test]
    fn a_bar_is_active_until_finished() {
        let progress = Progress::with_display(5, 0, Display::Bar(ProgressBar::hidden()));
        let is_active = || {
            ACTIVE_BAR
                .lock()
                .expect("active bar lock")
                .as_ref()
                .is_some_and(|(id, _)| *id == progress.id)
        };
        assert!(is_active());
        progress.update(&step(1));
        assert_eq!(suspend_active_bar(|| 7), 7);
        progress.update(&step(3));
        progress.finish();
        assert!(!is_active());
        let Display::Bar(bar) = &progress.display else {
            unreachable!("built with a bar")
        };
        assert_eq!(
            bar.position(),
            3,
            "a stopped run's bar shows the step reached, not 5/5"
        );
    }
}
