//! The shipped recipes must all describe models this crate can build, and the tiny one must run
//! end to end from YAML through the planner.

use std::path::{Path, PathBuf};

use ferrotron_plan::{PlanOptions, plan};
use ferrotron_recipe::{LoadOptions, Recipe, load};

use super::*;

/// GPT-2's BPE vocabulary, for presets that take their vocabulary from that tokenizer.
const GPT2_VOCAB: u32 = 50257;

fn recipes_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../recipes")
}

fn load_recipe(path: &Path) -> Recipe {
    let options = LoadOptions {
        overrides: &[],
        use_env: false,
    };
    match load(path, &options) {
        Ok(loaded) => loaded.recipe,
        Err(errors) => panic!("{} does not load: {errors:?}", path.display()),
    }
}

#[test]
fn every_preset_resolves_to_a_buildable_model() {
    let mut presets: Vec<PathBuf> = std::fs::read_dir(recipes_dir())
        .expect("recipes/ exists")
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    presets.sort();
    assert!(!presets.is_empty());
    for path in presets {
        let recipe = load_recipe(&path);
        let model = &recipe.model;
        let vocab = model.vocab_size.unwrap_or(GPT2_VOCAB);
        let tensor = recipe.parallel.tensor.fixed().unwrap_or(1);
        let padded = model.padded_vocab_size(vocab, tensor);
        let config = ModelConfig::from_model(model, padded)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(config.padded_vocab_size % 128, 0, "{}", path.display());
    }
}

#[test]
fn the_tiny_preset_runs_from_its_plan() {
    let recipe = load_recipe(&recipes_dir().join("shakespeare-tiny.yaml"));
    let options = PlanOptions {
        cluster: None,
        vocab_size: recipe.model.vocab_size.unwrap_or(GPT2_VOCAB),
    };
    let plan = plan(&recipe, &options).unwrap_or_else(|findings| panic!("{findings:?}"));
    let config = ModelConfig::from_model_with_vocab(
        &plan.recipe.model,
        plan.vocab_size,
        plan.padded_vocab_size,
    )
    .expect("the tiny preset builds");
    assert_eq!(config.padded_vocab_size, plan.padded_vocab_size as usize);
    let device = Default::default();
    Cpu::seed(&device, 0);
    let gpt = config.init::<Cpu>(&device);
    assert_eq!(gpt.num_trainable_params() as u64, plan.parameters.total);
    let logits = gpt.forward(tokens(&[&[464, 3290, 318, 257]])).logits;
    assert_eq!(logits.dims(), [1, 4, config.padded_vocab_size]);
}
