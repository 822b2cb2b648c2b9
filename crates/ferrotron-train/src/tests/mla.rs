//! Multi-latent attention (DeepSeek-V3's, `model.mla`) trained on every layout it splits over,
//! against one rank (`equivalence.rs`'s check: losses per step, final weights): tp2 with
//! sequence parallelism (heads split, the replicated down projections and latent norms reduced
//! over tp), cp2 (keys and values gathered), pp2 and tp2·pp2; twice on tp2·cp2 with sequence
//! parallelism, bit for bit; and recomputed (full, one rank with dropout and tp2 with sequence
//! parallelism) bit for bit as when it keeps its activations. Measured: losses within 5e-8
//! relative of one rank's, final weights within 4.2e-5 (tp2·pp2, the largest; the check allows
//! 5e-5), f32 summation order amplified by Adam's 1/√v.

use serde_json::{Value, json};

use super::equivalence::{ITERATIONS, check_with};
use super::fixture::{Layout, losses_and_weights, options, plan, train_world, write_data};
use super::recompute;

/// LLaMA's trunk (RoPE, RMSNorm, SwiGLU, untied, no biases; hidden 32, 4 heads) with MLA: a
/// query latent of 24, a key/value latent of 16, per head 8 plain and 4 rotary query/key
/// channels and 6 value channels, the latent norms on, YaRN-scaled RoPE (so the softmax
/// scale carries mscale²).
fn deepseek(mla: Value, parallel: Value) -> Value {
    let mut mla_section = json!({
        "q_lora_rank": 24, "kv_lora_rank": 16, "qk_head_dim": 8, "qk_pos_emb_head_dim": 4,
        "v_head_dim": 6
    });
    super::fixture::merge(&mut mla_section, mla);
    json!({
        "model": {
            "position_embedding": "rope", "normalization": "rmsnorm", "activation": "swiglu",
            "ffn_hidden_size": 64, "tie_embeddings": false, "add_bias_linear": false,
            "qk_layernorm": true, "mla": mla_section,
            "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4,
                             "beta_fast": 8.0, "mscale": 1.0, "mscale_all_dim": 1.0}
        },
        "parallel": parallel
    })
}

fn layout(tp: u32, cp: u32, pp: u32) -> Layout {
    Layout {
        tp,
        cp,
        pp,
        ..Layout::alone()
    }
}

#[test]
fn mla_under_tp2_with_sequence_parallelism_matches_one_rank() {
    check_with(
        layout(2, 1, 1),
        2,
        deepseek(json!({}), json!({"sequence_parallel": true})),
        ITERATIONS,
    );
}

/// A full-rank query projection (DeepSeek-V2-Lite's), column-parallel from the hidden states.
#[test]
fn mla_without_a_query_latent_under_tp2_matches_one_rank() {
    check_with(
        layout(2, 1, 1),
        2,
        deepseek(json!({"q_lora_rank": null}), json!({})),
        ITERATIONS,
    );
}

#[test]
fn mla_under_cp2_matches_one_rank() {
    check_with(
        layout(1, 2, 1),
        2,
        deepseek(json!({}), json!({})),
        ITERATIONS,
    );
}

#[test]
fn mla_under_pp2_and_tp2_pp2_matches_one_rank() {
    check_with(
        layout(1, 1, 2),
        4,
        deepseek(json!({}), json!({})),
        ITERATIONS,
    );
    check_with(
        layout(2, 1, 2),
        4,
        deepseek(json!({}), json!({"sequence_parallel": true})),
        ITERATIONS,
    );
}

/// tp2·cp2 with sequence parallelism, trained twice: the same bits.
#[test]
fn mla_trains_bit_identically_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_data(dir.path());
    let settings = deepseek(json!({}), json!({"sequence_parallel": true}));
    let run = |name: &str| {
        let plan = plan(dir.path(), layout(2, 2, 1), 2, 3, settings.clone());
        losses_and_weights(train_world(&plan, &options(&dir.path().join(name))).expect("trains"))
    };
    let (first_losses, first_weights) = run("first");
    let (losses, weights) = run("second");
    assert_eq!(losses, first_losses);
    assert!(weights == first_weights, "the final weights differ");
}

/// Full recomputation re-runs the layer (its dropout masks drawn again) and changes no bit.
#[test]
fn mla_recomputes_bit_identically() {
    let mut dropout = deepseek(json!({}), json!({}));
    dropout["model"]["attention_dropout"] = json!(0.1);
    dropout["model"]["hidden_dropout"] = json!(0.1);
    recompute::check(Layout::alone(), 2, dropout, recompute::full("uniform", 1));
    let tp2 = layout(2, 1, 1);
    let sp = deepseek(json!({}), json!({"sequence_parallel": true}));
    recompute::check(tp2, 2, sp, recompute::full("uniform", 1));
}
