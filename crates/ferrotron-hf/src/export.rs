//! `recipe export --format hf`: a checkpoint of any parallel layout as a transformers model
//! folder. Everything that can refuse (a feature the class cannot express, a tensor the mapping
//! does not expect, a damaged shard) is checked before the first byte is written; then tensors
//! are assembled and written one at a time, in files of at most `max_shard_bytes`, with
//! `model.safetensors.index.json` when there is more than one.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use ferrotron_recipe::{Tokenizer, TokenizerKind};
use ferrotron_train::checkpoint::Manifest;
use serde_json::json;

use crate::HfError;
use crate::checkpoint_tensors::CheckpointTensors;
use crate::config::{CONFIG_FILE, write_config};
use crate::family::Family;
use crate::names::{Dims, Piece, Source, pieces};
use crate::sink::{self, LazyTensor, OutDtype};

/// transformers' default `max_shard_size` for `save_pretrained`.
pub const DEFAULT_MAX_SHARD_BYTES: u64 = 5_000_000_000;
pub const INDEX_FILE: &str = "model.safetensors.index.json";

#[derive(Debug, Clone, Copy)]
pub struct ExportOptions {
    pub dtype: OutDtype,
    /// Start a new file before one would grow past this many bytes of tensor data.
    pub max_shard_bytes: u64,
}

/// What an export wrote.
#[derive(Debug, Clone)]
pub struct Exported {
    pub family: Family,
    pub iteration: u64,
    /// Every file written, config first.
    pub files: Vec<PathBuf>,
    pub tensors: usize,
    pub bytes: u64,
    /// What was left out, for the user to know (a tokenizer file that is gone).
    pub notes: Vec<String>,
}

/// Export the committed checkpoint `checkpoint` into `out` (created if needed).
pub fn export(checkpoint: &Path, out: &Path, options: ExportOptions) -> Result<Exported, HfError> {
    let manifest = Manifest::read(checkpoint)?;
    let model = &manifest.model;
    let family = Family::of(model);
    let refusals = family.refusals(model);
    if !refusals.is_empty() {
        return Err(HfError::Inexpressible {
            class: family.class(),
            reasons: refusals
                .into_iter()
                .map(|r| format!("{}: {}", r.path, r.reason))
                .collect(),
        });
    }
    let padded = manifest.shape.padded_vocab_size as usize;
    let vocab = model.vocab_size.map_or(padded, |v| v as usize);
    let dims = Dims::of(model, vocab, padded);
    let tensors = CheckpointTensors::open(checkpoint, &manifest)?;
    let pieces = pieces(&dims);
    check_tensors(checkpoint, &tensors, &pieces)?;
    let shards = shard(&pieces, options);

    std::fs::create_dir_all(out).map_err(|e| HfError::io("create", out, e))?;
    let tokenizer = tokenizer_files(&manifest.tokenizer);
    let eod = eod_id(&manifest.tokenizer);
    let mut files = vec![write_json(
        &out.join(CONFIG_FILE),
        &write_config(model, &dims, options.dtype, eod),
    )?];
    files.push(write_json(
        &out.join("generation_config.json"),
        &json!({"bos_token_id": eod, "eos_token_id": eod}),
    )?);
    let mut notes = Vec::new();
    for (from, name) in tokenizer {
        let to = out.join(name);
        match std::fs::copy(&from, &to) {
            Ok(_) => files.push(to),
            Err(e) => notes.push(format!("tokenizer file {} not copied: {e}", from.display())),
        }
    }
    let cache = RefCell::new(None);
    let count = shards.len();
    let mut weight_map = BTreeMap::new();
    for (index, shard) in shards.iter().enumerate() {
        let name = if count == 1 {
            "model.safetensors".to_owned()
        } else {
            format!("model-{:05}-of-{count:05}.safetensors", index + 1)
        };
        let lazy: Vec<LazyTensor<'_>> = shard
            .iter()
            .map(|piece| {
                weight_map.insert(piece.hf.clone(), name.clone());
                LazyTensor {
                    name: piece.hf.clone(),
                    shape: piece.shape.clone(),
                    produce: Box::new(|| values(&tensors, piece, &cache)),
                }
            })
            .collect();
        let path = out.join(&name);
        let metadata = HashMap::from([("format".to_owned(), "pt".to_owned())]);
        sink::write(&path, &lazy, options.dtype, metadata)?;
        files.push(path);
    }
    let bytes: u64 = pieces
        .iter()
        .map(|p| numel(&p.shape) * options.dtype.bytes())
        .sum();
    let index_path = out.join(INDEX_FILE);
    if count > 1 {
        let index = json!({"metadata": {"total_size": bytes}, "weight_map": weight_map});
        files.push(write_json(&index_path, &index)?);
    } else if index_path.is_file() {
        // an earlier, sharded export into the same folder: its index would name stale files
        std::fs::remove_file(&index_path).map_err(|e| HfError::io("remove", &index_path, e))?;
    }
    Ok(Exported {
        family,
        iteration: manifest.iteration,
        files,
        tensors: pieces.len(),
        bytes,
        notes,
    })
}

/// Every tensor the mapping reads exists with the shape it expects, and every tensor of the
/// checkpoint is read by some piece (one left over would be silently dropped).
fn check_tensors(dir: &Path, tensors: &CheckpointTensors, pieces: &[Piece]) -> Result<(), HfError> {
    let mut problems = Vec::new();
    let mut used = HashSet::new();
    for piece in pieces {
        let Source::Ours { name, shape, .. } = &piece.source else {
            continue;
        };
        used.insert(name.as_str());
        match tensors.shape(name) {
            Some(found) if found == shape.as_slice() => {}
            Some(found) => problems.push(format!(
                "{name}: shape {found:?}, the model needs {shape:?}"
            )),
            None => problems.push(format!("{name}: not in the checkpoint")),
        }
    }
    for name in tensors.names() {
        if !used.contains(name) {
            problems.push(format!("{name}: no transformers tensor holds it"));
        }
    }
    problems.sort();
    problems.dedup();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(HfError::tensors(dir, problems.join("\n  ")))
    }
}

/// Pieces in order, cut into files of at most `max_shard_bytes` (a larger tensor alone).
fn shard(pieces: &[Piece], options: ExportOptions) -> Vec<Vec<&Piece>> {
    let mut shards: Vec<Vec<&Piece>> = vec![Vec::new()];
    let mut size = 0;
    for piece in pieces {
        let bytes = numel(&piece.shape) * options.dtype.bytes();
        if size + bytes > options.max_shard_bytes && size > 0 {
            shards.push(Vec::new());
            size = 0;
        }
        size += bytes;
        shards.last_mut().expect("one shard at least").push(piece);
    }
    shards
}

/// A piece's values; the last global tensor is kept, since q, k and v (and gate and up) are
/// cut from one tensor one after another.
fn values(
    tensors: &CheckpointTensors,
    piece: &Piece,
    cache: &RefCell<Option<(String, Vec<f32>)>>,
) -> Result<Vec<f32>, HfError> {
    let Source::Ours {
        name,
        shape,
        selection,
    } = &piece.source
    else {
        return Ok(vec![0.0; numel(&piece.shape) as usize]);
    };
    let mut cache = cache.borrow_mut();
    if cache.as_ref().is_none_or(|(cached, _)| cached != name) {
        *cache = Some((name.clone(), tensors.global(name)?));
    }
    let (_, global) = cache.as_ref().expect("just filled");
    let mut out = vec![0.0f32; numel(&piece.shape) as usize];
    selection.for_each(shape, |hf, ours| out[hf] = global[ours]);
    Ok(out)
}

fn numel(shape: &[usize]) -> u64 {
    shape.iter().map(|&d| d as u64).product()
}

fn write_json(path: &Path, value: &serde_json::Value) -> Result<PathBuf, HfError> {
    let text = serde_json::to_string_pretty(value).expect("JSON values serialize");
    std::fs::write(path, text + "\n").map_err(|e| HfError::io("write", path, e))?;
    Ok(path.to_path_buf())
}

/// The tokenizer files to copy and their names in the model folder: transformers loads a
/// `tokenizer.json` (fast tokenizer) or GPT-2's `vocab.json` + `merges.txt`, and the
/// `tokenizer_config.json` / `special_tokens_map.json` beside them when there are.
fn tokenizer_files(tokenizer: &Tokenizer) -> Vec<(PathBuf, &'static str)> {
    let named: Vec<(Option<&String>, &'static str)> = match tokenizer.kind {
        TokenizerKind::Hf => vec![(tokenizer.file.as_ref(), "tokenizer.json")],
        TokenizerKind::Gpt2Bpe => vec![
            (tokenizer.vocab_file.as_ref(), "vocab.json"),
            (tokenizer.merge_file.as_ref(), "merges.txt"),
        ],
    };
    let mut files: Vec<(PathBuf, &'static str)> = named
        .into_iter()
        .filter_map(|(path, name)| path.map(|p| (PathBuf::from(p), name)))
        .collect();
    if let Some(dir) = files
        .first()
        .and_then(|(p, _)| p.parent().map(Path::to_path_buf))
    {
        for extra in ["tokenizer_config.json", "special_tokens_map.json"] {
            if dir.join(extra).is_file() {
                files.push((dir.join(extra), extra));
            }
        }
    }
    files
}

/// The end-of-document id, as transformers' bos/eos (absent when the tokenizer cannot load).
fn eod_id(tokenizer: &Tokenizer) -> Option<u32> {
    ferrotron_data::Tokenizer::from_recipe(tokenizer)
        .ok()
        .map(|t| t.eod_id())
}
