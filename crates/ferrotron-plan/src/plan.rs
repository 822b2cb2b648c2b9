//! The [`Plan`]: everything the runtime needs to start a run and everything a user should read
//! before asking for GPUs, in one serializable value with a stable hash.

use std::path::{Path, PathBuf};

use ferrotron_recipe::{Cluster, Degree, Finding, GpuKind, Recipe, RecomputeGranularity};
use serde::{Deserialize, Serialize};

use crate::flops::flops_per_iteration;
use crate::hardware::{GpuSpec, gpu_name};
use crate::layout::{Degrees, Layout};
use crate::memory::{Memory, memory, stage_local_parameters};
use crate::offload;
use crate::params::{ParameterCount, parameter_count};
use crate::ranks::{ProcessGroups, RankGroups, RankInfo, rank_grid};
use crate::search::{AutoReport, SearchFailure, Shortfall, search, setup};
use crate::setup::Setup;
use crate::stages::StageInfo;
use crate::time::{Predicted, predict};

/// What the planner needs besides the recipe.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanOptions {
    /// Overrides `recipe.cluster`; when both are absent the plan is for one `cpu` rank.
    pub cluster: Option<Cluster>,
    /// Vocabulary size before padding (the caller resolves it from the recipe or tokenizer).
    pub vocab_size: u32,
}

/// The GPU the plan assumes, and the numbers taken from it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hardware {
    pub gpu: GpuKind,
    /// Dense peak FLOP/s per GPU in the recipe's 16- or 32-bit dtype, fp8 recipes included
    /// (the MFU denominator, [`GpuSpec::mfu_peak`]).
    pub peak_flops: f64,
    pub memory_bytes: u64,
    /// Where the hardware figures come from (datasheet, measurement, or nominal).
    pub source: String,
}

/// A resolved parallel layout with its cost model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The recipe with derived defaults filled, every `auto` fixed, the vocabulary and cluster set.
    pub recipe: Recipe,
    pub world_size: u32,
    pub cluster: Cluster,
    pub hardware: Hardware,
    pub degrees: Degrees,
    pub micro_batch_size: u32,
    pub global_batch_size: u32,
    /// Microbatches per data-parallel rank and iteration.
    pub num_microbatches: u32,
    pub padded_vocab_size: u32,
    pub vocab_size: u32,
    pub train_iters: u64,
    pub parameters: ParameterCount,
    /// Megatron's model FLOPs per iteration (global batch).
    pub flops_per_iteration: f64,
    pub memory: Memory,
    pub predicted: Predicted,
    /// Layers and chunks of every pipeline stage.
    pub stages: Vec<StageInfo>,
    /// Every rank: coordinates and indices into `groups`.
    pub ranks: Vec<RankInfo>,
    pub groups: ProcessGroups,
    /// Present when some degree was `auto`: what was searched and why the winner won.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto: Option<AutoReport>,
    /// Notes a user should read (e.g. the layout does not fit in memory).
    pub warnings: Vec<String>,
    /// blake3 of this plan serialized without the hash.
    pub plan_hash: String,
}

/// Failure to write `plan.json`.
#[derive(Debug, thiserror::Error)]
pub enum PlanWriteError {
    #[error("cannot create {dir}")]
    CreateDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot serialize the plan")]
    Serialize(#[from] serde_json::Error),
}

impl Plan {
    /// The process groups of `rank`, resolved to rank lists.
    pub fn groups_of(&self, rank: u32) -> Option<RankGroups<'_>> {
        self.ranks
            .get(rank as usize)
            .map(|info| self.groups.of(info))
    }

    /// Writes `plan.json` into `dir` (atomically: a temporary file renamed into place).
    pub fn write_to(&self, dir: &Path) -> Result<PathBuf, PlanWriteError> {
        std::fs::create_dir_all(dir).map_err(|source| PlanWriteError::CreateDir {
            dir: dir.to_owned(),
            source,
        })?;
        let path = dir.join("plan.json");
        let temporary = dir.join(".plan.json.tmp");
        let mut json = serde_json::to_vec_pretty(self)?;
        json.push(b'\n');
        let io = |source| PlanWriteError::Write {
            path: path.clone(),
            source,
        };
        std::fs::write(&temporary, json).map_err(io)?;
        std::fs::rename(&temporary, &path).map_err(io)?;
        Ok(path)
    }

    /// Reads a `plan.json` written by [`Plan::write_to`].
    pub fn read_from(path: &Path) -> Result<Plan, PlanWriteError> {
        let text = std::fs::read(path).map_err(|source| PlanWriteError::Write {
            path: path.to_owned(),
            source,
        })?;
        Ok(serde_json::from_slice(&text)?)
    }

    fn compute_hash(&self) -> String {
        let mut unhashed = self.clone();
        unhashed.plan_hash = String::new();
        let bytes = serde_json::to_vec(&unhashed).expect("a plan always serializes");
        blake3::hash(&bytes).to_hex().to_string()
    }
}

/// The cluster a plan is for: the option's, the recipe's, or one `cpu` rank.
pub fn effective_cluster(recipe: &Recipe, opts: &PlanOptions) -> Cluster {
    opts.cluster
        .clone()
        .or_else(|| recipe.cluster.clone())
        .unwrap_or(Cluster {
            nodes: 1,
            gpus_per_node: 1,
            gpu: GpuKind::Cpu,
        })
}

/// The degrees the search chooses (`data` is not one: it follows from the others).
fn auto_keys(recipe: &Recipe) -> Vec<String> {
    let p = &recipe.parallel;
    let mut keys: Vec<String> = [
        ("parallel.tensor", p.tensor),
        ("parallel.pipeline", p.pipeline),
        ("parallel.virtual_pipeline", p.virtual_pipeline),
        ("parallel.context", p.context),
        ("parallel.expert", p.expert),
        (
            "training.micro_batch_size",
            recipe.training.micro_batch_size,
        ),
    ]
    .into_iter()
    .filter(|(_, degree)| degree.is_auto())
    .map(|(key, _)| key.to_owned())
    .collect();
    if p.expert_tensor.is_some_and(Degree::is_auto) {
        keys.push("parallel.expert_tensor".to_owned());
    }
    if recipe.recompute.granularity == RecomputeGranularity::Auto {
        keys.push("recompute.granularity".to_owned());
    }
    keys
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// Resolves `recipe` on the cluster into a [`Plan`], or the layout findings that prevent it.
pub fn plan(recipe: &Recipe, opts: &PlanOptions) -> Result<Plan, Vec<Finding>> {
    let cluster = effective_cluster(recipe, opts);
    let findings = crate::check_layout(recipe, Some(&cluster));
    if findings.iter().any(Finding::is_error) {
        return Err(findings);
    }
    let mut warnings: Vec<String> = findings
        .iter()
        .map(|f| format!("{}: {}", f.path, f.message))
        .collect();
    let out_of_bounds = crate::bounds::check(recipe, None, Some(opts.vocab_size));
    if !out_of_bounds.is_empty() {
        return Err(out_of_bounds);
    }
    if opts.vocab_size == 0 {
        return Err(vec![Finding::error(
            "plan::vocab-size",
            "model.vocab_size",
            "the vocabulary size is 0",
        )]);
    }
    let resolved = recipe.with_derived_defaults();
    let seq = resolved.model.seq_length;
    let Some(train_iters) = resolved.training.iterations(seq) else {
        return Err(vec![
            Finding::error(
                "plan::training-length",
                "training",
                "set training.train_iters or training.train_tokens",
            )
            .with_help("e.g. train_iters: 1000"),
        ]);
    };
    let model = resolved.model.clone();
    let vocab = opts.vocab_size;
    let gbs = resolved.training.global_batch_size;
    let keys = auto_keys(recipe);
    let optimizer = &resolved.training.optimizer;
    let may_offload = !keys.is_empty()
        && optimizer.use_precision_aware_optimizer
        && !optimizer.optimizer_cpu_offload
        && cluster.gpu != GpuKind::Cpu;
    let (ranked, searched, valid, fitting) = match search(
        &resolved,
        recipe.parallel.expert_tensor,
        &cluster,
        may_offload,
        |tp| model.padded_vocab_size(vocab, tp),
        |padded| flops_per_iteration(&resolved, padded, gbs),
    ) {
        Ok(found) => found,
        Err(SearchFailure::NoValidLayout { searched }) => {
            return Err(vec![
                Finding::error(
                    "plan::no-valid-layout",
                    keys.first().map_or("parallel", String::as_str),
                    format!(
                        "none of the {searched} layouts for {} GPUs satisfies every layout rule",
                        cluster.world_size()
                    ),
                )
                .with_help("fix some degrees, or change the cluster size"),
            ]);
        }
        Err(SearchFailure::NothingFits { device, host }) => {
            if keys.is_empty() {
                // One fixed layout: it plans anyway, and `finish` says what does not fit.
                let short = host.or(device).expect("a valid layout is over some limit");
                return finish(
                    resolved,
                    cluster,
                    short.layout,
                    vocab,
                    train_iters,
                    None,
                    warnings,
                );
            }
            return Err(vec![out_of_memory(&resolved, &keys, device, host)]);
        }
    };
    let best = &ranked[0];
    let mut resolved = resolved;
    resolved.recompute = best.recompute.clone();
    if let Some(fraction) = best.optimizer_offload_fraction {
        let optimizer = &mut resolved.training.optimizer;
        optimizer.optimizer_cpu_offload = true;
        optimizer.optimizer_offload_fraction = fraction;
        warnings.push(format!(
            "training.optimizer.optimizer_cpu_offload: turned on with optimizer_offload_fraction {fraction}: no valid layout fits in {:.0} GiB per GPU without it",
            gib(GpuSpec::of(cluster.gpu).memory_bytes as u64)
        ));
    }
    let layout = Layout {
        degrees: best.degrees,
        micro_batch_size: best.micro_batch_size,
    };
    let auto = (!keys.is_empty()).then(|| AutoReport {
        resolved: keys,
        searched,
        valid,
        fitting,
        top: ranked.iter().take(5).cloned().collect(),
    });
    finish(
        resolved,
        cluster,
        layout,
        vocab,
        train_iters,
        auto,
        warnings,
    )
}

/// The finding when no layout of an `auto` search fits: the node's host memory where some
/// layout fits the GPU with the optimizer offload, else the GPU's memory.
fn out_of_memory(
    recipe: &Recipe,
    keys: &[String],
    device: Option<Box<Shortfall>>,
    host: Option<Box<Shortfall>>,
) -> Finding {
    let first_key = keys.first().map_or("parallel", String::as_str);
    let layout_name = |layout: &Layout| {
        let d = layout.degrees;
        format!(
            "tp {} pp {} vpp {} cp {} ep {} dp {}, micro batch {}",
            d.tp, d.pp, d.vpp, d.cp, d.ep, d.dp, layout.micro_batch_size
        )
    };
    if let Some(short) = host {
        let recipe_offloads = recipe.training.optimizer.optimizer_cpu_offload;
        let (path, help) = if recipe_offloads {
            (
                "training.optimizer.optimizer_offload_fraction",
                "lower training.optimizer.optimizer_offload_fraction, or plan for more nodes: the distributed optimizer shards the offloaded state over more data-parallel ranks",
            )
        } else {
            (
                first_key,
                "plan for more nodes (the distributed optimizer shards the offloaded state over more data-parallel ranks), or enable recompute (granularity: full) so that less of the state has to leave the GPU",
            )
        };
        return Finding::error(
            "plan::out-of-host-memory",
            path,
            format!(
                "no valid layout fits: those that fit the GPU with the optimizer CPU offload need more host memory than a node has; the smallest ({}) needs {:.1} GiB of host memory per node, {:.1} GiB available",
                layout_name(&short.layout),
                gib(short.needed),
                gib(short.limit)
            ),
        )
        .with_help(help);
    }
    let short = device.expect("a valid layout is over some limit");
    Finding::error(
        "plan::out-of-memory",
        first_key,
        format!(
            "no valid layout fits in {:.0} GiB per GPU; the smallest ({}) needs {:.1} GiB",
            gib(short.limit),
            layout_name(&short.layout),
            gib(short.needed)
        ),
    )
    .with_help("enable recompute (granularity: full), the distributed optimizer, the optimizer CPU offload (training.optimizer.optimizer_cpu_offload), or plan for more GPUs")
}

/// What does not fit in `memory`, as warnings: the GPU (with the offload fraction that would
/// fit it, when there is one) and the node's host.
fn memory_warnings(s: &Setup<'_>, memory: &Memory) -> Vec<String> {
    let mut warnings = Vec::new();
    if memory.per_gpu_bytes.total > memory.limit_bytes {
        let mut warning = format!(
            "does not fit: {:.1} GiB needed on the most loaded GPU, {:.1} GiB available",
            gib(memory.per_gpu_bytes.total),
            gib(memory.limit_bytes)
        );
        let offload_possible = s.offload_fraction == 0.0 && s.cluster.gpu != GpuKind::Cpu;
        if let Some(fraction) = offload_possible
            .then(|| offload::fraction_that_fits(s, memory.limit_bytes))
            .flatten()
        {
            warning.push_str(&format!(
                "; training.optimizer.optimizer_cpu_offload with optimizer_offload_fraction {fraction} would fit it (with use_precision_aware_optimizer)"
            ));
        }
        warnings.push(warning);
    }
    if let Some(host) = memory.host.as_ref().filter(|h| !h.fits) {
        warnings.push(format!(
            "does not fit the host: {:.1} GiB of host memory needed on node {} (the offloaded optimizer state of its ranks, their transfer buffers, an asynchronous save's snapshot and {:.0} GiB reserved), {:.1} GiB available; {}",
            gib(host.total),
            host.most_loaded_node,
            gib(host.reserved),
            gib(host.limit_bytes),
            if host.snapshot_page_locked > 0 {
                "turn checkpoint.async_save off (a synchronous save needs no snapshot), lower training.optimizer.optimizer_offload_fraction or plan for more nodes"
            } else {
                "lower training.optimizer.optimizer_offload_fraction or plan for more nodes"
            }
        ));
    }
    warnings
}

/// Builds the plan for the chosen layout.
fn finish(
    mut resolved: Recipe,
    cluster: Cluster,
    layout: Layout,
    vocab: u32,
    train_iters: u64,
    auto: Option<AutoReport>,
    mut warnings: Vec<String>,
) -> Result<Plan, Vec<Finding>> {
    let d = layout.degrees;
    let p = &mut resolved.parallel;
    p.tensor = Degree::Fixed(d.tp);
    p.pipeline = Degree::Fixed(d.pp);
    p.virtual_pipeline = Degree::Fixed(d.vpp);
    p.context = Degree::Fixed(d.cp);
    p.expert = Degree::Fixed(d.ep);
    p.expert_tensor = Some(Degree::Fixed(d.etp));
    p.data = Degree::Fixed(d.dp);
    // Megatron switches sequence parallelism off without tensor parallelism.
    p.sequence_parallel &= d.tp > 1;
    resolved.training.micro_batch_size = Degree::Fixed(layout.micro_batch_size);
    resolved.model.vocab_size = Some(vocab);
    resolved.cluster = Some(cluster.clone());
    let padded = resolved.model.padded_vocab_size(vocab, d.tp);
    let params = parameter_count(&resolved.model, padded);
    let gbs = resolved.training.global_batch_size;
    let flops = flops_per_iteration(&resolved, padded, gbs);
    let spec = GpuSpec::of(cluster.gpu);
    let (memory, predicted, stages) = {
        let s = setup(&resolved, &cluster, layout, params, padded, true);
        let memory = memory(&s);
        let predicted = predict(&s, flops, &stage_local_parameters(&s));
        warnings.extend(memory_warnings(&s, &memory));
        (memory, predicted, s.stages)
    };
    let (ranks, groups) = rank_grid(&d, cluster.gpus_per_node);
    let mut plan = Plan {
        world_size: cluster.world_size(),
        hardware: Hardware {
            gpu: cluster.gpu,
            peak_flops: spec.mfu_peak(resolved.precision.dtype),
            memory_bytes: spec.memory_bytes as u64,
            source: format!("{}: {}", gpu_name(cluster.gpu), spec.source),
        },
        cluster,
        degrees: d,
        micro_batch_size: layout.micro_batch_size,
        global_batch_size: gbs,
        num_microbatches: layout.num_microbatches(gbs),
        padded_vocab_size: padded,
        vocab_size: vocab,
        train_iters,
        parameters: params,
        flops_per_iteration: flops,
        memory,
        predicted,
        stages,
        ranks,
        groups,
        auto,
        warnings,
        recipe: resolved,
        plan_hash: String::new(),
    };
    plan.plan_hash = plan.compute_hash();
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use ferrotron_recipe::{CrossEntropyFusionImpl, Degree, Fp8};

    use super::*;
    use crate::testing::{gpt2_small, llama3_8b};

    fn h100(nodes: u32) -> Option<Cluster> {
        Some(Cluster {
            nodes,
            gpus_per_node: 8,
            gpu: GpuKind::H100,
        })
    }

    #[test]
    fn a_fixed_layout_plans_with_ranks_stages_and_a_hash() {
        let mut recipe = llama3_8b();
        recipe.parallel.tensor = Degree::Fixed(2);
        recipe.parallel.pipeline = Degree::Fixed(2);
        recipe.parallel.sequence_parallel = true;
        let opts = PlanOptions {
            cluster: h100(2),
            vocab_size: 128256,
        };
        let plan = plan(&recipe, &opts).expect("plans");
        assert_eq!(plan.world_size, 16);
        assert_eq!(plan.degrees.dp, 4);
        assert_eq!(plan.num_microbatches, 128 / 4);
        assert_eq!(plan.ranks.len(), 16);
        assert_eq!(plan.stages.len(), 2);
        assert_eq!(plan.recipe.parallel.data, Degree::Fixed(4));
        assert_eq!(plan.recipe.model.vocab_size, Some(128256));
        assert_eq!(plan.padded_vocab_size, 128256);
        assert!(plan.auto.is_none());
        assert_eq!(plan.groups_of(13).expect("rank 13").tp, &[12, 13]);
        assert_eq!(plan.plan_hash.len(), 64);
        let again = super::plan(&recipe, &opts).expect("plans");
        assert_eq!(again.plan_hash, plan.plan_hash, "deterministic");
        recipe.training.global_batch_size = 256;
        let other = super::plan(&recipe, &opts).expect("plans");
        assert_ne!(other.plan_hash, plan.plan_hash);
    }

    #[test]
    fn fp8_plans_count_mfu_against_the_bf16_peak() {
        let plan_in = |fp8| {
            let mut recipe = llama3_8b();
            recipe.precision.fp8 = fp8;
            let opts = PlanOptions {
                cluster: h100(1),
                vocab_size: 128256,
            };
            plan(&recipe, &opts).expect("plans")
        };
        let (bf16, fp8) = (plan_in(Fp8::None), plan_in(Fp8::Hybrid));
        assert_eq!(bf16.hardware.peak_flops, 989e12);
        assert_eq!(fp8.hardware.peak_flops, 989e12);
        // The same FLOPs in less time: a higher MFU, against the same denominator.
        assert!(fp8.predicted.step_seconds < bf16.predicted.step_seconds);
        assert!(fp8.predicted.mfu > bf16.predicted.mfu);
        let gpus_times_seconds = f64::from(fp8.world_size) * fp8.predicted.step_seconds;
        let mfu = fp8.flops_per_iteration / (gpus_times_seconds * 989e12);
        assert!(
            (fp8.predicted.mfu - mfu).abs() < 1e-12,
            "{}",
            fp8.predicted.mfu
        );
    }

    #[test]
    fn layout_errors_come_back_as_findings() {
        let mut recipe = llama3_8b();
        recipe.parallel.tensor = Degree::Fixed(3);
        let err = plan(
            &recipe,
            &PlanOptions {
                cluster: h100(1),
                vocab_size: 128256,
            },
        )
        .expect_err("tp 3 on 8 GPUs");
        assert!(
            err.iter()
                .any(|f| f.code == "layout::heads-divisible-by-tp")
        );
        assert!(
            err.iter()
                .any(|f| f.code == "layout::world-divisible-by-model-parallel")
        );
    }

    #[test]
    fn without_a_cluster_the_plan_is_one_cpu_rank() {
        let recipe = gpt2_small();
        let plan = plan(
            &recipe,
            &PlanOptions {
                cluster: None,
                vocab_size: 50257,
            },
        )
        .expect("plans");
        assert_eq!(plan.world_size, 1);
        assert_eq!(plan.cluster.gpu, GpuKind::Cpu);
        assert!(plan.hardware.source.contains("NOMINAL"));
    }

    #[test]
    fn recompute_auto_takes_the_cheapest_setting_that_fits() {
        let plan_with = |granularity, micro_batch_size| {
            let mut recipe = llama3_8b();
            recipe.recompute.granularity = granularity;
            recipe.training.micro_batch_size = Degree::Fixed(micro_batch_size);
            recipe.parallel.tensor = Degree::Fixed(2);
            recipe.parallel.sequence_parallel = true;
            recipe.parallel.distributed_optimizer = true;
            plan(
                &recipe,
                &PlanOptions {
                    cluster: h100(1),
                    vocab_size: 128256,
                },
            )
            .expect("plans")
        };
        // Small microbatches fit without recomputation, which costs only time: auto keeps none.
        assert!(plan_with(RecomputeGranularity::None, 1).memory.fits);
        let small = plan_with(RecomputeGranularity::Auto, 1);
        assert_eq!(
            small.recipe.recompute.granularity,
            RecomputeGranularity::None
        );
        let auto = small.auto.as_ref().expect("auto report");
        assert_eq!(auto.resolved, vec!["recompute.granularity"]);
        // none, selective, full, and the block method's bisection
        assert!(auto.searched > 3, "{}", auto.searched);
        // Large ones do not fit without it: auto recomputes, and the result fits.
        assert!(!plan_with(RecomputeGranularity::None, 8).memory.fits);
        let large = plan_with(RecomputeGranularity::Auto, 8);
        assert_ne!(
            large.recipe.recompute.granularity,
            RecomputeGranularity::None
        );
        assert_ne!(
            large.recipe.recompute.granularity,
            RecomputeGranularity::Auto
        );
        assert!(large.memory.fits);
        let top = &large.auto.as_ref().expect("auto report").top;
        assert_eq!(top[0].recompute, large.recipe.recompute);
    }

    /// The LLaMA-style 1B of the long-context bench rows, one sequence a step on one H100.
    fn llama_1b_at(seq_length: u32, granularity: RecomputeGranularity) -> Plan {
        llama_1b_with(seq_length, granularity, CrossEntropyFusionImpl::Native)
    }

    fn llama_1b_with(
        seq_length: u32,
        granularity: RecomputeGranularity,
        fusion: CrossEntropyFusionImpl,
    ) -> Plan {
        // The bench rows' LLaMA-style 1B (`tools/gpu-bench.sh`): GPT-2's vocabulary, no
        // dropout, bf16.
        let mut recipe = llama3_8b();
        recipe.model.vocab_size = Some(50257);
        recipe.model.hidden_dropout = 0.0;
        recipe.model.attention_dropout = 0.0;
        recipe.precision.dtype = ferrotron_recipe::Dtype::Bf16;
        recipe.runtime.cross_entropy_fusion_impl = fusion;
        recipe.model.num_layers = 16;
        recipe.model.hidden_size = 2048;
        recipe.model.ffn_hidden_size = Some(8192);
        recipe.model.seq_length = seq_length;
        recipe.model.max_position_embeddings = Some(seq_length);
        recipe.training.global_batch_size = 1;
        recipe.recompute.granularity = granularity;
        if granularity == RecomputeGranularity::Full {
            recipe.recompute.method = Some(ferrotron_recipe::RecomputeMethod::Uniform);
            recipe.recompute.num_layers = Some(1);
        }
        let one_h100 = Some(Cluster {
            nodes: 1,
            gpus_per_node: 1,
            gpu: GpuKind::H100,
        });
        plan(
            &recipe,
            &PlanOptions {
                cluster: one_h100,
                vocab_size: 50257,
            },
        )
        .expect("plans")
    }

    #[test]
    fn recompute_auto_recomputes_only_the_layers_a_long_sequence_needs() {
        // 32k tokens fit without recomputation: auto recomputes nothing.
        let at_32k = llama_1b_at(32768, RecomputeGranularity::Auto);
        assert_eq!(
            at_32k.recipe.recompute.granularity,
            RecomputeGranularity::None
        );
        // 128k do not, and full recomputation is more than they need: the block method with
        // some layers kept fits and is faster.
        let full = llama_1b_at(131072, RecomputeGranularity::Full);
        assert!(full.memory.fits);
        let auto = llama_1b_at(131072, RecomputeGranularity::Auto);
        let recompute = &auto.recipe.recompute;
        assert_eq!(
            (recompute.granularity, recompute.method),
            (
                RecomputeGranularity::Full,
                Some(ferrotron_recipe::RecomputeMethod::Block)
            ),
        );
        let n = recompute.num_layers.expect("block layers");
        assert!((1..16).contains(&n), "block {n}");
        assert!(auto.memory.fits);
        assert!(auto.predicted.mfu > full.predicted.mfu);
        // One layer fewer does not fit: the bisection found the smallest.
        let mut fewer = auto.recipe.clone();
        fewer.recompute.num_layers = Some(n - 1);
        if n > 1 {
            let tighter = plan(
                &fewer,
                &PlanOptions {
                    cluster: Some(auto.cluster.clone()),
                    vocab_size: 50257,
                },
            )
            .expect("plans");
            assert!(!tighter.memory.fits);
        }
    }

    #[test]
    fn at_128k_the_linear_loss_leaves_room_to_recompute_only_the_mlp_blocks() {
        // The fp32 logits of 131,072 tokens (25.6 GiB) gone, every layer's attention block
        // can stay and only its MLP block is recomputed: a third of the MLP's GEMMs more,
        // where recomputing whole layers re-runs their attention too.
        let native = llama_1b_at(131072, RecomputeGranularity::Auto);
        let linear = llama_1b_with(
            131072,
            RecomputeGranularity::Auto,
            CrossEntropyFusionImpl::Linear,
        );
        let recompute = &linear.recipe.recompute;
        assert_eq!(recompute.granularity, RecomputeGranularity::Selective);
        assert!(recompute.recomputes_mlp());
        assert!(linear.memory.fits);
        assert!(
            linear.predicted.mfu > native.predicted.mfu + 0.05,
            "{} vs {}",
            linear.predicted.mfu,
            native.predicted.mfu
        );
    }

    #[test]
    fn auto_picks_the_fastest_layout_that_fits() {
        let mut recipe = llama3_8b();
        recipe.parallel.tensor = Degree::AUTO;
        recipe.parallel.pipeline = Degree::AUTO;
        recipe.training.micro_batch_size = Degree::AUTO;
        recipe.parallel.sequence_parallel = true;
        let plan = plan(
            &recipe,
            &PlanOptions {
                cluster: h100(2),
                vocab_size: 128256,
            },
        )
        .expect("plans");
        let auto = plan.auto.as_ref().expect("auto report");
        assert_eq!(
            auto.resolved,
            vec![
                "parallel.tensor",
                "parallel.pipeline",
                "training.micro_batch_size"
            ]
        );
        assert!(auto.fitting >= 1 && auto.fitting <= auto.valid && auto.valid <= auto.searched);
        let best = &auto.top[0];
        assert_eq!(best.degrees, plan.degrees);
        assert!(plan.memory.fits);
        for pair in auto.top.windows(2) {
            assert!(pair[0].tokens_per_second_per_gpu >= pair[1].tokens_per_second_per_gpu);
        }
        for candidate in &auto.top {
            assert!(candidate.peak_memory_bytes <= plan.memory.limit_bytes);
        }
        assert!(plan.recipe.parallel.tensor.fixed().is_some());
        assert!(plan.recipe.training.micro_batch_size.fixed().is_some());
    }

    #[test]
    fn auto_reports_when_nothing_fits() {
        let mut recipe = llama3_8b();
        recipe.model.num_layers = 400;
        recipe.parallel.tensor = Degree::AUTO;
        let err = plan(
            &recipe,
            &PlanOptions {
                cluster: h100(1),
                vocab_size: 128256,
            },
        )
        .expect_err("a 100B model does not fit on 8 GPUs");
        assert_eq!(err[0].code, "plan::out-of-memory");
        assert_eq!(err[0].path, "parallel.tensor");
    }

    #[test]
    fn a_fixed_layout_that_does_not_fit_still_plans_with_a_warning() {
        let mut recipe = llama3_8b();
        recipe.model.num_layers = 400;
        let plan = plan(
            &recipe,
            &PlanOptions {
                cluster: h100(1),
                vocab_size: 128256,
            },
        )
        .expect("plans");
        assert!(!plan.memory.fits);
        assert!(plan.warnings[0].starts_with("does not fit"));
    }

    #[test]
    fn plan_json_round_trips_through_write_to() {
        let recipe = gpt2_small();
        let plan = plan(
            &recipe,
            &PlanOptions {
                cluster: h100(1),
                vocab_size: 50257,
            },
        )
        .expect("plans");
        let dir = tempfile::tempdir().expect("temp dir");
        let path = plan.write_to(&dir.path().join("run")).expect("writes");
        assert_eq!(path.file_name().and_then(|n| n.to_str()), Some("plan.json"));
        let read = Plan::read_from(&path).expect("reads");
        assert_eq!(read.plan_hash, plan.plan_hash);
        assert_eq!(read.degrees, plan.degrees);
        assert_eq!(read.ranks, plan.ranks);
        assert_eq!(read.groups, plan.groups);
        assert_eq!(read.stages, plan.stages);
        assert_eq!(read.memory.per_gpu_bytes, plan.memory.per_gpu_bytes);
        assert_eq!(read.parameters, plan.parameters);
    }
}
