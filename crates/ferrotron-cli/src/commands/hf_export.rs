//! `recipe export CHECKPOINT --format hf --out DIR`: a checkpoint (of any layout) as a
//! transformers model folder. The conversion is `ferrotron-hf`'s; this edge finds the
//! checkpoint folder (a run directory means its newest checkpoint) and reports what was written.

use std::path::PathBuf;
use std::process::ExitCode;

use ferrotron_hf::{DEFAULT_MAX_SHARD_BYTES, ExportOptions, OutDtype};

use super::sample::checkpoint_folder;
use crate::exit;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// Hugging Face transformers (GPT2LMHeadModel, LlamaForCausalLM, MixtralForCausalLM,
    /// MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM,
    /// DeepseekV3ForCausalLM).
    Hf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum DtypeArg {
    Fp32,
    Bf16,
}

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// A checkpoint folder, a checkpoint directory or a run directory (its newest checkpoint).
    pub checkpoint: PathBuf,
    #[arg(long, value_enum)]
    pub format: Format,
    /// The model folder to write (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// Element type of the written weights (the checkpoint's fp32 master weights, or rounded).
    #[arg(long, value_enum, default_value = "fp32")]
    pub dtype: DtypeArg,
    /// Largest safetensors file in bytes before the weights are split over several files.
    #[arg(long, default_value_t = DEFAULT_MAX_SHARD_BYTES)]
    pub max_shard_bytes: u64,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let Format::Hf = args.format;
    let folder = checkpoint_folder(&args.checkpoint)?;
    let options = ExportOptions {
        dtype: match args.dtype {
            DtypeArg::Fp32 => OutDtype::F32,
            DtypeArg::Bf16 => OutDtype::Bf16,
        },
        max_shard_bytes: args.max_shard_bytes,
    };
    match ferrotron_hf::export(&folder, &args.out, options) {
        Ok(exported) => {
            for note in &exported.notes {
                eprintln!("note: {note}");
            }
            eprintln!(
                "exported {} (iteration {}) as {}: {} tensors, {:.1} MB in {} files under {}",
                folder.display(),
                exported.iteration,
                exported.family.class(),
                exported.tensors,
                exported.bytes as f64 / 1e6,
                exported.files.len(),
                args.out.display()
            );
            Ok(exit::code(exit::SUCCESS))
        }
        Err(err) => {
            eprintln!("error: {err}");
            Ok(exit::code(exit::FAILED))
        }
    }
}
