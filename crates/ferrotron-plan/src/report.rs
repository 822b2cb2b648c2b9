//! The human-readable plan: compact enough to read before asking for GPUs, with `--explain`
//! adding every term of the memory and time models and its formula.

use std::fmt::Write;

use ferrotron_recipe::GpuKind;

use crate::flat_step;
use crate::hardware::gpu_name;
use crate::memory::MemoryBytes;
use crate::offload::{self, HostMemory};
use crate::plan::Plan;
use crate::stages::StageInfo;

const GIB: f64 = (1u64 << 30) as f64;
const SHOWN_STAGES: usize = 16;

fn count(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.2} B", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.1} M", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1} K", n / 1e3)
    } else {
        format!("{n}")
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / GIB)
}

fn stage_layers(stage: &StageInfo) -> String {
    let ranges: Vec<String> = stage
        .chunks
        .iter()
        .filter(|c| c.num_layers > 0)
        .map(|c| {
            if c.num_layers == 1 {
                format!("{}", c.first_layer)
            } else {
                format!("{}-{}", c.first_layer, c.first_layer + c.num_layers - 1)
            }
        })
        .collect();
    let mut text = format!("layers {} ({})", ranges.join(", "), stage.num_layers);
    if stage.has_embedding {
        text.push_str(" + embedding");
    }
    if stage.has_output_layer {
        text.push_str(" + output layer");
    }
    text
}

fn groups_line(out: &mut String, name: &str, groups: &[Vec<u32>]) {
    if let Some(first) = groups.first() {
        let example: Vec<String> = first.iter().take(8).map(u32::to_string).collect();
        let more = if first.len() > 8 { ", …" } else { "" };
        let _ = writeln!(
            out,
            "  {name:<9} {} groups of {:<5} e.g. [{}{more}]",
            groups.len(),
            first.len(),
            example.join(", ")
        );
    }
}

fn memory_row(out: &mut String, label: &str, bytes: u64) {
    let _ = writeln!(out, "  {label:<20} {:>12}", gib(bytes));
}

fn total_row(out: &mut String, total: u64, limit: u64) {
    let _ = writeln!(
        out,
        "  {:<20} {:>12} of {} ({})",
        "total",
        gib(total),
        gib(limit),
        if total <= limit {
            "fits"
        } else {
            "DOES NOT FIT"
        }
    );
}

/// The host memory of the most loaded node under the optimizer CPU offload or asynchronous
/// saves.
fn host_memory(out: &mut String, plan: &Plan, host: &HostMemory) {
    let what = if host.offload_fraction > 0.0 {
        format!(
            "optimizer CPU offload of {}% of each rank's optimizer state",
            100.0 * host.offload_fraction
        )
    } else {
        "asynchronous checkpoint saves".to_owned()
    };
    let _ = writeln!(
        out,
        "host memory per node ({what}; most loaded: node {}, {} rank(s) per node)",
        host.most_loaded_node, plan.cluster.gpus_per_node
    );
    if host.offload_fraction > 0.0 {
        memory_row(out, "optimizer states", host.optimizer_states);
        memory_row(out, "transfer buffers", host.transfer_buffers);
    }
    if host.snapshot_page_locked > 0 {
        memory_row(out, "snapshot, page-locked", host.snapshot_page_locked);
    }
    if host.save_in_flight > 0 {
        memory_row(out, "async save in flight", host.save_in_flight);
    }
    memory_row(out, "reserved", host.reserved);
    total_row(out, host.total, host.limit_bytes);
}

/// The step time the optimizer CPU offload adds, by part.
fn offload_time(out: &mut String, plan: &Plan) {
    let t = &plan.predicted;
    let part = |name: &str| {
        t.terms
            .iter()
            .find(|term| term.name == name)
            .map_or(0.0, |term| term.value)
    };
    let _ = writeln!(
        out,
        "  optimizer offload    {:.3} s, {:.1}% of the step: the slowest of gradients down {:.3} s, AdamW on the host {:.3} s, weights up {:.3} s (overlapped)",
        t.breakdown.optimizer_offload,
        100.0 * t.breakdown.optimizer_offload / t.step_seconds,
        part(offload::GRADIENTS_DOWN),
        part(offload::HOST_ADAMW),
        part(offload::WEIGHTS_UP)
    );
}

fn peak(plan: &Plan) -> String {
    let flops = plan.hardware.peak_flops;
    if plan.cluster.gpu == GpuKind::Cpu {
        format!("{:.0} GFLOP/s (nominal cpu rank)", flops / 1e9)
    } else {
        format!("{:.0} TFLOP/s", flops / 1e12)
    }
}

/// The compact report printed by `recipe plan`.
pub fn render_human(plan: &Plan) -> String {
    let mut out = String::new();
    let d = plan.degrees;
    let c = &plan.cluster;
    let r = &plan.recipe;
    let _ = writeln!(
        out,
        "plan: {} on {} node(s) × {} {} = {} ranks",
        r.name,
        c.nodes,
        c.gpus_per_node,
        gpu_name(c.gpu),
        plan.world_size
    );
    let _ = writeln!(
        out,
        "  degrees   tp {} · cp {} · dp {} · pp {} (virtual {}) · ep {} · etp {} · edp {}; sequence parallel {}",
        d.tp,
        d.cp,
        d.dp,
        d.pp,
        d.vpp,
        d.ep,
        d.etp,
        d.edp,
        if r.parallel.sequence_parallel {
            "on"
        } else {
            "off"
        }
    );
    let _ = writeln!(
        out,
        "  batch     global {} = micro {} × dp {} × {} microbatches; seq {}; {} iterations",
        plan.global_batch_size,
        plan.micro_batch_size,
        d.dp,
        plan.num_microbatches,
        r.model.seq_length,
        plan.train_iters
    );
    let _ = writeln!(
        out,
        "  vocab     {} padded to {} (multiple of {} × tp {})",
        plan.vocab_size, plan.padded_vocab_size, r.model.make_vocab_size_divisible_by, d.tp
    );
    let p = &plan.parameters;
    let _ = writeln!(
        out,
        "  params    {} total, {} active per token ({} non-embedding); embedding {}",
        count(p.total),
        count(p.active()),
        count(p.active_non_embedding),
        count(p.embedding)
    );

    let _ = writeln!(out, "groups (Megatron order tp-cp-ep-dp-pp)");
    let g = &plan.groups;
    for (name, table) in [
        ("tp", &g.tp),
        ("cp", &g.cp),
        ("dp", &g.dp),
        ("dp×cp", &g.dp_cp),
        ("pp", &g.pp),
        ("ep", &g.ep),
        ("expert-dp", &g.edp),
        ("embedding", &g.embedding),
    ] {
        groups_line(&mut out, name, table);
    }

    let _ = writeln!(out, "stages");
    for (stage, bytes) in plan
        .stages
        .iter()
        .zip(&plan.memory.per_stage)
        .take(SHOWN_STAGES)
    {
        let _ = writeln!(
            out,
            "  stage {:<3} {:<48} {:>12} per GPU",
            stage.pipeline_rank,
            stage_layers(stage),
            gib(bytes.total)
        );
    }
    if plan.stages.len() > SHOWN_STAGES {
        let _ = writeln!(out, "  … {} more stages", plan.stages.len() - SHOWN_STAGES);
    }

    let m = &plan.memory;
    let phase = flat_step::peak_phase(&m.terms);
    let _ = writeln!(
        out,
        "memory per GPU (most loaded: stage {}, rank {}; {} parameters on it{})",
        m.most_loaded_stage,
        m.most_loaded_rank,
        count(m.parameters_per_gpu),
        phase
            .map(|p| format!("; peak in the {p}"))
            .unwrap_or_default()
    );
    let b: MemoryBytes = m.per_gpu_bytes;
    let update = phase == Some(flat_step::UPDATE_PHASE);
    memory_row(
        &mut out,
        if update {
            "weights + new copy"
        } else {
            "weights"
        },
        b.weights,
    );
    memory_row(&mut out, "gradients", b.gradients);
    memory_row(
        &mut out,
        if r.parallel.distributed_optimizer {
            "optimizer (sharded)"
        } else {
            "optimizer"
        },
        b.optimizer,
    );
    memory_row(
        &mut out,
        if update {
            "activations (pool)"
        } else {
            "activations"
        },
        b.activations,
    );
    memory_row(&mut out, "framework overhead", b.framework_overhead);
    total_row(&mut out, b.total, m.limit_bytes);
    if let Some(host) = &m.host {
        host_memory(&mut out, plan, host);
    }

    let t = &plan.predicted;
    let _ = writeln!(out, "compute");
    let _ = writeln!(
        out,
        "  FLOPs/iteration      {:.4e} (Megatron's formula)",
        plan.flops_per_iteration
    );
    let _ = writeln!(
        out,
        "  predicted step       {:.3} s, {:.0} tokens/s/GPU, MFU {:.1}% of {}",
        t.step_seconds,
        t.tokens_per_second_per_gpu,
        100.0 * t.mfu,
        peak(plan)
    );
    let _ = writeln!(
        out,
        "  pipeline bubble      {:.1}% of the step (slowest stage {})",
        100.0 * t.bubble_fraction,
        t.slowest_stage
    );
    if t.breakdown.optimizer_offload > 0.0 {
        offload_time(&mut out, plan);
    }

    if let Some(auto) = &plan.auto {
        let _ = writeln!(
            out,
            "auto ({}): {} layouts searched, {} valid, {} fit; best first",
            auto.resolved.join(", "),
            auto.searched,
            auto.valid,
            auto.fitting
        );
        for (rank, cand) in auto.top.iter().enumerate() {
            let d = cand.degrees;
            let _ = writeln!(
                out,
                "  {}. tp {} cp {} dp {} pp {}/{} ep {} etp {} mbs {} recompute {}: {:.0} tokens/s/GPU, MFU {:.1}%; {}",
                rank + 1,
                d.tp,
                d.cp,
                d.dp,
                d.pp,
                d.vpp,
                d.ep,
                d.etp,
                cand.micro_batch_size,
                recompute_name(&cand.recompute),
                cand.tokens_per_second_per_gpu,
                100.0 * cand.mfu,
                cand.why
            );
        }
    }
    for warning in &plan.warnings {
        let _ = writeln!(out, "warning: {warning}");
    }
    let _ = writeln!(out, "plan hash {}", plan.plan_hash);
    out
}

/// Every memory and time term of the plan with its formula, and the hardware assumptions.
pub fn render_explain(plan: &Plan) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "hardware: {}", plan.hardware.source);
    let _ = writeln!(
        out,
        "memory terms (stage {}, one GPU; s = seq/cp, b = micro batch, sp = tp with sequence parallelism else 1)",
        plan.memory.most_loaded_stage
    );
    for term in &plan.memory.terms {
        let value = if term.name.starts_with("parameters") {
            count(term.value as u64)
        } else {
            gib(term.value as u64)
        };
        let _ = writeln!(
            out,
            "  {:<72} {:>12}\n      = {}",
            term.name, value, term.formula
        );
    }
    let _ = writeln!(out, "time terms (seconds)");
    for term in &plan.predicted.terms {
        let _ = writeln!(
            out,
            "  {:<72} {:>12.6}\n      = {}",
            term.name, term.value, term.formula
        );
    }
    out
}

fn recompute_name(recompute: &ferrotron_recipe::Recompute) -> String {
    use ferrotron_recipe::RecomputeGranularity::*;
    use ferrotron_recipe::RecomputeMethod::*;
    match (
        recompute.granularity,
        recompute.method,
        recompute.num_layers,
    ) {
        (Full, Some(Uniform), Some(1)) => "full".to_owned(),
        (Full, Some(Uniform), Some(n)) => format!("full (uniform, {n} layers a chunk)"),
        (Full, Some(Block), Some(n)) => format!("block {n}"),
        (None, ..) => "none".to_owned(),
        (Selective, ..) if recompute.recomputes_mlp() => "selective (mlp)".to_owned(),
        (Selective, ..) => "selective".to_owned(),
        (Full, ..) => "full".to_owned(),
        (Auto, ..) => "auto".to_owned(),
    }
}
