//! The name and shape mapping against `config.json` files that transformers wrote: 5.24 from
//! each class's documented defaults (`GPT2Config()`, `LlamaConfig()`, `MixtralConfig()`), 5.25
//! from the published configurations of Llama 3.1 8B, Qwen2.5 7B, Qwen3 8B and Mistral 7B v0.1
//! (under tests/fixtures/): every tensor name and shape of the first layer and outside the layers
//! is snapshotted, and the parameter count must be the published one of the model (GPT-2 small,
//! LLaMA-2 7B, Mixtral 8x7B, and transformers' own count of the four, on the meta device). The
//! same for the published configurations of DeepSeek-V3 and Qwen3-30B-A3B (transformers 4.x
//! spelling; transformers 5.25's count on the meta device, DeepSeek-V3's selection biases
//! included and its multi-token prediction layer not, which transformers does not build), and
//! for the tiny models transformers 5.25 saved for tests/it/hf.rs.

use std::path::Path;

use ferrotron_hf::names::{Dims, pieces};
use ferrotron_hf::{Family, HfConfig};
use ferrotron_recipe::RopeScalingType;

fn fixture(name: &str) -> HfConfig {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    HfConfig::read(&dir).expect("the fixture reads")
}

/// `name [shape]` lines of the tensors outside the layers and of layer 0 (expert 0 of MoE),
/// and the parameter count.
fn mapping(config: &HfConfig) -> (String, u64) {
    let vocab = config.vocab as usize;
    let dims = Dims::of(&config.model, vocab, vocab);
    let pieces = pieces(&dims);
    let count = pieces
        .iter()
        .map(|p| p.shape.iter().product::<usize>() as u64)
        .sum();
    let shown: Vec<String> = pieces
        .iter()
        .filter(|p| {
            let layer = p.hf.contains(".h.") || p.hf.contains(".layers.");
            let first = p.hf.contains(".h.0.") || p.hf.contains(".layers.0.");
            let expert = p.hf.contains(".experts.") && !p.hf.contains(".shared_experts.");
            !layer || (first && (!expert || p.hf.contains(".experts.0.")))
        })
        .map(|p| format!("{} {:?}", p.hf, p.shape))
        .collect();
    (shown.join("\n"), count)
}

#[test]
fn gpt2_small() {
    let config = fixture("gpt2");
    assert_eq!(config.family, Family::Gpt2);
    let (names, count) = mapping(&config);
    assert_eq!(count, 124_439_808);
    insta::assert_snapshot!("gpt2", names);
}

#[test]
fn llama_2_7b() {
    let config = fixture("llama");
    assert_eq!(config.family, Family::Llama);
    let (names, count) = mapping(&config);
    assert_eq!(count, 6_738_415_616);
    insta::assert_snapshot!("llama", names);
}

#[test]
fn mixtral_8x7b() {
    let config = fixture("mixtral");
    assert_eq!(config.family, Family::Mixtral);
    let (names, count) = mapping(&config);
    assert_eq!(count, 46_702_792_704);
    insta::assert_snapshot!("mixtral", names);
}

#[test]
fn llama_3_1_8b() {
    let config = fixture("llama3.1");
    assert_eq!(config.family, Family::Llama);
    let scaling = config.model.rope_scaling.expect("llama3 scaling");
    assert_eq!(
        (scaling.scaling_type, scaling.factor),
        (RopeScalingType::Llama3, 8.0)
    );
    assert_eq!(scaling.original_max_position_embeddings, Some(8192));
    assert_eq!(config.model.rotary_base, 5e5);
    let (names, count) = mapping(&config);
    assert_eq!(count, 8_030_261_248);
    insta::assert_snapshot!("llama3.1", names);
}

#[test]
fn qwen2_5_7b() {
    let config = fixture("qwen2.5");
    assert_eq!(config.family, Family::Qwen2);
    // use_sliding_window: false, whatever sliding_window says
    assert_eq!(config.model.window_size, None);
    let (names, count) = mapping(&config);
    assert_eq!(count, 7_615_616_512);
    insta::assert_snapshot!("qwen2.5", names);
}

#[test]
fn qwen3_8b() {
    let config = fixture("qwen3");
    assert_eq!(config.family, Family::Qwen3);
    assert!(config.model.qk_layernorm);
    let (names, count) = mapping(&config);
    assert_eq!(count, 8_190_735_360);
    insta::assert_snapshot!("qwen3", names);
}

#[test]
fn mistral_7b() {
    let config = fixture("mistral");
    assert_eq!(config.family, Family::Mistral);
    assert_eq!(config.model.window_size, Some([4095, 0]));
    let (names, count) = mapping(&config);
    assert_eq!(count, 7_241_732_096);
    insta::assert_snapshot!("mistral", names);
}

/// The first MoE layer's names: DeepSeek-V3's layer 0 is dense.
fn moe_layer(config: &HfConfig, layer: usize) -> String {
    let vocab = config.vocab as usize;
    let prefix = format!(".layers.{layer}.");
    pieces(&Dims::of(&config.model, vocab, vocab))
        .iter()
        .filter(|p| p.hf.contains(&prefix))
        .filter(|p| !p.hf.contains(".experts.") || p.hf.contains(".experts.0."))
        .map(|p| format!("{} {:?}", p.hf, p.shape))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn deepseek_v3() {
    let config = fixture("deepseek-v3");
    assert_eq!(config.family, Family::DeepseekV3);
    assert_eq!(config.problems, vec![]);
    assert_eq!(config.mtp_layers, 1);
    let moe = config.model.moe.as_ref().expect("MoE");
    let dense_first: Vec<bool> = (0..61).map(|l| l >= 3).collect();
    assert_eq!(config.model.moe_layers(), dense_first);
    assert_eq!(
        (
            moe.num_groups,
            moe.group_topk,
            moe.router_topk_scaling_factor
        ),
        (Some(8), Some(4), Some(2.5))
    );
    assert_eq!(moe.shared_expert_ffn_hidden_size, Some(2048));
    let (names, count) = mapping(&config);
    assert_eq!(count, 671_026_419_200);
    insta::assert_snapshot!("deepseek-v3", names);
    insta::assert_snapshot!("deepseek-v3-layer-3", moe_layer(&config, 3));
}

#[test]
fn qwen3_30b_a3b() {
    let config = fixture("qwen3-30b-a3b");
    assert_eq!(config.family, Family::Qwen3Moe);
    assert_eq!(config.problems, vec![]);
    let moe = config.model.moe.as_ref().expect("MoE");
    assert!(
        !moe.pre_softmax,
        "norm_topk_prob: true is softmax after top-k"
    );
    let (names, count) = mapping(&config);
    assert_eq!(count, 30_532_122_624);
    insta::assert_snapshot!("qwen3-30b-a3b", names);
}

/// The tiny models transformers saved: every tensor of their files is in the mapping (the
/// multi-token prediction layer aside), with its shape, and the counts are transformers'.
#[test]
fn transformers_tiny_moe_models() {
    for (name, family, count) in [
        ("qwen3-moe-tiny", Family::Qwen3Moe, 17_136),
        ("deepseek-v3-tiny", Family::DeepseekV3, 17_496),
    ] {
        let config = fixture(name);
        assert_eq!(
            (config.family, &config.problems),
            (family, &vec![]),
            "{name}"
        );
        assert_eq!(mapping(&config).1, count, "{name}");
    }
    let qwen = fixture("qwen3-moe-tiny");
    assert_eq!(qwen.model.moe_layers(), [true, false, true, false]);
    let deepseek = fixture("deepseek-v3-tiny");
    assert_eq!(deepseek.model.moe_layers(), [false, true, true, true]);
}

#[test]
fn defaults_are_their_own_model() {
    for name in ["llama3.1", "qwen2.5", "qwen3", "mistral"] {
        assert_eq!(fixture(name).problems, vec![], "{name}");
    }
    for name in ["llama", "mixtral"] {
        let config = fixture(name);
        assert_eq!(config.problems, vec![], "{name}");
        assert_eq!(
            config.model.rotary_base,
            if name == "llama" { 1e4 } else { 1e6 }
        );
    }
    // GPT-2's `gelu_new` is the tanh approximation, which `gelu_tanh` computes.
    let gpt2 = fixture("gpt2");
    assert_eq!(gpt2.problems, vec![]);
    assert_eq!(
        gpt2.model.activation,
        ferrotron_recipe::Activation::GeluTanh
    );
}
