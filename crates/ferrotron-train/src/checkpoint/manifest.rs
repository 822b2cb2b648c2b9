//! The checkpoint manifest: what a checkpoint is (iteration, data position, seed), what wrote it
//! (recipe and plan hashes, the world layout), what model shape its tensors have, so resuming
//! into another model is refused field by field instead of failing deep inside a tensor copy,
//! and which shard files hold its tensors, so a lost or cut-short file is named, not guessed at.

use std::path::Path;

use ferrotron_parallel::ShardSpec;
use ferrotron_plan::Plan;
use ferrotron_recipe::{
    Activation, Degrees, LayerFreq, Mla, Model, Normalization, PositionEmbedding, RopeScaling,
    Tokenizer,
};
use serde::{Deserialize, Serialize};

use crate::TrainError;

/// Bumped when the checkpoint layout changes incompatibly. Version 2 added the world layout and
/// the shard files; version 1 checkpoints (one `model.safetensors` of whole tensors) still load.
pub const CHECKPOINT_FORMAT_VERSION: u32 = 2;
const READABLE_VERSIONS: [u32; 2] = [1, 2];
pub const MANIFEST_FILE: &str = "manifest.json";
pub const MODEL_FILE: &str = "model.safetensors";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const PLAN_FILE: &str = "plan.json";
pub const RECIPE_FILE: &str = "recipe.yaml";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    /// Optimizer steps completed.
    pub iteration: u64,
    /// Global training samples consumed (the data loader's whole state).
    pub consumed_samples: u64,
    pub consumed_tokens: u64,
    pub rng: RngInfo,
    pub recipe_name: String,
    /// blake3 of the resolved recipe's JSON.
    pub recipe_hash: String,
    pub plan_hash: String,
    pub shape: ModelShape,
    /// The resolved model section and tokenizer, so `recipe sample` needs only this folder.
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub files: ManifestFiles,
    /// The layout that wrote the checkpoint (one rank for version 1).
    #[serde(default)]
    pub layout: CheckpointLayout,
    /// Every tensor file with the rank that wrote it, its size and its shards (version 2).
    #[serde(default)]
    pub shards: Vec<ShardFile>,
}

/// The parallel layout of the run that wrote a checkpoint: for people reading the manifest
/// (a checkpoint loads into any layout, so nothing depends on it matching).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointLayout {
    pub world_size: u32,
    #[serde(flatten)]
    pub degrees: Degrees,
    pub sequence_parallel: bool,
    pub distributed_optimizer: bool,
}

impl Default for CheckpointLayout {
    fn default() -> Self {
        CheckpointLayout {
            world_size: 1,
            degrees: Degrees::ONE,
            sequence_parallel: false,
            distributed_optimizer: false,
        }
    }
}

impl CheckpointLayout {
    pub fn of(plan: &Plan) -> Self {
        CheckpointLayout {
            world_size: plan.world_size,
            degrees: plan.degrees,
            sequence_parallel: plan.recipe.parallel.sequence_parallel,
            distributed_optimizer: plan.recipe.parallel.distributed_optimizer,
        }
    }
}

/// What a shard file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ShardKind {
    /// Parameters.
    Model,
    /// Optimizer moments (`<global name>.exp_avg`, `.exp_avg_sq`).
    Optimizer,
}

/// One tensor file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardFile {
    pub file: String,
    pub kind: ShardKind,
    /// The global rank that wrote it.
    pub rank: u32,
    /// Its size when committed: a different size on disk means a damaged checkpoint.
    pub bytes: u64,
    /// blake3 of its bytes when committed (absent in checkpoints written before checksums).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blake3: Option<String>,
    pub tensors: Vec<ShardSpec>,
}

/// How randomness is derived: nothing is saved but the seed, because the backend is re-seeded
/// with `seed ^ iteration` before every step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RngInfo {
    pub seed: u64,
    pub scheme: String,
}

impl RngInfo {
    pub fn per_iteration(seed: u64) -> Self {
        RngInfo {
            seed,
            scheme: "backend seeded with seed ^ iteration before each step".into(),
        }
    }
}

/// The non-tensor files, and for version 1 the two tensor files (version 2 lists its tensor
/// files in [`Manifest::shards`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestFiles {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer: Option<String>,
    pub plan: String,
    pub recipe: String,
}

impl Default for ManifestFiles {
    fn default() -> Self {
        ManifestFiles {
            model: None,
            optimizer: None,
            plan: PLAN_FILE.into(),
            recipe: RECIPE_FILE.into(),
        }
    }
}

/// Every model field that decides a tensor's shape or meaning.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelShape {
    pub num_layers: u32,
    pub hidden_size: u32,
    pub ffn_hidden_size: u32,
    pub num_attention_heads: u32,
    pub num_query_groups: u32,
    pub kv_channels: u32,
    pub padded_vocab_size: u32,
    pub max_position_embeddings: u32,
    pub position_embedding: PositionEmbedding,
    pub normalization: Normalization,
    pub activation: Activation,
    pub tie_embeddings: bool,
    pub add_bias_linear: bool,
    /// The dense families' switches (issue 45), left out while off so manifests written before
    /// them read, and compare, as they did.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub add_qkv_bias: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub qk_layernorm: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_size: Option<[u32; 2]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeScaling>,
    /// Multi-latent attention's sizes (issue 46), left out without it as the switches above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mla: Option<Mla>,
    pub num_experts: Option<u32>,
    /// Which layers are MoE: the integer N where the pattern is every N-th layer (what every
    /// manifest written before the list form holds), else one 0/1 per layer.
    pub moe_layer_freq: Option<LayerFreq>,
    pub expert_ffn_hidden_size: Option<u32>,
    pub shared_expert_ffn_hidden_size: Option<u32>,
}

impl ModelShape {
    pub fn of(model: &Model, padded_vocab_size: u32) -> Self {
        let moe = model.moe.as_ref();
        ModelShape {
            num_layers: model.num_layers,
            hidden_size: model.hidden_size,
            ffn_hidden_size: model.ffn_hidden_size(),
            num_attention_heads: model.num_attention_heads,
            num_query_groups: model.num_query_groups(),
            kv_channels: model.kv_channels(),
            padded_vocab_size,
            max_position_embeddings: model.max_position_embeddings(),
            position_embedding: model.position_embedding,
            normalization: model.normalization,
            activation: model.activation,
            tie_embeddings: model.tie_embeddings,
            add_bias_linear: model.add_bias_linear,
            // Beyond add_bias_linear's, which already gives the projection its bias.
            add_qkv_bias: model.add_qkv_bias && !model.add_bias_linear,
            qk_layernorm: model.qk_layernorm,
            window_size: model.window_size,
            rope_scaling: model.rope_scaling.map(|scaling| scaling.with_defaults()),
            mla: model.mla,
            num_experts: moe.map(|m| m.num_experts),
            moe_layer_freq: moe.map(|m| m.layer_freq.canonical(model.num_layers)),
            expert_ffn_hidden_size: moe.map(|m| m.expert_ffn_hidden_size(model)),
            shared_expert_ffn_hidden_size: moe.and_then(|m| m.shared_expert_ffn_hidden_size),
        }
    }

    /// "field: checkpoint X, recipe Y" for every field where `self` (the checkpoint) and
    /// `recipe` differ; empty when they describe the same model.
    pub fn differences(&self, recipe: &ModelShape) -> Vec<String> {
        let ours = field_values(self);
        let theirs = field_values(recipe);
        // A field left out while off (the dense families' switches) is on one side only.
        let mut fields: Vec<&str> = ours.iter().map(|(field, _)| field.as_str()).collect();
        for (field, _) in &theirs {
            if !fields.contains(&field.as_str()) {
                fields.push(field);
            }
        }
        let value = |values: &[(String, String)], field: &str| {
            values
                .iter()
                .find(|(name, _)| name == field)
                .map_or_else(|| "none".to_owned(), |(_, value)| value.clone())
        };
        fields
            .into_iter()
            .filter_map(|field| {
                let (a, b) = (value(&ours, field), value(&theirs, field));
                (a != b).then(|| format!("{field}: checkpoint {a}, recipe {b}"))
            })
            .collect()
    }
}

/// The shape's fields as (name, printed value), in declaration order, via serde so a field
/// added to the struct is compared without touching this function.
fn field_values(shape: &ModelShape) -> Vec<(String, String)> {
    let serde_json::Value::Object(map) =
        serde_json::to_value(shape).expect("a plain struct serializes")
    else {
        unreachable!("a struct serializes to an object")
    };
    map.into_iter()
        .map(|(k, v)| {
            let printed = match v {
                serde_json::Value::Null => "none".to_owned(),
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            };
            (k, printed)
        })
        .collect()
}

impl Manifest {
    pub fn read(dir: &Path) -> Result<Self, TrainError> {
        let path = dir.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| TrainError::io("read", &path, e))?;
        let manifest: Manifest = serde_json::from_str(&text)
            .map_err(|e| TrainError::checkpoint(&path, format!("invalid manifest: {e}")))?;
        if !READABLE_VERSIONS.contains(&manifest.format_version) {
            return Err(TrainError::checkpoint(
                &path,
                format!(
                    "format version {} is not one this build reads ({READABLE_VERSIONS:?})",
                    manifest.format_version
                ),
            ));
        }
        Ok(manifest)
    }

    pub fn write(&self, dir: &Path) -> Result<(), TrainError> {
        let path = dir.join(MANIFEST_FILE);
        let text = serde_json::to_string_pretty(self).expect("the manifest serializes");
        std::fs::write(&path, text).map_err(|e| TrainError::io("write", &path, e))
    }

    /// Refuse to continue `recipe`'s model from this checkpoint unless the shapes agree.
    pub fn check_model(&self, dir: &Path, recipe: &ModelShape) -> Result<(), TrainError> {
        let fields = self.shape.differences(recipe);
        if fields.is_empty() {
            Ok(())
        } else {
            Err(TrainError::ModelMismatch {
                path: dir.to_path_buf(),
                fields,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(hidden: u32, layers: u32) -> Model {
        serde_json::from_value(serde_json::json!({
            "num_layers": layers, "hidden_size": hidden, "num_attention_heads": 4, "seq_length": 32
        }))
        .expect("a minimal model section parses")
    }

    #[test]
    fn differences_list_every_field() {
        let checkpoint = ModelShape::of(&model(256, 2), 50304);
        let recipe = ModelShape::of(&model(128, 2), 50304);
        assert_eq!(
            checkpoint.differences(&recipe),
            [
                "hidden_size: checkpoint 256, recipe 128",
                "ffn_hidden_size: checkpoint 1024, recipe 512",
                "kv_channels: checkpoint 64, recipe 32",
            ]
        );
        assert!(checkpoint.differences(&checkpoint.clone()).is_empty());
    }

    #[test]
    fn mismatch_error_names_the_fields() {
        let manifest_shape = ModelShape::of(&model(64, 3), 128);
        let recipe_shape = ModelShape::of(&model(64, 2), 256);
        let manifest = Manifest {
            format_version: CHECKPOINT_FORMAT_VERSION,
            iteration: 1,
            consumed_samples: 8,
            consumed_tokens: 256,
            rng: RngInfo::per_iteration(1),
            recipe_name: "t".into(),
            recipe_hash: "r".into(),
            plan_hash: "p".into(),
            shape: manifest_shape,
            model: model(64, 3),
            tokenizer: Tokenizer::default(),
            files: ManifestFiles::default(),
            layout: CheckpointLayout::default(),
            shards: vec![ShardFile {
                file: MODEL_FILE.into(),
                kind: ShardKind::Model,
                rank: 0,
                bytes: 10,
                blake3: None,
                tensors: vec![ShardSpec::full("w", vec![2, 5])],
            }],
        };
        let err = manifest
            .check_model(Path::new("ckpt"), &recipe_shape)
            .expect_err("different model");
        assert_eq!(
            err.to_string(),
            "checkpoint ckpt was written for a different model:\n  num_layers: checkpoint 3, recipe 2\n  padded_vocab_size: checkpoint 128, recipe 256"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        manifest.write(dir.path()).expect("write");
        assert_eq!(Manifest::read(dir.path()).expect("read"), manifest);
    }

    fn moe_model(layers: u32, layer_freq: serde_json::Value) -> Model {
        let mut model = model(64, layers);
        model.moe = Some(
            serde_json::from_value(serde_json::json!({"num_experts": 4, "layer_freq": layer_freq}))
                .expect("an MoE section parses"),
        );
        model
    }

    /// A shape written before the list form of `layer_freq` (an integer, no `mla` key) reads and
    /// compares equal to today's of the same model, in whichever form the recipe now writes it;
    /// a pattern no integer gives is recorded as its list.
    #[test]
    fn moe_layer_patterns_compare_by_the_layers_they_make_moe() {
        let every_second = ModelShape::of(&moe_model(4, serde_json::json!(2)), 128);
        let written_before = serde_json::to_value(&every_second).expect("serializes");
        assert_eq!(written_before["moe_layer_freq"], serde_json::json!(2));
        assert!(written_before.get("mla").is_none());
        let old: ModelShape = serde_json::from_value(written_before).expect("an old shape reads");
        for form in [
            serde_json::json!([1, 0, 1, 0]),
            serde_json::json!("[1,0]*2"),
        ] {
            assert!(
                old.differences(&ModelShape::of(&moe_model(4, form), 128))
                    .is_empty()
            );
        }
        let dense_first = ModelShape::of(&moe_model(4, serde_json::json!("[0]+[1]*3")), 128);
        assert_eq!(
            old.differences(&dense_first),
            ["moe_layer_freq: checkpoint 2, recipe [0,1,1,1]"]
        );
    }
}

#[cfg(test)]
mod version_one {
    use super::*;

    /// A manifest as version 1 wrote it (no layout, no shard list, tensor files named in `files`).
    fn version_one_json() -> serde_json::Value {
        let model = serde_json::json!({
            "num_layers": 1, "hidden_size": 8, "num_attention_heads": 2, "seq_length": 8
        });
        let shape = ModelShape::of(
            &serde_json::from_value(model.clone()).expect("model parses"),
            64,
        );
        serde_json::json!({
            "format_version": 1, "iteration": 3, "consumed_samples": 12, "consumed_tokens": 96,
            "rng": {"seed": 1, "scheme": "s"}, "recipe_name": "t", "recipe_hash": "r",
            "plan_hash": "p", "shape": shape, "model": model,
            "tokenizer": Tokenizer::default(),
            "files": {"model": "model.safetensors", "optimizer": "optimizer.safetensors",
                      "plan": "plan.json", "recipe": "recipe.yaml"}
        })
    }

    #[test]
    fn version_one_manifests_still_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join(MANIFEST_FILE),
            version_one_json().to_string(),
        )
        .expect("write");
        let manifest = Manifest::read(dir.path()).expect("version 1 reads");
        assert_eq!(manifest.files.model.as_deref(), Some(MODEL_FILE));
        assert_eq!(manifest.layout, CheckpointLayout::default());
        assert!(manifest.shards.is_empty());
    }

    #[test]
    fn unknown_versions_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut json = version_one_json();
        json["format_version"] = 9.into();
        std::fs::write(dir.path().join(MANIFEST_FILE), json.to_string()).expect("write");
        let err = Manifest::read(dir.path()).expect_err("version 9");
        assert!(
            err.to_string()
                .contains("format version 9 is not one this build reads ([1, 2])"),
            "{err}"
        );
    }
}
