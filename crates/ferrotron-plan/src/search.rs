//! `auto`: enumerate every layout the recipe leaves open, keep those the layout rules accept
//! and the GPU's memory holds, and rank them by predicted throughput.
//!
//! The search space is small by construction (tensor degrees within a node, pipeline degrees up
//! to the layer count, a handful of virtual-stage, context and micro-batch choices), and each
//! candidate costs only arithmetic, so even a 16,384-GPU cluster plans in milliseconds.

use ferrotron_recipe::{Cluster, Degree, Recipe, Recompute, RecomputeGranularity, RecomputeMethod};
use serde::{Deserialize, Serialize};

use crate::hardware::GpuSpec;
use crate::layout::{Degrees, Layout, OpenLayout, divisors};
use crate::params::{ParameterCount, parameter_count};
use crate::setup::Setup;
use crate::stages::stages;
use crate::time::Breakdown;
use crate::{memory, rules, time};

/// One ranked layout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    pub degrees: Degrees,
    pub micro_batch_size: u32,
    /// Activation recomputation of this candidate (differs only when the recipe says `auto`).
    pub recompute: RecomputeGranularity,
    pub step_seconds: f64,
    pub tokens_per_second_per_gpu: f64,
    pub mfu: f64,
    pub peak_memory_bytes: u64,
    /// Why it ranks where it does: memory headroom and where its step time goes.
    pub why: String,
}

/// What the `auto` search looked at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AutoReport {
    /// The keys that were `auto`.
    pub resolved: Vec<String>,
    pub searched: u32,
    /// Accepted by every layout rule.
    pub valid: u32,
    /// Valid and within the GPU's memory.
    pub fitting: u32,
    /// The best candidates, best first (the first is the plan).
    pub top: Vec<Candidate>,
}

/// Why the search found nothing.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SearchFailure {
    NoValidLayout {
        searched: u32,
    },
    NothingFits {
        smallest: Box<(Layout, u64)>,
        limit: u64,
    },
}

/// The recomputation settings `granularity` stands for: full recomputation checkpoints every
/// layer (uniform, one layer per chunk), Megatron's usual choice when memory forces it.
pub(crate) fn recompute_settings(base: &Recompute, granularity: RecomputeGranularity) -> Recompute {
    match granularity {
        RecomputeGranularity::Full if base.granularity == RecomputeGranularity::Auto => Recompute {
            granularity,
            method: Some(RecomputeMethod::Uniform),
            num_layers: Some(1),
        },
        _ if base.granularity == RecomputeGranularity::Auto => Recompute {
            granularity,
            method: None,
            num_layers: None,
        },
        _ => base.clone(),
    }
}

/// The recipes the search tries: one per recomputation choice when it is `auto`.
fn recompute_variants(recipe: &Recipe) -> Vec<Recipe> {
    let choices = match recipe.recompute.granularity {
        RecomputeGranularity::Auto => vec![
            RecomputeGranularity::None,
            RecomputeGranularity::Selective,
            RecomputeGranularity::Full,
        ],
        fixed => vec![fixed],
    };
    choices
        .into_iter()
        .map(|granularity| {
            let mut variant = recipe.clone();
            variant.recompute = recompute_settings(&recipe.recompute, granularity);
            variant
        })
        .collect()
}

fn options(degree: Degree, open: impl FnOnce() -> Vec<u32>) -> Vec<u32> {
    match degree.fixed() {
        Some(value) => vec![value],
        None => open(),
    }
}

/// Every layout the recipe allows on `cluster`, before the rules.
fn enumerate(
    recipe: &Recipe,
    original_expert_tensor: Option<Degree>,
    cluster: &Cluster,
) -> Vec<Layout> {
    let world = cluster.world_size();
    let p = &recipe.parallel;
    let model = &recipe.model;
    let fits_world = |d: &u32| world.is_multiple_of(*d);
    let tps = options(p.tensor, || {
        divisors(model.num_attention_heads)
            .into_iter()
            .filter(|t| *t <= cluster.gpus_per_node && fits_world(t))
            .collect()
    });
    let cps = options(p.context, || {
        (0..6)
            .map(|e| 1 << e)
            .filter(|c| fits_world(c) && (*c == 1 || model.seq_length.is_multiple_of(2 * c)))
            .collect()
    });
    let pps = options(p.pipeline, || {
        (1..=(model.num_layers + 2).min(world))
            .filter(fits_world)
            .collect()
    });
    let vpps = options(p.virtual_pipeline, || vec![1, 2, 3, 4, 5, 6, 8]);
    let experts = model.moe.as_ref().map_or(1, |m| m.num_experts);
    let eps = options(p.expert, || {
        divisors(experts).into_iter().filter(fits_world).collect()
    });
    let mut layouts = Vec::new();
    for &tp in &tps {
        let etps = match original_expert_tensor {
            None => vec![tp],
            Some(degree) => options(degree, || {
                divisors(tp.max(1) * cluster.gpus_per_node)
                    .into_iter()
                    .filter(|e| *e <= cluster.gpus_per_node)
                    .collect()
            }),
        };
        for &cp in &cps {
            for &pp in &pps {
                let model_parallel = tp * cp * pp;
                if !world.is_multiple_of(model_parallel) {
                    continue;
                }
                let dp = world / model_parallel;
                if p.data.fixed().is_some_and(|fixed| fixed != dp) {
                    continue;
                }
                let mbss = options(recipe.training.micro_batch_size, || {
                    let per_rank = recipe.training.global_batch_size / dp;
                    (0..5)
                        .map(|e| 1 << e)
                        .filter(|m| per_rank.is_multiple_of(*m) && *m <= per_rank)
                        .collect()
                });
                for &vpp in &vpps {
                    if vpp > 1 && pp <= 2 {
                        continue;
                    }
                    for &ep in &eps {
                        for &etp in &etps {
                            let expert_grid = etp * ep * pp;
                            if !world.is_multiple_of(expert_grid) {
                                continue;
                            }
                            for &micro_batch_size in &mbss {
                                layouts.push(Layout {
                                    degrees: Degrees {
                                        tp,
                                        pp,
                                        vpp,
                                        cp,
                                        ep,
                                        etp,
                                        dp,
                                        edp: world / expert_grid,
                                    },
                                    micro_batch_size,
                                });
                            }
                        }
                    }
                }
            }
        }
    }
    layouts
}

/// The setup the models read for one layout.
pub(crate) fn setup<'a>(
    recipe: &'a Recipe,
    cluster: &'a Cluster,
    layout: Layout,
    params: ParameterCount,
    padded_vocab: u32,
    explain: bool,
) -> Setup<'a> {
    Setup {
        recipe,
        cluster,
        layout,
        spec: GpuSpec::of(cluster.gpu),
        params,
        padded_vocab,
        stages: stages(recipe, &params, layout.degrees.pp, layout.degrees.vpp),
        num_microbatches: layout.num_microbatches(recipe.training.global_batch_size),
        explain,
    }
}

fn why(c: &Candidate, limit: u64, b: &Breakdown) -> String {
    let gib = |x: u64| x as f64 / (1u64 << 30) as f64;
    let share = |x: f64| 100.0 * x / c.step_seconds;
    let mut parts = vec![format!("compute {:.0}%", share(b.compute))];
    for (label, value) in [
        ("memory-bound", b.memory_bound),
        ("TP comm", b.tensor_parallel_comm),
        ("CP comm", b.context_parallel_comm),
        ("EP comm", b.expert_parallel_comm),
        ("PP p2p", b.pipeline_p2p),
        ("bubble", b.pipeline_bubble),
        ("DP comm", b.data_parallel_comm),
        ("optimizer", b.optimizer),
    ] {
        if share(value) >= 0.5 {
            parts.push(format!("{label} {:.0}%", share(value)));
        }
    }
    format!(
        "{:.1} of {:.0} GiB; step {}",
        gib(c.peak_memory_bytes),
        gib(limit),
        parts.join(", ")
    )
}

/// Ranks every valid, fitting layout; the best first.
pub(crate) fn search(
    recipe: &Recipe,
    original_expert_tensor: Option<Degree>,
    cluster: &Cluster,
    padded_vocab_of: impl Fn(u32) -> u32,
    flops_of: impl Fn(u32) -> f64,
) -> Result<(Vec<Candidate>, u32, u32, u32), SearchFailure> {
    let layouts = enumerate(recipe, original_expert_tensor, cluster);
    let variants = recompute_variants(recipe);
    let searched = (layouts.len() * variants.len()) as u32;
    let limit = GpuSpec::of(cluster.gpu).memory_bytes as u64;
    let mut valid = 0;
    let mut smallest: Option<(Layout, u64)> = None;
    let mut ranked = Vec::new();
    for (layout, recipe) in layouts
        .iter()
        .flat_map(|layout| variants.iter().map(move |recipe| (*layout, recipe)))
    {
        let findings = rules::check(recipe, OpenLayout::from_layout(&layout), Some(cluster.gpu));
        if findings.iter().any(|f| f.is_error()) {
            continue;
        }
        valid += 1;
        let padded = padded_vocab_of(layout.degrees.tp);
        let params = parameter_count(&recipe.model, padded);
        let s = setup(recipe, cluster, layout, params, padded, false);
        let peak = memory::peak_bytes(&s);
        if peak > limit {
            if smallest.is_none_or(|(_, best)| peak < best) {
                smallest = Some((layout, peak));
            }
            continue;
        }
        let stage_params = memory::stage_local_parameters(&s);
        let predicted = time::predict(&s, flops_of(padded), &stage_params);
        let mut candidate = Candidate {
            degrees: layout.degrees,
            micro_batch_size: layout.micro_batch_size,
            recompute: recipe.recompute.granularity,
            step_seconds: predicted.step_seconds,
            tokens_per_second_per_gpu: predicted.tokens_per_second_per_gpu,
            mfu: predicted.mfu,
            peak_memory_bytes: peak,
            why: String::new(),
        };
        candidate.why = why(&candidate, limit, &predicted.breakdown);
        ranked.push(candidate);
    }
    if valid == 0 {
        return Err(SearchFailure::NoValidLayout { searched });
    }
    if ranked.is_empty() {
        let smallest = smallest.expect("a valid layout that does not fit was recorded");
        return Err(SearchFailure::NothingFits {
            smallest: Box::new(smallest),
            limit,
        });
    }
    let fitting = ranked.len() as u32;
    ranked.sort_by(|a, b| {
        b.tokens_per_second_per_gpu
            .total_cmp(&a.tokens_per_second_per_gpu)
            .then(a.peak_memory_bytes.cmp(&b.peak_memory_bytes))
    });
    Ok((ranked, searched, valid, fitting))
}
