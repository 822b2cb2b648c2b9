//! Forward and forward+backward time of small models on burn's CPU backend: the numbers the
//! README quotes for CPU training, and a guard against slowdowns in the MoE dispatch loop.

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use criterion::{Criterion, criterion_group, criterion_main};
use ferrotron_model::ModelConfig;
use ferrotron_recipe::{
    Activation, LayerFreq, LoadBalancing, Model, Moe, Normalization, PositionEmbedding,
    ScoreFunction, TokenDispatcher, TokenDropPolicy,
};

const BATCH: usize = 4;
const SEQ: usize = 128;
const PADDED_VOCAB: u32 = 50304;

/// The shakespeare-tiny preset's shape: 4 layers, hidden 128, 4 heads, GPT-2 vocabulary.
fn tiny_gpt() -> Model {
    Model {
        num_layers: 4,
        hidden_size: 128,
        ffn_hidden_size: None,
        num_attention_heads: 4,
        num_query_groups: None,
        kv_channels: None,
        vocab_size: Some(50257),
        make_vocab_size_divisible_by: 128,
        seq_length: SEQ as u32,
        max_position_embeddings: None,
        position_embedding: PositionEmbedding::Learned,
        rotary_base: 10000.0,
        normalization: Normalization::Layernorm,
        norm_epsilon: 1e-5,
        activation: Activation::Gelu,
        tie_embeddings: true,
        add_bias_linear: true,
        hidden_dropout: 0.0,
        attention_dropout: 0.0,
        init_method_std: 0.02,
        moe: None,
        rope_scaling: None,
        add_qkv_bias: false,
        qk_layernorm: false,
        window_size: None,
        mla: None,
    }
}

/// The same trunk, LLaMA-style, with 8 experts top-2 in every layer.
fn tiny_moe() -> Model {
    Model {
        ffn_hidden_size: Some(256),
        num_query_groups: Some(2),
        position_embedding: PositionEmbedding::Rope,
        normalization: Normalization::Rmsnorm,
        activation: Activation::Swiglu,
        add_bias_linear: false,
        moe: Some(Moe {
            num_experts: 8,
            router_topk: 2,
            load_balancing: LoadBalancing::AuxLoss,
            aux_loss_coeff: 1e-2,
            z_loss_coeff: Some(1e-3),
            score_function: ScoreFunction::Softmax,
            pre_softmax: false,
            expert_bias: false,
            expert_bias_update_rate: 1e-3,
            num_groups: None,
            group_topk: None,
            capacity_factor: None,
            token_drop_policy: TokenDropPolicy::Probs,
            pad_to_capacity: false,
            token_dispatcher: TokenDispatcher::Alltoall,
            layer_freq: LayerFreq::Every(1),
            router_topk_scaling_factor: None,
            ffn_hidden_size: Some(128),
            shared_expert_ffn_hidden_size: None,
        }),
        ..tiny_gpt()
    }
}

fn batch<B: Backend>(offset: i64) -> Tensor<B, 2, Int> {
    let ids: Vec<i64> = (0..(BATCH * SEQ) as i64)
        .map(|i| (i * 7919 + offset) % 50257)
        .collect();
    Tensor::from_data(TensorData::new(ids, [BATCH, SEQ]), &Default::default())
}

fn bench_model(c: &mut Criterion, name: &str, model: &Model) {
    let config = ModelConfig::from_model(model, PADDED_VOCAB).expect("valid bench model");
    let device = Default::default();

    let inference = config.init::<Flex>(&device);
    c.bench_function(&format!("{name}/forward b{BATCH}xs{SEQ}"), |b| {
        b.iter(|| {
            let logits = inference.forward(batch::<Flex>(0)).logits;
            logits.into_data()
        })
    });

    let training = config.init::<Autodiff<Flex>>(&device);
    c.bench_function(&format!("{name}/forward+backward b{BATCH}xs{SEQ}"), |b| {
        b.iter(|| {
            let loss = training.loss(batch(0), batch(1)).loss;
            loss.backward()
        })
    });
}

fn benches(c: &mut Criterion) {
    bench_model(c, "gpt-tiny", &tiny_gpt());
    bench_model(c, "moe-tiny", &tiny_moe());
}

criterion_group! {
    name = step;
    config = Criterion::default().sample_size(10);
    targets = benches
}
criterion_main!(step);
