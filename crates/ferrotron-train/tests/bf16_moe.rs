//! DeepSeek-V3's MoE computing in bf16 (the device's default float dtype, as on a GPU; burn-flex
//! asserts in test builds that both operands of every op share a dtype, as the CUDA backends
//! require): its combine weights in f32 cast back, and its expert bias kept in f32 as Megatron
//! keeps it, through updates and a checkpoint round trip. Its own test binary, because a
//! device's default dtype is process-wide and fixed on first use.

use std::collections::HashMap;

use burn::backend::{Autodiff, Flex};
use burn::tensor::{DType, FloatDType, Int, Tensor, TensorData};
use ferrotron_model::{ExpertLoads, GptModel, ModelConfig};
use ferrotron_train::precision::use_compute_dtype;
use ferrotron_train::{load_named_tensors, named_tensors};

type B = Autodiff<Flex>;

/// Two layers, the first dense by the list form of `layer_freq`; the second routes top-2 of 4
/// experts by sigmoid scores with the bias, in 2 groups, scaled by 2.5, plus a shared expert.
fn config() -> ModelConfig {
    let model: ferrotron_recipe::Model = serde_json::from_value(serde_json::json!({
        "num_layers": 2, "hidden_size": 16, "num_attention_heads": 2, "seq_length": 8,
        "max_position_embeddings": 8, "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "moe": {"num_experts": 4, "router_topk": 2, "score_function": "sigmoid",
                "expert_bias": true, "expert_bias_update_rate": 1.0e-3,
                "num_groups": 2, "group_topk": 1, "router_topk_scaling_factor": 2.5,
                "shared_expert_ffn_hidden_size": 32, "layer_freq": [0, 1]}
    }))
    .expect("the model section parses");
    ModelConfig::from_model_with_vocab(&model, 64, 64).expect("a valid model")
}

fn bias(model: &GptModel<B>) -> Tensor<B, 1> {
    model.expert_biases()[0].clone()
}

#[test]
fn the_expert_bias_stays_f32_in_a_bf16_model() {
    let device = Default::default();
    use_compute_dtype::<B>(&device, FloatDType::BF16).expect("bf16 on a fresh device");
    let mut model: GptModel<B> = config().init(&device);
    assert_eq!(bias(&model).dtype(), DType::F32);

    let ids: Vec<i64> = (0..16).map(|t| (t * 7 + 3) % 64).collect();
    let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(ids.clone(), [2, 8]), &device);
    let labels = Tensor::<B, 2, Int>::from_data(
        TensorData::new(ids.iter().map(|t| (t + 1) % 64).collect(), [2, 8]),
        &device,
    );
    let output = model.loss(tokens, labels);
    assert_eq!(output.loss.dtype(), DType::F32);
    let gradients = output.loss.backward();
    assert!(
        model.expert_biases()[0].grad(&gradients).is_none(),
        "the bias is not trained by gradients"
    );

    // 300 updates of ±1e-3 (expert 0 below the mean load, 3 above): ±0.3 in f32, where a bf16
    // bias would take steps of 2⁻⁹ ≈ 2e-3 from 0.25 on (its spacing there) and overshoot.
    let mut loads = ExpertLoads::from_layers(vec![vec![0, 2, 2, 2]]);
    for _ in 0..300 {
        model = model
            .update_expert_bias(&mut loads)
            .expect("one MoE layer's loads");
    }
    let values: Vec<f32> = bias(&model).into_data().iter::<f32>().collect();
    assert_eq!(bias(&model).dtype(), DType::F32);
    assert!((values[0] - 0.3).abs() < 1e-5, "{values:?}");
    assert!((values[1] + 0.3).abs() < 1e-5, "{values:?}");

    // A checkpoint's f32 values load back into the f32 bias, the rest into bf16.
    let saved: HashMap<String, _> = named_tensors::<B, _>(&model)
        .into_iter()
        .map(|t| (t.name.clone(), t))
        .collect();
    let fresh: GptModel<B> = config().init(&device);
    let loaded = load_named_tensors(fresh, &saved).expect("the same model");
    assert_eq!(bias(&loaded).dtype(), DType::F32);
    let reloaded: Vec<f32> = bias(&loaded).into_data().iter::<f32>().collect();
    assert_eq!(reloaded, values);
}
