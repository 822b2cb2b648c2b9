//! Today's dense families' switches on every layout they touch, against the one-rank model
//! (see `parallel.rs` for how equivalence is judged): the QKV bias alone (Qwen2.5) and QK-norm
//! (Qwen3) split by query group under tensor (and sequence) parallelism; a causal sliding window
//! (Mistral) under context parallelism, shorter and longer than a chunk; scaled rotary
//! embeddings (Llama 3.1, YaRN) under context parallelism and pipeline chunks.

use ferrotron_recipe::RopeScaling;
use serde_json::json;

use super::parallel::{
    CP2, Layout, TP2, TP2_CP2_SP, TP2_SP, assert_equivalent, assert_equivalent_in_stages,
    llama_small,
};
use super::*;
use crate::ModelError;

/// Qwen-style: LLaMA's layout with a bias on the QKV projection only, and/or QK-norm.
fn qwen_small(qkv_bias: bool, qk_norm: bool) -> Model {
    Model {
        add_qkv_bias: qkv_bias,
        qk_layernorm: qk_norm,
        ..llama_small()
    }
}

fn scaled(json: serde_json::Value) -> Model {
    let scaling: RopeScaling = serde_json::from_value(json).expect("rope_scaling parses");
    Model {
        rope_scaling: Some(scaling),
        ..llama_small()
    }
}

/// Llama 3.1's scaling with an original context of 4 (a 16-token sequence runs past it), so
/// every band of frequencies is touched.
fn llama3_small() -> Model {
    scaled(json!({"type": "llama3", "factor": 4.0, "original_max_position_embeddings": 4}))
}

fn yarn_small() -> Model {
    scaled(json!({
        "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4,
        "beta_fast": 8.0, "beta_slow": 1.0
    }))
}

fn windowed(left: u32) -> Model {
    Model {
        window_size: Some([left, 0]),
        ..llama_small()
    }
}

const ONE_RANK: Layout = Layout {
    tp: 1,
    cp: 1,
    sequence_parallel: false,
};

#[test]
fn qkv_bias_and_qk_norm_split_by_query_group_under_tp2_with_and_without_sp() {
    for model in [
        qwen_small(true, false),
        qwen_small(false, true),
        qwen_small(true, true),
    ] {
        for layout in [TP2, TP2_SP] {
            assert_equivalent(&model, layout);
        }
    }
    // LayerNorm QK-norm (weight and bias per norm) and the context-parallel attention path.
    let mut layer_norm = qwen_small(true, true);
    layer_norm.normalization = Normalization::Layernorm;
    for layout in [TP2_SP, CP2, TP2_CP2_SP] {
        assert_equivalent(&layer_norm, layout);
    }
}

/// A 16-token sequence over cp2 is four chunks of 4 tokens: a window of 2 stays within a
/// query's own chunk or reaches one chunk back; one of 6 spans chunks held by the other rank.
#[test]
fn sliding_windows_shorter_and_longer_than_a_cp_chunk_match_one_rank() {
    for left in [2, 6] {
        assert_equivalent(&windowed(left), CP2);
        assert_equivalent(&windowed(left), TP2_CP2_SP);
        // The decomposed path (live attention dropout, too small to ever drop) masks too.
        let mut dropout = windowed(left);
        dropout.attention_dropout = 1e-9;
        assert_equivalent(&dropout, CP2);
    }
}

#[test]
fn scaled_rope_matches_one_rank_under_cp2_and_pipeline_chunks() {
    for model in [llama3_small(), yarn_small()] {
        assert_equivalent(&model, CP2);
        let mut deep = model.clone();
        deep.num_layers = 4;
        assert_equivalent_in_stages(&deep, ONE_RANK, 2);
        assert_equivalent_in_stages(&deep, CP2, 2);
    }
}

/// The switches change the numbers (a test of equivalence alone would pass with a switch
/// ignored everywhere): each loss differs from the plain LLaMA's.
#[test]
fn every_switch_changes_the_loss() {
    let loss = |model: &Model| {
        let full = build::<CpuAutodiff>(model, 17);
        let (inputs, targets) = causal_batch();
        scalar(full.loss(inputs, targets).loss)
    };
    let plain = loss(&llama_small());
    // (The QKV bias starts at zero, so it changes no loss at init; the equivalence tests above
    // shift it, and `counts.rs` counts it.)
    for (name, model) in [
        ("qk_layernorm", qwen_small(false, true)),
        ("window 2", windowed(2)),
        ("llama3 scaling", llama3_small()),
        ("yarn scaling", yarn_small()),
    ] {
        // The same arithmetic gives the same bits; any change to it, other bits (a tiny random
        // model's loss moves by about 1e-5 here).
        let changed = loss(&model);
        assert_ne!(changed, plain, "{name}: the loss of the plain model");
    }
    // A window reaching every earlier key is full causal attention, run as such.
    assert_eq!(loss(&windowed(15)), plain);
}

fn causal_batch() -> (Tensor<CpuAutodiff, 2, Int>, Tensor<CpuAutodiff, 2, Int>) {
    let row: Vec<u32> = (0..17).map(|t| (t * 37 + 11) % 100).collect();
    (tokens(&[&row[..16]]), tokens(&[&row[1..]]))
}

/// The configuration fills each scaling type's defaults, keeps the window's left size, turns
/// `add_bias_linear` into a QKV bias too, and refuses what the tables or masks cannot express.
#[test]
fn the_config_resolves_the_switches_and_refuses_what_they_cannot_express() {
    let resolved = config(&yarn_small());
    let scaling = resolved.rope_scaling.expect("scaled");
    assert_eq!(
        (scaling.beta_slow, scaling.mscale, scaling.mscale_all_dim),
        (Some(1.0), Some(1.0), Some(0.0))
    );
    assert_eq!(scaling.low_freq_factor, None, "not a key of yarn");
    assert_eq!(config(&windowed(6)).window_size, Some((6, 0)));
    assert!(
        config(&gpt2_model()).add_qkv_bias,
        "add_bias_linear implies it"
    );
    assert!(!config(&llama_small()).add_qkv_bias);

    let refused = |model: Model| ModelConfig::from_model(&model, PADDED_VOCAB).unwrap_err();
    let mut learned = llama3_small();
    learned.position_embedding = PositionEmbedding::Learned;
    assert!(
        refused(learned)
            .to_string()
            .contains("needs model.position_embedding: rope")
    );
    let mut ahead = windowed(6);
    ahead.window_size = Some([6, 1]);
    assert!(refused(ahead).to_string().contains("only causal windows"));
    assert!(matches!(
        refused(windowed(0)),
        ModelError::ZeroSize {
            field: "window_size[0]"
        }
    ));
    let foreign = scaled(json!({"type": "linear", "factor": 2.0, "beta_fast": 4.0}));
    assert!(
        refused(foreign)
            .to_string()
            .contains("beta_fast does not apply to type linear")
    );
    let inverted = scaled(json!({"type": "llama3", "factor": 8.0, "low_freq_factor": 4.0}));
    assert!(
        refused(inverted)
            .to_string()
            .contains("low_freq_factor < high_freq_factor")
    );
}

/// QK-norm's weights sit where the Hugging Face mapping (`ferrotron-hf`) and checkpoints name
/// them, beside the QKV bias.
#[test]
fn qk_norm_and_qkv_bias_parameters_are_named_by_their_module_path() {
    let model = build::<Cpu>(&qwen_small(true, true), 1);
    let names: Vec<String> = model
        .param_roles()
        .into_iter()
        .map(|role| role.shard.global_name)
        .filter(|name| name.starts_with("layers.0.attention."))
        .collect();
    for expected in [
        "layers.0.attention.qkv.bias",
        "layers.0.attention.q_norm.Rms.gamma",
        "layers.0.attention.k_norm.Rms.gamma",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} in {names:?}"
        );
    }
}
