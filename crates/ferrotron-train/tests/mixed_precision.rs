//! Mixed precision end to end on the CPU backend: a GPT trained with bf16 as the device's
//! default float dtype (burn-flex has bf16 arithmetic, and in test builds it asserts that both
//! operands of every op share a dtype, as the CUDA backends require). Its own test binary,
//! because a device's default dtype is process-wide and fixed on first use.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, Flex};
use burn::tensor::{DType, FloatDType, bf16};
use ferrotron_data::Tokenizer;
use ferrotron_model::{GptModel, ModelConfig};
use ferrotron_parallel::ParallelContext;
use ferrotron_plan::{Plan, PlanOptions};
use ferrotron_recipe::Recipe;
use ferrotron_telemetry::MemoryProbe;
use ferrotron_train::checkpoint::{MODEL_FILE, read_safetensors};
use ferrotron_train::precision::use_compute_dtype;
use ferrotron_train::{
    AdamW, AdamWConfig, Microbatch, RunOptions, RunSummary, StepContext, StopFlag, StopReason,
    param_entries, train_rank, train_step,
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
            moment_dtypes: ferrotron_ops::F32_MOMENTS,
            main_grads_dtype: burn::tensor::DType::F32,
            offload_fraction: None,
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
    // the step keeps its state flat: each master is a range of its group's fp32 buffer
    let params = param_entries::<B, _>(&model);
    assert!(params.iter().all(|p| optimizer.has_master(p.id)));
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

/// A bf16 run resumes where it stopped through the runtime's checkpoint path: the checkpoint
/// holds the fp32 master weights (not their bf16 rounding), which become the masters again on
/// load. 6 steps straight, and 3 steps + save (the exit interval) + a new run that resumes + 3,
/// give the same loss bits.
#[test]
fn a_bf16_run_resumes_bit_for_bit_from_its_fp32_master_weights() {
    let device = Default::default();
    use_compute_dtype::<B>(&device, FloatDType::BF16).expect("bf16 on a fresh device");
    let dir = tempfile::tempdir().expect("tempdir");
    let tokenizer = Tokenizer::from_tokenizer_json(&fixtures().join("tokenizer.json"))
        .expect("the fixture tokenizer loads");
    let run = |name: &str, exit_interval: Option<u64>| -> RunSummary {
        let plan = plan(dir.path(), name, &tokenizer);
        let options = RunOptions {
            run_dir: dir.path().join(name).join("run"),
            stop: StopFlag::default(),
            exit_interval,
            announce: |_| {},
            memory: MemoryProbe::process(),
        };
        let alone = ParallelContext::single();
        train_rank::<B>(&plan, alone, &tokenizer, &options, &device).expect("a bf16 run")
    };
    let straight = run("straight", None);
    let first = run("split", Some(3));
    assert_eq!(first.stopped, Some(StopReason::ExitInterval));
    let checkpoint = first
        .checkpoint
        .clone()
        .expect("saved at the exit interval");
    let saved = read_safetensors(&checkpoint.join(MODEL_FILE)).expect("the model file reads");
    let off_the_bf16_grid = saved
        .values()
        .flat_map(|t| &t.values)
        .filter(|v| f32::from(bf16::from_f32(**v)) != **v)
        .count();
    assert!(
        off_the_bf16_grid > 0,
        "the checkpoint holds only bf16 values"
    );
    let rest = run("split", None);
    assert_eq!(rest.start_iteration, 3);
    let bits = |losses: &[f64]| losses.iter().map(|l| l.to_bits()).collect::<Vec<_>>();
    let resumed: Vec<f64> = first.losses.iter().chain(&rest.losses).copied().collect();
    assert_eq!(straight.losses.len(), 6);
    assert_eq!(
        bits(&straight.losses),
        bits(&resumed),
        "loss bits differ after a bf16 resume"
    );
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parallel")
}

/// A 2-layer GPT on the parallel fixture's corpus, its checkpoints under `dir/name`.
fn plan(dir: &Path, name: &str, tokenizer: &Tokenizer) -> Plan {
    let recipe: Recipe = serde_json::from_value(serde_json::json!({
        "version": 2, "name": "bf16-resume",
        "model": {"num_layers": 2, "hidden_size": 16, "num_attention_heads": 2,
                  "seq_length": 16, "make_vocab_size_divisible_by": 32,
                  "hidden_dropout": 0.0, "attention_dropout": 0.0},
        "precision": {"dtype": "bf16"},
        "training": {"micro_batch_size": 2, "global_batch_size": 4, "train_iters": 6,
                     "log_interval": 1, "eval_interval": 0, "seed": 7,
                     "optimizer": {"lr": 0.01}},
        "data": {"tokenizer": {"type": "hf", "file": fixtures().join("tokenizer.json")},
                 "blend": [{"path": fixtures().join("corpus.jsonl")}],
                 "split": "100,0,0", "cache_dir": dir.join("cache")},
        "checkpoint": {"dir": dir.join(name).join("ckpt"), "resume": "auto"},
        "runtime": {"backend": "cpu"}
    }))
    .expect("the test recipe parses");
    let options = PlanOptions {
        cluster: None,
        vocab_size: tokenizer.vocab_size(),
    };
    ferrotron_plan::plan(&recipe, &options).expect("the test recipe plans")
}
