//! Starting from Hugging Face weights: `recipe import HF_DIR --out DIR [--recipe R]` and the
//! `checkpoint.init_from: {hf: DIR}` step of `recipe run`. Both check the recipe's model
//! section against `config.json` (every difference at its recipe line, as `recipe validate`
//! reports) and write the weights as the iteration-0 checkpoint of a checkpoint directory,
//! which `recipe run` resumes from like any checkpoint (re-padding the vocabulary for its
//! tensor parallelism). Without `--recipe` the model section is the one config.json describes.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use ferrotron_hf::HfModel;
use ferrotron_plan::{Plan, PlanOptions};
use ferrotron_recipe::{Finding, LoadedRecipe, Recipe};
use ferrotron_train::checkpoint::CheckpointStore;
use serde_json::json;

use super::resolve;
use crate::exit;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// A transformers model folder: config.json and model.safetensors (or an index and shards).
    pub hf_dir: PathBuf,
    /// The checkpoint directory to write the iteration-0 checkpoint into.
    #[arg(long)]
    pub out: PathBuf,
    /// Check the model against this recipe's model section and record its seed and plan, so
    /// that `checkpoint.resume` can name the result.
    #[arg(long)]
    pub recipe: Option<PathBuf>,
    /// Override a recipe value (with --recipe).
    #[arg(long = "set", value_name = "KEY=VALUE", requires = "recipe")]
    pub overrides: Vec<String>,
    /// Ignore `FERROTRON_*` environment overrides of the recipe.
    #[arg(long, requires = "recipe")]
    pub no_env: bool,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let hf = HfModel::open(&args.hf_dir)?;
    let plan = match &args.recipe {
        Some(path) => {
            let loaded = match resolve::load(path, &args.overrides, !args.no_env) {
                Ok(loaded) => loaded,
                Err(code) => return Ok(code),
            };
            let vocab = resolve::vocab_size(&loaded.recipe)?;
            if let Err(code) = report(&loaded, hf.check(&loaded.recipe.model, vocab)) {
                return Ok(code);
            }
            match resolve::plan_or_report(&loaded, None, ferrotron_data::tokenizer_vocab_size) {
                Ok(plan) => plan,
                Err(code) => return Ok(code),
            }
        }
        None => {
            let recipe = recipe_of(&hf)?;
            let findings = hf.check(&recipe.model, hf.config.vocab);
            if let Err(code) = report_unlocated(&findings) {
                return Ok(code);
            }
            let options = PlanOptions {
                cluster: None,
                vocab_size: hf.config.vocab,
            };
            ferrotron_plan::plan(&recipe, &options).map_err(|findings| {
                anyhow::anyhow!("the model of config.json does not plan: {findings:?}")
            })?
        }
    };
    let folder = hf.import(&plan, &CheckpointStore::new(&args.out, None))?;
    eprintln!(
        "imported {} ({}) as {}",
        args.hf_dir.display(),
        hf.config.family.class(),
        folder.display()
    );
    Ok(exit::code(exit::SUCCESS))
}

/// `checkpoint.init_from` for `recipe run`: when the checkpoint directory holds no checkpoint
/// yet, import the weights as its iteration 0 (the lead rank; the others wait for the commit).
/// `Err` carries the exit code after the diagnostics are printed.
pub(crate) fn init_from(
    loaded: &LoadedRecipe,
    plan: &Plan,
    lead: bool,
) -> anyhow::Result<Result<(), ExitCode>> {
    let recipe = &plan.recipe;
    let (Some(init), Some(dir)) = (&recipe.checkpoint.init_from, &recipe.checkpoint.dir) else {
        return Ok(Ok(()));
    };
    let store = CheckpointStore::new(dir, recipe.checkpoint.keep_last);
    if store.latest()?.is_some() {
        return Ok(Ok(()));
    }
    if !lead {
        wait_for_commit(&store)?;
        return Ok(Ok(()));
    }
    let hf = HfModel::open(Path::new(&init.hf))
        .with_context(|| format!("checkpoint.init_from.hf {}", init.hf))?;
    if let Err(code) = report(loaded, hf.check(&recipe.model, plan.vocab_size)) {
        return Ok(Err(code));
    }
    let folder = hf.import(plan, &store)?;
    eprintln!(
        "initialised from {} ({}): {}",
        init.hf,
        hf.config.family.class(),
        folder.display()
    );
    Ok(Ok(()))
}

/// Located diagnostics for `findings`; `Err` with the invalid-recipe code when one is an error.
fn report(loaded: &LoadedRecipe, findings: Vec<Finding>) -> Result<(), ExitCode> {
    match loaded.check(findings) {
        Ok(warnings) => {
            for problem in loaded.problems_for(&warnings) {
                eprintln!("{:?}", miette::Report::new(problem));
            }
            Ok(())
        }
        Err(errors) => {
            eprintln!("{:?}", miette::Report::new(errors));
            Err(exit::code(exit::FAILED))
        }
    }
}

/// Problems of config.json itself, with no recipe to point into.
fn report_unlocated(findings: &[Finding]) -> Result<(), ExitCode> {
    for finding in findings {
        let level = if finding.is_error() {
            "error"
        } else {
            "warning"
        };
        eprintln!("{level}[{}]: {}", finding.code, finding.message);
    }
    if findings.iter().any(Finding::is_error) {
        Err(exit::code(exit::FAILED))
    } else {
        Ok(())
    }
}

/// The recipe a model folder implies: its model section and tokenizer, one nominal step.
fn recipe_of(hf: &HfModel) -> anyhow::Result<Recipe> {
    let dir = std::path::absolute(hf.dir())?;
    let tokenizer = if dir.join("tokenizer.json").is_file() {
        json!({"type": "hf", "file": dir.join("tokenizer.json")})
    } else if dir.join("vocab.json").is_file() && dir.join("merges.txt").is_file() {
        json!({"type": "gpt2-bpe", "vocab_file": dir.join("vocab.json"),
               "merge_file": dir.join("merges.txt")})
    } else {
        json!({})
    };
    let name = dir
        .file_name()
        .map_or_else(|| "hf".to_owned(), |n| n.to_string_lossy().into_owned());
    let recipe = json!({
        "version": 2, "name": name, "model": hf.config.model,
        "training": {"micro_batch_size": 1, "global_batch_size": 1, "train_iters": 1},
        "data": {"tokenizer": tokenizer},
        "runtime": {"backend": "cpu"}
    });
    serde_json::from_value(recipe).context("the model of config.json as a recipe")
}

/// A non-lead rank of a process world: the lead imports; continue once it has committed.
fn wait_for_commit(store: &CheckpointStore) -> anyhow::Result<()> {
    const PATIENCE: Duration = Duration::from_secs(1800);
    let started = std::time::Instant::now();
    while store.latest()?.is_none() {
        if started.elapsed() > PATIENCE {
            anyhow::bail!(
                "rank 0 did not commit the checkpoint.init_from import into {} within {} s",
                store.dir().display(),
                PATIENCE.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Ok(())
}
