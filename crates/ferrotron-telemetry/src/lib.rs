//! Prometheus exporter, JSONL metrics and tracing set-up
