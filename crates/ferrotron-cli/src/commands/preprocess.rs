//! `recipe preprocess`: Megatron's `tools/preprocess_data.py` with the same flags, so a command
//! line copied from a Megatron guide works here and its outputs load in Megatron.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use ferrotron_data::{
    DataError, PreprocessConfig, Progress, Tokenizer, bin_path, idx_path, preprocess_jsonl,
};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// JSONL input files (one JSON object a line), read in order.
    #[arg(long, required = true, num_args = 1..)]
    input: Vec<PathBuf>,
    /// Outputs are PREFIX_KEY_document.bin/.idx, one pair per JSON key.
    #[arg(long)]
    output_prefix: PathBuf,
    /// JSON keys holding the text.
    #[arg(long, num_args = 1.., default_value = "text")]
    json_keys: Vec<String>,
    /// GPT-2 BPE vocab.json (with --merge-file).
    #[arg(long, requires = "merge_file", conflicts_with = "tokenizer_file")]
    vocab_file: Option<PathBuf>,
    /// GPT-2 BPE merges.txt (with --vocab-file).
    #[arg(long, requires = "vocab_file")]
    merge_file: Option<PathBuf>,
    /// A Hugging Face tokenizer.json.
    #[arg(long)]
    tokenizer_file: Option<PathBuf>,
    /// Accepted for Megatron compatibility; must agree with the tokenizer files given.
    #[arg(long, value_parser = ["GPT2BPETokenizer", "HuggingFaceTokenizer"])]
    tokenizer_type: Option<String>,
    /// Accepted for Megatron compatibility; only `mmap` exists.
    #[arg(long, value_parser = ["mmap"])]
    dataset_impl: Option<String>,
    /// Append the end-of-document token to every document.
    #[arg(long)]
    append_eod: bool,
    /// Tokenizing threads (default: every core).
    #[arg(long, default_value_t = 0)]
    workers: usize,
    /// Leave out lines that are not JSON objects with the keys (and list them) instead of failing.
    #[arg(long)]
    skip_bad_lines: bool,
    /// No progress output.
    #[arg(long, short)]
    quiet: bool,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let tokenizer = load_tokenizer(&args)?;
    let config = PreprocessConfig {
        inputs: args.input,
        output_prefix: args.output_prefix,
        json_keys: args.json_keys,
        append_eod: args.append_eod,
        workers: args.workers,
        skip_bad_lines: args.skip_bad_lines,
        progress: if args.quiet {
            Progress::Hidden
        } else {
            Progress::Auto
        },
    };
    let report = preprocess_jsonl(&config, &tokenizer).map_err(|e| match e {
        DataError::BadLine { .. } => {
            anyhow::anyhow!("{e} (pass --skip-bad-lines to leave such lines out)")
        }
        other => other.into(),
    })?;
    for skipped in &report.skipped {
        eprintln!(
            "skipped {}:{}: {}",
            skipped.path.display(),
            skipped.line,
            skipped.problem
        );
    }
    for output in &report.outputs {
        println!(
            "wrote {} and {}: {} documents, {} tokens",
            bin_path(&output.prefix).display(),
            idx_path(&output.prefix).display(),
            output.documents,
            output.tokens
        );
    }
    let megabytes = report.bytes as f64 / 1e6;
    let seconds = report.seconds.max(1e-9);
    println!(
        "{} documents, {} tokens from {megabytes:.1} MB in {seconds:.2} s ({:.1} MB/s, {:.0} tokens/s)",
        report.documents,
        report.tokens,
        megabytes / seconds,
        report.tokens as f64 / seconds
    );
    if !report.skipped.is_empty() {
        println!(
            "skipped {} bad lines (listed on stderr)",
            report.skipped.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn load_tokenizer(args: &Args) -> anyhow::Result<Tokenizer> {
    let wants_hf = args.tokenizer_type.as_deref() == Some("HuggingFaceTokenizer");
    let wants_gpt2 = args.tokenizer_type.as_deref() == Some("GPT2BPETokenizer");
    match (&args.vocab_file, &args.merge_file, &args.tokenizer_file) {
        (Some(vocab), Some(merges), None) if !wants_hf => {
            Tokenizer::gpt2(vocab, merges).context("loading the GPT-2 tokenizer")
        }
        (None, None, Some(file)) if !wants_gpt2 => {
            Tokenizer::from_tokenizer_json(file).context("loading the tokenizer")
        }
        (None, None, None) => bail!(
            "name a tokenizer: --vocab-file and --merge-file (GPT-2 BPE) or --tokenizer-file (tokenizer.json)"
        ),
        _ => bail!(
            "--tokenizer-type {} does not match the files given (GPT2BPETokenizer takes --vocab-file and --merge-file, HuggingFaceTokenizer takes --tokenizer-file)",
            args.tokenizer_type.as_deref().unwrap_or_default()
        ),
    }
}
