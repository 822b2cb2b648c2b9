//! The Grafana dashboard and recording rules shipped in tools/grafana/ must only name series that
//! the exporter serves (or that the rules record): a renamed metric would otherwise leave a
//! dashboard of empty panels, and nothing in the program would notice.

use std::collections::BTreeSet;
use std::path::Path;

use ferrotron_telemetry::{IterationCounts, Metrics, StepMetrics};

fn tools(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tools/grafana")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `ferrotron_*` / `ferrotron:*` identifier in `text`.
fn names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(start) = rest.find("ferrotron") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        if name.len() > "ferrotron".len()
            && name.as_bytes()["ferrotron".len()].is_ascii_punctuation()
        {
            out.insert(name.to_owned());
        }
        rest = &tail[end.max(1)..];
    }
    out
}

fn exported() -> BTreeSet<String> {
    let metrics = Metrics::new("dash", 0).expect("metrics");
    metrics.record_iteration(IterationCounts::default());
    metrics.record_step(&StepMetrics::default());
    metrics.record_eval(1, 1.0);
    metrics
        .encode_text()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn dashboard_and_rules_name_only_served_or_recorded_series() {
    let served = exported();
    let rules = tools("recording-rules.yml");
    let recorded: BTreeSet<String> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- record: "))
        .map(str::to_owned)
        .collect();
    assert!(!recorded.is_empty());
    let dashboard = tools("ferrotron-dashboard.json");
    serde_json::from_str::<serde_json::Value>(&dashboard).expect("the dashboard is JSON");
    for (file, text) in [
        ("recording-rules.yml", &rules),
        ("ferrotron-dashboard.json", &dashboard),
    ] {
        for name in names(text) {
            let known = served.contains(&name) || recorded.contains(&name);
            assert!(
                known,
                "{file} names `{name}`, which is neither served nor recorded"
            );
        }
    }
    for name in [
        "ferrotron_tokens_total",
        "ferrotron_mfu_ratio",
        "ferrotron_step_seconds_bucket",
    ] {
        assert!(served.contains(name), "{name} not served: {served:?}");
        assert!(names(&rules).contains(name), "the rules do not use {name}");
    }
}
