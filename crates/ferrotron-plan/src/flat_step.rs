//! Memory of the one-rank GPU step, whose optimizer state is flat fp32 buffers.
//!
//! That step (ferrotron-train `device_step`) keeps per group one fp32 master buffer and two
//! moment buffers, gathers every microbatch's gradients into one buffer as its backward ends
//! (fp32, or bf16 under `main_grads_dtype`; a step of one microbatch keeps them in the
//! weights' dtype: nothing is summed), and
//! updates in place, writing a new 16-bit copy of the parameters (the model keeps
//! reading the old one until the update returns). Its device memory has two phases and the
//! peak is the larger:
//!
//! - the activations phase (the last microbatch's forward and backward): weights, master and
//!   moments, the activations, and the fp32 gradient sum of the earlier microbatches when
//!   there are any;
//! - the update phase (after the last backward): the gradient buffer (gathered while the
//!   16-bit gradients are still held) and the new copy are allocated while the memory pool still
//!   keeps what the activations used. The pool hands freed activation memory to these buffers
//!   only where a free range is long enough, and the backward's gradients are scattered through
//!   it, so only a fraction [`POOL_REUSE`] of it is counted as reusable.
//!
//! The optimizer CPU offload takes its share of master and moments out of both phases; the
//! gradient buffers and both 16-bit copies stay (the offloaded groups' new values arrive from
//! the host into a new device buffer as the others' do).
//!
//! With `POOL_REUSE = 1` the update phase would be its live bytes; the fraction is what the
//! H200 measurements need (see the constant). Megatron's theoretical numbers stay for the
//! multi-rank layouts, whose runtime reduces gradients through buffers of its own and has not
//! been measured against this model, and for the `cpu` kind, whose step is the per-parameter
//! host step.

use ferrotron_recipe::GpuKind;

use crate::memory::MemoryBytes;
use crate::setup::Setup;
use crate::term::Term;

/// Fraction of the activations' freed memory the pool hands to the update's new buffers,
/// fitted to the one bench row whose device peak is its update (`tools/README.md`, "Where the
/// planner's fitted numbers come from"): every measured row stays within 10 % from 0.13 to 0.41.
pub(crate) const POOL_REUSE: f64 = 0.15;

/// The names the terms give the two phases.
pub(crate) const ACTIVATIONS_PHASE: &str = "activations phase";
pub(crate) const UPDATE_PHASE: &str = "update phase";
const TOTAL: &str = "total with the framework overhead";

/// The phase whose total is the peak, from a plan's memory terms (None: not the flat step).
pub(crate) fn peak_phase(terms: &[Term]) -> Option<&'static str> {
    let total = |phase: &str| {
        let name = format!("{phase}: {TOTAL}");
        terms.iter().find(|t| t.name == name).map(|t| t.value)
    };
    let (activations, update) = (total(ACTIVATIONS_PHASE)?, total(UPDATE_PHASE)?);
    Some(if update > activations {
        UPDATE_PHASE
    } else {
        ACTIVATIONS_PHASE
    })
}

/// Whether `setup` runs the flat-state step: one GPU rank.
pub(crate) fn applies(setup: &Setup<'_>) -> bool {
    setup.cluster.gpu != GpuKind::Cpu && setup.layout.degrees.world_size() == 1
}

/// Bytes per parameter of the step's state and the parameters on the GPU.
pub(crate) struct State {
    pub params: f64,
    /// The 16-bit (or fp32) weights.
    pub weight: f64,
    /// The summed gradient buffer (of several microbatches: fp32, or `main_grads_dtype`).
    pub gradient: f64,
    /// fp32 master (16-bit weights only) and both moments.
    pub optimizer: f64,
    /// Share of the optimizer state the CPU offload keeps in host memory instead.
    pub offloaded: f64,
}

/// The larger phase's bytes (overhead included) and both phases' terms, phase named.
pub(crate) fn peak(
    setup: &Setup<'_>,
    state: &State,
    activation_terms: Vec<Term>,
    overhead: f64,
) -> (MemoryBytes, Vec<Term>) {
    let State {
        params,
        weight,
        gradient,
        optimizer,
        offloaded,
    } = *state;
    // The offloaded share's master and moments live in host memory; the gradient buffers and
    // the weights (the new copy arrives from the host) stay.
    let full_optimizer = optimizer;
    let optimizer = optimizer * (1.0 - offloaded);
    let on_device = || {
        if offloaded > 0.0 {
            format!("(1 − {offloaded} offloaded to the host) × {full_optimizer} B")
        } else {
            format!("{optimizer} B")
        }
    };
    let activations: f64 = activation_terms.iter().map(|t| t.value).sum();
    let several = setup.num_microbatches > 1;
    // One microbatch has nothing to sum: its gradients stay in the weights' dtype.
    let gradient = if several { gradient } else { weight };
    let held_gradient = if several { gradient } else { 0.0 };
    let activations_phase = MemoryBytes {
        weights: (weight * params) as u64,
        gradients: (held_gradient * params) as u64,
        optimizer: (optimizer * params) as u64,
        activations: activations as u64,
        framework_overhead: overhead as u64,
        total: 0,
    };
    // Allocated after the last backward: the gradient buffer (one microbatch: gathered then),
    // and the update's new copy of the parameters.
    let new_per_param = gradient - held_gradient + weight;
    let new_buffers = new_per_param * params;
    let reused = (POOL_REUSE * activations).min(new_buffers);
    let kept = activations - reused;
    let update_phase = MemoryBytes {
        weights: (2.0 * weight * params) as u64,
        gradients: (gradient * params) as u64,
        optimizer: (optimizer * params) as u64,
        activations: kept as u64,
        framework_overhead: overhead as u64,
        total: 0,
    };
    let (activations_phase, update_phase) =
        (with_total(activations_phase), with_total(update_phase));

    let mut terms = vec![
        setup.term("activations phase: weights", weight * params, || {
            format!("{weight} B × {params:.0} parameters")
        }),
        setup.term(
            "activations phase: gradient buffer",
            held_gradient * params,
            || {
                if several {
                    format!(
                        "{gradient} B (flat, summed over the earlier microbatches) × {params:.0} parameters"
                    )
                } else {
                    "none yet: one microbatch, gathered when its backward ends".to_owned()
                }
            },
        ),
        setup.term("activations phase: optimizer states", optimizer * params, || {
            format!("{} (flat fp32 master where 16-bit, Adam m and v) × {params:.0} parameters", on_device())
        }),
    ];
    terms.extend(activation_terms.into_iter().map(|t| Term {
        name: format!("activations phase: activations: {}", t.name),
        ..t
    }));
    terms.push(phase_total(setup, ACTIVATIONS_PHASE, &activations_phase));
    terms.extend([
        setup.term(
            "update phase: weights and the update's new copy",
            2.0 * weight * params,
            || format!("2 × {weight} B × {params:.0} parameters (the model reads the old copy until the update returns)"),
        ),
        setup.term("update phase: gradient buffer", gradient * params, || {
            if several {
                format!("{gradient} B (flat, every microbatch summed) × {params:.0} parameters")
            } else {
                format!("{gradient} B (flat, the one microbatch's gradients in the weights' dtype) × {params:.0} parameters")
            }
        }),
        setup.term("update phase: optimizer states", optimizer * params, || {
            format!("{} × {params:.0} parameters, updated in place", on_device())
        }),
        setup.term(
            "update phase: activation memory the pool keeps and cannot reuse",
            kept,
            || format!(
                "A − min({POOL_REUSE}·A, new buffers {new_per_param} B × {params:.0}) = {activations:.0} − {reused:.0}"
            ),
        ),
    ]);
    terms.push(phase_total(setup, UPDATE_PHASE, &update_phase));
    let peak = if update_phase.total > activations_phase.total {
        update_phase
    } else {
        activations_phase
    };
    (peak, terms)
}

fn with_total(bytes: MemoryBytes) -> MemoryBytes {
    MemoryBytes {
        total: bytes.weights
            + bytes.gradients
            + bytes.optimizer
            + bytes.activations
            + bytes.framework_overhead,
        ..bytes
    }
}

fn phase_total(setup: &Setup<'_>, phase: &str, bytes: &MemoryBytes) -> Term {
    setup.term(&format!("{phase}: {TOTAL}"), bytes.total as f64, || {
        "the device peak is the larger phase".to_owned()
    })
}

#[cfg(test)]
mod tests {
    use ferrotron_recipe::{Cluster, GpuKind, Recipe};
    use serde_json::json;

    use crate::layout::{Degrees, Layout};
    use crate::memory::{Memory, memory};
    use crate::params::parameter_count;
    use crate::search::setup;
    use crate::testing::recipe;

    /// A LLaMA-style 1.2B with `micro_batch` × `seq` tokens a microbatch, `microbatches` a step.
    fn llama(seq: u32, micro_batch: u32, microbatches: u32) -> Recipe {
        recipe(
            json!({"num_layers": 16, "hidden_size": 2048, "ffn_hidden_size": 8192,
                   "num_attention_heads": 32, "num_query_groups": 8, "seq_length": seq,
                   "position_embedding": "rope", "normalization": "rmsnorm",
                   "activation": "swiglu", "tie_embeddings": false, "add_bias_linear": false}),
            json!({"data": 1}),
            json!({"micro_batch_size": micro_batch,
                   "global_batch_size": micro_batch * microbatches, "train_iters": 10}),
        )
    }

    fn plan_memory(recipe: &Recipe, micro_batch: u32, gpu: GpuKind) -> Memory {
        let params = parameter_count(&recipe.model, 50304);
        let cluster = Cluster {
            nodes: 1,
            gpus_per_node: 1,
            gpu,
        };
        let layout = Layout {
            degrees: Degrees::ONE,
            micro_batch_size: micro_batch,
        };
        memory(&setup(recipe, &cluster, layout, params, 50304, false))
    }

    /// (parameters, activations, overhead) of a plan, from its terms.
    fn facts(m: &Memory) -> (f64, f64, f64) {
        let term = |name: &str| {
            m.terms
                .iter()
                .find(|t| t.name == name)
                .unwrap_or_else(|| panic!("no term {name}"))
                .value
        };
        let activations = m
            .terms
            .iter()
            .filter(|t| t.name.starts_with("activations phase: activations: "))
            .map(|t| t.value)
            .sum();
        (
            term("parameters on this GPU"),
            activations,
            term("framework overhead"),
        )
    }

    fn near(actual: u64, expected: f64) -> bool {
        (actual as f64 - expected).abs() < 8.0
    }

    #[test]
    fn the_update_phase_holds_the_gradient_buffer_and_the_new_copy() {
        // 2 × 4096 tokens: 11 GiB of activations against 4 bytes per parameter (4.4 GiB: the
        // one microbatch's bf16 gradients and the new copy) allocated after the backward, of
        // which the pool reuses 15 % of the activations.
        let m = plan_memory(&llama(4096, 2, 1), 2, GpuKind::H200);
        let (p, a, overhead) = facts(&m);
        let b = m.per_gpu_bytes;
        assert!(near(b.gradients, 2.0 * p), "one microbatch, bf16: {b:?}");
        assert!(near(b.weights, 4.0 * p), "old and new 16-bit copies: {b:?}");
        assert!(near(b.optimizer, 12.0 * p), "{b:?}");
        let expected = 14.0 * p + a + (4.0 * p - super::POOL_REUSE * a) + overhead;
        assert!(near(b.total, expected), "{} vs {expected}", b.total);
    }

    #[test]
    fn a_large_micro_batch_peaks_in_its_activations() {
        // 16 × 4096 tokens: the freed activations host everything the update allocates.
        let m = plan_memory(&llama(4096, 16, 1), 16, GpuKind::H200);
        let (p, a, overhead) = facts(&m);
        let b = m.per_gpu_bytes;
        assert_eq!(
            b.gradients, 0,
            "one microbatch: gathered after its backward"
        );
        assert!(near(b.weights, 2.0 * p), "{b:?}");
        assert!(near(b.total, 14.0 * p + a + overhead), "{b:?}");
    }

    #[test]
    fn several_microbatches_hold_the_gradient_sum_in_their_activations() {
        let one = plan_memory(&llama(4096, 16, 1), 16, GpuKind::H200);
        let two = plan_memory(&llama(4096, 16, 2), 16, GpuKind::H200);
        let (p, _, _) = facts(&two);
        assert!(near(two.per_gpu_bytes.gradients, 4.0 * p));
        assert!(near(
            two.per_gpu_bytes.total - one.per_gpu_bytes.total,
            4.0 * p
        ));
    }

    #[test]
    fn the_cpu_rank_keeps_the_host_steps_bytes() {
        // The CPU step is per parameter: one microbatch holds no fp32 gradients, no new copy.
        let m = plan_memory(&llama(256, 1, 1), 1, GpuKind::Cpu);
        let b = m.per_gpu_bytes;
        let p = m.parameters_per_gpu as f64;
        assert_eq!(b.gradients, 0);
        assert!(near(b.weights, 2.0 * p));
        assert!(m.terms.iter().all(|t| !t.name.contains("phase")));
    }
}
