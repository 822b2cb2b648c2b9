//! One error type for the training runtime, so the CLI can turn every failure into a single
//! clear message (what, where, which value) at its edge.

use std::path::PathBuf;

/// Everything that can stop a training run or a checkpoint operation.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The recipe or plan asks for something the runtime cannot do.
    #[error("{0}")]
    Config(String),
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("checkpoint {path}: {message}")]
    Checkpoint { path: PathBuf, message: String },
    /// A tensor file whose bytes are not the ones the checkpoint recorded.
    #[error(
        "checkpoint {path}: {file} is damaged: its blake3 is {actual}, the manifest recorded {expected}"
    )]
    Damaged {
        path: PathBuf,
        file: String,
        expected: String,
        actual: String,
    },
    /// A checkpoint of another model: every differing field, "field: checkpoint X, recipe Y".
    #[error("checkpoint {path} was written for a different model:\n  {}", .fields.join("\n  "))]
    ModelMismatch { path: PathBuf, fields: Vec<String> },
    /// The loss or the gradient norm stopped being a number; the step was not applied.
    #[error(
        "iteration {iteration}: {what} is {value} — stopping before the optimizer step (nothing was saved from this step); lower the learning rate or check the data"
    )]
    NonFinite {
        iteration: u64,
        what: &'static str,
        value: f64,
    },
    /// A collective failed (a peer failed or did not arrive): what the runtime was doing.
    #[error("{what}: {source}")]
    Collective {
        what: &'static str,
        #[source]
        source: Box<ferrotron_parallel::CommError>,
    },
    #[error(transparent)]
    Data(#[from] ferrotron_data::DataError),
    #[error(transparent)]
    Model(#[from] ferrotron_model::ModelError),
    #[error(transparent)]
    Telemetry(#[from] ferrotron_telemetry::TelemetryError),
}

impl TrainError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        TrainError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn checkpoint(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        TrainError::Checkpoint {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// The error of a failed collective, saying what it was for.
pub(crate) fn comm_error(what: &'static str, source: ferrotron_parallel::CommError) -> TrainError {
    TrainError::Collective {
        what,
        source: Box::new(source),
    }
}
