//! Handing a script to `sbatch`.
//!
//! `sbatch --parsable` prints the job id (`123` or `123;cluster` on federated sites); that id is
//! what a user needs next (`squeue -j`, `scancel`, the log file name), so it is the result.
//! The log directory is created first because Slurm does not: a job whose `--output` directory
//! is missing starts, fails to open its log and vanishes without a word.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::sbatch::SbatchScript;

/// Why a submission failed.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "cannot run sbatch ({source}); is Slurm installed and on PATH? (--dry-run prints the script)"
    )]
    NoSbatch { source: std::io::Error },
    #[error("sbatch refused {}: {stderr}", script.display())]
    Refused { script: PathBuf, stderr: String },
    #[error("sbatch printed {output:?}, not a job id")]
    NoJobId { output: String },
}

/// Parses `sbatch --parsable` output: `123` or `123;cluster`.
pub fn parse_job_id(output: &str) -> Result<u64, SubmitError> {
    output
        .trim()
        .split(';')
        .next()
        .and_then(|id| id.trim().parse().ok())
        .ok_or_else(|| SubmitError::NoJobId {
            output: output.to_owned(),
        })
}

/// Writes `script` to `path`, creates its log directory and submits it; returns the job id.
pub fn submit(script: &SbatchScript, path: &Path) -> Result<u64, SubmitError> {
    let write_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SubmitError::Write { path, source }
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(write_error(parent))?;
    }
    fs::write(path, script.text()).map_err(write_error(path))?;
    fs::create_dir_all(&script.log_dir).map_err(write_error(&script.log_dir))?;
    let output = Command::new("sbatch")
        .arg("--parsable")
        .arg(path)
        .output()
        .map_err(|source| SubmitError::NoSbatch { source })?;
    if !output.status.success() {
        return Err(SubmitError::Refused {
            script: path.to_path_buf(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    parse_job_id(&String::from_utf8_lossy(&output.stdout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_with_and_without_cluster() {
        assert_eq!(parse_job_id("4242\n").ok(), Some(4242));
        assert_eq!(parse_job_id("17;west\n").ok(), Some(17));
        assert_eq!(
            parse_job_id("Submitted batch job 5")
                .map_err(|e| e.to_string())
                .err(),
            Some("sbatch printed \"Submitted batch job 5\", not a job id".to_owned())
        );
    }
}
