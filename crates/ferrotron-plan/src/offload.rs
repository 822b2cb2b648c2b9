//! The optimizer CPU offload (Megatron's `--optimizer-cpu-offload`): what it takes from the
//! node's host memory and what it adds to the step.
//!
//! Megatron's `HybridDeviceOptimizer` (`_get_sub_optimizer_param_groups`) offloads a rank's
//! parameters in order while the offloaded element count is below `optimizer_offload_fraction`
//! × the rank's total, so each rank offloads that fraction of the parameters whose optimizer
//! state it holds (its shard with the distributed optimizer). The whole tensor that crosses the
//! threshold goes too; the planner does not know the tensor order and counts the fraction
//! exactly. The runtime keeps the offloaded part's fp32 master and both moments (in their
//! dtypes) in host memory, so they leave the device (`memory.rs`, `flat_step.rs`) and fill the
//! node's host memory here; every step the offloaded part's gradients go device → host, AdamW
//! runs on the node's CPU cores (memory-bound, shared by the node's ranks) and the new 16-bit
//! weights come back host → device. The runtime streams the three through page-locked pieces
//! (`FusedOps::host_pass`), each direction's copies overlapping the update of the piece between
//! them, so the step waits for the slowest of the three; filling and draining that pipeline
//! costs one piece of each, well under a millisecond, and is left out.

use ferrotron_recipe::{Cluster, Dtype, GpuKind, Recipe};
use serde::{Deserialize, Serialize};

use crate::memory::{self, bytes_per_parameter};
use crate::setup::Setup;
use crate::term::Term;

/// The fractions the `auto` search chooses are multiples of 1/this (0.05), so the recipe it
/// writes reads as a round number and keeps a little headroom.
pub(crate) const FRACTION_STEPS: f64 = 20.0;

/// The names of the step-time terms, which the report reads back.
pub(crate) const GRADIENTS_DOWN: &str = "optimizer offload: gradients device → host";
pub(crate) const HOST_ADAMW: &str = "optimizer offload: AdamW on the host CPU";
pub(crate) const WEIGHTS_UP: &str = "optimizer offload: weights host → device";

/// Host memory of one node under the optimizer CPU offload or asynchronous saves on GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostMemory {
    /// Share of every rank's optimizer parameters whose state lives in host memory.
    pub offload_fraction: f64,
    /// The node whose ranks offload the most (the first of several).
    pub most_loaded_node: u32,
    /// Its ranks' offloaded state: fp32 master weights and both Adam moments.
    pub optimizer_states: u64,
    /// Its ranks' page-locked transfer pieces.
    pub transfer_buffers: u64,
    /// Its ranks' optimizer state still on their GPUs, page-locked from the first step for an
    /// asynchronous save's snapshot (the device reads land there).
    #[serde(default)]
    pub snapshot_page_locked: u64,
    /// While an asynchronous save is in flight: its ranks' offloaded state once more (the
    /// snapshot being written keeps the old buffers, the next update writes new ones) and the
    /// snapshot of the state on their GPUs as the f32 values the writer writes.
    pub save_in_flight: u64,
    /// What the OS and the processes keep (an assumed allowance per node).
    pub reserved: u64,
    pub total: u64,
    /// Host memory of one node.
    pub limit_bytes: u64,
    pub fits: bool,
}

/// The share of each rank's optimizer state the recipe offloads on `cluster`: none without
/// `optimizer_cpu_offload`, and none on `cpu` ranks, whose state is in host memory already.
pub(crate) fn fraction(recipe: &Recipe, cluster: &Cluster) -> f64 {
    let optimizer = &recipe.training.optimizer;
    if optimizer.optimizer_cpu_offload && cluster.gpu != GpuKind::Cpu {
        optimizer.optimizer_offload_fraction
    } else {
        0.0
    }
}

/// Host bytes of one offloaded parameter: the fp32 master and both moments in their dtypes
/// (an fp32 run's device weight is its master, so the host keeps a copy of it).
fn host_bytes_per_parameter(setup: &Setup<'_>) -> f64 {
    let optimizer = &setup.recipe.training.optimizer;
    4.0 + (optimizer.exp_avg_dtype.bytes() + optimizer.exp_avg_sq_dtype.bytes()) as f64
}

/// The sum over `node`'s ranks of a per-rank quantity that depends only on the rank's
/// pipeline stage. In Megatron's rank order pipeline is outermost, so a stage is world/pp
/// consecutive ranks, and a node is gpus_per_node consecutive ranks.
fn node_sum(setup: &Setup<'_>, node: u32, per_stage: &[f64]) -> f64 {
    let d = setup.layout.degrees;
    let ranks_per_stage = d.world_size() / d.pp;
    let per_node = ranks_per_node(setup);
    (node * per_node..(node + 1) * per_node)
        .map(|rank| per_stage[(rank / ranks_per_stage) as usize])
        .sum()
}

/// The node with the largest [`node_sum`] of `per_stage`: (node, sum).
fn busiest_node(setup: &Setup<'_>, per_stage: &[f64]) -> (u32, f64) {
    let nodes = setup.layout.degrees.world_size() / ranks_per_node(setup);
    let mut busiest = (0, 0.0);
    for node in 0..nodes {
        let sum = node_sum(setup, node, per_stage);
        if sum > busiest.1 {
            busiest = (node, sum);
        }
    }
    busiest
}

/// Whether a plan watches its nodes' host memory: under the optimizer offload, and with
/// asynchronous saves on GPUs, whose snapshots land in (page-locked) host memory.
pub(crate) fn watches_host(setup: &Setup<'_>) -> bool {
    setup.offload_fraction > 0.0
        || (setup.recipe.checkpoint.async_save && setup.cluster.gpu != GpuKind::Cpu)
}

/// Ranks on one node (a single node of a smaller world holds only the world).
fn ranks_per_node(setup: &Setup<'_>) -> u32 {
    setup
        .cluster
        .gpus_per_node
        .min(setup.layout.degrees.world_size())
}

/// The most loaded node's host memory, from the parameters whose optimizer state one rank of
/// every stage holds.
pub(crate) fn host_memory(setup: &Setup<'_>, optimizer_params: &[f64]) -> (HostMemory, Vec<Term>) {
    let fraction = setup.offload_fraction;
    let per_parameter = host_bytes_per_parameter(setup);
    let async_save = setup.recipe.checkpoint.async_save && setup.cluster.gpu != GpuKind::Cpu;
    let ranks = f64::from(ranks_per_node(setup));
    let host = &setup.host;
    let per_rank = |bytes: f64| -> Vec<f64> {
        optimizer_params
            .iter()
            .map(|params| params * bytes)
            .collect()
    };
    let offloaded = per_rank(fraction * per_parameter);
    let on_device = per_rank((1.0 - fraction) * per_parameter);
    // the device part's snapshot is written as f32: master, m and v
    let written = per_rank((1.0 - fraction) * 12.0);
    let buffer = if fraction > 0.0 {
        host.transfer_buffer_bytes
    } else {
        0.0
    };
    let total_per_rank: Vec<f64> = (0..optimizer_params.len())
        .map(|stage| {
            let saving = if async_save {
                offloaded[stage] + on_device[stage] + written[stage]
            } else {
                0.0
            };
            offloaded[stage] + buffer + saving
        })
        .collect();
    let (node, _) = busiest_node(setup, &total_per_rank);
    let states = node_sum(setup, node, &offloaded);
    let buffers = ranks * buffer;
    let (page_locked, in_flight) = if async_save {
        let page_locked = node_sum(setup, node, &on_device);
        (page_locked, states + node_sum(setup, node, &written))
    } else {
        (0.0, 0.0)
    };
    let reserved = host.reserved_per_node_bytes;
    let limit = f64::from(setup.cluster.gpus_per_node) * host.memory_per_gpu_bytes;
    let total = states + buffers + page_locked + in_flight + reserved;
    let memory = HostMemory {
        offload_fraction: fraction,
        most_loaded_node: node,
        optimizer_states: states as u64,
        transfer_buffers: buffers as u64,
        snapshot_page_locked: page_locked as u64,
        save_in_flight: in_flight as u64,
        reserved: reserved as u64,
        total: total as u64,
        limit_bytes: limit as u64,
        fits: total <= limit,
    };
    let terms = vec![
        setup.term(
            &format!("host of node {node}: offloaded optimizer states"),
            states,
            || {
                format!(
                    "Σ over its ranks ({ranks}) of {fraction} × optimizer parameters × {per_parameter} B (fp32 master, Adam m and v)"
                )
            },
        ),
        setup.term(
            &format!("host of node {node}: transfer buffers"),
            buffers,
            || {
                format!(
                    "ranks ({ranks}) × {buffer:.3e} B (four page-locked pieces each under the offload)"

                )
            },
        ),
        setup.term(
            &format!("host of node {node}: asynchronous save's page-locked snapshot"),
            page_locked,
            || {
                format!(
                    "with checkpoint.async_save on GPUs: Σ over its ranks of {} × optimizer parameters × {per_parameter} B (the state on the GPU, page-locked from the first step), else 0",
                    1.0 - fraction
                )
            },
        ),
        setup.term(
            &format!("host of node {node}: asynchronous save in flight"),
            in_flight,
            || {
                format!(
                    "with checkpoint.async_save on GPUs: the offloaded states again (the snapshot keeps the old buffers while the update writes new ones) + Σ over its ranks of {} × optimizer parameters × 12 B (the GPU part's snapshot as the f32 values written), else 0",
                    1.0 - fraction
                )
            },
        ),
        setup.term(&format!("host of node {node}: reserved"), reserved, || {
            "OS, the processes' heaps, the data loader (assumed)".to_owned()
        }),
        setup.term(&format!("host of node {node}: total"), total, || {
            format!(
                "of {} GPUs × {:.3e} B = {limit:.4e} B per node",
                setup.cluster.gpus_per_node, host.memory_per_gpu_bytes
            )
        }),
    ];
    (memory, terms)
}

/// The smallest fraction, a multiple of 1/[`FRACTION_STEPS`], with which `setup` (planned
/// without the offload) fits both `limit` bytes per GPU and its most loaded node's host.
pub(crate) fn fraction_that_fits(setup: &Setup<'_>, limit: u64) -> Option<f64> {
    let fraction = memory::offload_to_fit(setup, limit)?;
    let with = Setup {
        offload_fraction: fraction,
        ..setup.clone()
    };
    let (host, _) = host_memory(&with, &memory::stage_optimizer_parameters(&with));
    host.fits.then_some(fraction)
}

/// Seconds the offload adds to a step: the slowest of the gradients down, AdamW on the host and
/// the weights up, which run at once, with the terms. `optimizer_params` holds, per stage, the parameters whose optimizer state
/// one of its ranks holds.
pub(crate) fn step_time(setup: &Setup<'_>, optimizer_params: &[f64]) -> (f64, Vec<Term>) {
    let fraction = setup.offload_fraction;
    let recipe = setup.recipe;
    let (weight, summed, _) =
        bytes_per_parameter(recipe.precision.dtype, &recipe.training.optimizer);
    // Several microbatches are summed (in f32, or bf16 under `main_grads_dtype`); one hands
    // over its gradients in the weights' dtype.
    let gradient = if setup.num_microbatches > 1 {
        summed
    } else {
        weight
    };
    let state = host_bytes_per_parameter(setup);
    // AdamW reads master, m, v and the gradient and writes master, m, v and (16-bit runs) the
    // new 16-bit copy.
    let new_copy = if recipe.precision.dtype == Dtype::Fp32 {
        0.0
    } else {
        weight
    };
    let adam_bytes = 2.0 * state + gradient + new_copy;
    let offloaded: Vec<f64> = optimizer_params.iter().map(|p| fraction * p).collect();
    let most = offloaded.iter().copied().fold(0.0, f64::max);
    let host = &setup.host;
    let down = gradient * most / host.device_to_host_bandwidth;
    let up = weight * most / host.host_to_device_bandwidth;
    let per_rank_traffic: Vec<f64> = offloaded.iter().map(|p| adam_bytes * p).collect();
    let (node, traffic) = busiest_node(setup, &per_rank_traffic);
    let adam = traffic / host.cpu_optimizer_bandwidth;
    let terms = vec![
        setup.term(GRADIENTS_DOWN, down, || {
            format!(
                "{gradient} B × {most:.0} offloaded parameters / {:.3e} B/s (PCIe, page-locked, measured)",
                host.device_to_host_bandwidth
            )
        }),
        setup.term(HOST_ADAMW, adam, || {
            format!(
                "{adam_bytes} B read and written per parameter, Σ over node {node}'s ranks = {traffic:.4e} B / {:.3e} B/s (measured)",
                host.cpu_optimizer_bandwidth
            )
        }),
        setup.term(WEIGHTS_UP, up, || {
            format!(
                "{weight} B × {most:.0} offloaded parameters / {:.3e} B/s (PCIe, page-locked, measured)",
                host.host_to_device_bandwidth
            )
        }),
    ];
    (down.max(adam).max(up), terms)
}

#[cfg(test)]
mod tests {
    use ferrotron_recipe::{Cluster, GpuKind, Recipe, StateDtype};

    use super::*;
    use crate::hardware::GPU_HOST;
    use crate::layout::{Degrees, Layout};
    use crate::memory::{memory, stage_optimizer_parameters};
    use crate::params::parameter_count;
    use crate::search::setup;
    use crate::testing::llama3_8b;

    const GIB: f64 = (1u64 << 30) as f64;

    /// Llama 3 8B with the precision-aware optimizer, offloading `fraction`.
    fn offloading(fraction: f64) -> Recipe {
        let mut recipe = llama3_8b();
        recipe.parallel.distributed_optimizer = true;
        let optimizer = &mut recipe.training.optimizer;
        optimizer.use_precision_aware_optimizer = true;
        optimizer.optimizer_cpu_offload = fraction > 0.0;
        optimizer.optimizer_offload_fraction = if fraction > 0.0 { fraction } else { 1.0 };
        recipe
    }

    fn cluster(nodes: u32, gpus_per_node: u32) -> Cluster {
        Cluster {
            nodes,
            gpus_per_node,
            gpu: GpuKind::H100,
        }
    }

    /// `pp` pipeline stages and `dp` data-parallel ranks, no tensor parallelism, micro batch 1.
    fn layout(pp: u32, dp: u32) -> Layout {
        Layout {
            degrees: Degrees {
                tp: 1,
                pp,
                vpp: 1,
                cp: 1,
                ep: 1,
                etp: 1,
                dp,
                edp: dp,
            },
            micro_batch_size: 1,
        }
    }

    fn near(actual: u64, expected: f64) -> bool {
        (actual as f64 - expected).abs() <= 16.0
    }

    #[test]
    fn the_offloaded_fraction_of_the_state_moves_from_the_gpu_to_the_host() {
        let params = parameter_count(&llama3_8b().model, 128256);
        let p = params.total as f64;
        let c = cluster(1, 1);
        let bytes =
            |recipe: &Recipe| memory(&setup(recipe, &c, layout(1, 1), params, 128256, false));
        let none = bytes(&offloading(0.0));
        let whole = bytes(&offloading(1.0));
        let half = bytes(&offloading(0.5));
        assert!(none.host.is_none());
        assert!(near(none.per_gpu_bytes.optimizer, 12.0 * p));
        assert_eq!(whole.per_gpu_bytes.optimizer, 0);
        assert!(near(half.per_gpu_bytes.optimizer, 6.0 * p));
        // Weights and gradient buffers stay on the device; the peak falls by the state moved.
        for m in [&whole, &half] {
            assert_eq!(m.per_gpu_bytes.weights, none.per_gpu_bytes.weights);
            assert_eq!(m.per_gpu_bytes.gradients, none.per_gpu_bytes.gradients);
            let moved = none.per_gpu_bytes.optimizer - m.per_gpu_bytes.optimizer;
            assert_eq!(none.per_gpu_bytes.total - m.per_gpu_bytes.total, moved);
        }
        let host = whole.host.expect("host memory with the offload");
        assert!(near(host.optimizer_states, 12.0 * p));
        assert_eq!(host.transfer_buffers as f64, GPU_HOST.transfer_buffer_bytes);
        assert_eq!(host.reserved as f64, 16.0 * GIB);
        assert_eq!(host.limit_bytes as f64, 128.0 * GIB);
        assert_eq!(
            host.total,
            host.optimizer_states + host.transfer_buffers + host.reserved
        );
        let half_host = half.host.expect("host memory with the offload");
        assert!(near(half_host.optimizer_states, 6.0 * p));
    }

    #[test]
    fn bf16_moments_halve_what_the_host_holds_for_them() {
        let params = parameter_count(&llama3_8b().model, 128256);
        let p = params.total as f64;
        let mut recipe = offloading(0.5);
        recipe.training.optimizer.exp_avg_dtype = StateDtype::Bf16;
        recipe.training.optimizer.exp_avg_sq_dtype = StateDtype::Bf16;
        let c = cluster(1, 1);
        let m = memory(&setup(&recipe, &c, layout(1, 1), params, 128256, false));
        // fp32 master + bf16 m and v = 8 B per parameter, half of them on each side.
        assert!(near(m.per_gpu_bytes.optimizer, 4.0 * p));
        assert!(near(m.host.expect("host").optimizer_states, 4.0 * p));
    }

    #[test]
    fn a_node_holds_the_offloaded_shards_of_all_its_ranks() {
        // 2 nodes × 8, dp 16 with the distributed optimizer: each rank owns 1/16 of the state,
        // a node 8/16 of it.
        let params = parameter_count(&llama3_8b().model, 128256);
        let p = params.total as f64;
        let c = cluster(2, 8);
        let recipe = offloading(1.0);
        let m = memory(&setup(&recipe, &c, layout(1, 16), params, 128256, false));
        let host = m.host.expect("host");
        assert!((host.optimizer_states as f64 - 12.0 * p / 2.0).abs() < 1e3);
        assert_eq!(
            host.transfer_buffers as f64,
            8.0 * GPU_HOST.transfer_buffer_bytes
        );
        assert_eq!(host.save_in_flight, 0, "no asynchronous save");
        assert_eq!(host.limit_bytes as f64, 8.0 * 128.0 * GIB);
    }

    #[test]
    fn the_node_spanning_the_heaviest_stages_is_the_host_limit() {
        // pp 4 over 2 nodes of 2 (dp 1): node 0 holds stages 0 and 1 (with the embedding),
        // node 1 stages 2 and 3 (with the final norm and the output layer).
        let params = parameter_count(&llama3_8b().model, 128256);
        let c = cluster(2, 2);
        let recipe = offloading(1.0);
        let s = setup(&recipe, &c, layout(4, 1), params, 128256, false);
        let per_stage = stage_optimizer_parameters(&s);
        let host = memory(&s).host.expect("host");
        let node = |n: usize| (per_stage[2 * n] + per_stage[2 * n + 1]) * 12.0;
        let heavier = if node(0) >= node(1) { 0 } else { 1 };
        assert_eq!(host.most_loaded_node, heavier as u32);
        assert!((host.optimizer_states as f64 - node(heavier)).abs() < 16.0);
    }

    #[test]
    fn a_host_too_small_for_the_offloaded_state_does_not_fit() {
        let params = parameter_count(&llama3_8b().model, 128256);
        let c = cluster(1, 1);
        let mut recipe = offloading(1.0);
        recipe.recompute = ferrotron_recipe::Recompute {
            granularity: ferrotron_recipe::RecomputeGranularity::Full,
            method: Some(ferrotron_recipe::RecomputeMethod::Uniform),
            num_layers: Some(1),
            modules: Vec::new(),
        };
        let mut s = setup(&recipe, &c, layout(1, 1), params, 128256, false);
        assert!(memory(&s).fits);
        // 64 GiB of host: 12 B × 8 B parameters do not go.
        s.host.memory_per_gpu_bytes = 64.0 * GIB;
        let m = memory(&s);
        let host = m.host.expect("host");
        assert!(!host.fits);
        assert!(!m.fits, "the plan does not fit when its host does not");
        assert!(m.per_gpu_bytes.total <= m.limit_bytes, "the device does");
    }

    #[test]
    fn an_asynchronous_save_holds_the_offloaded_state_twice() {
        let params = parameter_count(&llama3_8b().model, 128256);
        let p = params.total as f64;
        let c = cluster(1, 1);
        let mut recipe = offloading(1.0);
        recipe.checkpoint.async_save = true;
        let host = memory(&setup(&recipe, &c, layout(1, 1), params, 128256, false))
            .host
            .expect("host");
        assert!((host.save_in_flight as f64 - 12.0 * p).abs() < 1e3);
        assert_eq!(host.save_in_flight, host.optimizer_states);
        assert!(!host.fits, "an 8B model's state twice is more than 128 GiB");
    }

    /// Without the offload, an asynchronous save page-locks the GPU's state (its snapshot's
    /// reads land there) and holds it as f32 values while the writer writes: an 8B model's
    /// state is 8 B a parameter with bf16 moments, 12 B written, more than 128 GiB of host
    /// together. A synchronous save and CPU ranks watch no host memory.
    #[test]
    fn an_asynchronous_save_of_the_state_on_the_gpu_page_locks_it_and_writes_it_as_f32() {
        let params = parameter_count(&llama3_8b().model, 128256);
        let p = params.total as f64;
        let c = cluster(1, 1);
        let mut recipe = offloading(0.0);
        recipe.training.optimizer.exp_avg_dtype = StateDtype::Bf16;
        recipe.training.optimizer.exp_avg_sq_dtype = StateDtype::Bf16;
        let plan = |recipe: &Recipe, c: &Cluster| {
            memory(&setup(recipe, c, layout(1, 1), params, 128256, false))
        };
        assert!(plan(&recipe, &c).host.is_none(), "synchronous saves");
        recipe.checkpoint.async_save = true;
        let m = plan(&recipe, &c);
        let host = m.host.expect("host memory with asynchronous saves");
        assert!(near(host.snapshot_page_locked, 8.0 * p));
        assert!(near(host.save_in_flight, 12.0 * p));
        assert_eq!((host.optimizer_states, host.transfer_buffers), (0, 0));
        assert_eq!(
            host.total,
            host.snapshot_page_locked + host.save_in_flight + host.reserved
        );
        assert!(
            !host.fits && !m.fits,
            "160 GB of snapshot on a 128 GiB host"
        );
        let mut cpu = cluster(1, 1);
        cpu.gpu = GpuKind::Cpu;
        assert!(
            plan(&recipe, &cpu).host.is_none(),
            "CPU ranks hold it in host memory already"
        );
    }

    #[test]
    fn offload_time_is_the_slowest_of_pcie_each_way_and_adamw_over_the_hosts_bandwidth() {
        let params = parameter_count(&llama3_8b().model, 128256);
        let p = params.total as f64;
        let c = cluster(1, 1);
        let h = GPU_HOST;
        // 128 microbatches: fp32 gradients go down, bf16 weights come up.
        let recipe = offloading(1.0);
        let s = setup(&recipe, &c, layout(1, 1), params, 128256, true);
        let (seconds, terms) = step_time(&s, &stage_optimizer_parameters(&s));
        let down = 4.0 * p / h.device_to_host_bandwidth;
        let up = 2.0 * p / h.host_to_device_bandwidth;
        // Reads master, m, v (12 B) and the gradient (4), writes master, m, v and the copy (2).
        let adam = 30.0 * p / h.cpu_optimizer_bandwidth;
        assert!((seconds - down.max(up).max(adam)).abs() < 1e-6, "{seconds}");
        assert_eq!(terms.len(), 3);
        assert!((terms[0].value - down).abs() < 1e-6);
        assert!((terms[1].value - adam).abs() < 1e-6);
        assert!((terms[2].value - up).abs() < 1e-6);
        // Half the fraction, half the time; bf16 moments read and write 8 B fewer.
        let mut half = offloading(0.5);
        half.training.optimizer.exp_avg_dtype = StateDtype::Bf16;
        half.training.optimizer.exp_avg_sq_dtype = StateDtype::Bf16;
        let s = setup(&half, &c, layout(1, 1), params, 128256, false);
        let (seconds, _) = step_time(&s, &stage_optimizer_parameters(&s));
        let expected = 0.5 * down.max(up).max(22.0 * p / h.cpu_optimizer_bandwidth);
        assert!((seconds - expected).abs() < 1e-6, "{seconds} vs {expected}");
    }

    #[test]
    fn the_ranks_of_a_node_share_its_cpu() {
        // 8 ranks of one node each offload 1/8 of the state: PCIe per GPU takes 1/8 of the one-
        // GPU time, the node's CPU the whole of it.
        let params = parameter_count(&llama3_8b().model, 128256);
        let recipe = offloading(1.0);
        let one = cluster(1, 1);
        let eight = cluster(1, 8);
        let s1 = setup(&recipe, &one, layout(1, 1), params, 128256, true);
        let s8 = setup(&recipe, &eight, layout(1, 8), params, 128256, true);
        let (_, t1) = step_time(&s1, &stage_optimizer_parameters(&s1));
        let (_, t8) = step_time(&s8, &stage_optimizer_parameters(&s8));
        assert!((t8[0].value * 8.0 - t1[0].value).abs() < 1e-9);
        // 128 / 8 = 16 microbatches: still fp32 gradients, so the CPU traffic is the same.
        assert!((t8[1].value - t1[1].value).abs() < 1e-9);
    }

    #[test]
    fn cpu_ranks_offload_nothing() {
        let recipe = offloading(1.0);
        let c = Cluster {
            nodes: 1,
            gpus_per_node: 1,
            gpu: GpuKind::Cpu,
        };
        assert_eq!(fraction(&recipe, &c), 0.0);
        assert_eq!(fraction(&recipe, &cluster(1, 1)), 1.0);
    }
}
