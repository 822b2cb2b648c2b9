//! `recipe plan`: resolve the parallel layout of a recipe on a cluster and print it.
//!
//! The planner does the work; this edge loads the recipe (with spans, so layout errors point at
//! a line), resolves the vocabulary, applies the cluster flags, and chooses the output format.
//! JSON is the stable interface for scripts; human text is for reading.

use std::process::ExitCode;

use ferrotron_plan::{render_explain, render_human};
use ferrotron_recipe::{Cluster, GpuKind, Recipe};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    Human,
    Json,
    Yaml,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Gpu {
    A100,
    H100,
    H200,
    B200,
    Cpu,
}

impl From<Gpu> for GpuKind {
    fn from(gpu: Gpu) -> GpuKind {
        match gpu {
            Gpu::A100 => GpuKind::A100,
            Gpu::H100 => GpuKind::H100,
            Gpu::H200 => GpuKind::H200,
            Gpu::B200 => GpuKind::B200,
            Gpu::Cpu => GpuKind::Cpu,
        }
    }
}

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    pub source: super::resolve::RecipeArgs,
    /// Nodes in the cluster (overrides `cluster.nodes`).
    #[arg(long)]
    pub nodes: Option<u32>,
    /// GPUs (ranks) per node (overrides `cluster.gpus_per_node`).
    #[arg(long)]
    pub gpus_per_node: Option<u32>,
    /// GPU kind (overrides `cluster.gpu`).
    #[arg(long, value_enum)]
    pub gpu: Option<Gpu>,
    #[arg(long, value_enum, default_value = "human")]
    pub format: Format,
    /// Print every memory and time term with its formula (human format).
    #[arg(long)]
    pub explain: bool,
}

/// The recipe's cluster with the command-line flags applied; `None` when neither says anything.
fn cluster(recipe: &Recipe, args: &Args) -> Option<Cluster> {
    if args.nodes.is_none() && args.gpus_per_node.is_none() && args.gpu.is_none() {
        return recipe.cluster.clone();
    }
    let base = recipe.cluster.clone().unwrap_or(Cluster {
        nodes: 1,
        gpus_per_node: 8,
        gpu: GpuKind::H100,
    });
    Some(Cluster {
        nodes: args.nodes.unwrap_or(base.nodes),
        gpus_per_node: args.gpus_per_node.unwrap_or(base.gpus_per_node),
        gpu: args.gpu.map_or(base.gpu, GpuKind::from),
    })
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.nodes == Some(0) || args.gpus_per_node == Some(0) {
        anyhow::bail!("--nodes and --gpus-per-node must be at least 1");
    }
    let loaded = match args.source.load() {
        Ok(loaded) => loaded,
        Err(code) => return Ok(code),
    };
    let recipe = &loaded.recipe;
    let plan = match super::resolve::plan_or_report(
        &loaded,
        cluster(recipe, &args),
        ferrotron_data::tokenizer_vocab_size,
    ) {
        Ok(plan) => plan,
        Err(code) => return Ok(code),
    };
    match args.format {
        Format::Human => {
            print!("{}", render_human(&plan));
            if args.explain {
                print!("{}", render_explain(&plan));
            }
        }
        Format::Json => println!("{}", serde_json::to_string_pretty(&plan)?),
        Format::Yaml => print!("{}", serde_saphyr::to_string(&plan)?),
    }
    Ok(ExitCode::SUCCESS)
}
