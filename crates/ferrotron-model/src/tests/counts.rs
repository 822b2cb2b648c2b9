use burn::module::Module;

use super::*;

#[test]
fn logits_cover_the_padded_vocabulary() {
    for model in [gpt2_model(), llama_model(), moe_model()] {
        let gpt = build::<Cpu>(&model, 1);
        let output = gpt.forward(tokens(&[&[1, 2, 3, 4, 5], &[6, 7, 8, 9, 10]]));
        assert_eq!(output.logits.dims(), [2, 5, 128]);
        assert_eq!(output.aux_loss.dims(), [1]);
    }
}

#[test]
fn dense_models_report_no_aux_loss_and_no_loads() {
    let gpt = build::<Cpu>(&gpt2_model(), 1);
    let output = gpt.forward(tokens(&[&[1, 2, 3]]));
    assert_eq!(scalar(output.aux_loss), 0.0);
    assert!(output.expert_loads.summed().is_empty());
}

#[test]
fn gpt2_parameter_count_matches_megatron_by_hand() {
    // h=16, ffn=64, 4 heads (kv 4), 2 layers, padded vocab 128, 8 learned positions, tied.
    // embedding 128·16 = 2048; positions 8·16 = 128;
    // per layer: qkv 16·48 + 48 = 816, proj 16·16 + 16 = 272, two LayerNorms 2·(16+16) = 64,
    //            fc1 16·64 + 64 = 1088, fc2 64·16 + 16 = 1040 → 3280; two layers 6560;
    // final LayerNorm 32; tied output adds nothing. Total 2048 + 128 + 6560 + 32 = 8768.
    let gpt = build::<Cpu>(&gpt2_model(), 1);
    assert_eq!(gpt.num_params(), 8768);
}

#[test]
fn llama_parameter_count_matches_megatron_by_hand() {
    // h=16, 4 heads, 2 groups, kv 4, SwiGLU ffn 32, RMSNorm, untied, no biases.
    // embedding 2048; per layer: qkv 16·(4 + 2·2)·4 = 512, proj 16·16 = 256, two RMSNorms 32,
    //            fc1 16·64 = 1024, fc2 32·16 = 512 → 2336; two layers 4672;
    // final RMSNorm 16; output layer 16·128 = 2048. Total 2048 + 4672 + 16 + 2048 = 8784.
    let gpt = build::<Cpu>(&llama_model(), 1);
    assert_eq!(gpt.num_params(), 8784);
}

#[test]
fn moe_parameter_count_matches_megatron_by_hand() {
    // As LLaMA, layer 0 is MoE (layer_freq 2): attention 512 + 256, norms 32, router 16·4 = 64,
    // 4 experts of SwiGLU ffn 8: 4·(16·16 + 8·16) = 1536, shared expert ffn 16: 16·32 + 16·16
    // = 768 → 3168. Layer 1 dense: 2336. Total 2048 + 3168 + 2336 + 16 + 2048 = 9616.
    let gpt = build::<Cpu>(&moe_model(), 1);
    assert_eq!(gpt.num_params(), 9616);
    assert_eq!(gpt.num_trainable_params(), 9616);
}

#[test]
fn expert_bias_is_a_buffer_not_a_trainable_parameter() {
    let mut model = moe_model();
    if let Some(moe) = model.moe.as_mut() {
        moe.score_function = ScoreFunction::Sigmoid;
        moe.expert_bias = true;
    }
    let gpt = build::<Cpu>(&model, 1);
    assert_eq!(gpt.num_params(), 9616 + 4);
    assert_eq!(gpt.num_trainable_params(), 9616);
    // One-dimensional: 2·2 RMSNorm weights + final norm + the bias buffer.
    assert_eq!(gpt.no_weight_decay_params().len(), 6);
}

#[test]
fn no_weight_decay_covers_norms_and_biases_only() {
    // GPT-2 tiny: per layer qkv, proj, fc1, fc2 biases + 2 LayerNorms × (weight, bias) = 8;
    // two layers 16, final LayerNorm 2 → 18. Embeddings and weight matrices decay.
    let gpt = build::<Cpu>(&gpt2_model(), 1);
    assert_eq!(gpt.no_weight_decay_params().len(), 18);
    // LLaMA tiny: no biases; 2 RMSNorms per layer + final = 5.
    let llama = build::<Cpu>(&llama_model(), 1);
    assert_eq!(llama.no_weight_decay_params().len(), 5);
}

#[test]
fn invalid_combinations_are_refused_with_a_reason() {
    let mut sinkhorn = moe_model();
    if let Some(moe) = sinkhorn.moe.as_mut() {
        moe.load_balancing = LoadBalancing::Sinkhorn;
    }
    let error = ModelConfig::from_model(&sinkhorn, PADDED_VOCAB).unwrap_err();
    assert_eq!(
        error.to_string(),
        "model.moe.load_balancing: sinkhorn balances by routing alone; it needs aux_loss_coeff: 0"
    );

    let mut groups = llama_model();
    groups.num_query_groups = Some(3);
    let error = ModelConfig::from_model(&groups, PADDED_VOCAB).unwrap_err();
    assert_eq!(
        error.to_string(),
        "model.num_attention_heads (4) must be divisible by model.num_query_groups (3)"
    );

    let mut bias = moe_model();
    if let Some(moe) = bias.moe.as_mut() {
        moe.expert_bias = true;
    }
    let error = ModelConfig::from_model(&bias, PADDED_VOCAB).unwrap_err();
    assert!(error.to_string().contains("sigmoid"), "{error}");

    let error = ModelConfig::from_model(&gpt2_model(), 64).unwrap_err();
    assert!(
        error.to_string().contains("smaller than the vocabulary"),
        "{error}"
    );

    let mut long = gpt2_model();
    long.max_position_embeddings = Some(4);
    assert!(ModelConfig::from_model(&long, PADDED_VOCAB).is_err());
}

#[test]
fn burn_models_have_exactly_the_planners_parameter_count() {
    let mut gqa_moe = moe_model();
    if let Some(moe) = gqa_moe.moe.as_mut() {
        moe.layer_freq = ferrotron_recipe::LayerFreq::Every(1);
        moe.num_experts = 8;
        moe.shared_expert_ffn_hidden_size = None;
    }
    // DeepSeek-V3's MoE: the first layer dense by the list form, sigmoid scores with the
    // expert bias (a buffer, not a parameter), groups, scaling and a shared expert.
    let mut deepseek_moe = moe_model();
    deepseek_moe.moe = Some(ferrotron_recipe::Moe {
        layer_freq: ferrotron_recipe::LayerFreq::Pattern(vec![0, 1]),
        score_function: ferrotron_recipe::ScoreFunction::Sigmoid,
        expert_bias: true,
        num_groups: Some(2),
        group_topk: Some(1),
        router_topk_scaling_factor: Some(2.5),
        ..moe_section()
    });
    let mut untied_gpt2 = gpt2_model();
    untied_gpt2.tie_embeddings = false;
    untied_gpt2.max_position_embeddings = Some(32);
    for model in [
        gpt2_model(),
        untied_gpt2,
        llama_model(),
        moe_model(),
        gqa_moe,
        deepseek_moe,
    ] {
        let planned = ferrotron_plan::parameter_count(&model, PADDED_VOCAB).total;
        let built = build::<Cpu>(&model, 1).num_trainable_params() as u64;
        assert_eq!(built, planned, "{model:?}");
    }
}

#[test]
fn every_dense_switch_combination_builds_runs_and_matches_the_planner() {
    let positions = [
        PositionEmbedding::Learned,
        PositionEmbedding::Rope,
        PositionEmbedding::None,
    ];
    let norms = [Normalization::Layernorm, Normalization::Rmsnorm];
    let activations = [Activation::Gelu, Activation::GeluTanh, Activation::Swiglu];
    for position_embedding in positions {
        for normalization in norms {
            for activation in activations {
                for (tie_embeddings, add_bias_linear) in
                    [(true, true), (true, false), (false, true), (false, false)]
                {
                    let model = Model {
                        position_embedding,
                        normalization,
                        activation,
                        tie_embeddings,
                        add_bias_linear,
                        num_query_groups: Some(2),
                        num_layers: 1,
                        ..gpt2_model()
                    };
                    let gpt = build::<Cpu>(&model, 1);
                    let logits = gpt.forward(tokens(&[&[1, 2, 3]])).logits;
                    assert_eq!(logits.dims(), [1, 3, 128]);
                    assert!(values(logits).iter().all(|v| v.is_finite()), "{model:?}");
                    let planned = ferrotron_plan::parameter_count(&model, PADDED_VOCAB).total;
                    assert_eq!(gpt.num_trainable_params() as u64, planned, "{model:?}");
                }
            }
        }
    }
}

/// Qwen2.5's QKV bias alone, Qwen3's QK-norm (RMSNorm, and LayerNorm with its bias) with a
/// head dimension that is not hidden / heads: the model holds what the planner counts.
#[test]
fn qkv_bias_and_qk_norm_are_the_planned_parameters() {
    for normalization in [Normalization::Rmsnorm, Normalization::Layernorm] {
        for (add_qkv_bias, qk_layernorm, add_bias_linear) in [
            (true, false, false),
            (false, true, false),
            (true, true, false),
            (false, true, true),
        ] {
            let model = Model {
                normalization,
                add_qkv_bias,
                qk_layernorm,
                add_bias_linear,
                kv_channels: Some(6),
                num_layers: 2,
                ..llama_model()
            };
            let gpt = build::<Cpu>(&model, 1);
            let planned = ferrotron_plan::parameter_count(&model, PADDED_VOCAB).total;
            assert_eq!(gpt.num_trainable_params() as u64, planned, "{model:?}");
            let plain = ferrotron_plan::parameter_count(&llama_model(), PADDED_VOCAB);
            let qkv_out = (4 + 2 * 2) * 6;
            let per_norm = match normalization {
                Normalization::Rmsnorm => 6,
                Normalization::Layernorm => 12,
            };
            let extra = u64::from(add_qkv_bias || add_bias_linear) * qkv_out
                + u64::from(add_bias_linear) * 16
                + u64::from(qk_layernorm) * 2 * per_norm;
            let count = ferrotron_plan::parameter_count(&model, PADDED_VOCAB);
            let projections = 16 * qkv_out + 4 * 6 * 16;
            assert_eq!(count.attention_per_layer, projections + extra, "{model:?}");
            assert_eq!(plain.attention_per_layer, 16 * (4 + 2 * 2) * 4 + 16 * 16);
        }
    }
}

#[test]
#[should_panic(expected = "longer than the 8 positions")]
fn sequences_longer_than_the_learned_table_are_refused() {
    let gpt = build::<Cpu>(&gpt2_model(), 1);
    gpt.forward(tokens(&[&[1; 9]]));
}

#[test]
fn the_real_vocabulary_comes_from_the_recipe_or_the_caller() {
    let mut model = gpt2_model();
    assert_eq!(config(&model).vocab_size, 100);
    model.vocab_size = None;
    assert_eq!(config(&model).vocab_size, 128);
    let given = ModelConfig::from_model_with_vocab(&model, 50, PADDED_VOCAB).expect("valid");
    assert_eq!((given.vocab_size, given.padded_vocab_size), (50, 128));
}

#[test]
fn mla_parameter_count_matches_megatron_by_hand() {
    // LLaMA's trunk, MLA: hidden 16, 4 heads, q latent 12, kv latent 8, heads of 6 + 4 query/key
    // and 5 value channels, latent RMSNorms. Per layer: linear_q_down_proj 16·12 = 192,
    // q_layernorm 12, linear_q_up_proj 12·(4·10) = 480, linear_kv_down_proj 16·(8 + 4) = 192,
    // kv_layernorm 8, linear_kv_up_proj 8·(4·11) = 352, linear_proj 20·16 = 320 → 1556;
    // two RMSNorms 32, fc1 1024, fc2 512 → 3124; two layers 6248. Embedding 2048, final norm
    // 16, output layer 2048. Total 10360.
    let gpt = build::<Cpu>(&mla_model(), 1);
    assert_eq!(gpt.num_params(), 10360);
    // Every MLA variant holds what the planner counts.
    for (q_lora_rank, qk_layernorm, add_bias_linear, normalization) in [
        (Some(12), true, false, Normalization::Rmsnorm),
        (None, true, false, Normalization::Rmsnorm),
        (Some(12), false, true, Normalization::Layernorm),
        (None, false, true, Normalization::Rmsnorm),
    ] {
        let mut model = Model {
            qk_layernorm,
            add_bias_linear,
            normalization,
            ..mla_model()
        };
        if let Some(mla) = model.mla.as_mut() {
            mla.q_lora_rank = q_lora_rank;
        }
        let planned = ferrotron_plan::parameter_count(&model, PADDED_VOCAB).total;
        let built = build::<Cpu>(&model, 1).num_trainable_params() as u64;
        assert_eq!(built, planned, "{model:?}");
    }
}
