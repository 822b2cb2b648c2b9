//! What can go wrong converting, each naming the file or tensor involved so a failed export or
//! import says what to fix.

use std::path::{Path, PathBuf};

use ferrotron_train::TrainError;

#[derive(Debug, thiserror::Error)]
pub enum HfError {
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The model uses features the target class cannot express; nothing was written.
    #[error("{class} cannot express this model:\n  {}", reasons.join("\n  "))]
    Inexpressible {
        class: &'static str,
        reasons: Vec<String>,
    },
    /// A `config.json` this crate cannot read as one of the supported classes.
    #[error("{}: {message}", path.display())]
    Config { path: PathBuf, message: String },
    /// A tensor file that is not what the config or the manifest says it should be.
    #[error("{}: {message}", path.display())]
    Tensors { path: PathBuf, message: String },
    #[error(transparent)]
    Checkpoint(#[from] TrainError),
}

impl HfError {
    pub(crate) fn io(action: &'static str, path: &Path, source: std::io::Error) -> Self {
        HfError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn config(path: &Path, message: impl Into<String>) -> Self {
        HfError::Config {
            path: path.to_path_buf(),
            message: message.into(),
        }
    }

    pub(crate) fn tensors(path: &Path, message: impl Into<String>) -> Self {
        HfError::Tensors {
            path: path.to_path_buf(),
            message: message.into(),
        }
    }
}
