//! Forward + backward of one MoE layer: one rank processing two ranks' tokens in turn, against
//! two expert-parallel thread ranks (each with its own tokens and half the experts) using the
//! all-to-all and the all-gather dispatcher. The gap is the price of the exchanges (host copies
//! through the thread communicator) minus what the second core buys.

use std::sync::Arc;
use std::time::{Duration, Instant};

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use criterion::{Criterion, criterion_group, criterion_main};
use ferrotron_dist::{Communicator, World};
use ferrotron_model::ModelConfig;
use ferrotron_model::moe::MoeLayer;
use ferrotron_parallel::{Comm, ParallelContext};
use ferrotron_recipe::{
    Activation, LayerFreq, LoadBalancing, Model, Moe, Normalization, PositionEmbedding,
    ScoreFunction, TokenDispatcher, TokenDropPolicy,
};

type B = Autodiff<Flex>;

const BATCH: usize = 4;
const SEQ: usize = 128;
const HIDDEN: usize = 128;

fn model() -> Model {
    Model {
        num_layers: 2,
        hidden_size: HIDDEN as u32,
        ffn_hidden_size: Some(256),
        num_attention_heads: 4,
        num_query_groups: None,
        kv_channels: None,
        vocab_size: Some(1024),
        make_vocab_size_divisible_by: 128,
        seq_length: SEQ as u32,
        max_position_embeddings: None,
        position_embedding: PositionEmbedding::Rope,
        rotary_base: 10000.0,
        normalization: Normalization::Rmsnorm,
        norm_epsilon: 1e-5,
        activation: Activation::Swiglu,
        tie_embeddings: false,
        add_bias_linear: false,
        hidden_dropout: 0.0,
        attention_dropout: 0.0,
        init_method_std: 0.02,
        rope_scaling: None,
        add_qkv_bias: false,
        qk_layernorm: false,
        window_size: None,
        moe: Some(Moe {
            num_experts: 8,
            router_topk: 2,
            load_balancing: LoadBalancing::AuxLoss,
            aux_loss_coeff: 1e-2,
            z_loss_coeff: None,
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
            ffn_hidden_size: Some(256),
            shared_expert_ffn_hidden_size: None,
        }),
        mla: None,
    }
}

fn layer() -> MoeLayer<B> {
    let config = ModelConfig::from_model(&model(), 1024).expect("the bench model is valid");
    let moe = config.moe.clone().expect("an MoE model");
    let device = Default::default();
    B::seed(&device, 3);
    MoeLayer::new(&config, &moe, &device)
}

fn step(layer: &MoeLayer<B>) {
    let device = Default::default();
    let x = Tensor::<B, 3>::random(
        [BATCH, SEQ, HIDDEN],
        Distribution::Normal(0.0, 1.0),
        &device,
    )
    .require_grad();
    let (output, stats) = layer.forward(x);
    let loss = output.sum() + stats.aux_loss;
    std::hint::black_box(loss.backward());
}

/// `iters` steps on two ep ranks (layers built outside the timing); the slower rank's time.
fn ep2(dispatcher: TokenDispatcher, iters: u64) -> Duration {
    let times = World::new(2)
        .run(|rank| {
            let ep: Comm = Arc::new(rank.world().new_group("ep", &[0, 1])?);
            let ctx = ParallelContext {
                ep: ep.clone(),
                ..ParallelContext::single()
            };
            let local = layer()
                .shard_with(&ctx, dispatcher)
                .map_err(|error| error.to_string())?;
            ep.barrier()?;
            let start = Instant::now();
            for _ in 0..iters {
                step(&local);
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(start.elapsed())
        })
        .expect("both ranks run");
    times.into_iter().max().unwrap_or_default()
}

fn benches(c: &mut Criterion) {
    let full = layer();
    c.bench_function("moe layer fwd+bwd, one rank, 2×512 tokens", |b| {
        b.iter(|| {
            step(&full);
            step(&full);
        })
    });
    c.bench_function("moe layer fwd+bwd, ep2 all-to-all, 512 tokens/rank", |b| {
        b.iter_custom(|iters| ep2(TokenDispatcher::Alltoall, iters))
    });
    c.bench_function("moe layer fwd+bwd, ep2 all-gather, 512 tokens/rank", |b| {
        b.iter_custom(|iters| ep2(TokenDispatcher::Allgather, iters))
    });
}

criterion_group! {
    name = moe_dispatch;
    config = Criterion::default().sample_size(10);
    targets = benches
}
criterion_main!(moe_dispatch);
