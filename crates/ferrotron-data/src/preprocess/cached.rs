//! Raw JSONL in a recipe's blend: preprocessed once into the cache and reused, so the quick
//! start needs no separate `recipe preprocess` step. The cache key covers the file's bytes, the
//! JSON key and the tokenizer, so editing the file or switching tokenizers re-tokenizes, and
//! nothing else does.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::{PreprocessConfig, Progress, output_prefix, preprocess_jsonl};
use crate::{DataError, IndexedDataset, Tokenizer, bin_path, idx_path};

/// Bump when the preprocessing output changes for the same inputs.
const PREPROCESS_VERSION: u32 = 1;

/// The indexed-dataset prefix holding `jsonl` tokenized (with end-of-document tokens), building
/// it under `cache_dir/jsonl/` if it is not there yet.
pub fn preprocess_jsonl_cached(
    jsonl: &Path,
    json_key: &str,
    tokenizer: &Tokenizer,
    cache_dir: &Path,
    progress: Progress,
) -> Result<PathBuf, DataError> {
    let key = cache_key(jsonl, json_key, tokenizer)?;
    let stem = jsonl
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "data".to_owned());
    let dir = cache_dir.join("jsonl");
    let base = dir.join(format!("{stem}-{}", &key[..16]));
    let prefix = output_prefix(&base, json_key);
    if IndexedDataset::open(&prefix).is_ok() {
        return Ok(prefix);
    }
    std::fs::create_dir_all(&dir).map_err(|e| DataError::io(&dir, e))?;
    // Build beside the final place, then rename: `.bin` first, `.idx` last, because readers
    // treat a present, valid pair as finished.
    let staging = tempfile::Builder::new()
        .prefix(".staging-")
        .tempdir_in(&dir)
        .map_err(|e| DataError::io(&dir, e))?;
    let config = PreprocessConfig {
        inputs: vec![jsonl.to_path_buf()],
        output_prefix: staging.path().join("out"),
        json_keys: vec![json_key.to_owned()],
        append_eod: true,
        workers: 0,
        skip_bad_lines: false,
        progress,
    };
    let report = preprocess_jsonl(&config, tokenizer).map_err(|e| match e {
        DataError::BadLine {
            path,
            line,
            problem,
        } => DataError::BadLine {
            problem: format!(
                "{problem} (fix or remove the line, or leave such lines out with `recipe \
                 preprocess --input {} --skip-bad-lines ...` and name its output prefix in \
                 data.blend)",
                path.display()
            ),
            path,
            line,
        },
        other => other,
    })?;
    let built = &report.outputs[0].prefix;
    for path in [bin_path, idx_path] {
        let to = path(&prefix);
        std::fs::rename(path(built), &to).map_err(|e| DataError::io(&to, e))?;
    }
    Ok(prefix)
}

fn cache_key(jsonl: &Path, json_key: &str, tokenizer: &Tokenizer) -> Result<String, DataError> {
    let mut hasher = blake3::Hasher::new();
    hasher.update(&PREPROCESS_VERSION.to_le_bytes());
    hasher.update(tokenizer.fingerprint()?.as_bytes());
    hasher.update(&(json_key.len() as u64).to_le_bytes());
    hasher.update(json_key.as_bytes());
    let mut file = std::fs::File::open(jsonl).map_err(|e| DataError::io(jsonl, e))?;
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let read = file
            .read(&mut buffer)
            .map_err(|e| DataError::io(jsonl, e))?;
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
    }
    Ok(hasher.finalize().to_hex().to_string())
}
