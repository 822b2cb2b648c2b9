//! DeepSeek-V3's MoE as a whole (sigmoid scores, the auxiliary-loss-free expert bias,
//! group-limited routing, `router_topk_scaling_factor`, a shared expert, the first layer dense
//! by the list form of `layer_freq`, sequence-level balancing) trained on every layout that
//! cuts it, against one rank (`equivalence.rs`'s check: losses per step, final weights): ep2,
//! ep2 with expert tensor parallelism 2, tp2 with sequence parallelism, cp2, pp2 (the dense
//! layer on the first stage only; the reported objective holds the first stage's auxiliary
//! losses too, `per_chunk::stage_losses`); and twice on tp2·ep2·etp2 with sequence
//! parallelism, bit for bit. Measured: final weights within 9.4e-6 of one rank's (pp2, the
//! largest), losses within the usual 1e-6.
//!
//! Routing has discontinuities, so the long comparisons route every token to every expert
//! (top-4 of 4 in 2 groups of 2, both groups selected): the weights are still the normalised
//! sigmoid scores times 2.5, the group scores still computed; ulp-level differences cannot flip
//! a choice (see `equivalence.rs`'s `check_moe`). A second check routes top-2 of 8 in 4 groups
//! (2 chosen, one expert each) over two steps, where the groups and the bias, updated from the
//! loads summed over every rank, really select.

use serde_json::{Value, json};

use super::equivalence::check_with;
use super::fixture::{Layout, losses_and_weights, options, plan, train_world, write_data};

/// LLaMA's trunk (RoPE, RMSNorm, SwiGLU, untied, no biases; hidden 32, 4 heads) with
/// DeepSeek-V3's MoE after one dense layer, `moe`'s keys over the defaults.
fn deepseek(moe: Value, layers: u32, parallel: Value) -> Value {
    let mut pattern = vec![1; layers as usize];
    pattern[0] = 0;
    let mut moe_section = json!({
        "num_experts": 4, "router_topk": 4, "score_function": "sigmoid", "expert_bias": true,
        "expert_bias_update_rate": 1.0e-2, "load_balancing": "seq_aux_loss",
        "aux_loss_coeff": 1.0e-2, "num_groups": 2, "group_topk": 2,
        "router_topk_scaling_factor": 2.5, "ffn_hidden_size": 16,
        "shared_expert_ffn_hidden_size": 24, "layer_freq": pattern
    });
    super::fixture::merge(&mut moe_section, moe);
    json!({
        "model": {
            "position_embedding": "rope", "normalization": "rmsnorm", "activation": "swiglu",
            "ffn_hidden_size": 64, "num_query_groups": 2, "tie_embeddings": false,
            "add_bias_linear": false, "moe": moe_section
        },
        "parallel": parallel
    })
}

fn layout(tp: u32, ep: u32, pp: u32, dp: u32) -> Layout {
    Layout {
        tp,
        ep,
        pp,
        dp,
        ..Layout::alone()
    }
}

const ITERATIONS: u64 = super::equivalence::ITERATIONS;

#[test]
fn deepseek_moe_under_ep2_matches_one_rank() {
    check_with(
        layout(1, 2, 1, 2),
        2,
        deepseek(json!({}), 2, json!({})),
        ITERATIONS,
    );
}

/// Expert tensor parallelism (Megatron's `--expert-tensor-parallel-size`): each expert's SwiGLU
/// cut over two ranks, the experts over two more.
#[test]
fn deepseek_moe_under_ep2_etp2_matches_one_rank() {
    check_with(
        layout(2, 2, 1, 2),
        2,
        deepseek(
            json!({}),
            2,
            json!({"expert_tensor": 2, "sequence_parallel": true}),
        ),
        ITERATIONS,
    );
}

#[test]
fn deepseek_moe_under_tp2_with_sequence_parallelism_matches_one_rank() {
    check_with(
        layout(2, 1, 1, 1),
        2,
        deepseek(json!({}), 2, json!({"sequence_parallel": true})),
        ITERATIONS,
    );
}

/// The sequence split over two context ranks: every rank routes its own tokens; the
/// sequence-level balancing loss counts whole sequences.
#[test]
fn deepseek_moe_under_cp2_matches_one_rank() {
    let split = Layout {
        cp: 2,
        ..layout(1, 1, 1, 1)
    };
    check_with(split, 2, deepseek(json!({}), 2, json!({})), ITERATIONS);
}

/// Four layers over two stages: the dense layer and an MoE layer on the first, two MoE layers
/// on the second.
#[test]
fn deepseek_moe_under_pp2_matches_one_rank() {
    check_with(
        layout(1, 1, 2, 1),
        4,
        deepseek(json!({}), 4, json!({})),
        ITERATIONS,
    );
}

/// Top-2 of 8 experts in 4 groups, 2 of them chosen: the groups and the expert bias select.
/// Two steps, so the second routes with the bias the first step's loads (summed over the
/// expert-parallel and data ranks) moved.
#[test]
fn deepseek_moe_selecting_by_groups_and_bias_under_ep2_matches_one_rank() {
    let selective = json!({"num_experts": 8, "router_topk": 2, "num_groups": 4, "group_topk": 2});
    check_with(layout(1, 2, 1, 2), 2, deepseek(selective, 2, json!({})), 2);
}

#[test]
fn deepseek_moe_trains_bit_identically_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_data(dir.path());
    let settings = deepseek(
        json!({}),
        2,
        json!({"expert_tensor": 2, "sequence_parallel": true}),
    );
    let run = |name: &str| {
        let plan = plan(dir.path(), layout(2, 2, 1, 2), 2, 3, settings.clone());
        losses_and_weights(train_world(&plan, &options(&dir.path().join(name))).expect("trains"))
    };
    let (first_losses, first_weights) = run("first");
    let (losses, weights) = run("second");
    assert_eq!(losses, first_losses);
    assert!(weights == first_weights, "the final weights differ");
}
