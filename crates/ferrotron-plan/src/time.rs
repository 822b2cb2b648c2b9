//! Predicted step time: compute from FLOPs at a measured GEMM efficiency, memory-bound work
//! from bytes over HBM bandwidth, collectives from bytes over link bandwidth, the pipeline
//! bubble, and the data-parallel gradient traffic that overlap cannot hide.
//!
//! It is a roofline-style model meant to rank layouts and to set expectations, not a
//! simulator; every term is returned so a user can see which assumption dominates.

use ferrotron_recipe::{CrossEntropyFusionImpl, Fp8, RecomputeGranularity, RecomputeMethod};
use serde::{Deserialize, Serialize};

use crate::flops::{
    attention_projections_per_layer_token, core_attention_per_layer_token,
    dense_mlp_per_layer_token, logits_per_token, moe_mlp_per_layer_token,
    routed_experts_per_layer_token, window_share,
};
use crate::setup::Setup;
use crate::stages::StageInfo;
use crate::term::Term;

/// What the model predicts for one iteration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Predicted {
    pub step_seconds: f64,
    pub tokens_per_second_per_gpu: f64,
    /// Model FLOPs utilisation: Megatron FLOPs / (step time · world · peak).
    pub mfu: f64,
    /// Pipeline bubble as a fraction of the step: (pp − 1) / (vpp · m) of the pipelined part.
    pub bubble_fraction: f64,
    /// The pipeline stage whose microbatch time sets the pace.
    pub slowest_stage: u32,
    /// Shares of the step, for "why this layout": compute, communication, bubble, optimizer.
    pub breakdown: Breakdown,
    pub terms: Vec<Term>,
}

/// Seconds per iteration by cause.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Breakdown {
    pub compute: f64,
    pub memory_bound: f64,
    pub tensor_parallel_comm: f64,
    pub context_parallel_comm: f64,
    pub expert_parallel_comm: f64,
    pub pipeline_p2p: f64,
    pub pipeline_bubble: f64,
    pub data_parallel_comm: f64,
    pub optimizer: f64,
    /// The optimizer CPU offload: gradients down, AdamW on the host, weights up.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub optimizer_offload: f64,
}

fn is_zero(seconds: &f64) -> bool {
    *seconds == 0.0
}

/// Ring all-reduce time of `bytes` over `n` ranks: 2(n−1)/n · bytes / bus bandwidth.
fn all_reduce(bytes: f64, n: f64, bandwidth: f64, latency: f64) -> f64 {
    if n <= 1.0 {
        0.0
    } else {
        2.0 * (n - 1.0) / n * bytes / bandwidth + latency
    }
}

/// Reduce-scatter or all-gather time of `bytes` (the full buffer) over `n` ranks.
fn gather(bytes: f64, n: f64, bandwidth: f64, latency: f64) -> f64 {
    if n <= 1.0 {
        0.0
    } else {
        (n - 1.0) / n * bytes / bandwidth + latency
    }
}

/// Per-microbatch seconds of one stage on one GPU, by cause, with terms.
struct StageTime {
    compute: f64,
    memory_bound: f64,
    tp: f64,
    cp: f64,
    ep: f64,
    p2p: f64,
    terms: Vec<Term>,
}

impl StageTime {
    fn total(&self) -> f64 {
        self.compute + self.memory_bound + self.tp + self.cp + self.ep + self.p2p
    }
}

fn stage_time(setup: &Setup<'_>, stage: &StageInfo) -> StageTime {
    let model = &setup.recipe.model;
    let d = setup.layout.degrees;
    let spec = &setup.spec;
    let precision = &setup.recipe.precision;
    let (tp, cp, ep, etp) = (
        f64::from(d.tp),
        f64::from(d.cp),
        f64::from(d.ep),
        f64::from(d.etp),
    );
    let tokens = setup.local_tokens();
    let sp = setup.sequence_shards();
    let h = f64::from(model.hidden_size);
    let f = f64::from(model.ffn_hidden_size());
    let layers = f64::from(stage.num_layers);
    let moe_layers = f64::from(stage.moe_layers);
    let dense_layers = layers - moe_layers;
    let recompute = setup.recipe.recompute.granularity;

    // GEMMs: the FLOPs of this stage's layers for this GPU's tokens, sharded over tensor ranks.
    let mut gemm = tokens
        * (layers * attention_projections_per_layer_token(model)
            + dense_layers * dense_mlp_per_layer_token(model)
            + moe_layers * moe_mlp_per_layer_token(model))
        / tp;
    // A recomputed layer runs its forward twice: 4/3 of its GEMMs; a recomputed MLP block,
    // 4/3 of the MLP's.
    let recomputed = recomputed_share(setup, stage);
    gemm *= 1.0 + recomputed / 3.0;
    if setup.recipe.recompute.recomputes_mlp() {
        gemm += tokens * dense_layers * dense_mlp_per_layer_token(model) / tp / 3.0;
    }
    if stage.has_output_layer {
        // The linear loss fusion recomputes the logits in the backward: a fourth product.
        let products = match setup.recipe.runtime.cross_entropy_fusion_impl {
            CrossEntropyFusionImpl::Native => 1.0,
            CrossEntropyFusionImpl::Linear => 4.0 / 3.0,
        };
        gemm += products * tokens * logits_per_token(model, setup.padded_vocab) / tp;
    }
    // Core attention over the full (causal) sequence for this rank's queries, of which a sliding
    // window computes only its band.
    let mut attention = tokens
        * layers
        * core_attention_per_layer_token(model, f64::from(model.seq_length))
        * window_share(model)
        / tp;
    // Selective recomputation recomputes every layer's core attention where it keeps scores;
    // the fused (flash) attention keeps only its softmax statistics, so the runtime keeps the
    // layer as it is (`RecomputePolicy::Keep`) and its backward already recomputes the rest.
    if recompute == RecomputeGranularity::Selective && !setup.flash_attention() {
        attention *= 4.0 / 3.0;
    } else {
        attention *= 1.0 + recomputed / 3.0;
    }
    // The fp8 layers' projections (and dense MLPs) at the fp8 rate, the rest at bf16's.
    let fp8 = crate::fp8::fp8_layers(setup.recipe, stage, setup.whole_experts());
    let fp8_gemm = if spec.supports_fp8() {
        (1.0 + recomputed / 3.0)
            * tokens
            * (fp8.all * attention_projections_per_layer_token(model)
                + fp8.dense * dense_mlp_per_layer_token(model))
            / tp
    } else {
        0.0
    };
    let gemm_rate = spec.peak(precision.dtype, Fp8::None) * spec.gemm_efficiency;
    let fp8_rate = spec.peak(precision.dtype, precision.fp8)
        * spec.gemm_efficiency
        * crate::fp8::FP8_EFFICIENCY;
    // The routed experts' GEMMs (bf16) at their own rate, per expert or grouped (`routed.rs`);
    // those of fp8-experts layers on the fp8 device-count kernel.
    let routed = (1.0 + recomputed / 3.0) * tokens * routed_experts_per_layer_token(model) / tp;
    let fp8_experts = if spec.supports_fp8() {
        fp8.experts
    } else {
        0.0
    };
    let (grouped, fp8_grouped) = (routed * (moe_layers - fp8_experts), routed * fp8_experts);
    let grouped_rate = spec.peak(precision.dtype, Fp8::None)
        * crate::routed::routed_gemm_efficiency(setup, tokens);
    let fp8_grouped_rate = spec.peak(precision.dtype, precision.fp8)
        * spec.device_counts_gemm_efficiency
        * crate::fp8::FP8_EFFICIENCY;
    let gemm_time = (gemm - fp8_gemm - grouped - fp8_grouped) / gemm_rate
        + fp8_gemm / fp8_rate
        + grouped / grouped_rate
        + fp8_grouped / fp8_grouped_rate;
    let attention_rate = spec.peak(precision.dtype, Fp8::None) * spec.attention_efficiency;
    // Attention dropout draws a random number for every score the kernel computes (the
    // forward's mask, regenerated in the backward): a cost per causal score, not per FLOP.
    let dropout_scores = if model.attention_dropout > 0.0 {
        tokens * layers * f64::from(model.num_attention_heads) / tp * f64::from(model.seq_length)
            / 2.0
            * window_share(model)
            * (1.0 + recomputed / 3.0)
    } else {
        0.0
    };
    let attention_time =
        attention / attention_rate + dropout_scores * spec.attention_dropout_seconds_per_score();
    let compute = gemm_time + attention_time;

    // Memory-bound work: ~36 passes over the hidden state (norms, residuals, dropout, RoPE,
    // forward and backward) and 6 over the FFN activations (GELU's; SwiGLU's input is twice as
    // wide: [`ffn_passes`]), 2 bytes each, at the fraction of HBM bandwidth the GPU kind's fit
    // found.
    // fp8 adds the casts of the GEMM operands, at the cast kernels' own fraction of HBM.
    // An MoE layer's FFN passes run over its routed rows (top-k expert widths, sharded over
    // etp, and the shared expert's), and its tokens pass through the dispatch and combine:
    // [`moe_routing_bytes_per_token`].
    let (moe_width, moe_routing) = match &model.moe {
        Some(moe) => (
            f64::from(moe.router_topk) * f64::from(moe.expert_ffn_hidden_size(model)) / etp
                + f64::from(moe.shared_expert_ffn_hidden_size.unwrap_or(0)) / tp,
            moe_routing_bytes_per_token(f64::from(moe.router_topk), h),
        ),
        None => (0.0, 0.0),
    };
    let elementwise_bytes = tokens
        * (layers * 36.0 * 2.0 * h / sp
            + ffn_passes(model) * 2.0 * (dense_layers * f / tp + moe_layers * moe_width)
            + moe_layers * moe_routing / sp);
    let cast_bytes = tokens * crate::fp8::cast_bytes_per_token(setup.recipe, fp8, tp);
    let memory_bound = elementwise_bytes / (spec.memory_bandwidth * spec.memory_bound_efficiency)
        + cast_bytes / (spec.memory_bandwidth * crate::fp8::CAST_BANDWIDTH_EFFICIENCY);

    let activation_bytes = 2.0 * tokens * h;
    let latency = spec.collective_latency;
    // TP: 2 all-reduces forward and 2 backward per layer (with sequence parallelism, the same
    // volume as all-gathers plus reduce-scatters).
    let tp_bandwidth = setup.bandwidth(d.tp);
    let tp_time = layers * 4.0 * all_reduce(activation_bytes, tp, tp_bandwidth, latency);
    // CP: ring exchange of K and V (forward) and of K, V, dK, dV (backward), cp − 1 steps,
    // hidden behind core attention when it is long enough.
    // Multi-latent attention exchanges every head's key (d_q) and value (d_v).
    let kv_bytes = match &model.mla {
        Some(mla) => {
            let heads = f64::from(model.num_attention_heads) / tp;
            2.0 * tokens * heads * f64::from(mla.q_head_dim() + mla.v_head_dim)
        }
        None => {
            let kv_heads = (f64::from(model.num_query_groups()) / tp).max(1.0);
            2.0 * tokens * 2.0 * kv_heads * f64::from(model.kv_channels())
        }
    };
    let cp_bandwidth = setup.bandwidth(d.tp * d.cp);
    let cp_comm = if d.cp > 1 {
        layers * 3.0 * (cp - 1.0) * (kv_bytes / cp_bandwidth + latency)
    } else {
        0.0
    };
    let cp_exposed = (cp_comm - attention_time).max(0.0);
    // EP: dispatch and combine all-to-alls, forward and backward, of the routed tokens.
    let ep_time = match &model.moe {
        Some(moe) if d.ep > 1 => {
            let routed = tokens / sp * f64::from(moe.router_topk) * 2.0 * h * etp;
            let bandwidth = setup.bandwidth(d.etp * d.ep);
            moe_layers * 4.0 * ((ep - 1.0) / ep * routed / bandwidth + latency)
        }
        _ => 0.0,
    };
    // PP: send activations forward and gradients backward at every chunk boundary.
    let p2p = if d.pp > 1 {
        // Neighbouring stages are world/pp ranks apart.
        let bandwidth = setup.bandwidth(d.world_size() / d.pp + 1);
        f64::from(d.vpp) * 2.0 * (activation_bytes / sp / bandwidth + latency)
    } else {
        0.0
    };
    let terms = vec![
        setup.term(
            "GEMM compute",
            gemm_time,
            || format!(
                "bf16 GEMM FLOPs / (peak × efficiency) + fp8 GEMM FLOPs / (fp8 peak × efficiency × {}){}{} = {:.4e} / ({:.4e} × {}) + {fp8_gemm:.4e} / {fp8_rate:.4e}{}{}",
                crate::fp8::FP8_EFFICIENCY,
                if grouped > 0.0 { " + grouped expert GEMM FLOPs / (peak × grouped efficiency)" } else { "" },
                if fp8_grouped > 0.0 { " + fp8 expert GEMM FLOPs / (fp8 peak × device-count efficiency × fp8 factor)" } else { "" },
                gemm - fp8_gemm - grouped - fp8_grouped,
                spec.peak(precision.dtype, Fp8::None),
                spec.gemm_efficiency,
                if grouped > 0.0 { format!(" + {grouped:.4e} / {grouped_rate:.4e}") } else { String::new() },
                if fp8_grouped > 0.0 { format!(" + {fp8_grouped:.4e} / {fp8_grouped_rate:.4e}") } else { String::new() },
            ),),
        setup.term(
            "core attention compute",
            attention_time,
            || format!(
                "causal attention FLOPs / (peak × attention efficiency) + dropout's causal scores × seconds a score = {attention:.4e} / ({:.4e} × {}) + {dropout_scores:.4e} × {:.2e}",
                spec.peak(precision.dtype, Fp8::None),
                spec.attention_efficiency,
                spec.attention_dropout_seconds_per_score()
            ),),
        setup.term(
            "memory-bound element-wise work",
            memory_bound,
            || {
                let hbm = spec.memory_bandwidth;
                let elementwise = format!(
                    "s·b·(L·72·h/sp + 2·passes·(L_dense·f/tp + L_moe·(k·f_e/etp + f_shared/tp)) + L_moe·(12k+6)·h/sp) bytes / (HBM × efficiency) = {elementwise_bytes:.4e} / ({hbm:.3e} × {})",
                    spec.memory_bound_efficiency
                );
                if cast_bytes > 0.0 {
                    let cast = crate::fp8::CAST_BANDWIDTH_EFFICIENCY;
                    format!("{elementwise}, + fp8 cast bytes / (HBM × cast efficiency) = {cast_bytes:.4e} / ({hbm:.3e} × {cast})")
                } else {
                    elementwise
                }
            },),
        setup.term(
            "tensor-parallel collectives",
            tp_time,
            || format!(
                "L · 4 · 2(tp−1)/tp · 2·s·b·h / bus_bw = {layers} · 4 · all_reduce({activation_bytes:.4e} B, {tp}, {tp_bandwidth:.3e} B/s)"
            ),),
        setup.term(
            "context-parallel ring exchange (exposed)",
            cp_exposed,
            || format!(
                "max(0, L · 3(cp−1) · kv_bytes / bw − attention) = max(0, {cp_comm:.4e} − {:.4e})",
                attention / attention_rate
            ),),
        setup.term(
            "expert-parallel all-to-all",
            ep_time,
            || "L_moe · 4 · (ep−1)/ep · k·s·b/sp·2h·etp / bw".to_owned(),),
        setup.term(
            "pipeline send/receive",
            p2p,
            || format!("vpp · 2 · (2·s·b·h/sp / bw + latency) = {} · 2 · …", d.vpp),),
    ];
    StageTime {
        compute,
        memory_bound,
        tp: tp_time,
        cp: cp_exposed,
        ep: ep_time,
        p2p,
        terms,
    }
}

/// Passes over an FFN-wide tensor (`f` elements a token) the element-wise term counts: 6 for
/// GELU, as fitted; SwiGLU's input is `2f` wide, so its passes read and write 8 `f`-wide
/// tensors where GELU's read and write 5 (forward: 3 against 2; backward: 5 against 3).
fn ffn_passes(model: &ferrotron_recipe::Model) -> f64 {
    match model.activation {
        ferrotron_recipe::Activation::Swiglu => 6.0 * 8.0 / 5.0,
        ferrotron_recipe::Activation::Gelu | ferrotron_recipe::Activation::GeluTanh => 6.0,
    }
}

/// Bytes an MoE layer's dispatch and combine move per token, forward and backward, 2 bytes an
/// element: the dispatch gathers each token's `k` routed rows (read and write `k·h`) and its
/// backward sums them back (read `k·h`, write `h`); the combine reads the `k` expert outputs
/// and writes the weighted sum (`(k+1)·h`), and its backward writes the `k` rows' gradients
/// and reads the rows again for the weights' gradients (`(2k+1)·h`): `(12k + 6)·h`.
fn moe_routing_bytes_per_token(topk: f64, h: f64) -> f64 {
    2.0 * (2.0 * topk + (topk + 1.0) + (topk + 1.0) + (2.0 * topk + 1.0)) * h
}

/// Local parameters that take part in the dense and the expert gradient reduction.
fn gradient_parameters(setup: &Setup<'_>, memory_params: f64, stage: &StageInfo) -> (f64, f64) {
    let model = &setup.recipe.model;
    let d = setup.layout.degrees;
    let expert = match &model.moe {
        Some(moe) => {
            f64::from(stage.moe_layers) * setup.params.experts_per_moe_layer as f64
                / f64::from(moe.num_experts)
                * (f64::from(moe.num_experts) / f64::from(d.ep))
                / f64::from(d.etp)
        }
        None => 0.0,
    };
    ((memory_params - expert).max(0.0), expert)
}

/// The time model for the whole iteration.
pub(crate) fn predict(
    setup: &Setup<'_>,
    flops_per_iteration: f64,
    stage_params: &[f64],
) -> Predicted {
    let d = setup.layout.degrees;
    let spec = &setup.spec;
    let m = f64::from(setup.num_microbatches);
    let stage_times: Vec<StageTime> = setup.stages.iter().map(|s| stage_time(setup, s)).collect();
    let (slowest, slow) = stage_times
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total().total_cmp(&b.1.total()))
        .expect("a plan has at least one stage");
    let per_microbatch = slow.total();
    let bubble_microbatches = f64::from(d.pp - 1) / f64::from(d.vpp);
    let pipelined = (m + bubble_microbatches) * per_microbatch;
    let bubble = bubble_microbatches * per_microbatch;

    // Data parallel: gradients (4 B) reduced, parameters (2 B) gathered with the distributed
    // optimizer, over dp·cp for dense and edp for expert parameters; overlap hides them behind
    // the last microbatch's backward (grads) and the first one's forward (params).
    let stage = &setup.stages[slowest];
    let (dense_params, expert_params) = gradient_parameters(setup, stage_params[slowest], stage);
    let distributed = setup.recipe.parallel.distributed_optimizer;
    let dense_group = f64::from(d.dp * d.cp);
    let dense_bw = setup.bandwidth(d.tp * d.cp * d.dp);
    let expert_group = f64::from(d.edp);
    let expert_bw = setup.bandwidth(d.etp * d.ep * d.edp);
    let latency = spec.collective_latency;
    let (grad_time, param_time) = if distributed {
        (
            gather(4.0 * dense_params, dense_group, dense_bw, latency)
                + gather(4.0 * expert_params, expert_group, expert_bw, latency),
            gather(2.0 * dense_params, dense_group, dense_bw, latency)
                + gather(2.0 * expert_params, expert_group, expert_bw, latency),
        )
    } else {
        (
            all_reduce(4.0 * dense_params, dense_group, dense_bw, latency)
                + all_reduce(4.0 * expert_params, expert_group, expert_bw, latency),
            0.0,
        )
    };
    let compute_per_microbatch = slow.compute;
    let grad_exposed = if setup.recipe.parallel.overlap_grad_reduce {
        (grad_time - 2.0 / 3.0 * compute_per_microbatch).max(0.0)
    } else {
        grad_time
    };
    let param_exposed = if distributed && setup.recipe.parallel.overlap_param_gather {
        (param_time - compute_per_microbatch / 3.0).max(0.0)
    } else {
        param_time
    };
    let dp_exposed = grad_exposed + param_exposed;

    // Optimizer: Adam over the parameters this GPU owns and keeps, ~34 bytes of HBM traffic
    // each; the share the CPU offload moves runs on the host instead.
    let owned = if distributed {
        dense_params / dense_group + expert_params / expert_group
    } else {
        dense_params + expert_params
    };
    let on_device = 1.0 - setup.offload_fraction;
    let optimizer = 34.0 * owned * on_device / spec.memory_bandwidth;
    let (offload, offload_terms) = if setup.offload_fraction > 0.0 {
        crate::offload::step_time(setup, &crate::memory::stage_optimizer_parameters(setup))
    } else {
        (0.0, Vec::new())
    };

    let step = pipelined + dp_exposed + optimizer + offload;
    let world = f64::from(d.world_size());
    let tokens = f64::from(setup.recipe.training.global_batch_size)
        * f64::from(setup.recipe.model.seq_length);
    let peak = spec.mfu_peak(setup.recipe.precision.dtype);
    let scale = m;
    let breakdown = Breakdown {
        compute: slow.compute * scale,
        memory_bound: slow.memory_bound * scale,
        tensor_parallel_comm: slow.tp * scale,
        context_parallel_comm: slow.cp * scale,
        expert_parallel_comm: slow.ep * scale,
        pipeline_p2p: slow.p2p * scale,
        pipeline_bubble: bubble,
        data_parallel_comm: dp_exposed,
        optimizer,
        optimizer_offload: offload,
    };
    let mut terms: Vec<Term> = slow
        .terms
        .iter()
        .map(|t| Term {
            name: format!("per microbatch, stage {slowest}: {}", t.name),
            ..t.clone()
        })
        .collect();
    terms.extend([
        setup.term(
            "pipelined microbatches incl. bubble",
            pipelined,
            || format!(
                "(m + (pp−1)/vpp) · t_microbatch = ({m} + {bubble_microbatches}) · {per_microbatch:.6}"
            ),),
        setup.term(
            "data-parallel gradient reduce (exposed)",
            grad_exposed,
            || format!(
                "{} of 4 B × {:.0} dense params over {dense_group} ranks + {:.0} expert params over {expert_group}, minus overlap with the last backward",
                if distributed { "reduce-scatter" } else { "all-reduce" },
                dense_params,
                expert_params
            ),),
        setup.term(
            "distributed-optimizer parameter all-gather (exposed)",
            param_exposed,
            || "all-gather of 2 B × params over the same groups, minus overlap with the first forward".to_owned(),),
        setup.term(
            "optimizer step",
            optimizer,
            || if on_device < 1.0 {
                format!("34 B × {owned:.0} owned params × {on_device} on the GPU / HBM {:.3e} B/s", spec.memory_bandwidth)
            } else {
                format!("34 B × {owned:.0} owned params / HBM {:.3e} B/s", spec.memory_bandwidth)
            },),
    ]);
    terms.extend(offload_terms);
    terms.push(setup.term("step", step, || {
        if offload > 0.0 {
            "pipelined + data-parallel exposed + optimizer + optimizer offload".to_owned()
        } else {
            "pipelined + data-parallel exposed + optimizer".to_owned()
        }
    }));
    Predicted {
        step_seconds: step,
        tokens_per_second_per_gpu: tokens / (step * world),
        mfu: flops_per_iteration / (step * world * peak),
        bubble_fraction: bubble / step,
        slowest_stage: slowest as u32,
        breakdown,
        terms,
    }
}

/// The share of `stage`'s layers whose whole forward is recomputed in the backward: every one
/// under full recomputation's `uniform` method, the first `num_layers` of each model chunk under
/// `block` (Megatron's `--recompute-method block`), none otherwise.
fn recomputed_share(setup: &Setup<'_>, stage: &StageInfo) -> f64 {
    let recompute = &setup.recipe.recompute;
    if recompute.granularity != RecomputeGranularity::Full || stage.num_layers == 0 {
        return 0.0;
    }
    match (recompute.method, recompute.num_layers) {
        (Some(RecomputeMethod::Block), Some(n)) => {
            let vpp = f64::from(setup.layout.degrees.vpp);
            let layers = f64::from(stage.num_layers);
            (f64::from(n).min(layers / vpp) * vpp / layers).min(1.0)
        }
        _ => 1.0,
    }
}

#[cfg(test)]
mod tests {
    use ferrotron_recipe::{Cluster, GpuKind};

    use super::*;
    use crate::layout::{Degrees, Layout};
    use crate::memory::stage_local_parameters;
    use crate::params::parameter_count;
    use crate::search::setup;
    use crate::testing::llama3_8b;

    /// Micro batch 1 at these degrees, etp = tp and edp = dp.
    fn layout(tp: u32, pp: u32, vpp: u32, dp: u32) -> Layout {
        Layout {
            degrees: Degrees {
                tp,
                pp,
                vpp,
                cp: 1,
                ep: 1,
                etp: tp,
                dp,
                edp: dp,
            },
            micro_batch_size: 1,
        }
    }

    fn predicted(tp: u32, pp: u32, vpp: u32, dp: u32, nodes: u32, gpus_per_node: u32) -> Predicted {
        let recipe = llama3_8b();
        let params = parameter_count(&recipe.model, 128256);
        let cluster = Cluster {
            nodes,
            gpus_per_node,
            gpu: GpuKind::H200,
        };
        let s = setup(
            &recipe,
            &cluster,
            layout(tp, pp, vpp, dp),
            params,
            128256,
            true,
        );
        let flops = crate::flops::flops_per_iteration(&recipe, 128256, 128);
        predict(&s, flops, &stage_local_parameters(&s))
    }

    /// The memory-bound seconds of one microbatch of `recipe` on one H200, one rank.
    fn memory_bound_on_one_gpu(recipe: &ferrotron_recipe::Recipe) -> f64 {
        let padded = recipe.model.padded_vocab_size(32000, 1);
        let params = parameter_count(&recipe.model, padded);
        let cluster = Cluster {
            nodes: 1,
            gpus_per_node: 1,
            gpu: GpuKind::H200,
        };
        let s = setup(recipe, &cluster, layout(1, 1, 1, 1), params, padded, false);
        stage_time(&s, &s.stages[0]).memory_bound
    }

    #[test]
    fn attention_dropout_costs_its_seconds_a_causal_score() {
        let mut dropout = llama3_8b();
        dropout.model.attention_dropout = 0.1;
        let mut without = llama3_8b();
        without.model.attention_dropout = 0.0;
        let attention_seconds = |recipe: &ferrotron_recipe::Recipe| {
            let params = parameter_count(&recipe.model, 128256);
            let cluster = Cluster {
                nodes: 1,
                gpus_per_node: 1,
                gpu: GpuKind::H100,
            };
            let s = setup(recipe, &cluster, layout(1, 1, 1, 1), params, 128256, false);
            let t = stage_time(&s, &s.stages[0]);
            t.terms
                .iter()
                .find(|t| t.name == "core attention compute")
                .expect("attention term")
                .value
        };
        let m = &dropout.model;
        // b·heads·s²/2 a layer, one sequence
        let scores = f64::from(m.num_layers)
            * f64::from(m.num_attention_heads)
            * f64::from(m.seq_length).powi(2)
            / 2.0;
        let per_score =
            crate::hardware::GpuSpec::of(GpuKind::H100).attention_dropout_seconds_per_score();
        let added = attention_seconds(&dropout) - attention_seconds(&without);
        assert!(
            (added - scores * per_score).abs() < 1e-9 * added,
            "{added} against {}",
            scores * per_score
        );
    }

    #[test]
    fn an_moe_layers_element_wise_passes_run_over_its_routed_rows_and_its_dispatch() {
        // Mixtral: top-2 of experts as wide as the dense FFN, so its FFN passes cover twice the
        // dense width, and every token is dispatched and combined: (12·2 + 6)·h bytes.
        let mixtral = crate::testing::mixtral_8x7b();
        let mut dense = mixtral.clone();
        dense.model.moe = None;
        let m = &mixtral.model;
        let tokens = f64::from(m.seq_length);
        let extra_bytes = f64::from(m.num_layers)
            * tokens
            * (ffn_passes(m) * 2.0 * f64::from(m.ffn_hidden_size())
                + 30.0 * f64::from(m.hidden_size));
        let spec = crate::hardware::GpuSpec::of(GpuKind::H200);
        let extra = extra_bytes / (spec.memory_bandwidth * spec.memory_bound_efficiency);
        let difference = memory_bound_on_one_gpu(&mixtral) - memory_bound_on_one_gpu(&dense);
        assert!(
            (difference - extra).abs() < 1e-9 * extra,
            "{difference} against {extra}"
        );
    }

    #[test]
    fn collective_formulas() {
        // Ring all-reduce: 2(n−1)/n · bytes / bandwidth.
        assert!((all_reduce(1e9, 4.0, 100e9, 0.0) - 0.015).abs() < 1e-12);
        assert!((gather(1e9, 4.0, 100e9, 0.0) - 0.0075).abs() < 1e-12);
        assert_eq!(all_reduce(1e9, 1.0, 100e9, 1.0), 0.0);
    }

    #[test]
    fn bubble_is_pp_minus_one_over_vpp_microbatches() {
        // 1 node of 8: tp 1, pp 4, dp 2 -> m = 128 / 2 = 64.
        let p = predicted(1, 4, 1, 2, 1, 8);
        let b = p.breakdown;
        let per_microbatch_total = b.compute
            + b.memory_bound
            + b.tensor_parallel_comm
            + b.context_parallel_comm
            + b.expert_parallel_comm
            + b.pipeline_p2p;
        assert!((b.pipeline_bubble * 64.0 / per_microbatch_total - 3.0).abs() < 1e-9);
        let interleaved = predicted(1, 4, 2, 2, 1, 8).breakdown;
        let total = interleaved.compute
            + interleaved.memory_bound
            + interleaved.tensor_parallel_comm
            + interleaved.pipeline_p2p;
        assert!((interleaved.pipeline_bubble * 64.0 / total - 1.5).abs() < 1e-9);
    }

    #[test]
    fn mfu_is_below_the_gemm_efficiency() {
        let p = predicted(1, 1, 1, 8, 1, 8);
        assert!(p.mfu > 0.3 && p.mfu < 0.80, "{}", p.mfu);
        assert_eq!(p.breakdown.tensor_parallel_comm, 0.0);
        let expected_tokens = 128.0 * 8192.0 / (p.step_seconds * 8.0);
        assert!((p.tokens_per_second_per_gpu - expected_tokens).abs() < 1e-6);
    }

    #[test]
    fn tensor_parallel_across_nodes_is_slower_than_within_one() {
        let within = predicted(8, 1, 1, 2, 2, 8);
        let across = predicted(8, 1, 1, 2, 4, 4);
        assert!(
            across.breakdown.tensor_parallel_comm > 5.0 * within.breakdown.tensor_parallel_comm
        );
        assert!(across.step_seconds > within.step_seconds);
    }

    #[test]
    fn block_recomputation_costs_its_share_of_full_recomputation() {
        let compute = |granularity, method, num_layers| {
            let mut recipe = llama3_8b();
            recipe.recompute = ferrotron_recipe::Recompute {
                granularity,
                method,
                num_layers,
                modules: Vec::new(),
            };
            let params = parameter_count(&recipe.model, 128256);
            let cluster = Cluster {
                nodes: 1,
                gpus_per_node: 8,
                gpu: GpuKind::H100,
            };
            let layout = Layout {
                degrees: Degrees {
                    dp: 8,
                    edp: 8,
                    ..Degrees::ONE
                },
                micro_batch_size: 1,
            };
            let s = setup(&recipe, &cluster, layout, params, 128256, true);
            let flops = crate::flops::flops_per_iteration(&recipe, 128256, 128);
            predict(&s, flops, &stage_local_parameters(&s))
                .breakdown
                .compute
        };
        use RecomputeGranularity::{Full, None};
        let none = compute(None, Option::None, Option::None);
        let full = compute(Full, Some(RecomputeMethod::Uniform), Some(1));
        // Llama 3 8B has 32 layers: a block of 8 recomputes a quarter of them.
        let block = compute(Full, Some(RecomputeMethod::Block), Some(8));
        assert!(full > none);
        assert!(
            (block - (none + (full - none) / 4.0)).abs() < 1e-9 * full,
            "{block}"
        );
        // a block as long as the stage is full recomputation
        let all = compute(Full, Some(RecomputeMethod::Block), Some(32));
        assert!((all - full).abs() < 1e-12 * full);
    }
}
