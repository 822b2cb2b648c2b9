//! The name and shape mapping against `config.json` files that transformers 5.24 wrote from
//! each class's documented defaults (`GPT2Config()`, `LlamaConfig()`, `MixtralConfig()`, under
//! tests/fixtures/): every tensor name and shape of the first layer and outside the layers is
//! snapshotted, and the parameter count must be the published one of the model those defaults
//! describe (GPT-2 small, LLaMA-2 7B, Mixtral 8x7B).

use std::path::Path;

use ferrotron_hf::names::{Dims, pieces};
use ferrotron_hf::{Family, HfConfig};

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
            let expert = p.hf.contains(".experts.");
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
fn defaults_are_their_own_model() {
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
