//! `preprocess_data.py` for Rust: JSONL in, Megatron `.bin/.idx` out, tokenized in parallel.
//!
//! The pipeline is three stages joined by bounded channels, so memory stays flat however large
//! the input: one thread reads lines in batches of about a megabyte, `workers` threads parse
//! and tokenize batches, and the calling thread writes them strictly in input order (batches
//! carry a sequence number and are reordered), so the output is the same for any worker count.
//! A bad line either stops the run with its file and line number or, with `skip_bad_lines`, is
//! left out and listed in the report; it is never dropped silently.

mod cached;
mod progress;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender, bounded};

pub use cached::preprocess_jsonl_cached;
pub use progress::Progress;
use progress::ProgressReporter;

use crate::{DataError, IndexedDatasetWriter, TokenDtype, Tokenizer, WrittenDataset};

/// Lines are handed to workers in batches of about this many bytes.
const BATCH_BYTES: usize = 1 << 20;
const BATCH_LINES: usize = 4096;

/// What to tokenize and where to write it.
#[derive(Debug, Clone)]
pub struct PreprocessConfig {
    /// JSONL files, read in order as one stream.
    pub inputs: Vec<PathBuf>,
    /// Outputs are `{output_prefix}_{key}_document.bin/.idx`, one pair per JSON key.
    pub output_prefix: PathBuf,
    pub json_keys: Vec<String>,
    /// Append the end-of-document token to every document.
    pub append_eod: bool,
    /// Tokenizing threads; 0 uses every core.
    pub workers: usize,
    /// Leave bad lines out (and report them) instead of failing.
    pub skip_bad_lines: bool,
    pub progress: Progress,
}

/// A line that was left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedLine {
    pub path: PathBuf,
    /// 1-based.
    pub line: u64,
    pub problem: String,
}

/// What a preprocessing run did.
#[derive(Debug, Clone)]
pub struct PreprocessReport {
    /// One dataset per JSON key.
    pub outputs: Vec<WrittenDataset>,
    /// Documents written (per key; every key gets every good line).
    pub documents: u64,
    /// Tokens written over all keys.
    pub tokens: u64,
    /// Input bytes read.
    pub bytes: u64,
    pub skipped: Vec<SkippedLine>,
    pub seconds: f64,
}

/// `{prefix}_{key}_document`, Megatron's output naming.
pub fn output_prefix(prefix: &Path, key: &str) -> PathBuf {
    crate::indexed::with_suffix(prefix, &format!("_{key}_document"))
}

struct Batch {
    sequence: u64,
    input: usize,
    first_line: u64,
    bytes: Vec<u8>,
    /// End offsets of the lines in `bytes`.
    line_ends: Vec<usize>,
}

struct TokenizedBatch {
    sequence: u64,
    input: usize,
    bytes: u64,
    /// Per line: its number and the tokens of every key, or why the line is bad.
    lines: Vec<(u64, LineTokens)>,
}

type LineTokens = Result<Vec<Vec<u32>>, String>;

/// Tokenizes `config.inputs` into Megatron indexed datasets.
pub fn preprocess_jsonl(
    config: &PreprocessConfig,
    tokenizer: &Tokenizer,
) -> Result<PreprocessReport, DataError> {
    if config.inputs.is_empty() {
        return Err(DataError::Config("no input files".to_owned()));
    }
    if config.json_keys.is_empty() {
        return Err(DataError::Config("no JSON keys to read".to_owned()));
    }
    let mut total_bytes = 0;
    for input in &config.inputs {
        let meta = std::fs::metadata(input).map_err(|e| DataError::io(input, e))?;
        if !meta.is_file() {
            return Err(DataError::format(input, "is not a file"));
        }
        total_bytes += meta.len();
    }
    let dtype = TokenDtype::for_vocab_size(tokenizer.vocab_size());
    let mut writers = config
        .json_keys
        .iter()
        .map(|key| IndexedDatasetWriter::create(&output_prefix(&config.output_prefix, key), dtype))
        .collect::<Result<Vec<_>, _>>()?;
    let workers = match config.workers {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let started = Instant::now();
    let mut reporter = ProgressReporter::new(config.progress, total_bytes);
    let mut totals = Totals::default();

    std::thread::scope(|scope| -> Result<(), DataError> {
        let (batch_tx, batch_rx) = bounded::<Batch>(2 * workers);
        let (result_tx, result_rx) = bounded::<TokenizedBatch>(2 * workers);
        let reader = scope.spawn(move || read_batches(&config.inputs, batch_tx));
        for _ in 0..workers {
            let batch_rx = batch_rx.clone();
            let result_tx = result_tx.clone();
            scope.spawn(move || tokenize_batches(batch_rx, result_tx, config, tokenizer));
        }
        drop((batch_rx, result_tx));
        write_in_order(result_rx, config, &mut writers, &mut totals, &mut reporter)?;
        match reader.join() {
            Ok(result) => result,
            Err(_) => Err(DataError::Config(
                "the JSONL reader thread panicked".to_owned(),
            )),
        }
    })?;

    let outputs = writers
        .into_iter()
        .map(IndexedDatasetWriter::finish)
        .collect::<Result<Vec<_>, _>>()?;
    reporter.finish(totals.bytes, totals.documents, totals.tokens);
    Ok(PreprocessReport {
        outputs,
        documents: totals.documents,
        tokens: totals.tokens,
        bytes: totals.bytes,
        skipped: totals.skipped,
        seconds: started.elapsed().as_secs_f64(),
    })
}

#[derive(Default)]
struct Totals {
    documents: u64,
    tokens: u64,
    bytes: u64,
    skipped: Vec<SkippedLine>,
}

fn read_batches(inputs: &[PathBuf], out: Sender<Batch>) -> Result<(), DataError> {
    let mut sequence = 0;
    for (input, path) in inputs.iter().enumerate() {
        let file = File::open(path).map_err(|e| DataError::io(path, e))?;
        let mut reader = BufReader::with_capacity(1 << 20, file);
        let mut line = 0u64;
        loop {
            let mut batch = Batch {
                sequence,
                input,
                first_line: line + 1,
                bytes: Vec::with_capacity(BATCH_BYTES + (64 << 10)),
                line_ends: Vec::new(),
            };
            while batch.bytes.len() < BATCH_BYTES && batch.line_ends.len() < BATCH_LINES {
                let read = reader
                    .read_until(b'\n', &mut batch.bytes)
                    .map_err(|e| DataError::io(path, e))?;
                if read == 0 {
                    break;
                }
                line += 1;
                batch.line_ends.push(batch.bytes.len());
            }
            if batch.line_ends.is_empty() {
                break;
            }
            sequence += 1;
            if out.send(batch).is_err() {
                // The writer stopped (a bad line); nothing more to read.
                return Ok(());
            }
        }
    }
    Ok(())
}

fn tokenize_batches(
    batches: Receiver<Batch>,
    results: Sender<TokenizedBatch>,
    config: &PreprocessConfig,
    tokenizer: &Tokenizer,
) {
    for batch in batches {
        let mut lines = Vec::with_capacity(batch.line_ends.len());
        let mut start = 0;
        for (n, &end) in batch.line_ends.iter().enumerate() {
            let tokens = tokenize_line(&batch.bytes[start..end], config, tokenizer);
            lines.push((batch.first_line + n as u64, tokens));
            start = end;
        }
        let done = TokenizedBatch {
            sequence: batch.sequence,
            input: batch.input,
            bytes: batch.bytes.len() as u64,
            lines,
        };
        if results.send(done).is_err() {
            return;
        }
    }
}

fn tokenize_line(line: &[u8], config: &PreprocessConfig, tokenizer: &Tokenizer) -> LineTokens {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Err("empty line".to_owned());
    }
    let value: serde_json::Value =
        serde_json::from_slice(line).map_err(|e| format!("invalid JSON: {e}"))?;
    let object = value
        .as_object()
        .ok_or_else(|| "not a JSON object".to_owned())?;
    config
        .json_keys
        .iter()
        .map(|key| {
            let text = match object.get(key) {
                None => return Err(format!("missing key {key:?}")),
                Some(serde_json::Value::String(text)) => text,
                Some(other) => {
                    return Err(format!("key {key:?} holds {}, not a string", kind(other)));
                }
            };
            let mut ids = tokenizer.encode(text).map_err(|e| e.to_string())?;
            if config.append_eod {
                ids.push(tokenizer.eod_id());
            }
            Ok(ids)
        })
        .collect()
}

fn kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

fn write_in_order(
    results: Receiver<TokenizedBatch>,
    config: &PreprocessConfig,
    writers: &mut [IndexedDatasetWriter],
    totals: &mut Totals,
    reporter: &mut ProgressReporter,
) -> Result<(), DataError> {
    let mut pending = BTreeMap::new();
    let mut next = 0u64;
    for result in results {
        pending.insert(result.sequence, result);
        while let Some(batch) = pending.remove(&next) {
            next += 1;
            let path = &config.inputs[batch.input];
            for (line, tokens) in batch.lines {
                match tokens {
                    Ok(per_key) => {
                        for (writer, ids) in writers.iter_mut().zip(&per_key) {
                            writer.add_document(ids)?;
                            totals.tokens += ids.len() as u64;
                        }
                        totals.documents += 1;
                    }
                    Err(problem) if config.skip_bad_lines => totals.skipped.push(SkippedLine {
                        path: path.clone(),
                        line,
                        problem,
                    }),
                    Err(problem) => {
                        // What to do about it depends on the caller (`recipe preprocess` has
                        // `--skip-bad-lines`, `recipe run` does not), so the caller says it.
                        return Err(DataError::BadLine {
                            path: path.clone(),
                            line,
                            problem,
                        });
                    }
                }
            }
            totals.bytes += batch.bytes;
            reporter.update(totals.bytes, totals.documents, totals.tokens);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
