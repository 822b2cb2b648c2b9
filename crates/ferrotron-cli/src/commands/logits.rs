//! `recipe logits CHECKPOINT --tokens T.json --out L.safetensors`: the model's logits for given
//! token ids, so another implementation (transformers, in `tools/hf-parity.sh`) can be compared
//! with ours on the same batch. Runs the one-rank model on the CPU backend in fp32.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use burn::tensor::{Int, Tensor, TensorData};
use ferrotron_train::checkpoint::write_safetensors;
use ferrotron_train::{CpuBackend, NamedTensor, load_for_inference};

use super::sample::checkpoint_folder;
use crate::exit;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// A checkpoint folder, a checkpoint directory or a run directory (its newest checkpoint).
    pub checkpoint: PathBuf,
    /// A JSON file holding a batch of token id rows of equal length: `[[1, 2, 3], [4, 5, 6]]`.
    #[arg(long)]
    pub tokens: PathBuf,
    /// Where to write the logits: one f32 tensor `logits` of shape [batch, seq, padded vocab].
    #[arg(long)]
    pub out: PathBuf,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let folder = checkpoint_folder(&args.checkpoint)?;
    let text = std::fs::read_to_string(&args.tokens)
        .with_context(|| format!("reading {}", args.tokens.display()))?;
    let rows: Vec<Vec<i64>> = serde_json::from_str(&text)
        .with_context(|| format!("{}: expected [[token ids]]", args.tokens.display()))?;
    let seq = rows.first().map_or(0, Vec::len);
    if seq == 0 || rows.iter().any(|r| r.len() != seq) {
        anyhow::bail!(
            "{}: rows must be non-empty and of equal length",
            args.tokens.display()
        );
    }
    let device = Default::default();
    let (model, _) = load_for_inference::<CpuBackend>(&folder, &device)
        .with_context(|| format!("loading {}", folder.display()))?;
    if seq > model.max_sequence_length() {
        anyhow::bail!(
            "{} tokens per row; the model covers {} positions",
            seq,
            model.max_sequence_length()
        );
    }
    let batch = rows.len();
    let ids: Vec<i64> = rows.into_iter().flatten().collect();
    let tokens =
        Tensor::<CpuBackend, 2, Int>::from_data(TensorData::new(ids, [batch, seq]), &device);
    let logits = model.forward(tokens).logits;
    let tensor = NamedTensor::from_tensor("logits".to_owned(), &logits);
    write_safetensors(&args.out, &[tensor])?;
    Ok(exit::code(exit::SUCCESS))
}
