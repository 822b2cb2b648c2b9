//! `recipe sample`: generate text from a checkpoint. The checkpoint folder carries everything
//! needed (manifest with the model shape and tokenizer, the tensors), so no recipe is read.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use ferrotron_data::Tokenizer;
use ferrotron_train::checkpoint::{CheckpointStore, is_committed};
use ferrotron_train::{CpuBackend, load_for_inference};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// A checkpoint folder (`.../iter_0000300`), a checkpoint directory or a run directory (its
    /// newest checkpoint).
    pub checkpoint: PathBuf,
    /// The text to continue.
    #[arg(long)]
    pub prompt: String,
    /// Tokens to generate.
    #[arg(long, default_value_t = 100)]
    pub max_tokens: usize,
    /// Softmax temperature; 0 decodes greedily.
    #[arg(long, default_value_t = 0.8, value_parser = temperature)]
    pub temperature: f32,
    /// Sample only among the K most likely tokens.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Random seed (same seed, same text).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// A finite temperature of 0 or more: `nan` or `inf` would make every probability NaN, and
/// sampling from NaN picks an arbitrary token without a word.
fn temperature(text: &str) -> Result<f32, String> {
    let value: f32 = text.parse().map_err(|e| format!("{e}"))?;
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(format!("{text} is not a finite number of 0 or more"))
    }
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let folder = checkpoint_folder(&args.checkpoint)?;
    let device = Default::default();
    let (model, manifest) = load_for_inference::<CpuBackend>(&folder, &device)
        .with_context(|| format!("loading {}", folder.display()))?;
    let tokenizer = Tokenizer::from_recipe(&manifest.tokenizer)
        .context("loading the tokenizer the checkpoint names")?;
    let prompt = tokenizer.encode(&args.prompt)?;
    if prompt.is_empty() {
        anyhow::bail!("the prompt encodes to no tokens; give some text with --prompt");
    }
    let generated = ferrotron_model::generate(
        &model,
        &prompt,
        args.max_tokens,
        args.temperature,
        args.top_k,
        args.seed,
        manifest.model.seq_length as usize,
    );
    let text = tokenizer.decode(&generated)?;
    eprintln!(
        "checkpoint {} (iteration {}), {} new tokens",
        folder.display(),
        manifest.iteration,
        generated.len()
    );
    println!("{}{}", args.prompt, text);
    Ok(ExitCode::SUCCESS)
}

/// The folder itself when committed, else the newest committed checkpoint inside it, else inside
/// its `checkpoints/` (a run directory, as `recipe run` lays them out).
pub(crate) fn checkpoint_folder(path: &Path) -> anyhow::Result<PathBuf> {
    if is_committed(path) {
        return Ok(path.to_path_buf());
    }
    for dir in [path.to_path_buf(), path.join("checkpoints")] {
        if let Some(latest) = CheckpointStore::new(&dir, None).latest()? {
            return Ok(latest.path);
        }
    }
    anyhow::bail!(
        "{} is neither a committed checkpoint nor a directory (or run directory) holding one",
        path.display()
    )
}
