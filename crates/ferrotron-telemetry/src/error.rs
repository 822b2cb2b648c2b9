//! One error type for the crate, so the CLI can turn any telemetry failure into a diagnostic
//! that names the file or address at fault.

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot build the Prometheus metrics: {0}")]
    Prometheus(#[from] prometheus::Error),
    #[error("cannot listen for /metrics on {address}:{port}: {source}")]
    Bind {
        address: String,
        port: u16,
        #[source]
        source: io::Error,
    },
    #[error("cannot start the /metrics server: {0}")]
    ServerStart(#[source] io::Error),
    /// `what` names the file and the recipe key that set it, e.g.
    /// `the metrics file (logging.jsonl)`.
    #[error("cannot open {what} {}: {source}", path.display())]
    Open {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write {what} {}: {source}", path.display())]
    Write {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot serialise a metrics record as JSON: {0}")]
    Serialize(#[from] serde_json::Error),
    #[error("cannot write run manifest {}: {source}", path.display())]
    ManifestWrite {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read run manifest {}: {source}", path.display())]
    ManifestRead {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("run manifest {} is not valid: {source}", path.display())]
    ManifestParse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}
