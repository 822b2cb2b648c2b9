//! Our checkpoint's global tensors, assembled one at a time from the shards of whatever layout
//! wrote it (each shard read from its byte range). `ferrotron-train`'s loader reads whole shard
//! files and keeps them, which suits resuming a CPU world; an export must not hold the model.

use std::collections::HashMap;
use std::path::Path;

use ferrotron_parallel::ShardSpec;
use ferrotron_train::checkpoint::{Manifest, ShardKind, is_committed};

use crate::HfError;
use crate::safetensors_file::TensorFile;

/// A committed checkpoint's model tensors, by global name.
#[derive(Debug)]
pub(crate) struct CheckpointTensors {
    files: Vec<TensorFile>,
    /// Global name → (index into `files`, the shard's spec).
    index: HashMap<String, Vec<(usize, ShardSpec)>>,
}

impl CheckpointTensors {
    /// Open the model shards of the committed checkpoint `dir`, checking each file's size
    /// against the manifest.
    pub(crate) fn open(dir: &Path, manifest: &Manifest) -> Result<Self, HfError> {
        if !is_committed(dir) {
            return Err(HfError::tensors(
                dir,
                "not a committed checkpoint folder (no COMMITTED marker)",
            ));
        }
        let mut files = Vec::new();
        let mut index: HashMap<String, Vec<(usize, ShardSpec)>> = HashMap::new();
        if manifest.shards.is_empty() {
            // version 1: whole tensors in one file
            let name = manifest
                .files
                .model
                .as_deref()
                .unwrap_or("model.safetensors");
            let file = TensorFile::open(&dir.join(name))?;
            for (tensor, entry) in &file.entries {
                index
                    .entry(tensor.clone())
                    .or_default()
                    .push((0, ShardSpec::full(tensor.clone(), entry.shape.clone())));
            }
            files.push(file);
        }
        for shard in manifest
            .shards
            .iter()
            .filter(|s| s.kind == ShardKind::Model)
        {
            let path = dir.join(&shard.file);
            let bytes = std::fs::metadata(&path)
                .map_err(|e| HfError::io("read", &path, e))?
                .len();
            if bytes != shard.bytes {
                return Err(HfError::tensors(
                    &path,
                    format!(
                        "{bytes} bytes, the manifest recorded {}: the checkpoint is damaged",
                        shard.bytes
                    ),
                ));
            }
            let position = files.len();
            files.push(TensorFile::open(&path)?);
            for spec in &shard.tensors {
                index
                    .entry(spec.global_name.clone())
                    .or_default()
                    .push((position, spec.clone()));
            }
        }
        Ok(CheckpointTensors { files, index })
    }

    /// Every global name, sorted.
    pub(crate) fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.index.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// The global shape of `name`, if the checkpoint has it.
    pub(crate) fn shape(&self, name: &str) -> Option<&[usize]> {
        self.index
            .get(name)
            .map(|shards| shards[0].1.global_shape.as_slice())
    }

    /// The global tensor `name`, assembled from its shards.
    pub(crate) fn global(&self, name: &str) -> Result<Vec<f32>, HfError> {
        let shards = self
            .index
            .get(name)
            .ok_or_else(|| HfError::tensors(Path::new(name), "not in the checkpoint"))?;
        let numel: usize = shards[0].1.global_shape.iter().product();
        let mut values = vec![0.0f32; numel];
        let mut covered = vec![0.0f32; numel];
        for (position, spec) in shards {
            let file = &self.files[*position];
            let local = file.read_f32(name)?;
            spec.place_f32(&local, &mut values)
                .map_err(|e| HfError::tensors(file.path(), format!("{name}: {e}")))?;
            spec.place_f32(&vec![1.0; local.len()], &mut covered)
                .map_err(|e| HfError::tensors(file.path(), format!("{name}: {e}")))?;
        }
        let missing = covered.iter().filter(|&&c| c == 0.0).count();
        if missing > 0 {
            return Err(HfError::tensors(
                Path::new(name),
                format!("the shards leave {missing} of {numel} elements uncovered"),
            ));
        }
        Ok(values)
    }
}
