//! Reading the metrics JSONL that `recipe run` writes, tolerantly: unknown fields are ignored, a
//! line may hold step and eval values together, and a torn or foreign line is skipped (counted)
//! rather than failing a whole report over one bad byte.

use std::path::Path;

use serde::Deserialize;

use crate::SweepError;

/// One training step as logged.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepPoint {
    pub step: u64,
    pub loss: f64,
    pub lr: Option<f64>,
    pub grad_norm: Option<f64>,
    pub tokens_per_second: Option<f64>,
    pub mfu: Option<f64>,
}

/// Everything in one metrics file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricsLog {
    pub steps: Vec<StepPoint>,
    /// `(step, eval_loss)`.
    pub evals: Vec<(u64, f64)>,
    /// Lines that were not JSON objects with a `step`.
    pub skipped_lines: usize,
}

#[derive(Deserialize)]
struct Line {
    step: u64,
    loss: Option<f64>,
    lr: Option<f64>,
    grad_norm: Option<f64>,
    tokens_per_second: Option<f64>,
    mfu: Option<f64>,
    eval_loss: Option<f64>,
}

impl MetricsLog {
    /// Reads `path`.
    pub fn read(path: &Path) -> Result<MetricsLog, SweepError> {
        let text = std::fs::read_to_string(path).map_err(|source| SweepError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(MetricsLog::parse(&text))
    }

    /// Parses JSONL text.
    pub fn parse(text: &str) -> MetricsLog {
        let mut log = MetricsLog::default();
        for raw in text.lines().filter(|l| !l.trim().is_empty()) {
            let Ok(line) = serde_json::from_str::<Line>(raw) else {
                log.skipped_lines += 1;
                continue;
            };
            if let Some(loss) = line.loss {
                log.steps.push(StepPoint {
                    step: line.step,
                    loss,
                    lr: line.lr,
                    grad_norm: line.grad_norm,
                    tokens_per_second: line.tokens_per_second,
                    mfu: line.mfu,
                });
            }
            if let Some(eval) = line.eval_loss {
                log.evals.push((line.step, eval));
            }
        }
        log
    }

    /// The interval loss of the last logged step: the mean loss over the steps since the log
    /// line before it (what metrics.jsonl's `loss`, the progress line and Prometheus show).
    pub fn last_interval_loss(&self) -> Option<f64> {
        self.steps.last().map(|s| s.loss)
    }

    /// The lowest validation loss (finite values only).
    pub fn best_eval_loss(&self) -> Option<f64> {
        self.evals
            .iter()
            .map(|&(_, l)| l)
            .filter(|l| l.is_finite())
            .min_by(f64::total_cmp)
    }

    /// Mean tokens/s over logged steps, leaving out the first one (it carries start-up cost)
    /// when there are others.
    pub fn mean_tokens_per_second(&self) -> Option<f64> {
        self.steady_mean(|s| s.tokens_per_second)
    }

    /// Mean MFU (0–1) over logged steps, like [`Self::mean_tokens_per_second`].
    pub fn mean_mfu(&self) -> Option<f64> {
        self.steady_mean(|s| s.mfu)
    }

    fn steady_mean(&self, value: impl Fn(&StepPoint) -> Option<f64>) -> Option<f64> {
        let values: Vec<f64> = self.steps.iter().filter_map(value).collect();
        let steady = if values.len() > 1 {
            &values[1..]
        } else {
            &values[..]
        };
        (!steady.is_empty()).then(|| steady.iter().sum::<f64>() / steady.len() as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_steps_and_evals_tolerantly() {
        let log = MetricsLog::parse(
            r#"{"step":10,"loss":5.0,"lr":0.001,"grad_norm":1.0,"tokens_per_second":100.0,"mfu":0.1,"extra":"x"}
{"step":20,"loss":4.0,"lr":0.002,"tokens_per_second":300.0,"mfu":0.3}
{"step":20,"eval_loss":4.5}
not json

{"step":30,"loss":3.0,"eval_loss":4.2,"tokens_per_second":500.0}
{"step":40,"lo"#,
        );
        assert_eq!(log.steps.len(), 3);
        assert_eq!(log.evals, vec![(20, 4.5), (30, 4.2)]);
        assert_eq!(log.skipped_lines, 2);
        assert_eq!(log.last_interval_loss(), Some(3.0));
        assert_eq!(log.best_eval_loss(), Some(4.2));
        assert_eq!(log.mean_tokens_per_second(), Some(400.0));
        assert_eq!(log.mean_mfu(), Some(0.3));
    }

    #[test]
    fn an_empty_log_has_no_numbers() {
        let log = MetricsLog::parse("");
        assert_eq!(log.last_interval_loss(), None);
        assert_eq!(log.best_eval_loss(), None);
        assert_eq!(log.mean_tokens_per_second(), None);
    }
}
