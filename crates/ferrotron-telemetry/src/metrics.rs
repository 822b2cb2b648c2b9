//! Prometheus metrics for one rank of one run.
//!
//! Each `Metrics` owns a private registry (not the process-global one) whose const labels `run`
//! and `rank` are stamped on every series: ranks simulated as threads in one process, and tests
//! running side by side, then never collide, and a scrape of any rank says whose numbers it holds.
//!
//! Names and types follow what dashboards expect: what accumulates is a counter (`*_total`, so
//! `rate()` works and survives restarts), ratios end in `_ratio`, the step-time histogram sees
//! every step (not one mean per log line), a series appears only once it has a value (no
//! `ferrotron_eval_loss 0` before the first evaluation), and `ferrotron_build_info` says which
//! program produced them.

use std::collections::HashMap;
use std::sync::{Arc, Once};

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntGauge, Opts, Registry, TextEncoder,
};
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
    /// Model FLOPs utilisation, 0–1; none where the hardware has no known peak (a CPU rank,
    /// which the planner gives a nominal one only), so no JSONL field and NaN in Prometheus.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mfu: Option<f64>,
    pub step_seconds: f64,
    pub memory_bytes: u64,
}

/// What one iteration adds to the running totals; recorded every step, logged or not.
#[derive(Debug, Clone, Copy, Default)]
pub struct IterationCounts {
    pub seconds: f64,
    pub tokens: u64,
    pub samples: u64,
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
    /// Registers the evaluation series on the first evaluation.
    eval_registered: Arc<Once>,
    learning_rate: Gauge,
    grad_norm: Gauge,
    tokens_per_second: Gauge,
    tflops_per_gpu: Gauge,
    mfu: Gauge,
    step_seconds: Histogram,
    memory_bytes: IntGauge,
    steps_total: IntCounter,
    tokens_total: IntCounter,
    samples_total: IntCounter,
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
        let counter = |name: &str, help: &str| -> Result<IntCounter, TelemetryError> {
            let counter = IntCounter::with_opts(opts(name, help))?;
            registry.register(Box::new(counter.clone()))?;
            Ok(counter)
        };
        let build_info = IntGauge::with_opts(
            opts(
                "build_info",
                "The program that exports these series; always 1.",
            )
            .const_label("version", env!("CARGO_PKG_VERSION")),
        )?;
        build_info.set(1);
        registry.register(Box::new(build_info))?;
        // Not registered yet: see `record_eval`.
        let eval_loss =
            Gauge::with_opts(opts("eval_loss", "Validation loss of the last evaluation."))?;
        let eval_iteration = IntGauge::with_opts(opts(
            "eval_iteration",
            "Training iteration at which ferrotron_eval_loss was measured.",
        ))?;
        Ok(Self {
            steps_total: counter(
                "steps_total",
                "Training iterations completed by this process.",
            )?,
            tokens_total: counter("tokens_total", "Tokens trained on by this process.")?,
            samples_total: counter(
                "samples_total",
                "Samples (sequences) trained on by this process.",
            )?,
            iteration: int_gauge("iteration", "Last completed training iteration.")?,
            train_loss: gauge(
                "train_loss",
                "Interval loss: the mean training loss since the previous log line.",
            )?,
            eval_loss,
            eval_iteration,
            eval_registered: Arc::new(Once::new()),
            learning_rate: gauge("learning_rate", "Learning rate of the last step.")?,
            grad_norm: gauge("grad_norm", "Global gradient norm before clipping.")?,
            tokens_per_second: gauge("tokens_per_second", "Training throughput in tokens/s.")?,
            tflops_per_gpu: gauge("tflops_per_gpu", "Achieved model TFLOP/s per GPU.")?,
            mfu: gauge("mfu_ratio", "Model FLOPs utilisation, 0 to 1.")?,
            memory_bytes: int_gauge("memory_bytes", "Memory in use by this rank, in bytes.")?,
            step_seconds,
            registry,
        })
    }

    /// Counts one iteration and adds its duration to the step-time histogram. Call it every
    /// iteration; [`Metrics::record_step`] only on logged ones.
    pub fn record_iteration(&self, counts: IterationCounts) {
        self.steps_total.inc();
        self.tokens_total.inc_by(counts.tokens);
        self.samples_total.inc_by(counts.samples);
        self.step_seconds.observe(counts.seconds);
    }

    /// Sets every gauge from one logged step.
    pub fn record_step(&self, m: &StepMetrics) {
        self.iteration.set(saturating_i64(m.step));
        self.train_loss.set(m.loss);
        self.learning_rate.set(m.lr);
        self.grad_norm.set(m.grad_norm);
        self.tokens_per_second.set(m.tokens_per_second);
        self.tflops_per_gpu.set(m.tflops_per_gpu);
        self.mfu.set(m.mfu.unwrap_or(f64::NAN));
        self.memory_bytes.set(saturating_i64(m.memory_bytes));
    }

    /// Records a validation loss and the iteration it belongs to.
    pub fn record_eval(&self, step: u64, eval_loss: f64) {
        self.eval_iteration.set(saturating_i64(step));
        self.eval_loss.set(eval_loss);
        self.eval_registered.call_once(|| {
            for series in [
                Box::new(self.eval_loss.clone()) as Box<dyn prometheus::core::Collector>,
                Box::new(self.eval_iteration.clone()),
            ] {
                if let Err(error) = self.registry.register(series) {
                    tracing::error!(%error, "cannot export the evaluation series");
                }
            }
        });
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

/// Text exposition of a registry and of the process's default registry (where other crates put
/// their series: the NCCL communicator its collective bandwidths); errors only if a registry
/// holds malformed families.
pub(crate) fn encode(registry: &Registry) -> Result<String, prometheus::Error> {
    let mut families = registry.gather();
    families.extend(prometheus::gather());
    let mut buffer = Vec::new();
    TextEncoder::new().encode(&families, &mut buffer)?;
    String::from_utf8(buffer).map_err(|error| prometheus::Error::Msg(error.to_string()))
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every series and the type a dashboard relies on.
    const METRIC_TYPES: [(&str, &str); 15] = [
        ("ferrotron_iteration", "gauge"),
        ("ferrotron_train_loss", "gauge"),
        ("ferrotron_eval_loss", "gauge"),
        ("ferrotron_eval_iteration", "gauge"),
        ("ferrotron_learning_rate", "gauge"),
        ("ferrotron_grad_norm", "gauge"),
        ("ferrotron_tokens_per_second", "gauge"),
        ("ferrotron_tflops_per_gpu", "gauge"),
        ("ferrotron_mfu_ratio", "gauge"),
        ("ferrotron_step_seconds", "histogram"),
        ("ferrotron_memory_bytes", "gauge"),
        ("ferrotron_steps_total", "counter"),
        ("ferrotron_tokens_total", "counter"),
        ("ferrotron_samples_total", "counter"),
        ("ferrotron_build_info", "gauge"),
    ];

    fn counts() -> IterationCounts {
        IterationCounts {
            seconds: 0.3,
            tokens: 1024,
            samples: 8,
        }
    }

    /// The exposition as a Prometheus text-format parser reads it: (name, value) samples and the
    /// declared `# TYPE` of each family.
    fn parse(text: &str) -> prometheus_parse::Scrape {
        let lines = text.lines().map(|l| Ok(l.to_owned()));
        prometheus_parse::Scrape::parse(lines).expect("valid text exposition")
    }

    fn declared_types(text: &str) -> HashMap<String, String> {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_once(' '))
            .map(|(name, kind)| (name.to_owned(), kind.to_owned()))
            .collect()
    }

    /// Series another crate put into the process's default registry (the NCCL communicator's
    /// bandwidths) are served with ours.
    #[test]
    fn series_of_the_default_registry_are_served_too() {
        let gauge = prometheus::Gauge::new("ferrotron_test_default_registry", "a test series")
            .expect("a gauge");
        gauge.set(2.5);
        prometheus::default_registry()
            .register(Box::new(gauge))
            .expect("registers");
        let text = Metrics::new("gpt-tiny", 0).expect("metrics").encode_text();
        let scrape = parse(&text);
        assert!(
            scrape
                .samples
                .iter()
                .any(|s| s.metric == "ferrotron_test_default_registry"),
            "{text}"
        );
        assert!(
            scrape
                .samples
                .iter()
                .any(|s| s.metric == "ferrotron_iteration")
        );
    }

    #[test]
    fn names_and_types_are_what_dashboards_expect() {
        let metrics = Metrics::new("gpt-tiny", 3).expect("metrics");
        for _ in 0..3 {
            metrics.record_iteration(counts());
        }
        metrics.record_step(&sample_step());
        metrics.record_eval(40, 3.5);
        let text = metrics.encode_text();
        let scrape = parse(&text);
        let types = declared_types(&text);
        for (name, kind) in METRIC_TYPES {
            assert_eq!(
                types.get(name).map(String::as_str),
                Some(kind),
                "{name}:\n{text}"
            );
            let sample = scrape
                .samples
                .iter()
                .find(|s| s.metric == name || s.metric.starts_with(&format!("{name}_")))
                .unwrap_or_else(|| panic!("{name} missing from:\n{text}"));
            assert_eq!(sample.labels.get("run"), Some("gpt-tiny"), "{name}");
            assert_eq!(sample.labels.get("rank"), Some("3"), "{name}");
            let counter = matches!(sample.value, prometheus_parse::Value::Counter(_));
            assert_eq!(
                counter,
                kind == "counter",
                "{name} parsed as {:?}",
                sample.value
            );
        }
        let value = |name: &str| {
            scrape
                .samples
                .iter()
                .find(|s| s.metric == name)
                .map(|s| match &s.value {
                    prometheus_parse::Value::Counter(v)
                    | prometheus_parse::Value::Gauge(v)
                    | prometheus_parse::Value::Untyped(v) => *v,
                    prometheus_parse::Value::Histogram(buckets) => {
                        buckets.last().map_or(f64::NAN, |b| b.count)
                    }
                    _ => f64::NAN,
                })
                .unwrap_or_else(|| panic!("{name} missing"))
        };
        assert_eq!(value("ferrotron_steps_total"), 3.0);
        assert_eq!(value("ferrotron_tokens_total"), 3072.0);
        assert_eq!(value("ferrotron_samples_total"), 24.0);
        assert_eq!(
            value("ferrotron_step_seconds"),
            3.0,
            "every step is observed"
        );
        assert_eq!(value("ferrotron_build_info"), 1.0);
        let info = scrape
            .samples
            .iter()
            .find(|s| s.metric == "ferrotron_build_info");
        assert_eq!(
            info.and_then(|s| s.labels.get("version")),
            Some(env!("CARGO_PKG_VERSION"))
        );
    }

    #[test]
    fn no_eval_loss_before_the_first_evaluation() {
        let metrics = Metrics::new("fresh", 0).expect("metrics");
        metrics.record_iteration(counts());
        metrics.record_step(&sample_step());
        let before = metrics.encode_text();
        assert!(!before.contains("ferrotron_eval_loss"), "{before}");
        assert!(!before.contains("ferrotron_eval_iteration"), "{before}");
        metrics.record_eval(40, 3.5);
        metrics.record_eval(80, 3.25);
        let after = parse(&metrics.encode_text());
        let eval: Vec<_> = after
            .samples
            .iter()
            .filter(|s| s.metric == "ferrotron_eval_loss")
            .collect();
        assert_eq!(eval.len(), 1);
        assert!(matches!(eval[0].value, prometheus_parse::Value::Gauge(v) if v == 3.25));
    }

    fn sample_step() -> StepMetrics {
        StepMetrics {
            step: 42,
            loss: 3.25,
            lr: 0.0006,
            grad_norm: 1.5,
            tokens_per_second: 12_345.0,
            tflops_per_gpu: 410.5,
            mfu: Some(0.415),
            step_seconds: 0.3,
            memory_bytes: 1 << 30,
        }
    }

    #[test]
    fn recorded_values_appear_in_the_exposition() {
        let metrics = Metrics::new("run-a", 0).expect("metrics");
        metrics.record_step(&sample_step());
        metrics.record_iteration(counts());
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
        assert_eq!(value("ferrotron_mfu_ratio"), 0.415);
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
