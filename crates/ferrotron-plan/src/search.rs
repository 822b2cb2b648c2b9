//! `auto`: enumerate every layout the recipe leaves open, keep those the layout rules accept
//! and the GPU's memory holds, and rank them by predicted throughput.
//!
//! The search space is small by construction (tensor degrees within a node, pipeline degrees up
//! to the layer count, a handful of virtual-stage, context and micro-batch choices), and each
//! candidate costs only arithmetic, so even a 16,384-GPU cluster plans in milliseconds.

use ferrotron_recipe::{
    Cluster, Degree, Recipe, Recompute, RecomputeGranularity, RecomputeMethod, RecomputeModule,
};
use serde::{Deserialize, Serialize};

use crate::hardware::{GPU_HOST, GpuSpec};
use crate::layout::{Degrees, Layout, OpenLayout, divisors};
use crate::offload::HostMemory;
use crate::params::{ParameterCount, parameter_count};
use crate::setup::Setup;
use crate::stages::stages;
use crate::time::Breakdown;
use crate::{memory, offload, rules, time};

/// One ranked layout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    pub degrees: Degrees,
    pub micro_batch_size: u32,
    /// Activation recomputation of this candidate (differs only when the recipe says `auto`).
    pub recompute: Recompute,
    pub step_seconds: f64,
    pub tokens_per_second_per_gpu: f64,
    pub mfu: f64,
    pub peak_memory_bytes: u64,
    /// The optimizer CPU offload fraction the search turned on for this candidate: only when
    /// the recipe asks for `auto`, has the precision-aware optimizer, and no layout fits the
    /// GPU without the offload (then the smallest fraction, in steps of 0.05, that fits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer_offload_fraction: Option<f64>,
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

/// A valid layout over a memory limit: bytes needed against bytes available.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Shortfall {
    pub layout: Layout,
    pub needed: u64,
    pub limit: u64,
}

impl Shortfall {
    /// Keeps the smaller need of `kept` and `self`.
    fn keep_smallest(self, kept: &mut Option<Shortfall>) {
        if kept.is_none_or(|k| self.needed < k.needed) {
            *kept = Some(self);
        }
    }
}

/// Why the search found nothing.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SearchFailure {
    NoValidLayout {
        searched: u32,
    },
    /// At least one of the two is set: the layout closest to the GPU's memory, and, where some
    /// layout fits the GPU with the optimizer offload, the one closest to its node's host memory.
    NothingFits {
        device: Option<Box<Shortfall>>,
        host: Option<Box<Shortfall>>,
    },
}

/// The settings `auto` tries for every layout: none, selective (the attention core, then also
/// every dense layer's MLP block: Megatron's `--recompute-modules core_attn mlp`), and full
/// recomputation of every layer (uniform, one layer per chunk, Megatron's usual choice when
/// memory forces it). Between
/// selective and full, [`fewest_block_layers`] adds Megatron's block method with the fewest
/// recomputed layers that fit.
fn recompute_variants(recipe: &Recipe) -> Vec<Recipe> {
    let choices = match recipe.recompute.granularity {
        RecomputeGranularity::Auto => {
            let selective = |modules| Recompute {
                granularity: RecomputeGranularity::Selective,
                modules,
                ..Recompute::default()
            };
            let mut choices = vec![Recompute::default(), selective(Vec::new())];
            // Without a dense layer the MLP blocks' variant would be plain selective again.
            if recipe.model.num_moe_layers() < recipe.model.num_layers {
                choices.push(selective(vec![
                    RecomputeModule::CoreAttn,
                    RecomputeModule::Mlp,
                ]));
            }
            choices.push(full_recompute(RecomputeMethod::Uniform, 1));
            choices
        }
        _ => vec![recipe.recompute.clone()],
    };
    choices
        .into_iter()
        .map(|recompute| Recipe {
            recompute,
            ..recipe.clone()
        })
        .collect()
}

/// Megatron's full recomputation by `method` of `num_layers` layers.
fn full_recompute(method: RecomputeMethod, num_layers: u32) -> Recompute {
    Recompute {
        granularity: RecomputeGranularity::Full,
        method: Some(method),
        num_layers: Some(num_layers),
        modules: Vec::new(),
    }
}

/// Under `auto`, Megatron's block method (the first `n` layers of every chunk recomputed, the
/// rest kept) with the smallest `n` whose peak fits `limit`, when some `n` short of every layer
/// does: the fastest partial recomputation of this layout. A long sequence is where it pays:
/// the LLaMA-style 1B at 128k tokens needs most of its layers recomputed on an 80 GB GPU, not
/// all. Memory falls as `n` grows (a recomputed layer keeps only its input), so a bisection
/// finds it; the variants it tried are added to `tried`.
fn fewest_block_layers(
    recipe: &Recipe,
    cluster: &Cluster,
    layout: Layout,
    limit: u64,
    padded: u32,
    tried: &mut u32,
) -> Option<Recipe> {
    let params = parameter_count(&recipe.model, padded);
    let block = |n| Recipe {
        recompute: full_recompute(RecomputeMethod::Block, n),
        ..recipe.clone()
    };
    let vpp = layout.degrees.vpp.max(1);
    let chunk_layers = stages(recipe, &params, layout.degrees.pp, vpp)
        .iter()
        .map(|stage| stage.num_layers.div_ceil(vpp))
        .max()?;
    let mut fits = |n| {
        *tried += 1;
        let variant = block(n);
        let s = setup(&variant, cluster, layout, params, padded, false);
        memory::peak_bytes(&s) <= limit
    };
    if chunk_layers < 2 || !fits(chunk_layers - 1) {
        return None;
    }
    let (mut low, mut high) = (1, chunk_layers - 1);
    while low < high {
        let mid = (low + high) / 2;
        if fits(mid) {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    Some(block(low))
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
        host: GPU_HOST,
        offload_fraction: offload::fraction(recipe, cluster),
        params,
        padded_vocab,
        stages: stages(recipe, &params, layout.degrees.pp, layout.degrees.vpp),
        num_microbatches: layout.num_microbatches(recipe.training.global_batch_size),
        explain,
    }
}

fn why(c: &Candidate, limit: u64, b: &Breakdown, host: Option<&HostMemory>) -> String {
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
        ("offload", b.optimizer_offload),
    ] {
        if share(value) >= 0.5 {
            parts.push(format!("{label} {:.0}%", share(value)));
        }
    }
    let host = host.map_or(String::new(), |h| {
        format!(
            ", optimizer offload {} with {:.1} of {:.0} GiB of host memory per node",
            h.offload_fraction,
            gib(h.total),
            gib(h.limit_bytes)
        )
    });
    format!(
        "{:.1} of {:.0} GiB{host}; step {}",
        gib(c.peak_memory_bytes),
        gib(limit),
        parts.join(", ")
    )
}

/// The candidate of a layout whose device peak fits, or the host's shortfall when its
/// optimizer offload (the recipe's or the search's `chosen_offload`) overfills the node's host.
fn candidate(
    s: &Setup<'_>,
    peak: u64,
    limit: u64,
    chosen_offload: Option<f64>,
    flops: f64,
) -> Result<Candidate, Shortfall> {
    let host = offload::watches_host(s)
        .then(|| offload::host_memory(s, &memory::stage_optimizer_parameters(s)).0);
    if let Some(host) = host.as_ref().filter(|h| !h.fits) {
        return Err(Shortfall {
            layout: s.layout,
            needed: host.total,
            limit: host.limit_bytes,
        });
    }
    let stage_params = memory::stage_local_parameters(s);
    let predicted = time::predict(s, flops, &stage_params);
    let mut candidate = Candidate {
        degrees: s.layout.degrees,
        micro_batch_size: s.layout.micro_batch_size,
        recompute: s.recipe.recompute.clone(),
        step_seconds: predicted.step_seconds,
        tokens_per_second_per_gpu: predicted.tokens_per_second_per_gpu,
        mfu: predicted.mfu,
        peak_memory_bytes: peak,
        optimizer_offload_fraction: chosen_offload,
        why: String::new(),
    };
    candidate.why = why(&candidate, limit, &predicted.breakdown, host.as_ref());
    Ok(candidate)
}

/// Ranks every valid, fitting layout; the best first.
///
/// With `may_offload` (the recipe asks for `auto` and has the precision-aware optimizer, but
/// not the offload), a layout over the GPU's memory is also tried with the smallest optimizer
/// offload fraction that fits it; those candidates are ranked only when no layout fits without
/// the offload, whose transfers and host AdamW cost time a fitting layout does not pay.
pub(crate) fn search(
    recipe: &Recipe,
    original_expert_tensor: Option<Degree>,
    cluster: &Cluster,
    may_offload: bool,
    padded_vocab_of: impl Fn(u32) -> u32,
    flops_of: impl Fn(u32) -> f64,
) -> Result<(Vec<Candidate>, u32, u32, u32), SearchFailure> {
    let layouts = enumerate(recipe, original_expert_tensor, cluster);
    let variants = recompute_variants(recipe);
    let mut searched = (layouts.len() * variants.len()) as u32;
    let limit = GpuSpec::of(cluster.gpu).memory_bytes as u64;
    let mut valid = 0;
    let mut device_short = None;
    let mut host_short = None;
    let mut ranked = Vec::new();
    let mut offloaded = Vec::new();
    let mut consider = |layout: Layout, recipe: &Recipe| {
        let findings = rules::check(recipe, OpenLayout::from_layout(&layout), Some(cluster.gpu));
        if findings.iter().any(|f| f.is_error()) {
            return;
        }
        valid += 1;
        let padded = padded_vocab_of(layout.degrees.tp);
        let params = parameter_count(&recipe.model, padded);
        let s = setup(recipe, cluster, layout, params, padded, false);
        let peak = memory::peak_bytes(&s);
        if peak <= limit {
            match candidate(&s, peak, limit, None, flops_of(padded)) {
                Ok(candidate) => ranked.push(candidate),
                Err(short) => short.keep_smallest(&mut host_short),
            }
            return;
        }
        Shortfall {
            layout,
            needed: peak,
            limit,
        }
        .keep_smallest(&mut device_short);
        let Some(fraction) = may_offload
            .then(|| memory::offload_to_fit(&s, limit))
            .flatten()
        else {
            return;
        };
        let s = Setup {
            offload_fraction: fraction,
            ..s
        };
        let peak = memory::peak_bytes(&s);
        if peak > limit {
            return;
        }
        match candidate(&s, peak, limit, Some(fraction), flops_of(padded)) {
            Ok(candidate) => offloaded.push(candidate),
            Err(short) => short.keep_smallest(&mut host_short),
        }
    };
    for &layout in &layouts {
        for variant in &variants {
            consider(layout, variant);
        }
        if recipe.recompute.granularity == RecomputeGranularity::Auto {
            let padded = padded_vocab_of(layout.degrees.tp);
            if let Some(block) =
                fewest_block_layers(recipe, cluster, layout, limit, padded, &mut searched)
            {
                consider(layout, &block);
            }
        }
    }
    if valid == 0 {
        return Err(SearchFailure::NoValidLayout { searched });
    }
    if ranked.is_empty() {
        ranked = offloaded;
    }
    if ranked.is_empty() {
        return Err(SearchFailure::NothingFits {
            device: device_short.map(Box::new),
            host: host_short.map(Box::new),
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
