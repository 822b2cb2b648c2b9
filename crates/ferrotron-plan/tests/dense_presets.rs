//! The presets of today's dense families (issue 45) at their published sizes: each model's
//! parameter count is the one its Hugging Face config.json gives (the embedding rows as
//! published, which 128 divides, so Megatron's padding at one tensor rank adds none), its
//! layout fits 80 GiB H100s, and `recipe plan`'s FLOPs per iteration are Megatron-LM's
//! `num_floating_point_operations`: the values below are that function's own output, run by
//! `tools/megatron_flops_ref.py` on Megatron-LM's training.py (d98e8a64dd, 2026-12-06) for each
//! preset's shape, padded vocabulary and batch; all eight agree to 0 relative difference.

mod support;

use ferrotron_plan::{PlanOptions, parameter_count, plan};
use ferrotron_recipe::PositionEmbedding;
use support::load_preset;

struct Preset {
    name: &'static str,
    /// Hugging Face's count of the published checkpoint.
    parameters: u64,
    /// Megatron's FLOPs per iteration at the preset's batch, sequence and padded vocabulary.
    flops: f64,
}

const PRESETS: &[Preset] = &[
    Preset {
        name: "llama3.1-8b",
        parameters: 8_030_261_248,
        flops: 53_970_627_761_012_736.0,
    },
    Preset {
        name: "llama3.1-70b",
        parameters: 70_553_706_496,
        flops: 1_884_228_678_473_220_096.0,
    },
    Preset {
        name: "llama3.1-405b",
        parameters: 405_853_388_800,
        flops: 42_346_221_396_257_931_264.0,
    },
    Preset {
        name: "qwen2.5-7b",
        parameters: 7_615_616_512,
        flops: 47_068_443_517_648_896.0,
    },
    Preset {
        name: "qwen3-8b",
        parameters: 8_190_735_360,
        flops: 51_414_263_226_433_536.0,
    },
    Preset {
        name: "qwen3-32b",
        parameters: 32_762_123_264,
        flops: 214_754_412_113_952_768.0,
    },
    Preset {
        name: "mistral-7b",
        parameters: 7_241_732_096,
        flops: 102_980_259_057_500_160.0,
    },
];

#[test]
fn each_preset_has_its_published_parameter_count() {
    for preset in PRESETS {
        let model = load_preset(preset.name).model;
        let vocab = model
            .vocab_size
            .expect("the presets state their vocabulary");
        let published_rows = model.padded_vocab_size(vocab, 1);
        assert_eq!(published_rows, vocab, "{}: rows as published", preset.name);
        assert_eq!(
            parameter_count(&model, published_rows).total,
            preset.parameters,
            "{}",
            preset.name
        );
    }
}

#[test]
fn each_preset_plans_megatrons_flops_and_fits_its_h100s() {
    for preset in PRESETS {
        let recipe = load_preset(preset.name);
        let options = PlanOptions {
            cluster: None,
            vocab_size: recipe.model.vocab_size.expect("stated"),
        };
        let plan = plan(&recipe, &options).unwrap_or_else(|f| panic!("{}: {f:?}", preset.name));
        let relative = (plan.flops_per_iteration - preset.flops).abs() / preset.flops;
        assert!(
            relative < 1e-12,
            "{}: {} vs Megatron's {}",
            preset.name,
            plan.flops_per_iteration,
            preset.flops
        );
        assert!(plan.memory.fits, "{} does not fit", preset.name);
        let cluster = recipe.cluster.as_ref().expect("a cluster");
        assert_eq!(
            format!("{:?}", cluster.gpu),
            "H100",
            "{}: laid out for H100s",
            preset.name
        );
        assert_eq!(recipe.model.position_embedding, PositionEmbedding::Rope);
    }
}

/// Each family's switch is on where the published model has it, and only there.
#[test]
fn each_family_sets_its_own_switches() {
    for preset in PRESETS {
        let model = load_preset(preset.name).model;
        let family = preset.name.split(['-', '.']).next().unwrap_or_default();
        let scaled = model.rope_scaling.is_some();
        let expected = (
            family == "llama3",
            preset.name.starts_with("qwen2.5"),
            family == "qwen3",
            (family == "mistral").then_some([4095, 0]),
        );
        assert_eq!(
            (
                scaled,
                model.add_qkv_bias,
                model.qk_layernorm,
                model.window_size
            ),
            expected,
            "{}",
            preset.name
        );
    }
}
