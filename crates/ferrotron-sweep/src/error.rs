//! One error type for sweeps and reports, naming the file or member at fault so the CLI can print
//! it as it is.

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("cannot read sweep file {}: {source}", path.display())]
    ReadSpec {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("sweep file {}: {message}", path.display())]
    ParseSpec { path: PathBuf, message: String },
    #[error("sweep file {}: {message}", path.display())]
    InvalidSpec { path: PathBuf, message: String },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot start {} for member {member}: {source}", program.display())]
    Spawn {
        program: PathBuf,
        member: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot serialise {what}: {message}")]
    Serialize { what: String, message: String },
    #[error(transparent)]
    Telemetry(#[from] ferrotron_telemetry::TelemetryError),
    #[error("cannot draw {}: {message}", path.display())]
    Plot { path: PathBuf, message: String },
    #[error("no metrics found: {0}")]
    NoMetrics(String),
}
