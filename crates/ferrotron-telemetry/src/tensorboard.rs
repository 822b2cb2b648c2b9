//! TensorBoard event files (`logging.tensorboard`), for Megatron and NeMo users who watch runs in
//! TensorBoard rather than Grafana.
//!
//! The format is TensorFlow's: a file of TFRecords (little-endian u64 length, masked CRC-32C of
//! the length, the bytes, masked CRC-32C of the bytes), each holding one `tensorflow.Event`
//! protobuf. The first says `file_version: "brain.Event:2"`; the others carry scalar summaries.
//! The few messages are derived with `prost` here instead of generated from TensorFlow's
//! `.proto` files: no build script, no protoc, and only the fields written are declared. The
//! tests hold bytes written by TensorBoard's own Python writer, and CI reads a training run's
//! files back with TensorBoard's own event reader (`tests/run.rs`).
//!
//! Every run start opens a new file, named as TensorFlow names them, and writes a
//! `SessionLog.START` at the first step it will log: TensorBoard then drops what an earlier
//! process logged from that step on (steps replayed after a resume from a checkpoint), the way
//! `metrics.jsonl` is cut back. Each record is flushed as written, so a live TensorBoard shows
//! every logged interval.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::TelemetryError;

/// The `file_version` TensorBoard expects of the first event.
/// What the writer writes, in errors: the key that set it, so a bad path is found in the recipe.
const WHAT: &str = "the TensorBoard log (logging.tensorboard)";
pub(crate) const FILE_VERSION: &str = "brain.Event:2";
/// Every event file's name starts with this.
pub(crate) const EVENT_FILE_PREFIX: &str = "events.out.tfevents.";

/// `tensorflow.Event`, the fields written. The `what` oneof's members are optional fields: the
/// wire format is the same, and a oneof member is written even when it holds its default.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Event {
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(string, optional, tag = "3")]
    pub file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    pub summary: Option<Summary>,
    #[prost(message, optional, tag = "7")]
    pub session_log: Option<SessionLog>,
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value` with a `simple_value` (a member of a oneof, hence optional: a
/// scalar 0.0 must still be written).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SummaryValue {
    #[prost(string, tag = "1")]
    pub tag: String,
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
}

/// `tensorflow.SessionLog`; `status` 1 is `START`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SessionLog {
    #[prost(int32, tag = "1")]
    pub status: i32,
}

const SESSION_START: i32 = 1;

const CASTAGNOLI: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

/// TFRecord's masked CRC-32C: rotated and offset so that CRCs of data holding CRCs stay strong.
pub(crate) fn masked_crc32c(bytes: &[u8]) -> u32 {
    let crc = CASTAGNOLI.checksum(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// `data` framed as one TFRecord.
pub(crate) fn tfrecord(data: &[u8]) -> Vec<u8> {
    let length = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&length);
    out.extend_from_slice(&masked_crc32c(&length).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    out
}

/// Writes one run start's event file in a TensorBoard log directory.
#[derive(Debug)]
pub struct TensorBoardWriter {
    path: PathBuf,
    file: File,
}

impl TensorBoardWriter {
    /// Creates a new event file in `dir` (and `dir` itself) for a run whose next logged step is
    /// after `iteration`: the file-version event, then a session start at `iteration + 1`.
    pub fn create(dir: &Path, iteration: u64) -> Result<Self, TelemetryError> {
        let open_error = |path: &Path, source| TelemetryError::Open {
            what: WHAT,
            path: path.to_owned(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(|source| open_error(dir, source))?;
        let now = wall_time();
        // TensorBoard reads a directory's files in name order: a restart within the second of
        // the previous start (or after a clock step back) still sorts after it.
        let seconds = (now as u64).max(newest_start(dir).map_or(0, |s| s + 1));
        let host = gethostname::gethostname().to_string_lossy().into_owned();
        let pid = std::process::id();
        let mut counter = 0u32;
        let (path, file) = loop {
            let path = dir.join(format!(
                "{EVENT_FILE_PREFIX}{seconds}.{host}.{pid}.{counter}"
            ));
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(file) => break (path, file),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => counter += 1,
                Err(source) => return Err(open_error(&path, source)),
            }
        };
        let mut writer = Self { path, file };
        writer.write_event(&Event {
            wall_time: now,
            file_version: Some(FILE_VERSION.to_owned()),
            ..Event::default()
        })?;
        writer.write_event(&Event {
            wall_time: now,
            step: step_of(iteration.saturating_add(1)),
            session_log: Some(SessionLog {
                status: SESSION_START,
            }),
            ..Event::default()
        })?;
        Ok(writer)
    }

    /// One event with a scalar per `(tag, value)` at `step`, handed to the operating system
    /// before returning. Values are stored as f32, as TensorBoard's scalars are.
    pub fn scalars(&mut self, step: u64, values: &[(&str, f64)]) -> Result<(), TelemetryError> {
        let value = values
            .iter()
            .map(|&(tag, v)| SummaryValue {
                tag: tag.to_owned(),
                simple_value: Some(v as f32),
            })
            .collect();
        self.write_event(&Event {
            wall_time: wall_time(),
            step: step_of(step),
            summary: Some(Summary { value }),
            ..Event::default()
        })
    }

    /// The event file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write_event(&mut self, event: &Event) -> Result<(), TelemetryError> {
        let record = tfrecord(&prost::Message::encode_to_vec(event));
        self.file
            .write_all(&record)
            .and_then(|()| self.file.flush())
            .map_err(|source| TelemetryError::Write {
                what: WHAT,
                path: self.path.clone(),
                source,
            })
    }
}

fn wall_time() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn step_of(step: u64) -> i64 {
    i64::try_from(step).unwrap_or(i64::MAX)
}

/// The largest start time in the names of `dir`'s event files.
fn newest_start(dir: &Path) -> Option<u64> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name();
            let rest = name.to_str()?.strip_prefix(EVENT_FILE_PREFIX)?.to_owned();
            rest.split('.').next()?.parse::<u64>().ok()
        })
        .max()
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
            .collect()
    }

    /// Splits TFRecords, checking both CRCs of each.
    fn records(mut bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let (length, rest) = bytes.split_at(8);
            let (length_crc, rest) = rest.split_at(4);
            assert_eq!(length_crc, masked_crc32c(length).to_le_bytes());
            let n = usize::try_from(u64::from_le_bytes(length.try_into().expect("8 bytes")))
                .expect("length");
            let (data, rest) = rest.split_at(n);
            let (data_crc, rest) = rest.split_at(4);
            assert_eq!(data_crc, masked_crc32c(data).to_le_bytes());
            out.push(data.to_vec());
            bytes = rest;
        }
        out
    }

    #[test]
    fn masked_crc_matches_tensorflow() {
        // Values of `masked_crc32c` in TensorBoard's Python package (the TensorFlow stub).
        assert_eq!(masked_crc32c(b""), 0xa282_ead8);
        assert_eq!(masked_crc32c(b"123456789"), 0xc78a_b0e5);
        assert_eq!(CASTAGNOLI.checksum(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn records_are_byte_identical_to_tensorboards_writer() {
        // Framed by TensorBoard's `RecordWriter` from `event_pb2.Event`s with these fields.
        let version = Event {
            wall_time: 1_700_000_000.5,
            file_version: Some(FILE_VERSION.to_owned()),
            ..Event::default()
        };
        let scalars = Event {
            wall_time: 1_700_000_001.25,
            step: 7,
            summary: Some(Summary {
                value: vec![
                    SummaryValue {
                        tag: "lm loss".into(),
                        simple_value: Some(2.5),
                    },
                    SummaryValue {
                        tag: "grad-norm".into(),
                        simple_value: Some(0.0),
                    },
                ],
            }),
            ..Event::default()
        };
        let start = Event {
            wall_time: 1_700_000_002.0,
            step: 4,
            session_log: Some(SessionLog {
                status: SESSION_START,
            }),
            ..Event::default()
        };
        let expected = [
            "1800000000000000a37f4b220900002040fc54d9411a0d627261696e2e4576656e743a322b353110",
            "2f000000000000006d5d1d500900005040fc54d94110072a220a0e0a076c6d206c6f737315000020400a100a09677261642d6e6f726d1500000000243182be",
            "0f000000000000006d532b090900008040fc54d94110043a02080176519426",
        ];
        for (event, expected) in [version, scalars, start].iter().zip(expected) {
            assert_eq!(tfrecord(&event.encode_to_vec()), hex(expected), "{event:?}");
        }
    }

    #[test]
    fn a_written_file_decodes_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tb = dir.path().join("tb");
        let mut writer = TensorBoardWriter::create(&tb, 3).expect("create");
        writer
            .scalars(4, &[("lm loss", 5.25), ("learning-rate", 3e-4)])
            .expect("write");
        let second = TensorBoardWriter::create(&tb, 3).expect("create again");
        assert_ne!(second.path(), writer.path(), "a new file per start");
        let name = |w: &TensorBoardWriter| {
            w.path()
                .file_name()
                .and_then(|n| n.to_str())
                .map(str::to_owned)
                .expect("name")
        };
        assert!(name(&writer).starts_with(EVENT_FILE_PREFIX));
        assert!(name(&second) > name(&writer), "a later start sorts later");

        let events: Vec<Event> = records(&std::fs::read(writer.path()).expect("read"))
            .iter()
            .map(|r| Event::decode(r.as_slice()).expect("an Event"))
            .collect();
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].file_version.as_deref(), Some(FILE_VERSION));
        assert_eq!(events[1].step, 4);
        assert_eq!(events[1].session_log.as_ref().map(|s| s.status), Some(1));
        assert_eq!(events[2].step, 4);
        let values = &events[2].summary.as_ref().expect("summary").value;
        assert_eq!(values[0].tag, "lm loss");
        assert_eq!(values[0].simple_value, Some(5.25));
        assert_eq!(values[1].simple_value, Some(3e-4_f32));
        assert!(events[2].wall_time >= events[0].wall_time);
    }
}
