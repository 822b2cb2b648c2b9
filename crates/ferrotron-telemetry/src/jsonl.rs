//! Append-only JSON Lines metrics file.
//!
//! Each record goes to the file in a single unbuffered `write` of the whole line, so a crash loses
//! at most the line being written. A resumed run reopens the same file and appends; if the previous
//! run died mid-line, that torn tail is cut off first so the file stays valid JSON Lines. The
//! steps the previous run logged after its last checkpoint are replayed by the resumed run, so
//! their rows are cut too ([`JsonlWriter::open_resumed`]): each step is in the file once, and
//! `recipe report` counts and charts what was trained, not what was trained twice.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::TelemetryError;

/// How far back to look at a time for the last newline of an existing file.
const TAIL_CHUNK_BYTES: u64 = 4096;
/// What the file is, in errors: the key that set it, so a bad path is found in the recipe.
const WHAT: &str = "the metrics file (logging.jsonl)";

/// Writes one JSON object per line to a metrics file.
#[derive(Debug)]
pub struct JsonlWriter {
    path: PathBuf,
    file: File,
    line: Vec<u8>,
}

impl JsonlWriter {
    /// Opens `path` for appending, creating it and its parent directories as needed.
    pub fn open(path: &Path) -> Result<Self, TelemetryError> {
        let open_error = |source| TelemetryError::Open {
            what: WHAT,
            path: path.to_owned(),
            source,
        };
        if let Some(parent) = path
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty())
        {
            std::fs::create_dir_all(parent).map_err(open_error)?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .map_err(open_error)?;
        drop_torn_last_line(&mut file).map_err(open_error)?;
        Ok(Self {
            path: path.to_owned(),
            file,
            line: Vec::with_capacity(256),
        })
    }

    /// [`JsonlWriter::open`] for a run continuing after `iteration`: the records of later steps
    /// (logged by a run that went past its last checkpoint, and about to be replayed) are
    /// removed first. Records are in step order, so the file is cut at the first one.
    pub fn open_resumed(path: &Path, iteration: u64) -> Result<Self, TelemetryError> {
        let mut writer = Self::open(path)?;
        let open_error = |source| TelemetryError::Open {
            what: WHAT,
            path: path.to_owned(),
            source,
        };
        if let Some(offset) = first_record_after(&mut writer.file, iteration).map_err(open_error)? {
            let length = writer.file.metadata().map_err(open_error)?.len();
            tracing::info!(
                dropped_bytes = length - offset,
                "metrics of steps after iteration {iteration} removed: the resumed run logs them again"
            );
            writer.file.set_len(offset).map_err(open_error)?;
        }
        Ok(writer)
    }

    /// Appends `record` as one line and hands it to the operating system before returning.
    pub fn write<T: Serialize>(&mut self, record: &T) -> Result<(), TelemetryError> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, record)?;
        self.line.push(b'\n');
        self.file
            .write_all(&self.line)
            .and_then(|()| self.file.flush())
            .map_err(|source| TelemetryError::Write {
                what: WHAT,
                path: self.path.clone(),
                source,
            })
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The byte offset of the first line whose `step` is past `iteration`, if any.
fn first_record_after(file: &mut File, iteration: u64) -> io::Result<Option<u64>> {
    use std::io::BufRead;
    file.seek(SeekFrom::Start(0))?;
    let mut reader = io::BufReader::new(&*file);
    let mut offset = 0u64;
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = reader.read_until(b'\n', &mut line)?;
        if read == 0 {
            return Ok(None);
        }
        let step = serde_json::from_slice::<serde_json::Value>(&line)
            .ok()
            .and_then(|record| record.get("step").and_then(serde_json::Value::as_u64));
        if step.is_some_and(|step| step > iteration) {
            return Ok(Some(offset));
        }
        offset += read as u64;
    }
}

/// Truncates the file just after its last `\n`, removing a line a crash left unfinished.
fn drop_torn_last_line(file: &mut File) -> io::Result<()> {
    let length = file.metadata()?.len();
    let mut end = length;
    let mut chunk = Vec::new();
    while end > 0 {
        let start = end.saturating_sub(TAIL_CHUNK_BYTES);
        chunk.resize(usize::try_from(end - start).unwrap_or(0), 0);
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut chunk)?;
        if let Some(newline) = chunk.iter().rposition(|&byte| byte == b'\n') {
            return truncate_if_shorter(file, length, start + newline as u64 + 1);
        }
        end = start;
    }
    truncate_if_shorter(file, length, 0)
}

fn truncate_if_shorter(file: &File, length: u64, keep: u64) -> io::Result<()> {
    if keep < length {
        tracing::warn!(
            dropped_bytes = length - keep,
            "metrics file ended in an unfinished line; removed it"
        );
        file.set_len(keep)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::StepMetrics;

    fn lines(path: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .expect("read metrics file")
            .lines()
            .map(|line| serde_json::from_str(line).expect("each line is JSON"))
            .collect()
    }

    #[test]
    fn lines_parse_as_json_with_every_step_field() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("nested/run/metrics.jsonl");
        let mut writer = JsonlWriter::open(&path).expect("open creates parent dirs");
        for step in 1..=3 {
            writer
                .write(&StepMetrics {
                    step,
                    loss: 4.0 / step as f64,
                    // known on a GPU, not on a CPU rank
                    mfu: (step < 3).then_some(0.4),
                    memory_bytes: 1024,
                    ..StepMetrics::default()
                })
                .expect("write");
        }
        let records = lines(&path);
        assert_eq!(records.len(), 3);
        for field in [
            "step",
            "loss",
            "lr",
            "grad_norm",
            "tokens_per_second",
            "tflops_per_gpu",
            "mfu",
            "step_seconds",
            "memory_bytes",
        ] {
            assert!(records[0].get(field).is_some(), "missing {field}");
        }
        assert_eq!(records[2]["step"], 3);
        assert_eq!(records[1]["loss"], 2.0);
        assert!(records[2].get("mfu").is_none(), "no MFU, no field");
    }

    #[test]
    fn each_line_is_on_disk_before_write_returns() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("metrics.jsonl");
        let mut writer = JsonlWriter::open(&path).expect("open");
        writer
            .write(&serde_json::json!({"step": 1}))
            .expect("write");
        // Read while the writer is still open: nothing may sit in a user-space buffer.
        assert_eq!(lines(&path), vec![serde_json::json!({"step": 1})]);
    }

    #[test]
    fn reopening_appends() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("metrics.jsonl");
        JsonlWriter::open(&path)
            .expect("first open")
            .write(&serde_json::json!({"step": 1}))
            .expect("first write");
        JsonlWriter::open(&path)
            .expect("second open")
            .write(&serde_json::json!({"step": 2, "eval_loss": 3.5}))
            .expect("second write");
        let steps: Vec<_> = lines(&path).iter().map(|r| r["step"].clone()).collect();
        assert_eq!(steps, vec![serde_json::json!(1), serde_json::json!(2)]);
    }

    #[test]
    fn a_resumed_run_replaces_the_steps_after_its_checkpoint() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("metrics.jsonl");
        let text: String = (1..=5)
            .map(|step| format!("{{\"kind\":\"train\",\"step\":{step}}}\n"))
            .collect();
        std::fs::write(&path, text).expect("write");
        let mut writer = JsonlWriter::open_resumed(&path, 3).expect("open");
        writer
            .write(&serde_json::json!({"kind": "train", "step": 4}))
            .expect("write");
        let steps: Vec<u64> = lines(&path)
            .iter()
            .map(|r| r["step"].as_u64().expect("step"))
            .collect();
        assert_eq!(steps, [1, 2, 3, 4]);
        // Nothing past the iteration: nothing removed.
        drop(JsonlWriter::open_resumed(&path, 9).expect("open"));
        assert_eq!(lines(&path).len(), 4);
    }

    #[test]
    fn a_torn_last_line_is_removed_before_appending() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("metrics.jsonl");
        let long_line = format!("{{\"pad\":\"{}\"}}\n", "x".repeat(5000));
        std::fs::write(
            &path,
            format!("{long_line}{{\"step\":1}}\n{{\"step\":2,\"lo"),
        )
        .expect("seed");
        JsonlWriter::open(&path)
            .expect("open")
            .write(&serde_json::json!({"step": 3}))
            .expect("write");
        let records = lines(&path);
        assert_eq!(records.len(), 3);
        assert_eq!(records[1]["step"], 1);
        assert_eq!(records[2]["step"], 3);
    }

    #[test]
    fn a_file_holding_only_a_torn_line_is_emptied() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("metrics.jsonl");
        std::fs::write(&path, "x".repeat(9000)).expect("seed");
        JsonlWriter::open(&path)
            .expect("open")
            .write(&serde_json::json!({"step": 1}))
            .expect("write");
        assert_eq!(lines(&path), vec![serde_json::json!({"step": 1})]);
    }

    #[test]
    fn an_unwritable_path_names_the_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let blocker = dir.path().join("blocker");
        std::fs::write(&blocker, "a file, not a directory").expect("seed");
        let error = JsonlWriter::open(&blocker.join("metrics.jsonl")).expect_err("must fail");
        assert!(error.to_string().contains("metrics.jsonl"), "{error}");
    }
}
