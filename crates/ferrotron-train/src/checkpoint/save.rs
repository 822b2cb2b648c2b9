//! Saving one checkpoint from every rank of a world into one folder, atomically.
//!
//! Each rank writes only its own files (`model-00003-of-00008.safetensors`), so no tensor
//! crosses the network to be saved and the write is as parallel as the file system; rank 0 then
//! reads the files' headers (not their data) to list every shard in the manifest and commits the
//! folder as the one-rank store does. The steps are separated by an agreement — an all-reduce
//! of a failure flag over tp, dp×cp and pp, which together span the world — so a rank that fails
//! to write makes every rank return an error instead of leaving the others waiting, and no rank
//! returns before the folder is committed. The resolved recipe beside the tensors is written as
//! the run directory writes it (`write_recipe`), so both read back the same way.

use std::path::{Path, PathBuf};

use ferrotron_parallel::{ParallelContext, ReduceOp};
use ferrotron_plan::Plan;
use ferrotron_recipe::Recipe;

use super::manifest::{
    CHECKPOINT_FORMAT_VERSION, CheckpointLayout, MODEL_FILE, Manifest, ManifestFiles, ModelShape,
    OPTIMIZER_FILE, RECIPE_FILE, RngInfo, ShardFile, ShardKind,
};
use super::store::CheckpointStore;
use super::tensors::{ShardTensor, read_shard_specs, write_shard_file};
use crate::TrainError;
use crate::run::resume::ResumeState;

/// What a checkpoint records besides the tensors.
#[derive(Debug, Clone, Copy)]
pub struct CheckpointInfo<'a> {
    pub state: ResumeState,
    pub plan: &'a Plan,
    /// The recipe as the runtime uses it (vocabulary filled in, `extends` dropped).
    pub recipe: &'a Recipe,
    pub shape: &'a ModelShape,
}

/// The number of ranks `ctx` spans: the dense grid tp × (dp × cp) × pp is the whole world.
pub fn world_size(ctx: &ParallelContext) -> u32 {
    let ranks = ctx.tp.size() * ctx.dp_cp.size() * ctx.pp.size();
    u32::try_from(ranks).unwrap_or(u32::MAX)
}

/// The file of `kind` that `rank` of `world` writes: Hugging Face's sharded naming, 1-based;
/// a one-rank world keeps the unsharded names.
pub fn shard_file_name(kind: ShardKind, rank: u32, world: u32) -> String {
    let stem = match kind {
        ShardKind::Model => "model",
        ShardKind::Optimizer => "optimizer",
    };
    if world == 1 {
        match kind {
            ShardKind::Model => MODEL_FILE.to_owned(),
            ShardKind::Optimizer => OPTIMIZER_FILE.to_owned(),
        }
    } else {
        format!("{stem}-{:05}-of-{world:05}.safetensors", rank + 1)
    }
}

/// Save a checkpoint at `info.state.iteration`. Collective: every rank of the world calls it
/// with the same iteration, passing the model and optimizer shards it should write (see
/// [`super::is_primary_replica`]; a shard written twice is harmless, only larger). Returns the
/// committed folder on every rank.
pub fn save_sharded(
    store: &CheckpointStore,
    ctx: &ParallelContext,
    info: &CheckpointInfo<'_>,
    model: &[ShardTensor],
    optimizer: &[ShardTensor],
) -> Result<PathBuf, TrainError> {
    let folder = begin_world(store, ctx, info.state.iteration)?;
    let written = write_rank_files(&folder.temp, folder.rank, folder.world, model, optimizer);
    agree(ctx, &folder.temp, written, "write its shards")?;

    let committed = if folder.rank == 0 {
        let info = FinishInfo::of(info);
        finish(store, &folder.temp, folder.world, &info).map(|_| ())
    } else {
        Ok(())
    };
    agree(ctx, &folder.temp, committed, "commit the checkpoint")?;
    Ok(folder.target)
}

/// The folder a world saves into, prepared by rank 0 and agreed by all.
pub(super) struct WorldFolder {
    pub rank: u32,
    pub world: u32,
    /// Where the ranks write, shared by every rank, even across processes.
    pub temp: PathBuf,
    /// What it becomes once committed.
    pub target: PathBuf,
}

/// Rank 0 creates the temporary folder (a leftover of a crash is cleared); every rank learns
/// that it exists before writing into it (collective).
pub(super) fn begin_world(
    store: &CheckpointStore,
    ctx: &ParallelContext,
    iteration: u64,
) -> Result<WorldFolder, TrainError> {
    let rank = ctx.tp.global_rank();
    let world = world_size(ctx);
    let temp = store.temp_folder(iteration, &format!("w{world}"));
    let target = store.dir().join(CheckpointStore::folder_name(iteration));
    let begun = if rank == 0 {
        store.begin(&temp)
    } else {
        Ok(())
    };
    agree(ctx, &temp, begun, "prepare the checkpoint folder")?;
    Ok(WorldFolder {
        rank,
        world,
        temp,
        target,
    })
}

/// What rank 0 records besides the shard files, owned so that a writer thread can hold it.
#[derive(Debug, Clone)]
pub(super) struct FinishInfo {
    state: ResumeState,
    plan: Plan,
    recipe: Recipe,
    shape: ModelShape,
}

impl FinishInfo {
    pub(super) fn of(info: &CheckpointInfo<'_>) -> Self {
        FinishInfo {
            state: info.state,
            plan: info.plan.clone(),
            recipe: info.recipe.clone(),
            shape: info.shape.clone(),
        }
    }
}

/// This rank's model and optimizer files (none when it has nothing to write), fsynced.
pub(super) fn write_rank_files(
    temp: &Path,
    rank: u32,
    world: u32,
    model: &[ShardTensor],
    optimizer: &[ShardTensor],
) -> Result<(), TrainError> {
    for (kind, shards) in [(ShardKind::Model, model), (ShardKind::Optimizer, optimizer)] {
        if shards.is_empty() {
            continue;
        }
        let path = temp.join(shard_file_name(kind, rank, world));
        write_shard_file(&path, shards)?;
        super::store::sync_path(&path)?;
    }
    Ok(())
}

/// Rank 0, once every rank has written: list the shard files, write the manifest, plan and
/// recipe, commit.
pub(super) fn finish(
    store: &CheckpointStore,
    temp: &Path,
    world: u32,
    info: &FinishInfo,
) -> Result<PathBuf, TrainError> {
    let mut shards = Vec::new();
    for rank in 0..world {
        for kind in [ShardKind::Model, ShardKind::Optimizer] {
            let file = shard_file_name(kind, rank, world);
            let path = temp.join(&file);
            if !path.is_file() {
                continue;
            }
            let bytes = std::fs::metadata(&path)
                .map_err(|e| TrainError::io("stat", &path, e))?
                .len();
            shards.push(ShardFile {
                file,
                kind,
                rank,
                bytes,
                blake3: Some(super::load::file_hash(&path)?),
                tensors: read_shard_specs(&path)?,
            });
        }
    }
    let recipe = &info.recipe;
    let manifest = Manifest {
        format_version: CHECKPOINT_FORMAT_VERSION,
        iteration: info.state.iteration,
        consumed_samples: info.state.consumed_samples,
        consumed_tokens: info.state.consumed_tokens,
        rng: RngInfo::per_iteration(recipe.training.seed),
        recipe_name: recipe.name.clone(),
        // the plan's recipe, as the run manifest hashes it: one identity for one run
        recipe_hash: info.plan.recipe.content_hash(),
        plan_hash: info.plan.plan_hash.clone(),
        shape: info.shape.clone(),
        model: recipe.model.clone(),
        tokenizer: absolute_tokenizer(&recipe.data.tokenizer),
        files: ManifestFiles::default(),
        layout: CheckpointLayout::of(&info.plan),
        shards,
    };
    info.plan
        .write_to(temp)
        .map_err(|e| TrainError::checkpoint(temp, format!("cannot write plan.json: {e}")))?;
    write_recipe(temp, recipe)?;
    manifest.write(temp)?;
    store.commit(info.state.iteration, temp)
}

/// The resolved recipe as YAML (`recipe validate` reads it back), in a checkpoint and in the run
/// directory.
pub(crate) fn write_recipe(dir: &Path, recipe: &Recipe) -> Result<(), TrainError> {
    let path = dir.join(RECIPE_FILE);
    std::fs::create_dir_all(dir).map_err(|e| TrainError::io("create", dir, e))?;
    let text = serde_saphyr::to_string(recipe)
        .map_err(|e| TrainError::Config(format!("cannot write the recipe as YAML: {e}")))?;
    std::fs::write(&path, text).map_err(|e| TrainError::io("write", &path, e))
}

/// The tokenizer with absolute paths, so a checkpoint samples from any working directory.
fn absolute_tokenizer(tokenizer: &ferrotron_recipe::Tokenizer) -> ferrotron_recipe::Tokenizer {
    let absolute = |path: &Option<String>| {
        path.as_ref().map(|p| {
            std::fs::canonicalize(p)
                .map(|c| c.display().to_string())
                .unwrap_or_else(|_| p.clone())
        })
    };
    ferrotron_recipe::Tokenizer {
        kind: tokenizer.kind,
        vocab_file: absolute(&tokenizer.vocab_file),
        merge_file: absolute(&tokenizer.merge_file),
        file: absolute(&tokenizer.file),
    }
}

/// Every rank learns whether every rank succeeded at `step`. This rank's own error comes back
/// as is; a rank that succeeded while another failed gets an error saying so.
pub(super) fn agree(
    ctx: &ParallelContext,
    temp: &Path,
    outcome: Result<(), TrainError>,
    step: &str,
) -> Result<(), TrainError> {
    let mut failed = [if outcome.is_err() { 1.0f32 } else { 0.0 }];
    for group in [&ctx.tp, &ctx.dp_cp, &ctx.pp] {
        group
            .all_reduce_f32(&mut failed, ReduceOp::Max)
            .map_err(|e| {
                TrainError::checkpoint(temp, format!("ranks could not agree to {step}: {e}"))
            })?;
    }
    outcome?;
    if failed[0] > 0.0 {
        return Err(TrainError::checkpoint(
            temp,
            format!(
                "another rank failed to {step} (its error is in its log); nothing was committed"
            ),
        ));
    }
    Ok(())
}
