//! Prometheus metrics for one rank of one run.
//!
//! Each `Metrics` owns a private registry (not the process-global one) whose const labels `run`
//! and `rank` are stamped on every series: ranks simulated as threads in one process, and tests
//! running side by side, then never collide, and a scrape of any rank says whose numbers it holds.

use std::collections::HashMap;

use prometheus::{Encoder, Gauge, Histogram, HistogramOpts, IntGauge, Opts, Registry, TextEncoder};
use serde::Serialize;

use crate::error::TelemetryError;
use crate::server::MetricsServer;

/// Everything measured for one training step; also the JSONL record of a logged step.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StepMetrics {
    pub step: u64,
    pub loss: f64,
    pub lr: f64,
    pub grad_norm: f64,
    pub tokens_per_second: f64,
    pub tflops_per_gpu: f64,
    /// Model FLOPs utilisation, 0–1.
    pub mfu: f64,
    pub step_seconds: f64,
    pub memory_bytes: u64,
}

/// Step-time buckets from 5 ms (tiny CPU models) doubling up to about 164 s (large GPU steps).
const STEP_SECONDS_FIRST_BUCKET: f64 = 0.005;
const STEP_SECONDS_BUCKETS: usize = 16;

/// The gauges and histogram of one run's rank, with the registry that exports them.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    iteration: IntGauge,
    train_loss: Gauge,
    eval_loss: Gauge,
    eval_iteration: IntGauge,
    learning_rate: Gauge,
    grad_norm: Gauge,
    tokens_per_second: Gauge,
    tflops_per_gpu: Gauge,
    mfu: Gauge,
    step_seconds: Histogram,
    memory_bytes: IntGauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("iteration", &self.iteration.get())
            .finish_non_exhaustive()
    }
}

impl Metrics {
    /// Registers every `ferrotron_*` series labelled `run=<run>` and `rank=<rank>`.
    pub fn new(run: &str, rank: u32) -> Result<Self, TelemetryError> {
        let labels = HashMap::from([
            ("run".to_owned(), run.to_owned()),
            ("rank".to_owned(), rank.to_string()),
        ]);
        // Const labels go on each metric rather than on the registry: the registry's labels are
        // emitted in hash order, each metric's in sorted order, and scrapes should read the same.
        let opts = |name: &str, help: &str| Opts::new(name, help).const_labels(labels.clone());
        let registry = Registry::new_custom(Some("ferrotron".to_owned()), None)?;
        let int_gauge = |name: &str, help: &str| -> Result<IntGauge, TelemetryError> {
            let gauge = IntGauge::with_opts(opts(name, help))?;
            registry.register(Box::new(gauge.clone()))?;
            Ok(gauge)
        };
        let gauge = |name: &str, help: &str| -> Result<Gauge, TelemetryError> {
            let gauge = Gauge::with_opts(opts(name, help))?;
            registry.register(Box::new(gauge.clone()))?;
            Ok(gauge)
        };
        let step_seconds = Histogram::with_opts(
            HistogramOpts::from(opts(
                "step_seconds",
                "Wall-clock seconds per training step.",
            ))
            .buckets(prometheus::exponential_buckets(
                STEP_SECONDS_FIRST_BUCKET,
                2.0,
                STEP_SECONDS_BUCKETS,
            )?),
        )?;
        registry.register(Box::new(step_seconds.clone()))?;
        Ok(Self {
            iteration: int_gauge("iteration", "Last completed training iteration.")?,
            train_loss: gauge("train_loss", "Training loss of the last step.")?,
            eval_loss: gauge("eval_loss", "Validation loss of the last evaluation.")?,
            eval_iteration: int_gauge(
                "eval_iteration",
                "Training iteration at which ferrotron_eval_loss was measured.",
            )?,
            learning_rate: gauge("learning_rate", "Learning rate of the last step.")?,
            grad_norm: gauge("grad_norm", "Global gradient norm before clipping.")?,
            tokens_per_second: gauge("tokens_per_second", "Training throughput in tokens/s.")?,
            tflops_per_gpu: gauge("tflops_per_gpu", "Achieved model TFLOP/s per GPU.")?,
            mfu: gauge("mfu", "Model FLOPs utilisation, 0 to 1.")?,
            memory_bytes: int_gauge("memory_bytes", "Memory in use by this rank, in bytes.")?,
            step_seconds,
            registry,
        })
    }

    /// Sets every gauge from one step and adds its duration to the histogram.
    pub fn record_step(&self, m: &StepMetrics) {
        self.iteration.set(saturating_i64(m.step));
        self.train_loss.set(m.loss);
        self.learning_rate.set(m.lr);
        self.grad_norm.set(m.grad_norm);
        self.tokens_per_second.set(m.tokens_per_second);
        self.tflops_per_gpu.set(m.tflops_per_gpu);
        self.mfu.set(m.mfu);
        self.memory_bytes.set(saturating_i64(m.memory_bytes));
        self.step_seconds.observe(m.step_seconds);
    }

    /// Records a validation loss and the iteration it belongs to.
    pub fn record_eval(&self, step: u64, eval_loss: f64) {
        self.eval_iteration.set(saturating_i64(step));
        self.eval_loss.set(eval_loss);
    }

    /// The Prometheus text exposition of every series.
    pub fn encode_text(&self) -> String {
        encode(&self.registry).unwrap_or_else(|error| {
            tracing::error!(%error, "cannot encode the Prometheus metrics");
            format!("# ferrotron: cannot encode metrics: {error}\n")
        })
    }

    /// Serves `GET /metrics` on `address:port` (port 0 picks a free one) from a background thread.
    pub fn serve(&self, address: &str, port: u16) -> Result<MetricsServer, TelemetryError> {
        MetricsServer::start(self.registry.clone(), address, port)
    }
}

/// Text exposition of a registry; errors only if the registry holds malformed families.
pub(crate) fn encode(registry: &Registry) -> Result<String, prometheus::Error> {
    let mut buffer = Vec::new();
    TextEncoder::new().encode(&registry.gather(), &mut buffer)?;
    String::from_utf8(buffer).map_err(|error| prometheus::Error::Msg(error.to_string()))
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRIC_NAMES: [&str; 11] = [
        "ferrotron_iteration",
        "ferrotron_train_loss",
        "ferrotron_eval_loss",
        "ferrotron_eval_iteration",
        "ferrotron_learning_rate",
        "ferrotron_grad_norm",
        "ferrotron_tokens_per_second",
        "ferrotron_tflops_per_gpu",
        "ferrotron_mfu",
        "ferrotron_step_seconds",
        "ferrotron_memory_bytes",
    ];

    fn sample_step() -> StepMetrics {
        StepMetrics {
            step: 42,
            loss: 3.25,
            lr: 0.0006,
            grad_norm: 1.5,
            tokens_per_second: 12_345.0,
            tflops_per_gpu: 410.5,
            mfu: 0.415,
            step_seconds: 0.3,
            memory_bytes: 1 << 30,
        }
    }

    #[test]
    fn exposition_has_every_metric_with_run_and_rank_labels() {
        let metrics = Metrics::new("gpt-tiny", 3).expect("metrics");
        metrics.record_step(&sample_step());
        metrics.record_eval(40, 3.5);
        let text = metrics.encode_text();
        for name in METRIC_NAMES {
            let series = text
                .lines()
                .find(|line| line.starts_with(name) && !line.starts_with('#'))
                .unwrap_or_else(|| panic!("{name} missing from:\n{text}"));
            assert!(series.contains(r#"run="gpt-tiny""#), "{series}");
            assert!(series.contains(r#"rank="3""#), "{series}");
        }
        assert!(text.contains("# TYPE ferrotron_step_seconds histogram"));
    }

    #[test]
    fn recorded_values_appear_in_the_exposition() {
        let metrics = Metrics::new("run-a", 0).expect("metrics");
        metrics.record_step(&sample_step());
        metrics.record_eval(40, 3.5);
        let text = metrics.encode_text();
        let value = |name: &str| -> f64 {
            let line = text
                .lines()
                .find(|line| line.starts_with(&format!("{name}{{")))
                .unwrap_or_else(|| panic!("{name} missing"));
            let number = line.rsplit(' ').next().unwrap_or_default();
            number
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line}"))
        };
        assert_eq!(value("ferrotron_iteration"), 42.0);
        assert_eq!(value("ferrotron_train_loss"), 3.25);
        assert_eq!(value("ferrotron_eval_loss"), 3.5);
        assert_eq!(value("ferrotron_eval_iteration"), 40.0);
        assert_eq!(value("ferrotron_learning_rate"), 0.0006);
        assert_eq!(value("ferrotron_mfu"), 0.415);
        assert_eq!(value("ferrotron_memory_bytes"), f64::from(1u32 << 30));
        assert_eq!(value("ferrotron_step_seconds_count"), 1.0);
        assert_eq!(value("ferrotron_step_seconds_sum"), 0.3);
    }

    #[test]
    fn two_ranks_in_one_process_do_not_collide() {
        let rank0 = Metrics::new("shared", 0).expect("rank 0");
        let rank1 = Metrics::new("shared", 1).expect("rank 1");
        rank0.record_step(&StepMetrics {
            step: 7,
            ..StepMetrics::default()
        });
        let iteration_line = |metrics: &Metrics| {
            metrics
                .encode_text()
                .lines()
                .find(|line| line.starts_with("ferrotron_iteration{"))
                .map(str::to_owned)
                .unwrap_or_default()
        };
        let line0 = iteration_line(&rank0);
        let line1 = iteration_line(&rank1);
        assert!(
            line0.contains(r#"rank="0""#) && line0.ends_with(" 7"),
            "{line0}"
        );
        assert!(
            line1.contains(r#"rank="1""#) && line1.ends_with(" 0"),
            "{line1}"
        );
    }

    #[test]
    fn step_seconds_buckets_span_milliseconds_to_minutes() {
        let metrics = Metrics::new("buckets", 0).expect("metrics");
        let text = metrics.encode_text();
        assert!(text.contains(r#"le="0.005""#), "{text}");
        assert!(text.contains(r#"le="163.84""#), "{text}");
    }
}
