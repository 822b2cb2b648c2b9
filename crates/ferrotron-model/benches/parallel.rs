//! Forward+backward time of the shakespeare-tiny shape on one rank and split over two thread
//! ranks (tp2, tp2 with sequence parallelism, cp2), on burn's CPU backend. What it shows is the
//! cost of the collectives and of the split arithmetic next to the work each rank saves; the
//! time per step is the slowest rank's, measured inside the ranks so model building and thread
//! start-up are excluded.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use criterion::{Criterion, criterion_group, criterion_main};
use ferrotron_dist::{Communicator, World};
use ferrotron_model::{ChunkSpec, GptModel, ModelConfig, split_for_context_parallel};
use ferrotron_parallel::ParallelContext;
use ferrotron_recipe::{Activation, Model, Normalization, PositionEmbedding};

type Train = Autodiff<Flex>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

const BATCH: usize = 4;
const SEQ: usize = 128;
const PADDED_VOCAB: u32 = 50304;

/// Flex's RNG is process-global: ranks build their models one at a time.
static INIT: Mutex<()> = Mutex::new(());

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

fn batch<B: Backend>(offset: i64) -> Tensor<B, 2, Int> {
    let ids: Vec<i64> = (0..(BATCH * SEQ) as i64)
        .map(|i| (i * 7919 + offset) % 50257)
        .collect();
    Tensor::from_data(TensorData::new(ids, [BATCH, SEQ]), &Default::default())
}

#[derive(Clone, Copy)]
struct Layout {
    tp: usize,
    cp: usize,
    sequence_parallel: bool,
}

/// `iters` training steps on every rank of `layout`; the slowest rank's time.
fn run(config: &ModelConfig, layout: Layout, iters: u64) -> Duration {
    let times = World::new((layout.tp * layout.cp) as u32)
        .run(|rank| -> Result<Duration, BoxError> {
            let world = rank.world();
            let members: Vec<u32> = (0..world.size() as u32).collect();
            let group = Arc::new(world.new_group("split", &members)?);
            let ctx = ParallelContext {
                tp: if layout.tp > 1 {
                    group.clone()
                } else {
                    ParallelContext::single().tp
                },
                cp: if layout.cp > 1 {
                    group
                } else {
                    ParallelContext::single().cp
                },
                sequence_parallel: layout.sequence_parallel,
                ..ParallelContext::single()
            };
            let device = Default::default();
            let model = {
                let _guard = INIT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                Train::seed(&device, 1);
                GptModel::<Train>::new_parallel(config, &ctx, &ChunkSpec::whole(config), &device)?
            };
            let (tokens, labels) =
                split_for_context_parallel(batch(0), batch(1), ctx.cp_rank(), ctx.cp_size())?;
            world.barrier()?;
            let start = Instant::now();
            for _ in 0..iters {
                let loss = model.loss(tokens.clone(), labels.clone()).loss;
                loss.backward();
            }
            Ok(start.elapsed())
        })
        .expect("every rank runs");
    times.into_iter().max().unwrap_or_default()
}

fn benches(c: &mut Criterion) {
    let config = ModelConfig::from_model(&tiny_gpt(), PADDED_VOCAB).expect("valid bench model");
    let layouts = [
        (
            "one rank",
            Layout {
                tp: 1,
                cp: 1,
                sequence_parallel: false,
            },
        ),
        (
            "tp2",
            Layout {
                tp: 2,
                cp: 1,
                sequence_parallel: false,
            },
        ),
        (
            "tp2+sp",
            Layout {
                tp: 2,
                cp: 1,
                sequence_parallel: true,
            },
        ),
        (
            "cp2",
            Layout {
                tp: 1,
                cp: 2,
                sequence_parallel: false,
            },
        ),
    ];
    for (name, layout) in layouts {
        c.bench_function(
            &format!("gpt-tiny/{name}/forward+backward b{BATCH}xs{SEQ}"),
            |b| b.iter_custom(|iters| run(&config, layout, iters)),
        );
    }
}

criterion_group! {
    name = parallel;
    config = Criterion::default().sample_size(10);
    targets = benches
}
criterion_main!(parallel);
