//! Resuming is exact: N steps straight and N/2 steps + checkpoint + a fresh process-like restart
//! (new model with a different initialisation, new optimizer) + N/2 steps give bit-identical
//! losses on CPU. Dropout is on, so this also proves the per-iteration seeding.

use burn::module::AutodiffModule;
use ferrotron_model::{GptModel, ModelConfig};
use ferrotron_recipe::Model;
use ferrotron_train::checkpoint::{CheckpointStore, read_safetensors, write_safetensors};
use ferrotron_train::{
    AdamW, AdamWConfig, CpuBackend, CpuTrainBackend, Microbatch, StepContext, evaluate,
    load_named_tensors, named_tensors, param_entries, train_step,
};

type B = CpuTrainBackend;

const SEQ: usize = 8;
const SEED: u64 = 7;

fn config() -> ModelConfig {
    let model: Model = serde_json::from_value(serde_json::json!({
        "num_layers": 2, "hidden_size": 16, "num_attention_heads": 2, "seq_length": SEQ,
        "vocab_size": 64, "hidden_dropout": 0.1, "attention_dropout": 0.1
    }))
    .expect("model section parses");
    ModelConfig::from_model(&model, 128).expect("valid tiny model")
}

/// The data of iteration `i`: two microbatches of two samples, a pure function of `i` (as the
/// real loader's samples are a pure function of consumed samples).
fn batches(iteration: u64) -> Vec<Microbatch> {
    (0..2u64)
        .map(|m| {
            let samples: Vec<Vec<u32>> = (0..2u64)
                .map(|s| {
                    (0..=SEQ as u64)
                        .map(|t| ((iteration * 31 + m * 17 + s * 7 + t * 3) % 64) as u32)
                        .collect()
                })
                .collect();
            Microbatch::from_samples(&samples, SEQ).expect("well-formed samples")
        })
        .collect()
}

fn adamw() -> AdamWConfig {
    AdamWConfig {
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
        moment_dtypes: ferrotron_ops::F32_MOMENTS,
        main_grads_dtype: burn::tensor::DType::F32,
        offload_fraction: None,
    }
}

fn context(iteration: u64) -> StepContext {
    StepContext {
        iteration,
        seed: SEED,
        lr: 3e-3 / iteration as f64,
        clip_grad: 0.5,
    }
}

fn fresh(init_seed: u64) -> (GptModel<B>, AdamW<CpuBackend>) {
    let device = Default::default();
    <B as burn::tensor::backend::Backend>::seed(&device, init_seed);
    let model: GptModel<B> = config().init(&device);
    let optimizer = AdamW::new(adamw(), model.no_weight_decay_params());
    (model, optimizer)
}

fn run(
    mut model: GptModel<B>,
    optimizer: &mut AdamW<CpuBackend>,
    iterations: std::ops::RangeInclusive<u64>,
) -> (GptModel<B>, Vec<u64>) {
    let device = Default::default();
    let mut losses = Vec::new();
    for iteration in iterations {
        let (next, stats) = train_step(
            model,
            optimizer,
            &batches(iteration),
            context(iteration),
            &device,
        )
        .expect("finite step");
        model = next;
        losses.push(stats.loss.to_bits());
    }
    (model, losses)
}

#[test]
fn resumed_run_matches_uninterrupted_bit_for_bit() {
    let (model, mut optimizer) = fresh(SEED);
    let (straight_model, straight) = run(model, &mut optimizer, 1..=6);

    let (model, mut optimizer) = fresh(SEED);
    let (half_model, mut resumed) = run(model, &mut optimizer, 1..=3);
    let root = tempfile::tempdir().expect("tempdir");
    let store = CheckpointStore::new(root.path(), Some(1));
    let folder = store
        .save(3, |dir| {
            write_safetensors(
                &dir.join("model.safetensors"),
                &named_tensors::<B, _>(&half_model),
            )?;
            let entries = param_entries::<B, _>(&half_model);
            write_safetensors(
                &dir.join("optimizer.safetensors"),
                &optimizer.state_tensors(&entries),
            )
        })
        .expect("checkpoint saves");
    drop((half_model, optimizer));

    // A different initialisation proves everything comes from the checkpoint.
    let (model, mut optimizer) = fresh(SEED + 1000);
    let tensors = read_safetensors(&folder.join("model.safetensors")).expect("model reads");
    let model = load_named_tensors::<B, _>(model, &tensors).expect("same model loads");
    let moments = read_safetensors(&folder.join("optimizer.safetensors")).expect("moments read");
    optimizer
        .load_state(
            &param_entries::<B, _>(&model),
            &moments,
            3,
            &Default::default(),
        )
        .expect("moments load");
    let (resumed_model, rest) = run(model, &mut optimizer, 4..=6);
    resumed.extend(rest);

    assert_eq!(straight, resumed, "loss bits differ after resume");
    let device = Default::default();
    let eval = |m: &GptModel<B>| evaluate(&m.valid(), &batches(99), &device).to_bits();
    assert_eq!(eval(&straight_model), eval(&resumed_model));
}

#[test]
fn training_lowers_the_loss_on_a_fixed_batch() {
    let (mut model, mut optimizer) = fresh(SEED);
    let device = Default::default();
    let data = batches(1);
    let mut first = None;
    let mut last = 0.0;
    for iteration in 1..=30 {
        let step = StepContext {
            iteration,
            seed: SEED,
            lr: 1e-2,
            clip_grad: 1.0,
        };
        let (next, stats) =
            train_step(model, &mut optimizer, &data, step, &device).expect("finite");
        model = next;
        first.get_or_insert(stats.lm_loss);
        last = stats.lm_loss;
    }
    let first = first.expect("ran");
    assert!(last < 0.5 * first, "loss {first} → {last}");
}

#[test]
fn non_finite_loss_stops_before_the_update() {
    let (model, mut optimizer) = fresh(SEED);
    let device = Default::default();
    // An absurd rate blows the weights up on step 1; step 2's loss is then not a number.
    let absurd = |iteration| StepContext {
        iteration,
        seed: SEED,
        lr: 1e30,
        clip_grad: 0.0,
    };
    let (model, _) = train_step(model, &mut optimizer, &batches(1), absurd(1), &device)
        .expect("step 1 is finite");
    let err = train_step(model, &mut optimizer, &batches(2), absurd(2), &device)
        .expect_err("step 2 must stop");
    let message = err.to_string();
    assert!(message.starts_with("iteration 2: the loss is"), "{message}");
    assert_eq!(
        optimizer.step_count(),
        1,
        "the failed step must not reach the optimizer"
    );
}

#[test]
fn moe_expert_bias_is_updated_after_each_step() {
    let model: Model = serde_json::from_value(serde_json::json!({
        "num_layers": 1, "hidden_size": 16, "num_attention_heads": 2, "seq_length": SEQ,
        "vocab_size": 64, "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "moe": {"num_experts": 4, "router_topk": 2, "score_function": "sigmoid",
                "expert_bias": true, "load_balancing": "none", "expert_bias_update_rate": 0.01}
    }))
    .expect("model section parses");
    let config = ModelConfig::from_model(&model, 128).expect("valid MoE model");
    let device = Default::default();
    let model: GptModel<B> = config.init(&device);
    let before: Vec<f32> = model.expert_biases()[0]
        .to_data()
        .to_vec()
        .expect("f32 bias");
    let mut optimizer = AdamW::new(adamw(), model.no_weight_decay_params());
    let (model, _) =
        train_step(model, &mut optimizer, &batches(1), context(1), &device).expect("finite step");
    let after: Vec<f32> = model.expert_biases()[0]
        .to_data()
        .to_vec()
        .expect("f32 bias");
    assert_ne!(
        before, after,
        "the aux-loss-free bias must move with the loads"
    );
    // every change is ±rate or 0 (sign of mean load − load)
    for (b, a) in before.iter().zip(&after) {
        let delta = (a - b).abs();
        assert!(
            delta < 1e-6 || (delta - 0.01).abs() < 1e-6,
            "{before:?} → {after:?}"
        );
    }
}
