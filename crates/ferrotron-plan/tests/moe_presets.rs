//! The presets of today's fine-grained MoE models (issue 46) at their published sizes:
//! DeepSeek-V3 (multi-latent attention, three dense layers then 58 MoE layers of 256 routed
//! experts and a shared one) and Qwen3-MoE. Each model's total and active parameter counts are
//! the published ones (DeepSeek-V3's 671B without its multi-token-prediction module, 37B active;
//! Qwen3's from their config.json, "A3B" and "A22B" active), each layout fits 80 GiB H100s, and
//! `recipe plan`'s FLOPs per iteration are Megatron-LM's `num_floating_point_operations`: the
//! values below are that function's own output, run by `tools/megatron_flops_ref.py` on
//! Megatron-LM's training.py and arguments.py (d98e8a64dd, 2026-08-22; its
//! `multi_latent_attention` branch, and `--moe-layer-freq` parsed by its `moe_freq_type`) for
//! each preset's shape, padded vocabulary and batch; all three agree to 0 relative difference.

mod support;

use ferrotron_plan::{PlanOptions, parameter_count, plan};
use support::load_preset;

struct Preset {
    name: &'static str,
    /// The published checkpoint's count (embedding rows as published).
    parameters: u64,
    /// Parameters one token passes through, embeddings included.
    active: u64,
    /// Megatron's FLOPs per iteration at the preset's batch, sequence and padded vocabulary.
    flops: f64,
}

const PRESETS: &[Preset] = &[
    Preset {
        name: "deepseek-v3",
        parameters: 671_026_404_352,
        active: 37_552_282_624,
        flops: 15_716_815_461_112_872_960.0,
    },
    Preset {
        name: "qwen3-30b-a3b",
        parameters: 30_532_122_624,
        active: 3_353_032_704,
        flops: 48_247_669_738_438_656.0,
    },
    Preset {
        name: "qwen3-235b-a22b",
        parameters: 235_093_634_560,
        active: 22_190_763_520,
        flops: 620_916_206_437_662_720.0,
    },
];

#[test]
fn each_moe_preset_has_its_published_total_and_active_parameters() {
    for preset in PRESETS {
        let model = load_preset(preset.name).model;
        let vocab = model
            .vocab_size
            .expect("the presets state their vocabulary");
        let published_rows = model.padded_vocab_size(vocab, 1);
        assert_eq!(published_rows, vocab, "{}: rows as published", preset.name);
        let count = parameter_count(&model, published_rows);
        assert_eq!(
            (count.total, count.active()),
            (preset.parameters, preset.active),
            "{}",
            preset.name
        );
    }
}

#[test]
fn each_moe_preset_plans_megatrons_flops_and_fits_its_h100s() {
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
        assert_eq!(format!("{:?}", cluster.gpu), "H100", "{}", preset.name);
    }
}

/// DeepSeek-V3 at Megatron-LM's recommended layout (TP 2, PP 16, EP 64 on 1024 GPUs): expert
/// tensor 1, so the 64 expert ranks are the tensor × data ranks of a stage, and every rank holds
/// 4 of the 256 experts of each MoE layer.
#[test]
fn deepseek_v3_plans_megatrons_published_layout() {
    let recipe = load_preset("deepseek-v3");
    let options = PlanOptions {
        cluster: None,
        vocab_size: 129_280,
    };
    let plan = plan(&recipe, &options).expect("plans");
    let d = plan.degrees;
    assert_eq!(
        (d.tp, d.pp, d.cp, d.ep, d.etp, d.dp, plan.world_size),
        (2, 16, 1, 64, 1, 32, 1024)
    );
    let layers: Vec<u32> = plan.stages.iter().map(|s| s.num_layers).collect();
    assert_eq!(layers.iter().sum::<u32>(), 61);
    assert_eq!((layers[0], layers[15]), (3, 2));
    // Only the first stage holds the dense layers.
    assert_eq!(plan.stages[0].moe_layers, 0);
    assert_eq!(plan.stages[1].moe_layers, 4);
}
