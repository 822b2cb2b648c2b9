//! The sharded checkpoint end to end on thread ranks: a tp2·dp2 world saves, the folder is
//! read back into whole tensors and into another layout's shards, and every kind of damage is
//! refused with the file or tensor named.

use std::path::{Path, PathBuf};

use burn::module::ParamId;
use ferrotron_dist::{CommError, ProcessGroups, RankContext, ThreadComm, World};
use ferrotron_parallel::{ParallelContext, ParamRole, ShardSpec, Split};
use ferrotron_plan::{Plan, PlanOptions};
use ferrotron_recipe::{Cluster, GpuKind, Recipe};

use super::*;
use crate::TrainError;
use crate::run::resume::ResumeState;

/// `rank`'s groups from `plan`, as the runtime builds them.
fn rank_groups(plan: &Plan, rank: &RankContext) -> Result<ProcessGroups<ThreadComm>, CommError> {
    let members = crate::group_members(plan, rank.rank(), rank.world_size() as usize)
        .unwrap_or_else(|e| panic!("rank {}: {e}", rank.rank()));
    rank.groups(&members)
}

fn recipe() -> Recipe {
    serde_json::from_value(serde_json::json!({
        "version": 2,
        "name": "ckpt-test",
        "model": {"num_layers": 2, "hidden_size": 8, "num_attention_heads": 2,
                  "seq_length": 8, "vocab_size": 60, "make_vocab_size_divisible_by": 32},
        "parallel": {"tensor": 2},
        "training": {"micro_batch_size": 1, "global_batch_size": 4, "train_iters": 2, "seed": 7}
    }))
    .expect("test recipe deserializes")
}

fn tp2_dp2_plan() -> Plan {
    let recipe = recipe();
    ferrotron_plan::plan(
        &recipe,
        &PlanOptions {
            cluster: Some(Cluster {
                nodes: 1,
                gpus_per_node: 4,
                gpu: GpuKind::Cpu,
            }),
            vocab_size: 60,
        },
    )
    .expect("tp2·dp2 plans")
}

/// Two global tensors with recognisable values: a tp-split weight and a tp-replicated bias.
fn globals() -> Vec<(ShardSpec, Vec<f32>)> {
    let weight: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let bias: Vec<f32> = (0..6).map(|i| 100.0 + i as f32).collect();
    vec![
        (ShardSpec::full("layer.weight", vec![4, 6]), weight),
        (ShardSpec::full("layer.bias", vec![6]), bias),
    ]
}

/// Rank-local roles: the weight's rows split over tp, the bias replicated over tp.
fn roles(ctx: &ParallelContext) -> Vec<ParamRole> {
    let (tp, tp_size) = (ctx.tp.rank(), ctx.tp.size());
    let weight = ShardSpec::full("layer.weight", vec![4, 6]).with_split(Split::new(0, tp, tp_size));
    let mut bias = ParamRole::new(ParamId::new(), ShardSpec::full("layer.bias", vec![6]));
    bias.tp_duplicate = true;
    vec![ParamRole::new(ParamId::new(), weight), bias]
}

fn local(spec: &ShardSpec) -> ShardTensor {
    let global = globals()
        .into_iter()
        .find(|(g, _)| g.global_name == spec.global_name)
        .expect("a known tensor")
        .1;
    ShardTensor {
        spec: spec.clone(),
        values: spec.slice_of_f32(&global).expect("slice").into(),
    }
}

/// Every rank of a tp2·dp2 thread world saves its primary shards (and moments named after
/// them); returns the committed folder.
fn save_tp2_dp2(root: &Path) -> PathBuf {
    save_tp2_dp2_as(root, false)
}

/// [`save_tp2_dp2`], the save asynchronous (started, then settled) when `async_save`.
fn save_tp2_dp2_as(root: &Path, async_save: bool) -> PathBuf {
    let plan = tp2_dp2_plan();
    let recipe = plan.recipe.clone();
    let shape = ModelShape::of(&recipe.model, plan.padded_vocab_size);
    let store = CheckpointStore::new(root.join("ckpt"), None);
    let folders = World::new(4)
        .run(|rank| {
            let ctx = ParallelContext::from_groups(rank_groups(&plan, &rank)?, false);
            let mine: Vec<ParamRole> = roles(&ctx)
                .into_iter()
                .filter(|r| is_primary_replica(r, &ctx))
                .collect();
            let model: Vec<ShardTensor> = mine.iter().map(|r| local(&r.shard)).collect();
            let moments: Vec<ShardTensor> = model
                .iter()
                .map(|t| ShardTensor {
                    spec: moment_spec(&t.spec, crate::EXP_AVG),
                    values: t
                        .values
                        .to_vec()
                        .iter()
                        .map(|v| v / 10.0)
                        .collect::<Vec<_>>()
                        .into(),
                })
                .collect();
            let info = CheckpointInfo {
                state: ResumeState {
                    iteration: 5,
                    consumed_samples: 20,
                    consumed_tokens: 160,
                },
                plan: &plan,
                recipe: &recipe,
                shape: &shape,
            };
            let saved = if async_save {
                start_sharded_save(&store, &ctx, &info, (model, moments))
                    .and_then(|save| save.settle(&ctx))
            } else {
                save_sharded(&store, &ctx, &info, &model, &moments)
            };
            saved.map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
        })
        .expect("every rank saves");
    assert!(folders.iter().all(|f| f == &folders[0]));
    folders[0].clone()
}

#[test]
fn a_world_saves_one_folder_with_one_copy_of_each_shard() {
    let root = tempfile::tempdir().expect("tempdir");
    let folder = save_tp2_dp2(root.path());
    assert!(is_committed(&folder));
    let manifest = Manifest::read(&folder).expect("manifest");
    assert_eq!(manifest.iteration, 5);
    assert_eq!(manifest.layout.world_size, 4);
    assert_eq!(
        (manifest.layout.degrees.tp, manifest.layout.degrees.dp),
        (2, 2)
    );
    // dp rank 0 of each replica set writes: ranks 0 and 1 (tp 0 and 1); the bias only on tp 0.
    let files: Vec<(&str, u32, usize)> = manifest
        .shards
        .iter()
        .map(|f| (f.file.as_str(), f.rank, f.tensors.len()))
        .collect();
    assert_eq!(
        files,
        [
            ("model-00001-of-00004.safetensors", 0, 2),
            ("optimizer-00001-of-00004.safetensors", 0, 2),
            ("model-00002-of-00004.safetensors", 1, 1),
            ("optimizer-00002-of-00004.safetensors", 1, 1),
        ]
    );
    assert!(!folder.join("model-00003-of-00004.safetensors").exists());
    assert!(folder.join(PLAN_FILE).is_file() && folder.join(RECIPE_FILE).is_file());
}

/// Every file of `folder` by its name, with its bytes.
fn files_of(folder: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(folder)
        .expect("folder")
        .map(|entry| {
            let path = entry.expect("entry").path();
            let name = path
                .file_name()
                .expect("name")
                .to_string_lossy()
                .into_owned();
            (name, std::fs::read(&path).expect("readable"))
        })
        .collect();
    files.sort();
    files
}

#[test]
fn an_async_save_commits_the_bytes_of_a_synchronous_one() {
    let (sync_root, async_root) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    let synchronous = save_tp2_dp2_as(sync_root.path(), false);
    let asynchronous = save_tp2_dp2_as(async_root.path(), true);
    assert!(is_committed(&asynchronous));
    let (expected, got) = (files_of(&synchronous), files_of(&asynchronous));
    let names: Vec<&str> = got.iter().map(|(name, _)| name.as_str()).collect();
    assert!(
        names.contains(&"model-00001-of-00004.safetensors"),
        "{names:?}"
    );
    assert_eq!(
        got, expected,
        "the same files with the same bytes, markers gone"
    );
    // nothing left beside the committed folder
    let left: Vec<_> = std::fs::read_dir(async_root.path().join("ckpt"))
        .expect("store")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
}

/// Every rank's error from a tp2·dp2 save in which rank `failing` claims two shards of one
/// tensor (which the file writer refuses), `save` being the synchronous or the asynchronous
/// one; and whether anything was committed.
fn a_save_with_a_failing_rank(
    failing: u32,
    save: impl Fn(
        &CheckpointStore,
        &ParallelContext,
        &CheckpointInfo<'_>,
        Vec<ShardTensor>,
    ) -> Result<PathBuf, TrainError>
    + Sync,
) -> (Vec<(u32, String)>, bool) {
    let root = tempfile::tempdir().expect("tempdir");
    let plan = tp2_dp2_plan();
    let recipe = plan.recipe.clone();
    let shape = ModelShape::of(&recipe.model, plan.padded_vocab_size);
    let store = CheckpointStore::new(root.path().join("ckpt"), None);
    let outcomes = std::sync::Mutex::new(Vec::new());
    let _ = World::new(4).run(|rank| {
        let ctx = ParallelContext::from_groups(rank_groups(&plan, &rank)?, false);
        let spec = ShardSpec::full("layer.bias", vec![6]);
        let model = if rank.rank() == failing {
            vec![local(&spec), local(&spec)]
        } else {
            vec![local(&spec)]
        };
        let info = CheckpointInfo {
            state: ResumeState::fresh(),
            plan: &plan,
            recipe: &recipe,
            shape: &shape,
        };
        let outcome = save(&store, &ctx, &info, model);
        outcomes
            .lock()
            .expect("lock")
            .push((rank.rank(), outcome.map_err(|e| e.to_string())));
        Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    });
    let mut outcomes = outcomes.into_inner().expect("lock");
    outcomes.sort_by_key(|(rank, _)| *rank);
    let errors = outcomes
        .into_iter()
        .map(|(rank, outcome)| (rank, outcome.expect_err("every rank fails")))
        .collect();
    (errors, store.latest().expect("list").is_some())
}

#[test]
fn a_failing_async_writer_fails_every_rank_and_commits_nothing() {
    let (errors, committed) = a_save_with_a_failing_rank(3, |store, ctx, info, model| {
        start_sharded_save(store, ctx, info, (model, Vec::new()))?.settle(ctx)
    });
    assert_eq!(errors.len(), 4);
    for (rank, err) in &errors {
        match rank {
            3 => assert!(
                err.contains("two shards of layer.bias from one rank"),
                "{err}"
            ),
            0 => assert!(err.contains("rank 3 failed to write its shards"), "{err}"),
            _ => assert!(
                err.contains("another rank failed to write and commit"),
                "{err}"
            ),
        }
    }
    assert!(!committed);
}

#[test]
fn shards_assemble_into_global_tensors_and_any_new_layout() {
    let root = tempfile::tempdir().expect("tempdir");
    let checkpoint = ShardedCheckpoint::open(&save_tp2_dp2(root.path())).expect("opens");
    let model = checkpoint
        .global_tensors(ShardKind::Model)
        .expect("assembles");
    for (spec, values) in globals() {
        let got = &model[&spec.global_name];
        assert_eq!(got.shape, spec.global_shape);
        assert_eq!(got.values, values, "{}", spec.global_name);
    }
    let moments = checkpoint
        .global_tensors(ShardKind::Optimizer)
        .expect("assembles");
    assert_eq!(moments["layer.weight.exp_avg"].values[23], 2.3);

    // tp3 along the other dim: piece 1 of 3 of every row.
    let spec = ShardSpec::full("layer.weight", vec![4, 6]).with_split(Split::new(1, 1, 3));
    assert_eq!(
        checkpoint.shard(&spec).expect("cut"),
        [2.0, 3.0, 8.0, 9.0, 14.0, 15.0, 20.0, 21.0]
    );
    assert_eq!(
        checkpoint.resume_state(),
        ResumeState {
            iteration: 5,
            consumed_samples: 20,
            consumed_tokens: 160
        }
    );
}

#[test]
fn another_models_tensors_are_refused_by_name() {
    let root = tempfile::tempdir().expect("tempdir");
    let checkpoint = ShardedCheckpoint::open(&save_tp2_dp2(root.path())).expect("opens");
    let wider = ShardSpec::full("layer.weight", vec![4, 8]);
    let err = checkpoint.shard(&wider).expect_err("another shape");
    assert!(
        err.to_string()
            .ends_with("layer.weight: global shape [4, 6] in the checkpoint, [4, 8] in the model"),
        "{err}"
    );
    let err = checkpoint
        .shard(&ShardSpec::full("other.weight", vec![2]))
        .expect_err("absent");
    assert!(
        err.to_string()
            .ends_with("other.weight: not in the checkpoint"),
        "{err}"
    );
    let mut shape = ModelShape::of(&recipe().model, 64);
    assert!(checkpoint.check_compatible(&shape, 7).is_ok());
    assert!(
        checkpoint
            .check_compatible(&shape, 8)
            .expect_err("seed")
            .to_string()
            .contains("written with training.seed 7, the recipe has 8")
    );
    shape.num_layers = 3;
    assert!(
        checkpoint
            .check_compatible(&shape, 7)
            .expect_err("model")
            .to_string()
            .contains("num_layers: checkpoint 2, recipe 3")
    );
    // A switch the checkpoint's manifest leaves out (off) differs from one the recipe turns on.
    shape.num_layers = 2;
    shape.qk_layernorm = true;
    shape.window_size = Some([4095, 0]);
    let err = checkpoint
        .check_compatible(&shape, 7)
        .expect_err("model")
        .to_string();
    assert!(
        err.contains("qk_layernorm: checkpoint none, recipe true"),
        "{err}"
    );
    assert!(
        err.contains("window_size: checkpoint none, recipe [4095,0]"),
        "{err}"
    );
    assert!(!err.contains("num_layers"), "{err}");
}

#[test]
fn missing_and_truncated_files_are_named_with_their_rank() {
    let root = tempfile::tempdir().expect("tempdir");
    let folder = save_tp2_dp2(root.path());
    let file = folder.join("model-00002-of-00004.safetensors");
    let bytes = std::fs::read(&file).expect("read");
    std::fs::write(&file, &bytes[..bytes.len() - 3]).expect("truncate");
    let err = ShardedCheckpoint::open(&folder).expect_err("truncated");
    assert!(
        err.to_string().contains(&format!(
            "shard file model-00002-of-00004.safetensors (written by rank 1 of 4) is truncated: {} bytes, the manifest recorded {}",
            bytes.len() - 3,
            bytes.len()
        )),
        "{err}"
    );
    std::fs::remove_file(&file).expect("remove");
    let err = ShardedCheckpoint::open(&folder).expect_err("missing");
    assert!(
        err.to_string().contains(
            "shard file model-00002-of-00004.safetensors (written by rank 1 of 4) is missing"
        ),
        "{err}"
    );
}

#[test]
fn shards_that_do_not_cover_a_tensor_are_refused() {
    let root = tempfile::tempdir().expect("tempdir");
    let folder = save_tp2_dp2(root.path());
    // Forget rank 1's files in the manifest: half of layer.weight has no shard.
    let mut manifest = Manifest::read(&folder).expect("manifest");
    manifest.shards.retain(|f| f.rank == 0);
    manifest.write(&folder).expect("rewrite");
    let checkpoint = ShardedCheckpoint::open(&folder).expect("opens");
    assert_eq!(
        checkpoint.global("layer.bias").expect("whole").values.len(),
        6
    );
    let err = checkpoint.global("layer.weight").expect_err("half");
    assert!(
        err.to_string().ends_with(
            "layer.weight: the shards cover 12 of its 24 elements; the checkpoint is incomplete"
        ),
        "{err}"
    );
}

#[test]
fn a_failing_rank_fails_every_rank_and_commits_nothing() {
    let (errors, committed) = a_save_with_a_failing_rank(2, |store, ctx, info, model| {
        save_sharded(store, ctx, info, &model, &[])
    });
    for (rank, err) in &errors {
        if *rank == 2 {
            assert!(
                err.contains("two shards of layer.bias from one rank"),
                "{err}"
            );
        } else {
            assert!(
                err.contains("another rank failed to write its shards"),
                "{err}"
            );
        }
    }
    assert!(!committed);
}

#[test]
fn version_one_checkpoints_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let folder = dir.path().join("iter_0000003");
    std::fs::create_dir_all(&folder).expect("mkdir");
    write_safetensors(
        &folder.join(MODEL_FILE),
        &[crate::NamedTensor {
            name: "w".into(),
            shape: vec![2, 2],
            values: vec![1.0, 2.0, 3.0, 4.0],
        }],
    )
    .expect("write");
    let plan = tp2_dp2_plan();
    let mut manifest = Manifest {
        format_version: 1,
        iteration: 3,
        consumed_samples: 12,
        consumed_tokens: 96,
        rng: RngInfo::per_iteration(7),
        recipe_name: "t".into(),
        recipe_hash: "r".into(),
        plan_hash: "p".into(),
        shape: ModelShape::of(&plan.recipe.model, 64),
        model: plan.recipe.model.clone(),
        tokenizer: Default::default(),
        files: ManifestFiles::default(),
        layout: CheckpointLayout::default(),
        shards: Vec::new(),
    };
    manifest.files.model = Some(MODEL_FILE.into());
    manifest.write(&folder).expect("manifest");
    std::fs::write(folder.join(COMMIT_MARKER), "3\n").expect("marker");
    let checkpoint = ShardedCheckpoint::open(&folder).expect("version 1 opens");
    let half = ShardSpec::full("w", vec![2, 2]).with_split(Split::new(1, 1, 2));
    assert_eq!(checkpoint.shard(&half).expect("cut"), [2.0, 4.0]);
    assert!(checkpoint.names(ShardKind::Optimizer).is_empty());
}

/// Burn modules through the checkpoint: a one-rank module's parameters and AdamW moments saved
/// under global names load into a module holding only tp piece 1 of 2 of its first layer.
mod modules {
    use std::collections::{HashMap, HashSet};

    use burn::module::Param;
    use burn::nn::LinearConfig;
    use burn::optim::GradientsParams;
    use burn::tensor::Tensor;

    use super::*;
    use crate::params::tests::{Cpu, CpuAutodiff, Tiny, tiny};
    use crate::{AdamW, AdamWConfig, EXP_AVG_SQ, named_tensors, param_entries};

    fn full_roles(model: &Tiny<CpuAutodiff>) -> Vec<ParamRole> {
        param_entries::<CpuAutodiff, _>(model)
            .into_iter()
            .map(|e| ParamRole::new(e.id, ShardSpec::full(e.name, e.shape)))
            .collect()
    }

    /// The first layer's output columns split in two (this rank holds piece 1), the rest whole.
    fn half_model() -> (Tiny<CpuAutodiff>, Vec<ParamRole>) {
        let device = Default::default();
        let model = Tiny {
            layers: vec![
                LinearConfig::new(3, 1).init(&device),
                LinearConfig::new(2, 2).with_bias(false).init(&device),
            ],
            scale: Param::from_tensor(Tensor::zeros([2], &device)),
        };
        let entries = param_entries::<CpuAutodiff, _>(&model);
        let global_shape = |name: &str| match name {
            "layers.0.weight" => vec![3, 2],
            "layers.0.bias" => vec![2],
            "layers.1.weight" => vec![2, 2],
            _ => vec![2],
        };
        let roles = entries
            .into_iter()
            .map(|e| {
                let mut spec = ShardSpec::full(e.name.clone(), global_shape(&e.name));
                if e.name.starts_with("layers.0.") {
                    let dim = spec.global_shape.len() - 1;
                    spec = spec.with_split(Split::new(dim, 1, 2));
                }
                ParamRole::new(e.id, spec)
            })
            .collect();
        (model, roles)
    }

    fn by_name(tensors: Vec<crate::NamedTensor>) -> HashMap<String, Vec<f32>> {
        tensors.into_iter().map(|t| (t.name, t.values)).collect()
    }

    #[test]
    fn a_module_and_its_moments_load_into_another_layout() {
        let device = Default::default();
        let model = tiny::<CpuAutodiff>(&device);
        let mut optimizer = AdamW::<Cpu>::new(
            AdamWConfig {
                beta1: 0.9,
                beta2: 0.95,
                eps: 1e-8,
                weight_decay: 0.0,
                moment_dtypes: ferrotron_ops::F32_MOMENTS,
                main_grads_dtype: burn::tensor::DType::F32,
                offload_fraction: None,
            },
            HashSet::new(),
        );
        let input = Tensor::<CpuAutodiff, 2>::from_floats([[1.0, -2.0, 0.5]], &device);
        let hidden = model.layers[0].forward(input);
        let loss = (model.layers[1].forward(hidden) * model.scale.val().unsqueeze()).sum();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let model = optimizer.step(model, grads, 0.01, 1.0);

        let ctx = ParallelContext::single();
        let roles = full_roles(&model);
        let params = model_shards::<CpuAutodiff, _>(&model, &roles, &ctx).expect("shards");
        let moments = adamw_shards(&optimizer, &roles, &ctx).expect("moments");
        assert_eq!(params.len(), 4);
        assert_eq!(moments.len(), 8);

        let root = tempfile::tempdir().expect("tempdir");
        let plan = tp2_dp2_plan();
        let shape = ModelShape::of(&plan.recipe.model, plan.padded_vocab_size);
        let info = CheckpointInfo {
            state: ResumeState {
                iteration: 1,
                consumed_samples: 4,
                consumed_tokens: 32,
            },
            plan: &plan,
            recipe: &plan.recipe,
            shape: &shape,
        };
        let store = CheckpointStore::new(root.path(), None);
        let folder = save_sharded(&store, &ctx, &info, &params, &moments).expect("saves");
        assert!(folder.join(MODEL_FILE).is_file() && folder.join(OPTIMIZER_FILE).is_file());

        let checkpoint = ShardedCheckpoint::open(&folder).expect("opens");
        let (half, half_roles) = half_model();
        let half = checkpoint
            .load_module::<CpuAutodiff, _>(half, &half_roles)
            .expect("loads the shards");
        let full = by_name(named_tensors::<CpuAutodiff, _>(&model));
        let loaded = by_name(named_tensors::<CpuAutodiff, _>(&half));
        // weight [3, 2] → column 1 of each row; bias [2] → element 1
        let w = &full["layers.0.weight"];
        assert_eq!(loaded["layers.0.weight"], [w[1], w[3], w[5]]);
        assert_eq!(loaded["layers.0.bias"], [full["layers.0.bias"][1]]);
        assert_eq!(loaded["layers.1.weight"], full["layers.1.weight"]);
        assert_eq!(loaded["scale"], full["scale"]);

        let mut restored = AdamW::<Cpu>::new(
            AdamWConfig {
                beta1: 0.9,
                beta2: 0.95,
                eps: 1e-8,
                weight_decay: 0.0,
                moment_dtypes: ferrotron_ops::F32_MOMENTS,
                main_grads_dtype: burn::tensor::DType::F32,
                offload_fraction: None,
            },
            HashSet::new(),
        );
        checkpoint
            .load_adamw(&mut restored, &half_roles, &device)
            .expect("moments load");
        assert_eq!(restored.step_count(), 1);
        let entries: Vec<crate::ParamEntry> = half_roles
            .iter()
            .map(|r| crate::ParamEntry {
                name: r.shard.global_name.clone(),
                id: r.id,
                shape: r.shard.local_shape().expect("valid"),
            })
            .collect();
        let saved = by_name(optimizer.state_tensors(&param_entries::<CpuAutodiff, _>(&model)));
        let got = by_name(restored.state_tensors(&entries));
        let v = &saved[&format!("layers.0.weight.{EXP_AVG_SQ}")];
        assert_eq!(
            got[&format!("layers.0.weight.{EXP_AVG_SQ}")],
            [v[1], v[3], v[5]]
        );
        assert_eq!(got["scale.exp_avg"], saved["scale.exp_avg"]);
    }

    #[test]
    fn parameters_without_a_role_are_refused() {
        let device = Default::default();
        let model = tiny::<CpuAutodiff>(&device);
        let mut roles = full_roles(&model);
        roles.pop();
        let err = model_shards::<CpuAutodiff, _>(&model, &roles, &ParallelContext::single())
            .expect_err("scale has no role");
        assert!(err.to_string().contains("has no ParamRole"), "{err}");
    }
}

/// Another tp degree pads the vocabulary differently; the rows are re-padded on load as long as
/// the real vocabulary (60 here, padded to 64 when saved) fits.
#[test]
fn another_vocabulary_padding_is_re_padded() {
    let root = tempfile::tempdir().expect("tempdir");
    let plan = tp2_dp2_plan();
    let shape = ModelShape::of(&plan.recipe.model, plan.padded_vocab_size);
    assert_eq!(
        (plan.padded_vocab_size, plan.recipe.model.vocab_size),
        (64, Some(60))
    );
    let values: Vec<f32> = (0..128).map(|i| i as f32).collect();
    let embedding = ShardTensor {
        spec: ShardSpec::full("embedding.weight", vec![64, 2]),
        values: values.clone().into(),
    };
    let info = CheckpointInfo {
        state: ResumeState::fresh(),
        plan: &plan,
        recipe: &plan.recipe,
        shape: &shape,
    };
    let store = CheckpointStore::new(root.path(), None);
    let ctx = ParallelContext::single();
    let folder = save_sharded(&store, &ctx, &info, &[embedding], &[]).expect("saves");
    let checkpoint = ShardedCheckpoint::open(&folder).expect("opens");

    let mut wider = shape.clone();
    wider.padded_vocab_size = 128;
    checkpoint
        .check_compatible(&wider, 7)
        .expect("only the padding differs");
    // tp2 of a 128-row vocabulary: rank 1 holds rows 64..128, all new padding rows, which take
    // the mean of the saved padding rows 60..64 (values 120..128 → columns 123 and 124).
    let spec = ShardSpec::full("embedding.weight", vec![128, 2]).with_split(Split::new(0, 1, 2));
    let shard = checkpoint.shard(&spec).expect("re-padded");
    assert_eq!(shard.len(), 128);
    assert!(
        shard.chunks(2).all(|row| row == [123.0, 124.0]),
        "{shard:?}"
    );
    // fewer rows: the real vocabulary still fits
    let narrow = ShardSpec::full("embedding.weight", vec![60, 2]);
    assert_eq!(checkpoint.shard(&narrow).expect("cut"), values[..120]);
    // the real vocabulary does not fit in 32 rows: another model
    let err = checkpoint
        .shard(&ShardSpec::full("embedding.weight", vec![32, 2]))
        .expect_err("too small");
    assert!(
        err.to_string().ends_with(
            "embedding.weight: global shape [64, 2] in the checkpoint, [32, 2] in the model"
        ),
        "{err}"
    );
    wider.padded_vocab_size = 32;
    assert!(
        checkpoint
            .check_compatible(&wider, 7)
            .expect_err("does not fit")
            .to_string()
            .contains("padded_vocab_size: checkpoint 64, recipe 32")
    );
}

/// With pp2 the last stage holds a copy of the tied embedding: the first stage alone writes it.
#[test]
fn the_tied_embedding_is_written_by_the_first_stage_only() {
    let mut recipe = recipe();
    recipe.parallel =
        serde_json::from_value(serde_json::json!({"pipeline": 2})).expect("parallel section");
    let plan = ferrotron_plan::plan(
        &recipe,
        &PlanOptions {
            cluster: Some(Cluster {
                nodes: 1,
                gpus_per_node: 2,
                gpu: GpuKind::Cpu,
            }),
            vocab_size: 60,
        },
    )
    .expect("pp2 plans");
    let writes = World::new(2)
        .run(|rank| {
            let ctx = ParallelContext::from_groups(rank_groups(&plan, &rank)?, false);
            let mut role = ParamRole::new(
                ParamId::new(),
                ShardSpec::full("embedding.weight", vec![64, 8]),
            );
            role.tied_embedding = true;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(is_primary_replica(&role, &ctx))
        })
        .expect("both ranks answer");
    assert_eq!(writes, [true, false]);
}
