//! The collectives' achieved bandwidth as Prometheus series, read at scrape time.
//!
//! Registered in the process's default Prometheus registry (once, by the first world
//! communicator), which `ferrotron-telemetry` serves beside its own series on `/metrics`: the
//! telemetry crate knows nothing of NCCL and the training loop nothing of exporters. Values are
//! the totals since the process started, of collectives that already finished (no wait).

use std::sync::Once;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{GaugeVec, IntCounterVec, Opts};

use super::stats;

struct NcclCollector {
    bus: GaugeVec,
    algorithm: GaugeVec,
    bytes: IntCounterVec,
}

impl NcclCollector {
    fn new(rank: u32) -> prometheus::Result<Self> {
        let opts = |name: &str, help: &str| {
            Opts::new(name, help)
                .namespace("ferrotron")
                .const_label("rank", rank.to_string())
        };
        Ok(Self {
            bus: GaugeVec::new(
                opts(
                    "collective_bus_bandwidth_bytes_per_second",
                    "NCCL bus bandwidth per collective kind since start (NCCL-tests' definition).",
                ),
                &["kind"],
            )?,
            algorithm: GaugeVec::new(
                opts(
                    "collective_algorithm_bandwidth_bytes_per_second",
                    "NCCL algorithm bandwidth (bytes / GPU time) per collective kind since start.",
                ),
                &["kind"],
            )?,
            bytes: IntCounterVec::new(
                opts(
                    "collective_bytes_total",
                    "Bytes moved by NCCL collectives per kind.",
                ),
                &["kind"],
            )?,
        })
    }
}

impl Collector for NcclCollector {
    fn desc(&self) -> Vec<&Desc> {
        [self.bus.desc(), self.algorithm.desc(), self.bytes.desc()].concat()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        for s in stats::current() {
            let kind = [s.kind.name()];
            self.bus
                .with_label_values(&kind)
                .set(s.totals.bus_bandwidth());
            self.algorithm
                .with_label_values(&kind)
                .set(s.totals.algorithm_bandwidth());
            let counter = self.bytes.with_label_values(&kind);
            counter.inc_by((s.totals.bytes as u64).saturating_sub(counter.get()));
        }
        [
            self.bus.collect(),
            self.algorithm.collect(),
            self.bytes.collect(),
        ]
        .concat()
    }
}

/// Puts the collective series of this process (`rank`) into the default registry, once.
pub(crate) fn register(rank: u32) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let registered = NcclCollector::new(rank)
            .and_then(|c| prometheus::default_registry().register(Box::new(c)));
        if let Err(error) = registered {
            tracing::warn!(%error, "the NCCL bandwidth series are not exported");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The collector's descriptions are valid and match what it collects (a registry refuses a
    /// collector whose families it cannot describe); before any collective it exports nothing.
    #[test]
    fn the_collector_registers_and_exports_nothing_before_a_collective() {
        let registry = prometheus::Registry::new();
        registry
            .register(Box::new(NcclCollector::new(3).expect("valid series")))
            .expect("registers");
        assert!(registry.gather().iter().all(|f| f.get_metric().is_empty()));
        let names: Vec<String> = NcclCollector::new(3)
            .expect("valid series")
            .desc()
            .iter()
            .map(|d| d.fq_name.clone())
            .collect();
        assert_eq!(
            names,
            [
                "ferrotron_collective_bus_bandwidth_bytes_per_second",
                "ferrotron_collective_algorithm_bandwidth_bytes_per_second",
                "ferrotron_collective_bytes_total"
            ]
        );
    }
}
