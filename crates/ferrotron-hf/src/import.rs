//! `recipe import` and `checkpoint.init_from: {hf: DIR}`: a transformers model folder as the
//! iteration-0 checkpoint of a checkpoint directory, with whole tensors under our global names
//! and the recipe's seed and plan. A run then resumes from it like from any checkpoint, which
//! is what re-pads the vocabulary for the run's tensor parallelism and cuts every rank's shards
//! (`ferrotron-train`'s loader), so no layout logic lives here. Tensors are read from the HF
//! files and written one at a time.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ferrotron_parallel::ShardSpec;
use ferrotron_plan::Plan;
use ferrotron_recipe::{Finding, Model, Tokenizer};
use ferrotron_train::checkpoint::{
    CHECKPOINT_FORMAT_VERSION, CheckpointLayout, CheckpointStore, MODEL_FILE, Manifest,
    ManifestFiles, ModelShape, RECIPE_FILE, RngInfo, SHARDS_METADATA_KEY, ShardFile, ShardKind,
};

use crate::HfError;
use crate::config::HfConfig;
use crate::export::INDEX_FILE;
use crate::family::Family;
use crate::names::{Piece, Source, pieces};
use crate::safetensors_file::TensorFile;
use crate::sink::{self, LazyTensor, OutDtype};

/// The iteration an imported checkpoint is saved at: a run starting from it trains step 1 next.
pub const IMPORTED_ITERATION: u64 = 0;

/// Buffers transformers may save that are not weights (masks, rotary tables).
const BUFFERS: [&str; 3] = [".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq"];

/// One of our tensors and the transformers tensors it is assembled from.
struct Target<'p> {
    name: String,
    shape: Vec<usize>,
    parts: Vec<&'p Piece>,
}

/// A transformers model folder opened for import: its configuration and where each tensor is.
#[derive(Debug)]
pub struct HfModel {
    dir: PathBuf,
    pub config: HfConfig,
    files: Vec<TensorFile>,
    /// Tensor name (with the class's prefix) → index into `files` and the name stored there.
    index: HashMap<String, (usize, String)>,
}

impl HfModel {
    /// Read `config.json` and the headers of `model.safetensors` (or of every file
    /// `model.safetensors.index.json` names).
    pub fn open(dir: &Path) -> Result<Self, HfError> {
        let config = HfConfig::read(dir)?;
        let index_path = dir.join(INDEX_FILE);
        let names: Vec<String> = if index_path.is_file() {
            let text = std::fs::read_to_string(&index_path)
                .map_err(|e| HfError::io("read", &index_path, e))?;
            let index: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| HfError::config(&index_path, format!("invalid JSON: {e}")))?;
            let mut files: Vec<String> = index["weight_map"]
                .as_object()
                .ok_or_else(|| HfError::config(&index_path, "no weight_map"))?
                .values()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect();
            files.sort();
            files.dedup();
            files
        } else {
            vec![MODEL_FILE.to_owned()]
        };
        // Files saved from the base model (OpenAI's GPT-2 on the Hub: `h.0.attn...`) lack the
        // `transformer.` / `model.` prefix that transformers adds on load; add it here.
        let prefix = match config.family {
            Family::Gpt2 => "transformer.",
            _ => "model.",
        };
        let mut files = Vec::new();
        let mut index = HashMap::new();
        for name in names {
            let file = TensorFile::open(&dir.join(name))?;
            for tensor in file.entries.keys() {
                let full = if tensor.starts_with(prefix) || tensor.starts_with("lm_head.") {
                    tensor.clone()
                } else {
                    format!("{prefix}{tensor}")
                };
                index.insert(full, (files.len(), tensor.clone()));
            }
            files.push(file);
        }
        Ok(HfModel {
            dir: dir.to_path_buf(),
            config,
            files,
            index,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every difference between `recipe` (with its real vocabulary) and this model, at the
    /// recipe's keys.
    pub fn check(&self, recipe: &Model, vocab: u32) -> Vec<Finding> {
        let mut findings = crate::check::check(recipe, vocab, &self.config);
        let skipped = self.multi_token_prediction_tensors();
        if let (Some(first), Some(last)) = (skipped.first(), skipped.last()) {
            findings.push(Finding::warning(
                "hf::mtp-skipped",
                "model",
                format!(
                    "config.json's {} multi-token prediction layer(s) ({} tensors, {first} … \
                     {last}) are not part of this model and are not imported",
                    self.config.mtp_layers,
                    skipped.len()
                ),
            ));
        }
        findings
    }

    /// DeepSeek-V3's multi-token prediction weights: the layers past `num_hidden_layers`.
    pub fn multi_token_prediction_tensors(&self) -> Vec<String> {
        if self.config.mtp_layers == 0 {
            return Vec::new();
        }
        let layers = u64::from(self.config.model.num_layers);
        let mut names: Vec<String> = self
            .index
            .keys()
            .filter(|name| {
                name.strip_prefix("model.layers.")
                    .and_then(|rest| rest.split('.').next())
                    .and_then(|layer| layer.parse::<u64>().ok())
                    .is_some_and(|layer| (layers..layers + self.config.mtp_layers).contains(&layer))
            })
            .cloned()
            .collect();
        names.sort();
        names
    }

    /// Write this model as the iteration-0 checkpoint of `store`, for `plan` (whose model
    /// section [`Self::check`] found equal to this one). Returns the committed folder.
    pub fn import(&self, plan: &Plan, store: &CheckpointStore) -> Result<PathBuf, HfError> {
        let pieces = pieces(&self.config.dims());
        let targets = self.targets(&pieces)?;
        let temp = store.temp_folder(IMPORTED_ITERATION, "hf");
        store.begin(&temp)?;
        let path = temp.join(MODEL_FILE);
        let specs: Vec<ShardSpec> = targets
            .iter()
            .map(|t| ShardSpec::full(t.name.clone(), t.shape.clone()))
            .collect();
        let lazy: Vec<LazyTensor<'_>> = targets
            .iter()
            .map(|t| LazyTensor {
                name: t.name.clone(),
                shape: t.shape.clone(),
                produce: Box::new(move || self.assemble(&t.shape, &t.parts)),
            })
            .collect();
        let metadata = HashMap::from([(
            SHARDS_METADATA_KEY.to_owned(),
            serde_json::to_string(&specs).expect("shard specs serialize"),
        )]);
        sink::write(&path, &lazy, OutDtype::F32, metadata)?;
        let bytes = std::fs::metadata(&path)
            .map_err(|e| HfError::io("stat", &path, e))?
            .len();
        let recipe = &plan.recipe;
        let mut model = recipe.model.clone();
        model.vocab_size = Some(self.config.vocab);
        let manifest = Manifest {
            format_version: CHECKPOINT_FORMAT_VERSION,
            iteration: IMPORTED_ITERATION,
            consumed_samples: 0,
            consumed_tokens: 0,
            rng: RngInfo::per_iteration(recipe.training.seed),
            recipe_name: recipe.name.clone(),
            recipe_hash: recipe.content_hash(),
            plan_hash: plan.plan_hash.clone(),
            shape: ModelShape::of(&model, self.config.vocab),
            model,
            tokenizer: absolute(&recipe.data.tokenizer),
            files: ManifestFiles::default(),
            layout: CheckpointLayout::default(),
            shards: vec![ShardFile {
                file: MODEL_FILE.to_owned(),
                kind: ShardKind::Model,
                rank: 0,
                bytes,
                blake3: Some(ferrotron_train::checkpoint::file_hash(&path)?),
                tensors: specs,
            }],
        };
        plan.write_to(&temp)
            .map_err(|e| HfError::tensors(&temp, format!("cannot write plan.json: {e}")))?;
        let yaml = serde_saphyr::to_string(recipe)
            .map_err(|e| HfError::tensors(&temp, format!("cannot write the recipe: {e}")))?;
        let recipe_path = temp.join(RECIPE_FILE);
        std::fs::write(&recipe_path, yaml).map_err(|e| HfError::io("write", &recipe_path, e))?;
        manifest.write(&temp)?;
        Ok(store.commit(IMPORTED_ITERATION, &temp)?)
    }

    /// Our tensors with the pieces they are made of, in first-use order, after
    /// checking that every piece's HF tensor is there with its shape and no weight is left over.
    fn targets<'p>(&self, pieces: &'p [Piece]) -> Result<Vec<Target<'p>>, HfError> {
        let mut problems = Vec::new();
        let mut targets: Vec<Target<'p>> = Vec::new();
        for piece in pieces {
            let Source::Ours { name, shape, .. } = &piece.source else {
                continue;
            };
            match self.entry_shape(&piece.hf) {
                Some(found) if found == piece.shape.as_slice() => {}
                Some(found) => problems.push(format!(
                    "{}: shape {found:?}, config.json implies {:?}",
                    piece.hf, piece.shape
                )),
                None => problems.push(format!("{}: missing", piece.hf)),
            }
            match targets.iter_mut().find(|t| &t.name == name) {
                Some(target) => target.parts.push(piece),
                None => targets.push(Target {
                    name: name.clone(),
                    shape: shape.clone(),
                    parts: vec![piece],
                }),
            }
        }
        let tied = self.config.model.tie_embeddings;
        let skipped = self.multi_token_prediction_tensors();
        let mut extra: Vec<&String> = self
            .index
            .keys()
            .filter(|name| !pieces.iter().any(|p| &p.hf == *name))
            .filter(|name| !BUFFERS.iter().any(|b| name.ends_with(b)))
            .filter(|name| !(tied && name.as_str() == "lm_head.weight"))
            .filter(|name| !skipped.contains(name))
            .collect();
        extra.sort();
        problems.extend(
            extra
                .into_iter()
                .map(|n| format!("{n}: not part of the model config.json describes")),
        );
        if problems.is_empty() {
            Ok(targets)
        } else {
            Err(HfError::tensors(&self.dir, problems.join("\n  ")))
        }
    }

    fn entry_shape(&self, name: &str) -> Option<&[usize]> {
        let (file, stored) = self.index.get(name)?;
        self.files[*file]
            .entries
            .get(stored)
            .map(|e| e.shape.as_slice())
    }

    /// One of our tensors, its elements placed from the HF tensors it was cut into.
    fn assemble(&self, shape: &[usize], parts: &[&Piece]) -> Result<Vec<f32>, HfError> {
        let mut out = vec![0.0f32; shape.iter().product()];
        for piece in parts {
            let Source::Ours { selection, .. } = &piece.source else {
                continue;
            };
            let (file, stored) = &self.index[&piece.hf];
            let values = self.files[*file].read_f32(stored)?;
            selection.for_each(shape, |hf, ours| out[ours] = values[hf]);
        }
        Ok(out)
    }
}

/// The tokenizer with absolute paths, so the checkpoint is usable from any directory.
fn absolute(tokenizer: &Tokenizer) -> Tokenizer {
    let fix = |path: &Option<String>| {
        path.as_ref()
            .map(|p| std::path::absolute(p).map_or_else(|_| p.clone(), |a| a.display().to_string()))
    };
    Tokenizer {
        kind: tokenizer.kind,
        vocab_file: fix(&tokenizer.vocab_file),
        merge_file: fix(&tokenizer.merge_file),
        file: fix(&tokenizer.file),
    }
}
