//! Memory per GPU: weights, gradients, optimizer states, activations and framework overhead.
//!
//! Two models, because two runtimes: the one-rank GPU step keeps flat fp32 optimizer state and
//! peaks in either its activations or its update (`flat_step`, fitted to the H200 bench rows);
//! the multi-rank layouts and the `cpu` rank hold everything at once, as Megatron counts it.
//! Megatron's numbers stay for them because their runtime has not been measured against a
//! refined model yet, and they are the numbers users compare with Megatron's logs.
//!
//! Weights, gradients and optimizer states follow Megatron's `theoretical_memory_usage.py`:
//! 18 bytes per parameter in bf16/fp16 (2 weight + 4 fp32 gradient + 4 fp32 master + 4 + 4
//! Adam moments; the gradient only where microbatches are summed, see `megatron_memory`), or
//! 6 + 12/d with the distributed optimizer, where d is the group the states
//! are sharded over (data × context for dense parameters, expert-data for experts).
//! Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation"), Table 2,
//! generalised to GQA, SwiGLU, MoE and flash attention, term by term; every term is returned
//! so `--explain` shows the arithmetic. Every stage is evaluated and the most loaded one wins.
//! With the optimizer CPU offload the offloaded share of each rank's master and moments leaves
//! the GPU, and the most loaded node's host memory is reported beside it (`offload.rs`).

use ferrotron_recipe::{
    Activation, CrossEntropyFusionImpl, Dtype, Model, Optimizer, RecomputeGranularity,
    RecomputeMethod,
};
use serde::{Deserialize, Serialize};

use crate::flat_step;
use crate::offload::{self, HostMemory};
use crate::setup::Setup;
use crate::stages::StageInfo;
use crate::term::Term;

/// Bytes on one GPU, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MemoryBytes {
    pub weights: u64,
    pub gradients: u64,
    pub optimizer: u64,
    pub activations: u64,
    /// CUDA context, NCCL buffers, workspaces: a fixed allowance per GPU kind.
    pub framework_overhead: u64,
    pub total: u64,
}

/// The memory report of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    /// The most loaded GPU.
    pub per_gpu_bytes: MemoryBytes,
    pub limit_bytes: u64,
    /// The most loaded GPU within `limit_bytes` and, with the optimizer CPU offload, the most
    /// loaded node's host within its memory.
    pub fits: bool,
    /// Pipeline stage of the most loaded GPU, and its first rank.
    pub most_loaded_stage: u32,
    pub most_loaded_rank: u32,
    /// One entry per pipeline stage.
    pub per_stage: Vec<MemoryBytes>,
    /// Parameters held by one GPU of the most loaded stage (after tensor/expert sharding).
    pub parameters_per_gpu: u64,
    /// Host memory of the most loaded node, with the optimizer CPU offload only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostMemory>,
    /// The formulas behind the most loaded stage's numbers (and the host's, with the offload).
    pub terms: Vec<Term>,
}

/// Parameters of one GPU of `stage`, split into dense and expert parameters.
struct LocalParameters {
    dense: f64,
    expert: f64,
}

fn local_parameters(setup: &Setup<'_>, stage: &StageInfo) -> LocalParameters {
    let model = &setup.recipe.model;
    let d = setup.layout.degrees;
    let (tp, ep, etp) = (f64::from(d.tp), f64::from(d.ep), f64::from(d.etp));
    let p = &setup.params;
    let h = f64::from(model.hidden_size);
    // Row-parallel output biases and norms (QK-norm's too) are replicated over tensor ranks, and
    // so are multi-latent attention's down projections.
    let bias = if model.add_bias_linear { h } else { 0.0 };
    let replicated_attention = bias
        + crate::params::qk_norm_parameters(model) as f64
        + crate::params::mla_replicated_parameters(model) as f64;
    let attention =
        (p.attention_per_layer as f64 - replicated_attention) / tp + replicated_attention;
    let norms = p.norms_per_layer as f64;
    let mlp = (p.mlp_per_layer as f64 - bias) / tp + bias;
    let dense_layers = f64::from(stage.num_layers - stage.moe_layers);
    let moe_layers = f64::from(stage.moe_layers);
    let mut dense = f64::from(stage.num_layers) * (attention + norms) + dense_layers * mlp;
    let mut expert = 0.0;
    if let Some(moe) = &model.moe {
        let experts = f64::from(moe.num_experts);
        let one_expert = p.experts_per_moe_layer as f64 / experts;
        let local_experts = experts / ep;
        expert = moe_layers * local_experts * ((one_expert - bias) / etp + bias);
        let shared = p.shared_expert_per_moe_layer as f64;
        let shared_local = if shared > 0.0 {
            (shared - bias) / tp + bias
        } else {
            0.0
        };
        dense += moe_layers * (p.router_per_moe_layer as f64 + shared_local);
    }
    let last = setup.stages.len() - 1;
    if stage.has_embedding {
        dense += p.embedding as f64 / tp + p.position_embedding as f64;
    }
    if stage.pipeline_rank as usize == last {
        dense += p.final_norm as f64;
        let output = if model.tie_embeddings {
            if setup.stages.len() > 1 {
                p.embedding as f64
            } else {
                0.0
            }
        } else {
            p.output_layer as f64
        };
        dense += output / tp;
    }
    LocalParameters { dense, expert }
}

/// Bytes per parameter: (weight, gradient, optimizer states). Adam's m and v take 4 bytes each,
/// or 2 in bf16 under Megatron's precision-aware optimizer (`--exp-avg-dtype bf16`), and so
/// does the summed gradient (`--main-grads-dtype bf16`).
pub(crate) fn bytes_per_parameter(dtype: Dtype, optimizer: &Optimizer) -> (f64, f64, f64) {
    let moments = (optimizer.exp_avg_dtype.bytes() + optimizer.exp_avg_sq_dtype.bytes()) as f64;
    match dtype {
        // bf16/fp16 weight, main gradient, fp32 master copy + Adam m and v.
        Dtype::Bf16 | Dtype::Fp16 => (
            2.0,
            optimizer.main_grads_dtype.bytes() as f64,
            4.0 + moments,
        ),
        // fp32 weight doubles as master; main gradient; Adam m and v.
        Dtype::Fp32 => (4.0, optimizer.main_grads_dtype.bytes() as f64, moments),
    }
}

/// Activation bytes of one transformer layer for one microbatch on one GPU, with the terms.
pub(crate) fn layer_activation_terms(setup: &Setup<'_>, moe_layer: bool) -> Vec<Term> {
    let model: &Model = &setup.recipe.model;
    let d = setup.layout.degrees;
    let tp = f64::from(d.tp);
    let etp = f64::from(d.etp);
    let sp = setup.sequence_shards();
    let sb = setup.local_tokens();
    let h = f64::from(model.hidden_size);
    let a = f64::from(model.num_attention_heads);
    let s = f64::from(model.seq_length) / f64::from(d.cp);
    let b = f64::from(setup.layout.micro_batch_size);
    let masks = if model.hidden_dropout > 0.0 { 2.0 } else { 0.0 };
    let mlp_recomputed = !moe_layer && setup.recipe.recompute.recomputes_mlp();
    let mut terms = vec![if mlp_recomputed {
        // The MLP block keeps only its input: not its normed input or its dropout mask.
        let masks = masks / 2.0;
        setup.term(
            "norm inputs, residual inputs, attention's dropout mask (MLP block recomputed)",
            (6.0 + masks) * sb * h / sp,
            || format!("(6 + {masks}) · s·b·h / sp = (6 + {masks}) · {sb}·{h} / {sp}"),
        )
    } else {
        setup.term(
            "norm inputs, residual inputs, dropout masks",
            (8.0 + masks) * sb * h / sp,
            || format!("(8 + {masks}) · s·b·h / sp = (8 + {masks}) · {sb}·{h} / {sp}"),
        )
    }];
    match &model.mla {
        None => {
            let kv = f64::from(model.kv_channels());
            let (q, k) = (a * kv, f64::from(model.num_query_groups()) * kv);
            terms.push(setup.term(
                "Q, K, V and attention output",
                2.0 * sb * (2.0 * q + 2.0 * k) / tp,
                || format!("2 · s·b·(2q + 2k) / tp = 2·{sb}·(2·{q} + 2·{k}) / {tp}"),
            ));
        }
        Some(mla) => {
            let q = a * f64::from(mla.q_head_dim());
            let v = a * f64::from(mla.v_head_dim);
            terms.push(setup.term(
                "MLA Q, K (n·d_q each), V and attention output (n·d_v each)",
                2.0 * sb * (2.0 * q + 2.0 * v) / tp,
                || format!("2 · s·b·(2q + 2v) / tp = 2·{sb}·(2·{q} + 2·{v}) / {tp}"),
            ));
            // The latents, whole on every tensor rank: the norms' inputs and the up
            // projections' inputs, plus the shared rotary key.
            let latents = f64::from(mla.q_lora_rank.unwrap_or(0) + mla.kv_lora_rank);
            let rope = f64::from(mla.qk_pos_emb_head_dim);
            terms.push(setup.term(
                "MLA latents (norm and up-projection inputs) and rotary key",
                2.0 * sb * (2.0 * latents + rope),
                || format!("2 · s·b·(2·latents + d_rope) = 2·{sb}·(2·{latents} + {rope})"),
            ));
        }
    }
    let softmax_recomputed = setup.recipe.recompute.granularity == RecomputeGranularity::Selective;
    if setup.flash_attention() {
        terms.push(setup.term(
            "flash-attention softmax statistics (fp32)",
            4.0 * a * s * b / tp,
            || format!("4 · a·s·b / tp = 4·{a}·{s}·{b} / {tp}"),
        ));
    } else if !softmax_recomputed {
        let dropout = if model.attention_dropout > 0.0 {
            3.0
        } else {
            0.0
        };
        terms.push(setup.term(
            "attention scores, softmax and dropout (no flash attention)",
            (2.0 + dropout) * a * s * s * b / tp,
            || format!("(2 + {dropout}) · a·s²·b / tp = (2 + {dropout})·{a}·{s}²·{b} / {tp}"),
        ));
    }
    let per_ffn = ffn_bytes_per_width(model);
    match (&model.moe, moe_layer) {
        (Some(moe), true) => {
            let experts = f64::from(moe.num_experts);
            let topk = f64::from(moe.router_topk);
            let f = f64::from(moe.expert_ffn_hidden_size(model));
            let capacity = moe.capacity_factor.unwrap_or(1.0).max(1.0);
            let routed = sb / sp * topk * capacity;
            terms.push(setup.term(
                "router logits and probabilities (fp32)",
                8.0 * sb * experts / sp,
                || format!("8 · s·b·E / sp = 8·{sb}·{experts} / {sp}"),
            ));
            terms.push(setup.term(
                "routed tokens: permuted inputs and outputs (balanced routing)",
                routed * (2.0 * h * etp + 2.0 * h),
                || format!(
                    "k·cf·s·b/sp · (2h·etp + 2h) = {topk}·{capacity}·{sb}/{sp} · (2·{h}·{etp} + 2·{h})"
                ),));
            terms.push(setup.term(
                "expert MLP activations",
                routed * etp * per_ffn * f / etp,
                || format!("k·cf·s·b/sp · {per_ffn}·f_expert = {topk}·{capacity}·{sb}/{sp} · {per_ffn}·{f}"),));
            if let Some(shared) = moe.shared_expert_ffn_hidden_size {
                let shared = f64::from(shared);
                terms.push(setup.term(
                    "shared expert MLP activations",
                    per_ffn * sb * shared / tp,
                    || format!("{per_ffn} · s·b·f_shared / tp = {per_ffn}·{sb}·{shared} / {tp}"),
                ));
            }
        }
        _ if mlp_recomputed => {}
        _ => {
            let f = f64::from(model.ffn_hidden_size());
            terms.push(setup.term("MLP activations", per_ffn * sb * f / tp, || {
                format!("{per_ffn} · s·b·f / tp = {per_ffn}·{sb}·{f} / {tp}")
            }));
        }
    }
    terms
}

/// Bytes an MLP keeps per token and unit of FFN width: GELU's input and output, SwiGLU's
/// twice-as-wide input and its output, 16-bit.
fn ffn_bytes_per_width(model: &Model) -> f64 {
    match model.activation {
        Activation::Gelu | Activation::GeluTanh => 4.0,
        Activation::Swiglu => 6.0,
    }
}

/// A dense MLP block's activations beyond its input, which `recompute.modules: [mlp]` rebuilds
/// one layer at a time in the backward: the normed input, the dropout mask, the MLP's own.
fn mlp_block_bytes(setup: &Setup<'_>) -> f64 {
    let model = &setup.recipe.model;
    let mask = if model.hidden_dropout > 0.0 { 1.0 } else { 0.0 };
    let (sb, sp) = (setup.local_tokens(), setup.sequence_shards());
    let (h, f) = (
        f64::from(model.hidden_size),
        f64::from(model.ffn_hidden_size()),
    );
    (2.0 + mask) * sb * h / sp
        + ffn_bytes_per_width(model) * sb * f / f64::from(setup.layout.degrees.tp)
}

fn sum(terms: &[Term]) -> f64 {
    terms.iter().map(|t| t.value).sum()
}

/// Microbatches whose activations a stage holds at its peak (1F1B or interleaved warm-up).
pub(crate) fn in_flight_microbatches(setup: &Setup<'_>, pipeline_rank: u32) -> f64 {
    let d = setup.layout.degrees;
    let (pp, vpp, m) = (d.pp, d.vpp, setup.num_microbatches);
    if pp == 1 {
        return 1.0;
    }
    if vpp == 1 {
        return f64::from((pp - pipeline_rank).min(m));
    }
    // Megatron's interleaved warm-up: (pp - rank - 1)·2 + (vpp - 1)·pp chunk-microbatches, plus
    // the one in progress; each chunk holds 1/vpp of the stage.
    let chunks = (pp - pipeline_rank - 1) * 2 + (vpp - 1) * pp + 1;
    f64::from(chunks.min(m * vpp)) / f64::from(vpp)
}

/// Activation terms of a whole stage (the layers × microbatches in flight, recomputation and
/// the output layer).
fn stage_activation_terms(setup: &Setup<'_>, stage: &StageInfo) -> Vec<Term> {
    let model = &setup.recipe.model;
    let sp = setup.sequence_shards();
    let sb = setup.local_tokens();
    let h = f64::from(model.hidden_size);
    let tp = f64::from(setup.layout.degrees.tp);
    let dense_layer = sum(&layer_activation_terms(setup, false));
    let moe_layer = sum(&layer_activation_terms(setup, true));
    let dense_layers = f64::from(stage.num_layers - stage.moe_layers);
    let moe_layers = f64::from(stage.moe_layers);
    let full_layers = dense_layers * dense_layer + moe_layers * moe_layer;
    let layers = f64::from(stage.num_layers);
    let widest = if stage.moe_layers > 0 {
        moe_layer.max(dense_layer)
    } else {
        dense_layer
    };
    let in_flight = in_flight_microbatches(setup, stage.pipeline_rank);
    let checkpoint = 2.0 * sb * h / sp;
    let recompute = &setup.recipe.recompute;
    let mut terms = Vec::new();
    match (
        recompute.granularity,
        recompute.method,
        recompute.num_layers,
    ) {
        (RecomputeGranularity::Full, Some(RecomputeMethod::Uniform), Some(n)) => {
            let n = f64::from(n);
            let stored = (layers / n).ceil() * checkpoint;
            terms.push(setup.term(
                "checkpointed layer inputs × microbatches in flight",
                stored * in_flight,
                || format!(
                    "ceil(L/n) · 2·s·b·h/sp · in_flight = ceil({layers}/{n}) · {checkpoint} · {in_flight}"
                ),));
            terms.push(setup.term(
                "recomputation working set (one chunk of layers)",
                n.min(layers) * widest,
                || format!("min(n, L) · layer = {} · {widest}", n.min(layers)),
            ));
        }
        (RecomputeGranularity::Full, Some(RecomputeMethod::Block), Some(n)) => {
            let per_chunk = layers / f64::from(setup.layout.degrees.vpp);
            let recomputed = f64::from(n).min(per_chunk) * f64::from(setup.layout.degrees.vpp);
            let kept = (layers - recomputed).max(0.0);
            let stored = recomputed * checkpoint + kept * full_layers / layers.max(1.0);
            terms.push(setup.term(
                "block: checkpointed inputs + kept layers × microbatches in flight",
                stored * in_flight,
                || format!(
                    "(n_rec · 2·s·b·h/sp + n_kept · layer) · in_flight = ({recomputed} · {checkpoint} + {kept} · {}) · {in_flight}",
                    full_layers / layers.max(1.0)
                ),));
            terms.push(
                setup.term("recomputation working set (one layer)", widest, || {
                    format!("one layer = {widest}")
                }),
            );
        }
        _ => {
            terms.push(setup.term(
                "layers × microbatches in flight",
                full_layers * in_flight,
                || format!(
                    "(L_dense · {dense_layer} + L_moe · {moe_layer}) · in_flight = ({dense_layers}·{dense_layer} + {moe_layers}·{moe_layer}) · {in_flight}"
                ),));
            if recompute.recomputes_mlp() && dense_layers > 0.0 {
                // The re-run block's backward holds its activations and their gradients: at
                // 128k tokens the LLaMA-style 1B's plan without the gradients (71.5 GiB) ran out
                // of an 80 GB H100's memory in its first steps (tools/README.md, 2026-12-07).
                let block = 2.0 * mlp_block_bytes(setup);
                terms.push(setup.term(
                    "recomputation working set (one MLP block and its gradients)",
                    block,
                    || format!("2 · ((2 + mask)·s·b·h/sp + ffn bytes·s·b·f/tp) = {block}"),
                ));
            }
        }
    }
    let fp8 = crate::fp8::fp8_layers(setup.recipe, stage, setup.whole_experts());
    if fp8.all > 0.0 {
        let copies = crate::fp8::weight_cast_bytes(setup.recipe, fp8, tp);
        terms.push(
            setup.term("fp8 weight copies (q and qᵀ, one step)", copies, || {
                format!("2 B × fp8 layers' GEMM weights / tp = {copies:.4e}")
            }),
        );
        // Saved inputs: fp8 transposes instead of 16-bit inputs, where whole layers are kept.
        if recompute.granularity != RecomputeGranularity::Full {
            let per_token =
                |dense| crate::fp8::saved_input_delta_per_token(setup.recipe, dense, tp);
            let moe_fp8 = fp8.all - fp8.dense;
            let delta = sb * (fp8.dense * per_token(true) + moe_fp8 * per_token(false)) * in_flight;
            terms.push(setup.term(
                "fp8 saved inputs (1-byte transposes instead of 16-bit inputs)",
                delta,
                || format!("s·b · Σ fp8 layers' Δ bytes/token · in_flight = {delta:.4e}"),
            ));
        }
    }
    if stage.has_output_layer {
        let v = f64::from(setup.padded_vocab);
        terms.push(match setup.recipe.runtime.cross_entropy_fusion_impl {
            CrossEntropyFusionImpl::Native => setup.term(
                "final norm and output-layer input, fp32 logits (one microbatch)",
                4.0 * sb * h / sp + 4.0 * sb * v / tp,
                || format!("4·s·b·h/sp + 4·s·b·V/tp = 4·{sb}·{h}/{sp} + 4·{sb}·{v}/{tp}"),
            ),
            CrossEntropyFusionImpl::Linear => {
                // One chunk's 16-bit logits and their gradient, and with several chunks the
                // weight gradient's f32 sum.
                let chunk = (CrossEntropyFusionImpl::linear_chunk_rows(u64::from(setup.padded_vocab))
                    as f64)
                    .min(sb);
                let weight_sum = if chunk < sb { 4.0 * v * h } else { 0.0 };
                setup.term(
                    "final norm and output-layer input, one chunk of logits and its gradient (linear loss)",
                    4.0 * sb * h / sp + 4.0 * chunk * v + weight_sum,
                    || format!("4·s·b·h/sp + 4·chunk·V + f32 weight-gradient sum = 4·{sb}·{h}/{sp} + 4·{chunk}·{v} + {weight_sum}"),
                )
            }
        });
    }
    terms
}

/// Parameters whose optimizer state one GPU of a stage holds: all of its parameters, or its
/// shard with the distributed optimizer (each instance holds a full copy, sharded over its share
/// of dp·cp for dense parameters, over edp for experts).
fn optimizer_parameters(setup: &Setup<'_>, local: &LocalParameters) -> f64 {
    let parallel = &setup.recipe.parallel;
    if !parallel.distributed_optimizer {
        return local.dense + local.expert;
    }
    let d = setup.layout.degrees;
    let dense_shards = f64::from(d.dp * d.cp) / f64::from(parallel.distributed_optimizer_instances);
    local.dense / dense_shards + local.expert / f64::from(d.edp)
}

/// One GPU of one stage: its bytes, its parameters, the parameters whose optimizer state it
/// holds, and the terms.
struct StageMemory {
    bytes: MemoryBytes,
    params: f64,
    optimizer_params: f64,
    terms: Vec<Term>,
}

/// Memory of one GPU of `stage`, with terms.
fn stage_memory(setup: &Setup<'_>, stage: &StageInfo) -> StageMemory {
    let local = local_parameters(setup, stage);
    let (weight, gradient, optimizer) = bytes_per_parameter(
        setup.recipe.precision.dtype,
        &setup.recipe.training.optimizer,
    );
    let params = local.dense + local.expert;
    let optimizer_params = optimizer_parameters(setup, &local);
    let activation_terms = stage_activation_terms(setup, stage);
    let overhead = setup.spec.framework_overhead_bytes;
    let mut terms = vec![setup.term("parameters on this GPU", params, || {
        format!(
            "dense (sharded over tp) {:.0} + expert (sharded over ep·etp) {:.0}",
            local.dense, local.expert
        )
    })];
    let (bytes, state_terms) = if flat_step::applies(setup) {
        let state = flat_step::State {
            params,
            weight,
            gradient,
            optimizer,
            offloaded: setup.offload_fraction,
        };
        flat_step::peak(setup, &state, activation_terms, overhead)
    } else {
        megatron_memory(setup, &local, optimizer_params, activation_terms, overhead)
    };
    terms.extend(state_terms);
    terms.push(setup.term("framework overhead", overhead, || {
        format!(
            "fixed allowance for {}: CUDA context, NCCL buffers, workspaces",
            crate::hardware::gpu_name(setup.cluster.gpu)
        )
    }));
    StageMemory {
        bytes,
        params,
        optimizer_params,
        terms,
    }
}

/// Megatron's theoretical bytes (multi-rank layouts and the `cpu` kind): weights, fp32
/// gradients where microbatches are summed, optimizer states sharded by the distributed
/// optimizer (less the share the CPU offload keeps in host memory), activations, and the
/// overhead, all held at once.
fn megatron_memory(
    setup: &Setup<'_>,
    local: &LocalParameters,
    optimizer_params: f64,
    activation_terms: Vec<Term>,
    overhead: f64,
) -> (MemoryBytes, Vec<Term>) {
    let (weight, gradient, optimizer) = bytes_per_parameter(
        setup.recipe.precision.dtype,
        &setup.recipe.training.optimizer,
    );
    let distributed = setup.recipe.parallel.distributed_optimizer;
    let offloaded = setup.offload_fraction;
    let params = local.dense + local.expert;
    let optimizer_bytes = optimizer * optimizer_params * (1.0 - offloaded);
    let activations = sum(&activation_terms);
    // The fp32 gradients persist from one microbatch to the next; with a single microbatch the
    // runtime hands backward's 16-bit gradients straight to the norm and the optimizer, and they
    // appear as backward frees the activations, so the peak (backward's start) holds none.
    let gradient = if setup.num_microbatches > 1 {
        gradient
    } else {
        0.0
    };
    let bytes = MemoryBytes {
        weights: (weight * params) as u64,
        gradients: (gradient * params) as u64,
        optimizer: optimizer_bytes as u64,
        activations: activations as u64,
        framework_overhead: overhead as u64,
        total: 0,
    };
    let total = bytes.weights
        + bytes.gradients
        + bytes.optimizer
        + bytes.activations
        + bytes.framework_overhead;
    let bytes = MemoryBytes { total, ..bytes };
    let mut terms = vec![
        setup.term("weights", weight * params, || format!("{weight} B × {params:.0} parameters")),
        setup.term(
            "gradients",
            gradient * params,
            || if gradient > 0.0 {
                let dtype = if setup.recipe.training.optimizer.main_grads_dtype.is_fp32() { "fp32" } else { "bf16" };
                format!("{gradient} B ({dtype} main gradients, summed over microbatches) × {params:.0} parameters")
            } else {
                "none at the peak: one microbatch, whose gradients replace activations as backward frees them".to_owned()
            },),
        setup.term(
            "optimizer states",
            optimizer_bytes,
            || {
                let held = if distributed {
                    let d = setup.layout.degrees;
                    let instances = setup.recipe.parallel.distributed_optimizer_instances;
                    format!(
                        "{optimizer} B × (dense {:.0} / (dp·cp = {}) + expert {:.0} / (edp = {}))  [distributed optimizer]",
                        local.dense, f64::from(d.dp * d.cp) / f64::from(instances), local.expert, f64::from(d.edp)
                    )
                } else {
                    format!("{optimizer} B (master weights, Adam m and v) × {params:.0} parameters")
                };
                if offloaded > 0.0 {
                    format!("{held} × (1 − {offloaded} offloaded to the host)")
                } else {
                    held
                }
            },),
    ];
    terms.extend(activation_terms.into_iter().map(|t| Term {
        name: format!("activations: {}", t.name),
        ..t
    }));
    (bytes, terms)
}

/// Memory of every stage, and of the most loaded node's host under the optimizer offload; the
/// report names the most loaded GPU.
pub(crate) fn memory(setup: &Setup<'_>) -> Memory {
    let mut per_stage: Vec<MemoryBytes> = Vec::with_capacity(setup.stages.len());
    let mut optimizer_params = Vec::with_capacity(setup.stages.len());
    let mut worst: Option<(usize, f64, Vec<Term>)> = None;
    for (index, stage) in setup.stages.iter().enumerate() {
        let one = stage_memory(setup, stage);
        let heavier = worst
            .as_ref()
            .is_none_or(|(w, _, _)| one.bytes.total > per_stage[*w].total);
        per_stage.push(one.bytes);
        optimizer_params.push(one.optimizer_params);
        if heavier {
            worst = Some((index, one.params, one.terms));
        }
    }
    let (stage, params, mut terms) = worst.unwrap_or((0, 0.0, Vec::new()));
    let per_gpu = per_stage.get(stage).copied().unwrap_or_default();
    let limit = setup.spec.memory_bytes as u64;
    let d = setup.layout.degrees;
    let host = offload::watches_host(setup).then(|| {
        let (host, host_terms) = offload::host_memory(setup, &optimizer_params);
        terms.extend(host_terms);
        host
    });
    Memory {
        per_gpu_bytes: per_gpu,
        limit_bytes: limit,
        fits: per_gpu.total <= limit && host.as_ref().is_none_or(|h| h.fits),
        most_loaded_stage: stage as u32,
        most_loaded_rank: stage as u32 * (d.world_size() / d.pp),
        per_stage,
        parameters_per_gpu: params as u64,
        host,
        terms,
    }
}

/// Parameters on one GPU of every stage (dense plus expert, after sharding).
pub(crate) fn stage_local_parameters(setup: &Setup<'_>) -> Vec<f64> {
    setup
        .stages
        .iter()
        .map(|stage| {
            let local = local_parameters(setup, stage);
            local.dense + local.expert
        })
        .collect()
}

/// Parameters whose optimizer state one GPU of every stage holds.
pub(crate) fn stage_optimizer_parameters(setup: &Setup<'_>) -> Vec<f64> {
    setup
        .stages
        .iter()
        .map(|stage| optimizer_parameters(setup, &local_parameters(setup, stage)))
        .collect()
}

/// Peak bytes of the most loaded stage, without building the report (for the `auto` search).
pub(crate) fn peak_bytes(setup: &Setup<'_>) -> u64 {
    setup
        .stages
        .iter()
        .map(|stage| stage_memory(setup, stage).bytes.total)
        .max()
        .unwrap_or(0)
}

/// The smallest offload fraction, a multiple of 1/[`offload::FRACTION_STEPS`], with which
/// every stage of `setup` (planned without the offload) fits `limit` bytes, or None when not
/// even the whole optimizer state in host memory is enough. A stage's peak falls by exactly the
/// optimizer bytes it offloads (they are in both memory phases), so the need is a division.
pub(crate) fn offload_to_fit(setup: &Setup<'_>, limit: u64) -> Option<f64> {
    let mut needed: f64 = 0.0;
    for stage in &setup.stages {
        let bytes = stage_memory(setup, stage).bytes;
        if bytes.total <= limit {
            continue;
        }
        if bytes.optimizer == 0 {
            return None;
        }
        needed = needed.max((bytes.total - limit) as f64 / bytes.optimizer as f64);
    }
    let steps = (needed * offload::FRACTION_STEPS).ceil().max(1.0);
    (steps <= offload::FRACTION_STEPS).then(|| steps / offload::FRACTION_STEPS)
}

#[cfg(test)]
mod tests {
    use ferrotron_recipe::{Cluster, GpuKind, RecomputeGranularity};

    use super::*;
    use crate::layout::{Degrees, Layout};
    use crate::params::parameter_count;
    use crate::search::setup;
    use crate::testing::{gpt3_175b, llama3_8b};

    fn layout(tp: u32, pp: u32, dp: u32, mbs: u32) -> Layout {
        Layout {
            degrees: Degrees {
                tp,
                pp,
                vpp: 1,
                cp: 1,
                ep: 1,
                etp: tp,
                dp,
                edp: dp,
            },
            micro_batch_size: mbs,
        }
    }

    fn cluster(world: u32, gpu: GpuKind) -> Cluster {
        Cluster {
            nodes: 1,
            gpus_per_node: world,
            gpu,
        }
    }

    #[test]
    fn megatron_18_bytes_per_parameter_without_the_distributed_optimizer() {
        let recipe = llama3_8b();
        let params = parameter_count(&recipe.model, 128256);
        let c = cluster(8, GpuKind::H100);
        let s = setup(&recipe, &c, layout(1, 1, 8, 1), params, 128256, false);
        let m = memory(&s);
        let b = m.per_gpu_bytes;
        assert_eq!(m.parameters_per_gpu, params.total);
        let state = (b.weights + b.gradients + b.optimizer) as f64;
        assert!((state / params.total as f64 - 18.0).abs() < 1e-6);
    }

    #[test]
    fn one_microbatch_holds_no_gradients_at_its_peak() {
        // 8 ranks × micro batch 1: a global batch of 8 is one microbatch each, so the 16-bit
        // gradients go straight to the optimizer; 16 needs two, summed in fp32.
        let mut recipe = llama3_8b();
        let params = parameter_count(&recipe.model, 128256);
        let c = cluster(8, GpuKind::H100);
        let bytes = |recipe: &ferrotron_recipe::Recipe| {
            let s = setup(recipe, &c, layout(1, 1, 8, 1), params, 128256, false);
            memory(&s).per_gpu_bytes
        };
        recipe.training.global_batch_size = 8;
        let one = bytes(&recipe);
        recipe.training.global_batch_size = 16;
        let two = bytes(&recipe);
        assert_eq!(one.gradients, 0);
        assert_eq!(two.gradients as f64, 4.0 * params.total as f64);
        assert_eq!(one.weights + one.optimizer, two.weights + two.optimizer);
    }

    #[test]
    fn megatron_6_plus_12_over_dp_with_the_distributed_optimizer() {
        let mut recipe = llama3_8b();
        recipe.parallel.distributed_optimizer = true;
        let bytes = state_bytes_per_parameter_over_dp8(&recipe);
        // 6 + 12/8 = 7.5 bytes per parameter.
        assert!((bytes - 7.5).abs() < 1e-6, "{bytes}");
    }

    /// Weights, gradients and optimizer states per parameter of `recipe` on 8 data-parallel
    /// H100s.
    fn state_bytes_per_parameter_over_dp8(recipe: &ferrotron_recipe::Recipe) -> f64 {
        let params = parameter_count(&recipe.model, 128256);
        let c = cluster(8, GpuKind::H100);
        let s = setup(recipe, &c, layout(1, 1, 8, 1), params, 128256, false);
        let b = memory(&s).per_gpu_bytes;
        (b.weights + b.gradients + b.optimizer) as f64 / params.total as f64
    }

    #[test]
    fn bf16_moments_take_6_plus_8_over_dp() {
        let mut recipe = llama3_8b();
        recipe.parallel.distributed_optimizer = true;
        let optimizer = &mut recipe.training.optimizer;
        optimizer.use_precision_aware_optimizer = true;
        optimizer.exp_avg_dtype = ferrotron_recipe::StateDtype::Bf16;
        optimizer.exp_avg_sq_dtype = ferrotron_recipe::StateDtype::Bf16;
        let bytes = state_bytes_per_parameter_over_dp8(&recipe);
        // fp32 master + bf16 m and v: 6 + (4 + 2 + 2)/8 = 7 bytes per parameter.
        assert!((bytes - 7.0).abs() < 1e-6, "{bytes}");
    }

    #[test]
    fn bf16_main_grads_take_4_plus_8_over_dp() {
        let mut recipe = llama3_8b();
        recipe.parallel.distributed_optimizer = true;
        let optimizer = &mut recipe.training.optimizer;
        optimizer.use_precision_aware_optimizer = true;
        optimizer.main_grads_dtype = ferrotron_recipe::StateDtype::Bf16;
        optimizer.exp_avg_dtype = ferrotron_recipe::StateDtype::Bf16;
        optimizer.exp_avg_sq_dtype = ferrotron_recipe::StateDtype::Bf16;
        let bytes = state_bytes_per_parameter_over_dp8(&recipe);
        // bf16 weight and main gradient + (fp32 master + bf16 m and v)/8: 4 + 8/8 = 5 bytes.
        assert!((bytes - 5.0).abs() < 1e-6, "{bytes}");
    }

    #[test]
    fn korthikanti_34_sbh_over_t_with_selective_recompute_and_sequence_parallel() {
        // Table 2 of Korthikanti et al.: sequence parallel + selective recompute stores
        // 34·s·b·h/t bytes per layer (GELU, ffn 4h, MHA, dropout on, no flash attention).
        let mut recipe = gpt3_175b();
        recipe.parallel.sequence_parallel = true;
        recipe.recompute.granularity = RecomputeGranularity::Selective;
        let params = parameter_count(&recipe.model, 51200);
        let c = cluster(8, GpuKind::Cpu);
        let s = setup(&recipe, &c, layout(8, 1, 1, 1), params, 51200, false);
        let per_layer = sum(&layer_activation_terms(&s, false));
        let (sq, b, h, t) = (2048.0, 1.0, 12288.0, 8.0);
        assert!(
            (per_layer - 34.0 * sq * b * h / t).abs() < 1.0,
            "{per_layer}"
        );
    }

    #[test]
    fn korthikanti_tensor_parallel_without_sequence_parallel() {
        // Table 2: tensor parallel only: s·b·h·(10 + 24/t + 5·a·s/(h·t)).
        let recipe = gpt3_175b();
        let params = parameter_count(&recipe.model, 51200);
        let c = cluster(8, GpuKind::Cpu);
        let s = setup(&recipe, &c, layout(8, 1, 1, 1), params, 51200, false);
        let per_layer = sum(&layer_activation_terms(&s, false));
        let (sq, b, h, t, a) = (2048.0, 1.0, 12288.0, 8.0, 96.0);
        let expected = sq * b * h * (10.0 + 24.0 / t + 5.0 * a * sq / (h * t));
        assert!(
            (per_layer - expected).abs() < 1.0,
            "{per_layer} vs {expected}"
        );
    }

    #[test]
    fn first_stage_holds_pp_microbatches_under_1f1b() {
        let recipe = llama3_8b();
        let params = parameter_count(&recipe.model, 128256);
        let c = cluster(8, GpuKind::H100);
        let s = setup(&recipe, &c, layout(1, 4, 2, 1), params, 128256, false);
        // 128 / (1·2) = 64 microbatches, 4 stages.
        let in_flight: Vec<f64> = (0..4).map(|r| in_flight_microbatches(&s, r)).collect();
        assert_eq!(in_flight, vec![4.0, 3.0, 2.0, 1.0]);
        let m = memory(&s);
        assert_eq!(m.most_loaded_stage, 0);
        assert_eq!(m.most_loaded_rank, 0);
    }

    #[test]
    fn interleaving_costs_megatrons_penalty() {
        // Megatron: first stage holds pp·(1 + (pp−1)/(pp·vpp)) microbatches of its layers.
        let recipe = llama3_8b();
        let params = parameter_count(&recipe.model, 128256);
        let c = cluster(8, GpuKind::H100);
        let mut l = layout(1, 4, 2, 1);
        l.degrees.vpp = 2;
        let s = setup(&recipe, &c, l, params, 128256, false);
        assert_eq!(in_flight_microbatches(&s, 0), 4.0 * (1.0 + 3.0 / 8.0));
    }

    #[test]
    fn full_recompute_keeps_only_layer_inputs() {
        let mut recipe = llama3_8b();
        let params = parameter_count(&recipe.model, 128256);
        let c = cluster(8, GpuKind::H100);
        let plain = memory(&setup(
            &recipe,
            &c,
            layout(1, 1, 8, 1),
            params,
            128256,
            false,
        ));
        recipe.recompute.granularity = RecomputeGranularity::Full;
        recipe.recompute.method = Some(ferrotron_recipe::RecomputeMethod::Uniform);
        recipe.recompute.num_layers = Some(1);
        let full = memory(&setup(
            &recipe,
            &c,
            layout(1, 1, 8, 1),
            params,
            128256,
            false,
        ));
        assert!(full.per_gpu_bytes.activations * 5 < plain.per_gpu_bytes.activations);
        assert_eq!(full.per_gpu_bytes.weights, plain.per_gpu_bytes.weights);
    }

    /// Activation bytes of `recipe` (Llama-3-8B's size) on 8 H100s, data-parallel, micro batch 1.
    fn activations_over_dp8(recipe: &ferrotron_recipe::Recipe) -> f64 {
        let params = parameter_count(&recipe.model, 128256);
        let c = cluster(8, GpuKind::H100);
        memory(&setup(
            recipe,
            &c,
            layout(1, 1, 8, 1),
            params,
            128256,
            false,
        ))
        .per_gpu_bytes
        .activations as f64
    }

    #[test]
    fn mlp_recomputation_keeps_no_mlp_activations_and_rebuilds_one_block() {
        // Llama-3-8B at 8,192 tokens, micro batch 1, hidden dropout on: each dense layer drops
        // its MLP activations (6 bytes × f, SwiGLU), its normed MLP input (2 bytes × h) and
        // its dropout mask (1 byte × h) per token; one block's worth and its gradients come
        // back as the backward's working set.
        let mut recipe = llama3_8b();
        recipe.recompute.granularity = RecomputeGranularity::Selective;
        let kept = activations_over_dp8(&recipe);
        recipe.recompute.modules = vec![ferrotron_recipe::RecomputeModule::Mlp];
        let recomputed = activations_over_dp8(&recipe);
        let (tokens, h, f, layers) = (8192.0, 4096.0, 14336.0, 32.0);
        assert!(recipe.model.hidden_dropout > 0.0);
        let block = tokens * (3.0 * h + 6.0 * f);
        let saved = (layers - 2.0) * block;
        assert!(
            (kept - recomputed - saved).abs() < 1.0,
            "{kept} − {recomputed} ≠ {saved}"
        );
    }

    #[test]
    fn the_linear_loss_keeps_one_chunk_of_logits_and_the_weight_gradients_sum() {
        // Llama-3-8B's 128,256-token vocabulary over 8,192 tokens: 2,092 rows a chunk, four
        // chunks, so the f32 sum of the output layer's weight gradient is alive too.
        let mut recipe = llama3_8b();
        let native = activations_over_dp8(&recipe);
        recipe.runtime.cross_entropy_fusion_impl = CrossEntropyFusionImpl::Linear;
        let linear = activations_over_dp8(&recipe);
        let (tokens, vocab, hidden) = (8192.0, 128256.0, 4096.0);
        let chunk = f64::from(1u32 << 28).div_euclid(vocab);
        assert_eq!(chunk, 2092.0);
        let saved = 4.0 * tokens * vocab - (4.0 * chunk * vocab + 4.0 * vocab * hidden);
        assert!(
            (native - linear - saved).abs() < 1.0,
            "{native} − {linear} ≠ {saved}"
        );
        // One chunk covers a short sequence: no sum.
        recipe.model.seq_length = 1024;
        let linear_short = activations_over_dp8(&recipe);
        recipe.runtime.cross_entropy_fusion_impl = CrossEntropyFusionImpl::Native;
        let native_short = activations_over_dp8(&recipe);
        assert!((native_short - linear_short).abs() < 1.0);
    }
}
