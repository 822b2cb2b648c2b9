//! Reading a checkpoint into any layout: assemble each global tensor from whatever shards the
//! checkpoint has, then cut the shard the new layout wants. The saved layout never has to match
//! the loading one — tp2·pp2 resumes as tp1·dp4, one rank as eight and back — because shards are
//! stored under global names with their [`ShardSpec`], and the global tensor is the one thing
//! every layout agrees on.
//!
//! Every rank reads on its own (no communication). Files are read when first needed and global
//! tensors assembled once and kept, which is plain and right for the CPU worlds this runs in
//! today; a rank of a large model would want to read only the byte ranges of its shard.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use ferrotron_parallel::ShardSpec;

use super::manifest::{Manifest, ModelShape, ShardFile, ShardKind};
use super::tensors::read_safetensors;
use super::vocab;
use crate::TrainError;
use crate::params::NamedTensor;
use crate::run::resume::ResumeState;

/// A committed checkpoint opened for loading: its manifest and where each global tensor's
/// shards are.
#[derive(Debug)]
pub struct ShardedCheckpoint {
    dir: PathBuf,
    manifest: Manifest,
    files: Vec<ShardFile>,
    /// Global name → (index into `files`, the shard's spec).
    index: HashMap<String, Vec<(usize, ShardSpec)>>,
    loaded_files: Mutex<HashMap<usize, Arc<HashMap<String, NamedTensor>>>>,
    globals: Mutex<HashMap<String, Arc<NamedTensor>>>,
}

impl ShardedCheckpoint {
    /// Open `dir`: read the manifest and check that every file it lists is there, whole, and
    /// has the checksum it was committed with.
    pub fn open(dir: &Path) -> Result<Self, TrainError> {
        Self::open_with(dir, true)
    }

    /// [`ShardedCheckpoint::open`]; `verify: false` checks sizes only, not checksums (for a
    /// checkpoint verified already, or huge ones on trusted storage).
    pub fn open_with(dir: &Path, verify: bool) -> Result<Self, TrainError> {
        if !super::store::is_committed(dir) {
            return Err(TrainError::checkpoint(
                dir,
                "not a committed checkpoint folder (no COMMITTED marker; pass an iter_NNNNNNN folder)",
            ));
        }
        let manifest = Manifest::read(dir)?;
        let files = if manifest.shards.is_empty() {
            version_one_files(dir, &manifest)?
        } else {
            manifest.shards.clone()
        };
        for file in &files {
            check_file(dir, file, manifest.layout.world_size)?;
        }
        if verify {
            for file in &files {
                verify_file(dir, file)?;
            }
        }
        let mut index: HashMap<String, Vec<(usize, ShardSpec)>> = HashMap::new();
        for (position, file) in files.iter().enumerate() {
            for spec in &file.tensors {
                index
                    .entry(spec.global_name.clone())
                    .or_default()
                    .push((position, spec.clone()));
            }
        }
        Ok(ShardedCheckpoint {
            dir: dir.to_path_buf(),
            manifest,
            files,
            index,
            loaded_files: Mutex::new(HashMap::new()),
            globals: Mutex::new(HashMap::new()),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Where the saved run stood.
    pub fn resume_state(&self) -> ResumeState {
        ResumeState {
            iteration: self.manifest.iteration,
            consumed_samples: self.manifest.consumed_samples,
            consumed_tokens: self.manifest.consumed_tokens,
        }
    }

    /// Refuse a checkpoint of another model (every differing shape field listed) or of another
    /// seed (the data order and every step's randomness derive from it). A different vocabulary
    /// padding (another tp degree) is not another model when the real vocabulary fits: the
    /// vocabulary rows are re-padded on load (see `vocab`).
    pub fn check_compatible(&self, shape: &ModelShape, seed: u64) -> Result<(), TrainError> {
        let mut fields = self.manifest.shape.differences(shape);
        if self.real_vocab_fits(shape.padded_vocab_size as usize) {
            fields.retain(|field| !field.starts_with("padded_vocab_size:"));
        }
        if !fields.is_empty() {
            return Err(TrainError::ModelMismatch {
                path: self.dir.clone(),
                fields,
            });
        }
        if self.manifest.rng.seed != seed {
            return Err(TrainError::checkpoint(
                &self.dir,
                format!(
                    "written with training.seed {}, the recipe has {seed}; a resumed run must keep its seed",
                    self.manifest.rng.seed
                ),
            ));
        }
        Ok(())
    }

    /// Whether the checkpoint holds (pieces of) the global tensor `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// The global names of one kind, sorted.
    pub fn names(&self, kind: ShardKind) -> Vec<String> {
        let mut names: Vec<String> = self
            .index
            .iter()
            .filter(|(_, shards)| shards.iter().any(|(f, _)| self.files[*f].kind == kind))
            .map(|(name, _)| name.clone())
            .collect();
        names.sort();
        names
    }

    /// The global tensor `name`, assembled from its shards (and kept for later calls).
    pub fn global(&self, name: &str) -> Result<Arc<NamedTensor>, TrainError> {
        if let Some(found) = lock(&self.globals).get(name) {
            return Ok(Arc::clone(found));
        }
        let shards = self.index.get(name).ok_or_else(|| {
            TrainError::checkpoint(&self.dir, format!("{name}: not in the checkpoint"))
        })?;
        let shape = shards[0].1.global_shape.clone();
        let numel: usize = shape.iter().product();
        let mut values = vec![0.0f32; numel];
        let mut covered = vec![0.0f32; numel];
        for (position, spec) in shards {
            let file = &self.files[*position];
            if spec.global_shape != shape {
                return Err(TrainError::checkpoint(
                    &self.dir,
                    format!(
                        "{name}: {} says the global shape is {:?}, another shard {shape:?}",
                        file.file, spec.global_shape
                    ),
                ));
            }
            let tensors = self.file(*position)?;
            let local = tensors.get(name).ok_or_else(|| {
                TrainError::checkpoint(
                    &self.dir,
                    format!("{name}: listed in {} but not stored in it", file.file),
                )
            })?;
            let ones = vec![1.0f32; local.values.len()];
            spec.place_f32(&local.values, &mut values)
                .and_then(|()| spec.place_f32(&ones, &mut covered))
                .map_err(|e| TrainError::checkpoint(self.dir.join(&file.file), e.to_string()))?;
        }
        let missing = covered.iter().filter(|&&c| c == 0.0).count();
        if missing > 0 {
            return Err(TrainError::checkpoint(
                &self.dir,
                format!(
                    "{name}: the shards cover {} of its {numel} elements; the checkpoint is incomplete",
                    numel - missing
                ),
            ));
        }
        let tensor = Arc::new(NamedTensor {
            name: name.to_owned(),
            shape,
            values,
        });
        lock(&self.globals).insert(name.to_owned(), Arc::clone(&tensor));
        Ok(tensor)
    }

    /// The values of the shard `spec` describes, cut from the assembled global tensor. A global
    /// shape other than the checkpoint's is another model's tensor, refused by name.
    pub fn shard(&self, spec: &ShardSpec) -> Result<Vec<f32>, TrainError> {
        let global = self.global(&spec.global_name)?;
        if let Some(dim) = self.vocab_dim(&global.shape, &spec.global_shape) {
            let real_vocab = self.manifest.model.vocab_size.unwrap_or_default() as usize;
            let repadded = vocab::repad(
                &global.values,
                &global.shape,
                dim,
                real_vocab,
                spec.global_shape[dim],
            );
            return spec
                .slice_of_f32(&repadded)
                .map_err(|e| TrainError::checkpoint(&self.dir, e.to_string()));
        }
        if global.shape != spec.global_shape {
            return Err(TrainError::checkpoint(
                &self.dir,
                format!(
                    "{}: global shape {:?} in the checkpoint, {:?} in the model",
                    spec.global_name, global.shape, spec.global_shape
                ),
            ));
        }
        spec.slice_of_f32(&global.values)
            .map_err(|e| TrainError::checkpoint(&self.dir, e.to_string()))
    }

    /// Every global tensor of one kind, assembled, by name (inference, one-rank resume, tests).
    pub fn global_tensors(
        &self,
        kind: ShardKind,
    ) -> Result<HashMap<String, NamedTensor>, TrainError> {
        self.names(kind)
            .into_iter()
            .map(|name| {
                let tensor = self.global(&name)?;
                Ok((name, NamedTensor::clone(&tensor)))
            })
            .collect()
    }

    /// The checkpoint knows its real vocabulary and it fits in `padded_rows`.
    fn real_vocab_fits(&self, padded_rows: usize) -> bool {
        self.manifest
            .model
            .vocab_size
            .is_some_and(|vocab| vocab as usize <= padded_rows)
    }

    /// The one dim in which `saved` and `wanted` differ, when it is the vocabulary padded
    /// differently: the saved size is the checkpoint's padded vocabulary and the real
    /// vocabulary fits the wanted size.
    fn vocab_dim(&self, saved: &[usize], wanted: &[usize]) -> Option<usize> {
        if saved.len() != wanted.len() {
            return None;
        }
        let mut differing = (0..saved.len()).filter(|&d| saved[d] != wanted[d]);
        let dim = differing.next()?;
        let padded = self.manifest.shape.padded_vocab_size as usize;
        (differing.next().is_none() && saved[dim] == padded && self.real_vocab_fits(wanted[dim]))
            .then_some(dim)
    }

    fn file(&self, position: usize) -> Result<Arc<HashMap<String, NamedTensor>>, TrainError> {
        if let Some(found) = lock(&self.loaded_files).get(&position) {
            return Ok(Arc::clone(found));
        }
        let tensors = Arc::new(read_safetensors(
            &self.dir.join(&self.files[position].file),
        )?);
        lock(&self.loaded_files).insert(position, Arc::clone(&tensors));
        Ok(tensors)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A version-1 checkpoint: whole tensors in the two files the manifest names.
fn version_one_files(dir: &Path, manifest: &Manifest) -> Result<Vec<ShardFile>, TrainError> {
    let mut files = Vec::new();
    for (kind, file) in [
        (ShardKind::Model, &manifest.files.model),
        (ShardKind::Optimizer, &manifest.files.optimizer),
    ] {
        let Some(file) = file else { continue };
        let path = dir.join(file);
        let bytes = std::fs::metadata(&path)
            .map_err(|e| TrainError::io("read", &path, e))?
            .len();
        let mut tensors: Vec<ShardSpec> = read_safetensors(&path)?
            .into_values()
            .map(|t| ShardSpec::full(t.name, t.shape))
            .collect();
        tensors.sort_by(|a, b| a.global_name.cmp(&b.global_name));
        files.push(ShardFile {
            file: file.clone(),
            kind,
            rank: 0,
            bytes,
            blake3: None,
            tensors,
        });
    }
    if files.is_empty() {
        return Err(TrainError::checkpoint(
            dir,
            "the manifest lists no tensor files",
        ));
    }
    Ok(files)
}

/// blake3 of a file, read in 1 MiB pieces (the whole checkpoint is read once more on load).
pub fn file_hash(path: &Path) -> Result<String, TrainError> {
    let file = std::fs::File::open(path).map_err(|e| TrainError::io("read", path, e))?;
    let mut hasher = blake3::Hasher::new();
    hasher
        .update_reader(std::io::BufReader::with_capacity(1 << 20, file))
        .map_err(|e| TrainError::io("read", path, e))?;
    Ok(hasher.finalize().to_hex().to_string())
}

/// The file has the checksum the manifest recorded (when it recorded one).
fn verify_file(dir: &Path, file: &ShardFile) -> Result<(), TrainError> {
    let Some(expected) = &file.blake3 else {
        return Ok(());
    };
    let actual = file_hash(&dir.join(&file.file))?;
    if actual == *expected {
        return Ok(());
    }
    Err(TrainError::Damaged {
        path: dir.to_path_buf(),
        file: file.file.clone(),
        expected: expected.clone(),
        actual,
    })
}

/// The file is there and has the size the manifest recorded.
fn check_file(dir: &Path, file: &ShardFile, world: u32) -> Result<(), TrainError> {
    let path = dir.join(&file.file);
    let written_by = format!("written by rank {} of {world}", file.rank);
    let actual = match std::fs::metadata(&path) {
        Ok(meta) => meta.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(TrainError::checkpoint(
                dir,
                format!("shard file {} ({written_by}) is missing", file.file),
            ));
        }
        Err(e) => return Err(TrainError::io("read", &path, e)),
    };
    if actual != file.bytes {
        let what = if actual < file.bytes {
            "truncated"
        } else {
            "damaged"
        };
        return Err(TrainError::checkpoint(
            dir,
            format!(
                "shard file {} ({written_by}) is {what}: {actual} bytes, the manifest recorded {}",
                file.file, file.bytes
            ),
        ));
    }
    Ok(())
}
