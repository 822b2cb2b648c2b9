//! Mixed precision end to end on the CPU backend: a GPT trained with bf16 as the device's
//! default float dtype (burn-flex has bf16 arithmetic, and in test builds it asserts that both
//! operands of every op share a dtype, as the CUDA backends require). Its own test binary,
//! because a device's default dtype is process-wide and fixed on first use.

use std::collections::{HashMap, HashSet};

use burn::backend::{Autodiff, Flex};
use burn::tensor::{DType, FloatDType, bf16};
use ferrotron_model::{GptModel, ModelConfig};
use ferrotron_train::precision::use_compute_dtype;
use ferrotron_train::{
    AdamW, AdamWConfig, Microbatch, NamedTensor, StepContext, load_named_tensors, named_tensors,
    param_entries, train_step,
};

type B = Autodiff<Flex>;

fn config() -> ModelConfig {
    let recipe: ferrotron_recipe::Model = serde_saphyr::from_str(
        "num_layers: 2\nhidden_size: 16\nnum_attention_heads: 2\nseq_length: 8\n\
         max_position_embeddings: 8\nhidden_dropout: 0.0\nattention_dropout: 0.0\n",
    )
    .expect("model section parses");
    ModelConfig::from_model_with_vocab(&recipe, 64, 64).expect("valid model")
}

/// A learnable stream: token t+1 = (3·t + 1) mod 64.
fn batch() -> Vec<Microbatch> {
    (0..2)
        .map(|m| {
            let samples: Vec<Vec<u32>> = (0..4)
                .map(|row| {
                    let mut t = (m * 4 + row) as u32 * 5 % 64;
                    (0..9)
                        .map(|_| {
                            let now = t;
                            t = (3 * t + 1) % 64;
                            now
                        })
                        .collect()
                })
                .collect();
            Microbatch::from_samples(&samples, 8).expect("samples of seq + 1 tokens")
        })
        .collect()
}

#[test]
fn a_gpt_trains_in_bf16_with_fp32_master_weights() {
    let device = Default::default();
    use_compute_dtype::<B>(&device, FloatDType::BF16).expect("bf16 on a fresh device");
    let mut model: GptModel<B> = config().init(&device);
    let mut optimizer = AdamW::<Flex>::new(
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        },
        HashSet::new(),
    );
    let microbatches = batch();
    let mut losses = Vec::new();
    for iteration in 1..=20 {
        let context = StepContext {
            iteration,
            seed: 1,
            lr: 1e-2,
            clip_grad: 1.0,
        };
        let (next, stats) = train_step(model, &mut optimizer, &microbatches, context, &device)
            .expect("a bf16 step");
        model = next;
        assert!(stats.grad_norm.is_finite(), "step {iteration}: {stats:?}");
        losses.push(stats.loss);
    }
    let params = named_tensors::<B, _>(&model);
    assert_eq!(optimizer.master_weights().len(), params.len());
    let embedding = model_dtypes(&model);
    assert!(embedding.iter().all(|d| *d == DType::BF16), "{embedding:?}");
    let (first, last) = (losses[0], losses[losses.len() - 1]);
    assert!(
        last < first * 0.7,
        "the loss falls in bf16: {first} → {last} ({losses:?})"
    );
}

fn model_dtypes(model: &GptModel<B>) -> Vec<DType> {
    use burn::module::{Module, ModuleVisitor, Param};
    use burn::tensor::Tensor;
    struct Dtypes(Vec<DType>);
    impl ModuleVisitor<B> for Dtypes {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push(param.val().dtype());
        }
    }
    let mut visitor = Dtypes(Vec::new());
    model.visit(&mut visitor);
    visitor.0
}

fn optimizer_for(model: &GptModel<B>) -> AdamW<Flex> {
    AdamW::<Flex>::new(
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        },
        model.no_weight_decay_params(),
    )
}

fn train(
    mut model: GptModel<B>,
    optimizer: &mut AdamW<Flex>,
    iterations: std::ops::RangeInclusive<u64>,
) -> (GptModel<B>, Vec<u64>) {
    let device = Default::default();
    let mut losses = Vec::new();
    for iteration in iterations {
        let context = StepContext {
            iteration,
            seed: 1,
            lr: 1e-2,
            clip_grad: 1.0,
        };
        let (next, stats) =
            train_step(model, optimizer, &batch(), context, &device).expect("a bf16 step");
        model = next;
        losses.push(stats.loss.to_bits());
    }
    (model, losses)
}

fn by_name(tensors: Vec<NamedTensor>) -> HashMap<String, NamedTensor> {
    tensors.into_iter().map(|t| (t.name.clone(), t)).collect()
}

/// A checkpoint of a bf16 run holds the fp32 master weights, so the run resumes where it
/// stopped: 6 steps straight and 3 + save + restore into a differently initialised model + 3
/// give the same loss bits.
#[test]
fn a_bf16_run_resumes_bit_for_bit_from_its_fp32_master_weights() {
    let device = Default::default();
    use_compute_dtype::<B>(&device, FloatDType::BF16).expect("bf16 on a fresh device");
    let fresh = |seed: u64| -> GptModel<B> {
        <B as burn::tensor::backend::Backend>::seed(&device, seed);
        config().init(&device)
    };
    let model = fresh(5);
    let mut optimizer = optimizer_for(&model);
    let (_, straight) = train(model, &mut optimizer, 1..=6);

    let model = fresh(5);
    let mut optimizer = optimizer_for(&model);
    let (half, mut resumed) = train(model, &mut optimizer, 1..=3);
    let params = optimizer.checkpoint_params::<B, _>(&half);
    let moments = optimizer.state_tensors(&param_entries::<B, _>(&half));
    let off_the_bf16_grid = params
        .iter()
        .flat_map(|t| &t.values)
        .filter(|v| f32::from(bf16::from_f32(**v)) != **v)
        .count();
    assert!(
        off_the_bf16_grid > 0,
        "the checkpoint holds only bf16 values"
    );
    drop((half, optimizer));

    let model = fresh(99);
    let mut optimizer = optimizer_for(&model);
    let params = by_name(params);
    let model = load_named_tensors::<B, _>(model, &params).expect("same model loads");
    optimizer
        .load_state(
            &param_entries::<B, _>(&model),
            &by_name(moments),
            3,
            &device,
        )
        .expect("moments load");
    optimizer.restore_master_weights::<B, _>(&model, &params, &device);
    let (_, rest) = train(model, &mut optimizer, 4..=6);
    resumed.extend(rest);
    assert_eq!(straight, resumed, "loss bits differ after a bf16 resume");
}
