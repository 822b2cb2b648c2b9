//! The recipe's `recompute` changes what is kept between forward and backward, never the
//! numbers: the same layout trained with and without it gives bit-identical losses and weights
//! (thread ranks with tensor + sequence parallelism, a 1F1B pipeline, one rank with dropout and
//! an MoE model, whose auxiliary loss runs through the recomputed ranges).

use serde_json::{Value, json};

use super::fixture::{
    Layout, assemble, max_weight_difference, options, plan, train_alone, train_world, write_data,
};

const ITERATIONS: u64 = 3;

/// Trains `layout` twice, without and with `recompute`, and demands identical curves.
pub(super) fn check(layout: Layout, layers: u32, extra: Value, recompute: Value) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_data(dir.path());
    let run = |name: &str, recompute: Value| {
        let mut settings = extra.clone();
        settings["recompute"] = recompute;
        let plan = plan(dir.path(), layout, layers, ITERATIONS, settings);
        let options = options(&dir.path().join(name));
        let outcomes = if layout.world() == 1 {
            vec![train_alone(&plan, &options).expect("the one-rank run trains")]
        } else {
            train_world(&plan, &options).expect("the parallel run trains")
        };
        let losses = outcomes[0].summary.losses.clone();
        (
            losses,
            assemble(outcomes.into_iter().flat_map(|o| o.params)),
        )
    };
    let (kept_losses, kept_weights) = run("kept", json!({"granularity": "none"}));
    let (losses, weights) = run("recomputed", recompute.clone());
    assert_eq!(
        losses, kept_losses,
        "{layout:?} with {recompute}: losses differ from the run that keeps activations"
    );
    let difference = max_weight_difference(&kept_weights, &weights);
    assert_eq!(
        difference, 0.0,
        "{layout:?} with {recompute}: weights differ"
    );
}

pub(super) fn full(method: &str, layers: u32) -> Value {
    json!({"granularity": "full", "method": method, "num_layers": layers})
}

/// Dropout on: each recomputed layer must draw its masks again, and the draws after the
/// backward must be the ones a run without recomputation makes.
#[test]
fn one_rank_with_dropout_recomputes_bit_identically() {
    let dropout = json!({"model": {"hidden_dropout": 0.1, "attention_dropout": 0.1}});
    check(Layout::alone(), 3, dropout.clone(), full("uniform", 2));
    check(Layout::alone(), 3, dropout, full("block", 2));
}

#[test]
fn moe_recomputes_bit_identically() {
    let moe = json!({"model": {"moe": {"num_experts": 2, "router_topk": 2}}});
    check(Layout::alone(), 2, moe, full("uniform", 1));
}

#[test]
fn tensor_and_sequence_parallel_recompute_bit_identically() {
    let tp2 = Layout {
        tp: 2,
        ..Layout::alone()
    };
    let sp = json!({"parallel": {"sequence_parallel": true}});
    check(tp2, 2, sp, full("uniform", 1));
}

#[test]
fn pipeline_stages_recompute_bit_identically() {
    let pp2 = Layout {
        pp: 2,
        ..Layout::alone()
    };
    check(pp2, 4, json!({}), full("block", 1));
}

/// Megatron's `--recompute-modules mlp`: every dense layer's MLP block a recomputed range, on
/// one rank, over tensor + sequence parallel thread ranks and over a pipeline.
#[test]
fn mlp_blocks_recompute_bit_identically() {
    let mlp = json!({"granularity": "selective", "modules": ["core_attn", "mlp"]});
    check(Layout::alone(), 2, json!({}), mlp.clone());
    let tp2 = Layout {
        tp: 2,
        ..Layout::alone()
    };
    let sp = json!({"parallel": {"sequence_parallel": true}});
    check(tp2, 2, sp, mlp.clone());
    let pp2 = Layout {
        pp: 2,
        ..Layout::alone()
    };
    check(pp2, 4, json!({}), mlp.clone());
    // A dense layer then an MoE layer: the MoE layer runs whole, its auxiliary loss beside the
    // dense layer's recomputed MLP block.
    let mixed =
        json!({"model": {"moe": {"num_experts": 2, "router_topk": 2, "layer_freq": [0, 1]}}});
    check(Layout::alone(), 2, mixed, mlp);
}
