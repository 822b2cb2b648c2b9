//! Multi-latent attention on every layout it splits over, against the one-rank model, gradient
//! by gradient (see `parallel.rs` for how equivalence is judged): heads split over tp (with and
//! without sequence parallelism, with and without a query latent), the replicated down
//! projections and latent norms reduced as their roles say, keys and values gathered over cp
//! (fused and composed-with-dropout paths, and inference on the plain backend), and pipeline
//! chunks.

use ferrotron_recipe::RopeScaling;
use serde_json::json;

use super::parallel::{
    CP2, Layout, TP2, TP2_CP2_SP, TP2_SP, assert_cp2_inference_matches, assert_equivalent,
    assert_equivalent_in_stages, small,
};
use super::*;

/// `mla_model` at the parallel tests' size (hidden 32, 4 heads), YaRN-scaled RoPE.
fn mla_small() -> Model {
    let yarn: RopeScaling = serde_json::from_value(json!({
        "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4, "beta_fast": 8.0,
        "mscale": 1.0, "mscale_all_dim": 1.0
    }))
    .expect("rope_scaling parses");
    Model {
        rope_scaling: Some(yarn),
        ..small(mla_model())
    }
}

const ONE_RANK: Layout = Layout {
    tp: 1,
    cp: 1,
    sequence_parallel: false,
};

#[test]
fn mla_matches_one_rank_under_tp2_cp2_and_both() {
    for layout in [TP2, TP2_SP, CP2, TP2_CP2_SP] {
        assert_equivalent(&mla_small(), layout);
    }
}

/// DeepSeek-V2-Lite's full-rank query projection (column-parallel from the hidden states) and
/// no latent norms.
#[test]
fn mla_without_a_query_latent_matches_one_rank() {
    let mut model = mla_small();
    model.qk_layernorm = false;
    if let Some(mla) = model.mla.as_mut() {
        mla.q_lora_rank = None;
    }
    for layout in [TP2, TP2_SP, CP2] {
        assert_equivalent(&model, layout);
    }
}

/// The composed context-parallel path with live attention dropout (too small to ever drop)
/// masks by global position with MLA's scale and value head dim too.
#[test]
fn mla_with_live_attention_dropout_matches_one_rank_under_cp2() {
    let mut model = mla_small();
    model.attention_dropout = 1e-9;
    assert_equivalent(&model, CP2);
}

/// Inference on the plain backend under cp2: burn's attention op with the explicit
/// global-position mask, MLA's scale and value head dim.
#[test]
fn mla_cp2_inference_logits_are_the_one_rank_logits() {
    assert_cp2_inference_matches(&mla_small());
}

#[test]
fn mla_matches_one_rank_in_pipeline_chunks() {
    let mut deep = mla_small();
    deep.num_layers = 4;
    assert_equivalent_in_stages(&deep, ONE_RANK, 2);
    assert_equivalent_in_stages(&deep, TP2_CP2_SP, 2);
}
