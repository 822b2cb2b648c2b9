//! The routers of DeepSeek-V3 (sigmoid scores, expert bias for selection only, group-limited
//! top-k, normalised, scaled by `router_topk_scaling_factor`) and Qwen3-MoE (softmax,
//! `norm_topk_prob` either way) against the combine weights Megatron-Core's
//! `topk_routing_with_score_function` and transformers' routers give for the same logits
//! (`routing_reference.json`, written by `tools/moe_routing_ref.py`). Both the host router and
//! the device decisions with the layer's differentiable weights are checked. (transformers
//! ranks DeepSeek's groups by their top 2 scores, Megatron by their top `topk / group_topk`:
//! the cases keep that ratio at 2, DeepSeek-V3's 8 / 4, where both agree.)

use burn::module::{Param, ParamId};
use burn::tensor::{Tensor, TensorData};
use ferrotron_recipe::Moe;

use super::decisions::Decisions;
use super::layer::MoeLayer;
use crate::tests::{Cpu, config, moe_model, values};

struct Reference {
    tokens: usize,
    cases: Vec<Case>,
}

struct Case {
    name: String,
    moe: serde_json::Value,
    logits: Vec<f32>,
    expert_bias: Option<Vec<f32>>,
    /// `[tokens, experts]`: each token's combine weight of each expert (0 where not chosen).
    weights: Vec<f32>,
}

fn floats(value: &serde_json::Value) -> Vec<f32> {
    let list = value.as_array().expect("a list of numbers");
    list.iter()
        .map(|v| v.as_f64().expect("a number") as f32)
        .collect()
}

fn reference() -> Reference {
    let json: serde_json::Value =
        serde_json::from_str(include_str!("routing_reference.json")).expect("the fixture parses");
    let cases = json["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|case| Case {
            name: case["name"].as_str().expect("a name").to_owned(),
            moe: case["moe"].clone(),
            logits: floats(&case["logits"]),
            expert_bias: (!case["expert_bias"].is_null()).then(|| floats(&case["expert_bias"])),
            weights: floats(&case["weights"]),
        })
        .collect();
    Reference {
        tokens: json["tokens"].as_u64().expect("tokens") as usize,
        cases,
    }
}

/// The case's layer with the identity as its router (hidden size = experts), so its logits
/// are its input, and the case's selection bias.
fn layer(case: &Case) -> MoeLayer<Cpu> {
    let moe: Moe = serde_json::from_value(case.moe.clone()).expect("a recipe MoE section");
    let experts = moe.num_experts as usize;
    let model = ferrotron_recipe::Model {
        hidden_size: experts as u32,
        num_attention_heads: 2,
        moe: Some(Moe {
            shared_expert_ffn_hidden_size: None,
            layer_freq: ferrotron_recipe::LayerFreq::Every(1),
            ..moe
        }),
        ..moe_model()
    };
    let model_config = config(&model);
    let moe_config = model_config.moe.clone().expect("an MoE model");
    let device = Default::default();
    let mut layer = MoeLayer::<Cpu>::new(&model_config, &moe_config, &device);
    layer.router.weight = Param::from_tensor(Tensor::eye(experts, &device));
    if let Some(bias) = &case.expert_bias {
        let bias = Tensor::from_data(TensorData::new(bias.clone(), [experts]), &device);
        layer.expert_bias = Some(Param::initialized(ParamId::new(), bias).set_require_grad(false));
    }
    layer
}

fn scatter(tokens: usize, experts: usize, chosen: &[usize], weights: &[f32]) -> Vec<f32> {
    let topk = chosen.len() / tokens;
    let mut dense = vec![0.0; tokens * experts];
    for (slot, (&expert, &weight)) in chosen.iter().zip(weights).enumerate() {
        dense[slot / topk * experts + expert] = weight;
    }
    dense
}

fn assert_close(name: &str, what: &str, actual: &[f32], expected: &[f32]) {
    assert_eq!(actual.len(), expected.len(), "{name}: {what}");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (a - e).abs() < 1e-6,
            "{name}: {what}: token {i} weight {a}, Megatron/transformers {e}"
        );
    }
}

#[test]
fn host_routing_gives_megatrons_and_transformers_weights() {
    let reference = reference();
    for case in &reference.cases {
        let layer = layer(case);
        let experts = layer.num_experts();
        let routing = layer.route(&case.logits, true);
        let dense = scatter(
            reference.tokens,
            experts,
            &routing.experts,
            &routing.weights,
        );
        assert_close(&case.name, "host router", &dense, &case.weights);
    }
}

#[test]
fn device_decisions_and_combine_weights_give_megatrons_and_transformers_weights() {
    let reference = reference();
    let device = Default::default();
    for case in &reference.cases {
        let layer = layer(case);
        let experts = layer.num_experts();
        let logits = Tensor::<Cpu, 2>::from_data(
            TensorData::new(case.logits.clone(), [reference.tokens, experts]),
            &device,
        );
        let decisions = Decisions::on_device(&layer.config, logits.clone(), layer.expert_bias());
        let chosen: Vec<usize> = decisions
            .chosen
            .clone()
            .reshape([-1])
            .into_data()
            .iter::<i64>()
            .map(|e| e as usize)
            .collect();
        let weights = values(layer.combine_weights(logits, decisions.chosen.clone()));
        let dense = scatter(reference.tokens, experts, &chosen, &weights);
        assert_close(&case.name, "device decisions", &dense, &case.weights);
    }
}
