//! The plan's device memory and step time against what `tools/gpu-bench.sh` measured on one
//! H200 and one H100: the numbers the issues hold the planner to (memory within 10 %, the dense
//! models' step within 10 %).
//!
//! Each row is built as the bench script builds it: the preset, the script's common overrides
//! and the row's own, global batch = micro batch (one microbatch a step), one H200. The
//! measured peaks are `nvidia-smi`'s, from the 2026-12-02 17:26 UTC call on the tree with the
//! flat optimizer state; the step times are the bench's medians (tools/README.md). `cargo
//! nextest run -p ferrotron-plan --test bench_rows --no-capture` prints every bench row's
//! prediction, measured or not.

use std::path::Path;

use ferrotron_plan::{Plan, PlanOptions, plan};
use ferrotron_recipe::{Cluster, GpuKind, LoadOptions, load};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// `common` of tools/gpu-bench.sh, less the log and data paths (which the plan does not read).
const COMMON: &[&str] = &[
    "checkpoint.dir=null",
    "parallel.data=1",
    "parallel.distributed_optimizer=false",
    "training.train_tokens=null",
    "training.schedule.warmup_iters=3",
    "training.eval_interval=100000",
    "training.train_iters=30",
];

/// The script's `gpt2_tokenizer` as the plan sees it: the GPT-2 vocabulary.
const GPT2_VOCAB: &str = "model.vocab_size=50257";

const LLAMA_1B: &[&str] = &[
    GPT2_VOCAB,
    "model.num_layers=16",
    "model.hidden_size=2048",
    "model.ffn_hidden_size=8192",
    "model.num_attention_heads=32",
    "model.num_query_groups=8",
    "model.seq_length=4096",
    "recompute.granularity=none",
    "recompute.method=null",
    "recompute.num_layers=null",
];

/// The script's `fp8` rows: Megatron's hybrid format, its default delayed scaling.
const FP8: &[&str] = &["precision.fp8=hybrid"];

const MOE_SMALL: &[&str] = &[
    GPT2_VOCAB,
    "model.num_layers=8",
    "model.hidden_size=1024",
    "model.ffn_hidden_size=2816",
    "model.num_attention_heads=16",
    "model.num_query_groups=4",
    "model.seq_length=2048",
    "parallel.tensor=1",
    "parallel.pipeline=1",
    "parallel.expert=1",
    "parallel.sequence_parallel=false",
    "recompute.granularity=none",
];

const FULL: &[&str] = &[
    "recompute.granularity=full",
    "recompute.method=uniform",
    "recompute.num_layers=1",
];

const NODROP: &[&str] = &["model.attention_dropout=0.0", "model.hidden_dropout=0.0"];

/// The 8B-class presets of issue 45 cut to 4 layers: hidden 4096 (Qwen2.5's 3584) and the real
/// head layout, vocabulary, switches and sequence, one GPU, no recomputation. (The script reads
/// the corpus with the GPT-2 tokenizer, whose ids fit every vocabulary here but Mistral's.)
const DENSE_4L: &[&str] = &[
    "model.num_layers=4",
    "parallel.tensor=1",
    "parallel.pipeline=1",
    "parallel.context=1",
    "parallel.sequence_parallel=false",
    "recompute.granularity=none",
    "recompute.method=null",
    "recompute.num_layers=null",
];

/// The script's `moe_1gpu`: a fine-grained MoE preset on one GPU, no recomputation.
const MOE_1GPU: &[&str] = &[
    "parallel.tensor=1",
    "parallel.pipeline=1",
    "parallel.expert=1",
    "parallel.context=1",
    "parallel.sequence_parallel=false",
    "recompute.granularity=none",
    "recompute.method=null",
    "recompute.num_layers=null",
];

/// The script's `deepseek_3l`: three layers (one dense, two MoE), 16 of the 256 experts.
const DEEPSEEK_3L: &[&str] = &[
    GPT2_VOCAB,
    "model.num_layers=3",
    "model.moe.layer_freq=[0, 1, 1]",
    "model.moe.num_experts=16",
    "parallel.num_layers_in_first_pipeline_stage=null",
    "parallel.num_layers_in_last_pipeline_stage=null",
];

/// The script's `qwen3_235b_2l` beyond `dense_4l` and `moe_1gpu`: two layers, 32 of 128 experts.
const QWEN3_235B_2L: &[&str] = &[
    "model.num_layers=2",
    "model.moe.num_experts=32",
    "parallel.num_layers_in_first_pipeline_stage=null",
    "parallel.num_layers_in_last_pipeline_stage=null",
];

/// One row of the script's `benches`: name, preset, micro batch, extra overrides (the script's
/// arrays, concatenated).
struct Bench {
    name: &'static str,
    preset: &'static str,
    micro_batch: u32,
    extra: &'static [&'static [&'static str]],
}

const BENCHES: &[Bench] = &[
    Bench {
        name: "gpt2-124m",
        preset: "gpt2-124m",
        micro_batch: 16,
        extra: &[],
    },
    Bench {
        name: "gpt-350m",
        preset: "gpt-350m",
        micro_batch: 16,
        extra: &[],
    },
    Bench {
        name: "gpt-350m-mb24",
        preset: "gpt-350m",
        micro_batch: 24,
        extra: &[],
    },
    Bench {
        name: "gpt-350m-mb32",
        preset: "gpt-350m",
        micro_batch: 32,
        extra: &[],
    },
    Bench {
        name: "gpt-350m-mb48",
        preset: "gpt-350m",
        micro_batch: 48,
        extra: &[],
    },
    Bench {
        name: "gpt-1.3b-mb2",
        preset: "gpt-1.3b",
        micro_batch: 2,
        extra: &[],
    },
    Bench {
        name: "gpt-1.3b-mb8",
        preset: "gpt-1.3b",
        micro_batch: 8,
        extra: &[],
    },
    Bench {
        name: "gpt-1.3b",
        preset: "gpt-1.3b",
        micro_batch: 12,
        extra: &[],
    },
    Bench {
        name: "gpt-1.3b-mb16",
        preset: "gpt-1.3b",
        micro_batch: 16,
        extra: &[],
    },
    Bench {
        name: "gpt-1.3b-mb24",
        preset: "gpt-1.3b",
        micro_batch: 24,
        extra: &[],
    },
    Bench {
        name: "gpt-1.3b-mb32",
        preset: "gpt-1.3b",
        micro_batch: 32,
        extra: &[],
    },
    Bench {
        name: "gpt-1.3b-nodrop",
        preset: "gpt-1.3b",
        micro_batch: 12,
        extra: &[NODROP],
    },
    Bench {
        name: "gpt-1.3b-full",
        preset: "gpt-1.3b",
        micro_batch: 12,
        extra: &[FULL],
    },
    Bench {
        name: "gpt-1.3b-full-mb24",
        preset: "gpt-1.3b",
        micro_batch: 24,
        extra: &[FULL],
    },
    Bench {
        name: "llama-1b",
        preset: "llama3-8b",
        micro_batch: 2,
        extra: &[LLAMA_1B],
    },
    Bench {
        name: "llama-1b-mb4",
        preset: "llama3-8b",
        micro_batch: 4,
        extra: &[LLAMA_1B],
    },
    Bench {
        name: "llama-1b-mb6",
        preset: "llama3-8b",
        micro_batch: 6,
        extra: &[LLAMA_1B],
    },
    Bench {
        name: "gpt-1.3b-fp8",
        preset: "gpt-1.3b",
        micro_batch: 12,
        extra: &[FP8],
    },
    Bench {
        name: "llama-1b-mb4-fp8",
        preset: "llama3-8b",
        micro_batch: 4,
        extra: &[LLAMA_1B, FP8],
    },
    Bench {
        name: "llama-1b-mb6-fp8",
        preset: "llama3-8b",
        micro_batch: 6,
        extra: &[LLAMA_1B, FP8],
    },
    Bench {
        name: "llama3.1-8b-4l",
        preset: "llama3.1-8b",
        micro_batch: 2,
        extra: &[DENSE_4L],
    },
    Bench {
        name: "qwen2.5-7b-4l",
        preset: "qwen2.5-7b",
        micro_batch: 4,
        extra: &[DENSE_4L],
    },
    Bench {
        name: "qwen3-8b-4l",
        preset: "qwen3-8b",
        micro_batch: 4,
        extra: &[DENSE_4L],
    },
    Bench {
        name: "mistral-7b-4l",
        preset: "mistral-7b",
        micro_batch: 2,
        extra: &[DENSE_4L, &[GPT2_VOCAB]],
    },
    Bench {
        name: "moe-8x",
        preset: "mixtral-8x7b",
        micro_batch: 4,
        extra: &[MOE_SMALL],
    },
    Bench {
        name: "moe-8x-mb16",
        preset: "mixtral-8x7b",
        micro_batch: 16,
        extra: &[MOE_SMALL],
    },
];

/// Device peaks (GiB), nvidia-smi's, of the 2026-12-05 calls on one H200 (01:58–02:19 UTC),
/// where a step of one microbatch gathers its gradients in the weights' dtype. Rows measured
/// only before that change (the LLaMA-style 1B at micro batch 2, its fp8 row at 4) are left out:
/// their update phase held an fp32 gradient buffer this model no longer counts.
const MEASURED: &[(&str, f64)] = &[
    ("gpt-1.3b", 58.8),
    ("gpt-350m", 35.8),
    ("gpt-350m-mb24", 51.0),
    ("gpt-350m-mb32", 66.2),
    ("llama-1b-mb6", 49.9),
    ("gpt-1.3b-fp8", 60.6),
    ("llama-1b-mb6-fp8", 49.4),
    ("moe-8x", 15.9),
    ("moe-8x-mb16", 31.0),
];

/// Step times (s), the bench's median of steps 6–12. The LLaMA-style 1B at micro batches 2 and 4
/// (and its fp8 row at 4): 2026-12-04 (17:26, 19:43 and 21:13 UTC calls). Every other row: the
/// 2026-12-05 02:03 UTC call (gpt-350m at 24 and 32 from 02:14), release build, after the step
/// stopped waiting for the host and the norm backward became one pass. The MoE is outside the
/// time model's fit.
const MEASURED_STEP: &[(&str, f64)] = &[
    ("gpt-1.3b", 0.388),
    ("gpt-350m", 0.184),
    ("gpt-350m-mb24", 0.278),
    ("gpt-350m-mb32", 0.364),
    ("llama-1b", 0.122),
    ("llama-1b-mb4", 0.234),
    ("llama-1b-mb6", 0.336),
    ("gpt-1.3b-fp8", 0.285),
    ("llama-1b-mb4-fp8", 0.176),
    ("llama-1b-mb6-fp8", 0.247),
];

/// The long-context rows as they ran on one H100 on 2026-12-06, before their recomputation
/// became `auto`: full recomputation, one sequence a step.
const LONG_CONTEXT_FULL: &[&str] = &[
    "recompute.granularity=full",
    "recompute.method=uniform",
    "recompute.num_layers=1",
];

/// Rows measured on one H100 that `BENCHES` does not hold (their overrides came from
/// `EXTRA_SETS`, or the row has changed since).
const H100_DENSE_BENCHES: &[Bench] = &[
    Bench {
        name: "gpt-350m-nodrop",
        preset: "gpt-350m",
        micro_batch: 16,
        extra: &[NODROP],
    },
    Bench {
        name: "llama-1b-32k-full",
        preset: "llama3-8b",
        micro_batch: 1,
        extra: &[
            LLAMA_1B,
            LONG_CONTEXT_FULL,
            &[
                "model.seq_length=32768",
                "model.max_position_embeddings=32768",
            ],
        ],
    },
    Bench {
        name: "llama-1b-128k-full",
        preset: "llama3-8b",
        micro_batch: 1,
        extra: &[
            LLAMA_1B,
            LONG_CONTEXT_FULL,
            &[
                "model.seq_length=131072",
                "model.max_position_embeddings=131072",
            ],
        ],
    },
    Bench {
        name: "llama-1b-32k",
        preset: "llama3-8b",
        micro_batch: 1,
        extra: &[
            LLAMA_1B,
            LONG_CONTEXT_AUTO,
            &[
                "model.seq_length=32768",
                "model.max_position_embeddings=32768",
            ],
        ],
    },
    Bench {
        name: "llama-1b-64k-mlp",
        preset: "llama3-8b",
        micro_batch: 1,
        extra: &[
            LLAMA_1B,
            LINEAR_LOSS,
            &[
                "model.seq_length=65536",
                "model.max_position_embeddings=65536",
                "recompute.granularity=selective",
                "recompute.modules=[core_attn, mlp]",
            ],
        ],
    },
    Bench {
        name: "llama-1b-128k",
        preset: "llama3-8b",
        micro_batch: 1,
        extra: &[
            LLAMA_1B,
            LONG_CONTEXT_AUTO,
            LINEAR_LOSS,
            &[
                "model.seq_length=131072",
                "model.max_position_embeddings=131072",
            ],
        ],
    },
];

/// The script's `long_ctx`: the recomputation the planner picks.
const LONG_CONTEXT_AUTO: &[&str] = &[
    "recompute.granularity=auto",
    "recompute.method=null",
    "recompute.num_layers=null",
];

/// The script's `linear_loss`: the chunked output layer and loss.
const LINEAR_LOSS: &[&str] = &["runtime.cross_entropy_fusion_impl=linear"];

/// Issue 48's long-context rows on one H100 with the recomputation `auto` picks (and selective
/// MLP blocks at 64k): steps (s) and device peaks (GiB, nvidia-smi's). 32k: 2026-12-07 04:45
/// UTC; 64k and 128k: 09:08 and 09:57 UTC (128k's third step, the first two logged together).
const MEASURED_H100_LONG: &[(&str, f64, f64)] = &[
    ("llama-1b-32k", 0.924, 61.1),
    ("llama-1b-64k-mlp", 3.136, 48.7),
    ("llama-1b-128k", 10.69, 79.2),
];

#[test]
fn the_long_context_rows_are_within_ten_percent_of_their_step_and_device_peak() {
    let steps: Vec<_> = MEASURED_H100_LONG
        .iter()
        .map(|&(name, seconds, _)| (name, Measured::Seconds(seconds)))
        .collect();
    assert_steps_within_ten_percent(&steps, GpuKind::H100);
    for &(name, _, peak) in MEASURED_H100_LONG {
        let bench = H100_DENSE_BENCHES
            .iter()
            .find(|b| b.name == name)
            .expect(name);
        let planned = gib(bench_plan_on(bench, GpuKind::H100)
            .memory
            .per_gpu_bytes
            .total);
        assert!(
            (0.9..=1.1).contains(&(peak / planned)),
            "{name}: {peak} GiB on the device, {planned:.2} planned"
        );
    }
}

/// A measured step: its seconds, or the MFU the bench reported (the step is then the plan's
/// FLOPs over it).
#[derive(Clone, Copy)]
enum Measured {
    Seconds(f64),
    Mfu(f64),
}

/// Steps on one H100, 2026-12-06 (issue 48's table, `tools/gpu-bench.sh`, 16 steps each): the
/// bench's tokens a step over its tokens/s; the 32k row's MFU.
const MEASURED_H100_STEP: &[(&str, Measured)] = &[
    ("gpt-1.3b", Measured::Seconds(24576.0 / 63353.0)),
    ("gpt-1.3b-nodrop", Measured::Seconds(24576.0 / 67699.0)),
    ("gpt-1.3b-fp8", Measured::Seconds(24576.0 / 84659.0)),
    ("gpt-350m", Measured::Seconds(32768.0 / 172692.0)),
    ("gpt-350m-nodrop", Measured::Seconds(32768.0 / 199527.0)),
    ("llama-1b-mb6", Measured::Seconds(24576.0 / 72002.0)),
    ("llama-1b-mb6-fp8", Measured::Seconds(24576.0 / 97824.0)),
    ("llama-1b-32k-full", Measured::Mfu(0.363)),
    ("llama-1b-128k-full", Measured::Seconds(12.7)),
];

/// The script's `mixtral_2l` beyond `dense_4l` and `moe_1gpu`: Mixtral's layer, two of them.
const MIXTRAL_2L: &[&str] = &["model.num_layers=2", "model.vocab_size=50257"];

/// The script's `qwen3_moe_4l_fp8`: the routed experts in fp8 too.
const FP8_EXPERTS: &[&str] = &["precision.fp8_experts=true"];

/// The script's `qwen3-30b-a3b-4l-gb16`: a global batch of 16, eight microbatches of 2.
const EIGHT_MICROBATCHES_OF_2: &[&str] = &["training.global_batch_size=16"];

/// Issue 46's fine-grained MoE rows and issue 47's Mixtral shape, measured on one H100 (below).
const H100_MOE_BENCHES: &[Bench] = &[
    Bench {
        name: "mixtral-8x7b-2l",
        preset: "mixtral-8x7b",
        micro_batch: 4,
        extra: &[DENSE_4L, MOE_1GPU, MIXTRAL_2L],
    },
    Bench {
        name: "qwen3-30b-a3b-4l",
        preset: "qwen3-30b-a3b",
        micro_batch: 2,
        extra: &[DENSE_4L, MOE_1GPU],
    },
    Bench {
        name: "qwen3-30b-a3b-4l-gb16",
        preset: "qwen3-30b-a3b",
        micro_batch: 2,
        extra: &[DENSE_4L, MOE_1GPU, EIGHT_MICROBATCHES_OF_2],
    },
    Bench {
        name: "qwen3-30b-a3b-4l-gb16-fp8",
        preset: "qwen3-30b-a3b",
        micro_batch: 2,
        extra: &[
            DENSE_4L,
            MOE_1GPU,
            EIGHT_MICROBATCHES_OF_2,
            FP8,
            FP8_EXPERTS,
        ],
    },
    Bench {
        name: "deepseek-v3-3l",
        preset: "deepseek-v3",
        micro_batch: 1,
        extra: &[MOE_1GPU, DEEPSEEK_3L],
    },
    Bench {
        name: "qwen3-235b-a22b-2l",
        preset: "qwen3-235b-a22b",
        micro_batch: 2,
        extra: &[DENSE_4L, MOE_1GPU, QWEN3_235B_2L],
    },
];

/// Device peaks (GiB, nvidia-smi's) of the H100 rows: DeepSeek-V3's and Qwen3-235B's from the
/// 2026-12-06 09:45–10:57 UTC calls (tools/README.md, "DeepSeek-V3 and Qwen3-MoE"), when each
/// MoE layer still kept a stacked copy of its experts' weights from the forward to the backward
/// (1.2 GiB a layer for Qwen3-30B-A3B, which the plan never counted: 7–9 % under them then);
/// Qwen3-30B-A3B's from 2026-12-07 12:45 UTC, its experts' weights never stacked.
const MEASURED_H100_MOE: &[(&str, f64)] = &[
    ("qwen3-30b-a3b-4l", 64.8),
    ("deepseek-v3-3l", 67.1),
    ("qwen3-235b-a22b-2l", 58.6),
];

fn bench_plan(bench: &Bench) -> Plan {
    bench_plan_on(bench, GpuKind::H200)
}

fn bench_plan_on(bench: &Bench, gpu: GpuKind) -> Plan {
    let mb = bench.micro_batch;
    // One microbatch a step unless the row's own overrides say otherwise.
    let sets: Vec<String> = [
        format!("training.global_batch_size={mb}"),
        format!("training.micro_batch_size={mb}"),
    ]
    .into_iter()
    .chain(
        COMMON
            .iter()
            .chain(bench.extra.iter().copied().flatten())
            .map(|s| (*s).to_owned()),
    )
    .collect();
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../recipes")
        .join(format!("{}.yaml", bench.preset));
    let options = LoadOptions {
        overrides: &sets,
        use_env: false,
    };
    let loaded = load(&path, &options).unwrap_or_else(|e| panic!("{}: {e}", bench.name));
    let options = PlanOptions {
        cluster: Some(Cluster {
            nodes: 1,
            gpus_per_node: 1,
            gpu,
        }),
        // The GPT presets read the GPT-2 tokenizer: 50257 tokens.
        vocab_size: loaded.recipe.model.vocab_size.unwrap_or(50257),
    };
    plan(&loaded.recipe, &options).unwrap_or_else(|f| panic!("{}: {f:?}", bench.name))
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB
}

#[test]
fn every_measured_bench_row_is_within_ten_percent_of_its_device_peak() {
    let mut misses = Vec::new();
    println!("| model | predicted GiB | phase | measured GiB | measured/predicted |");
    for bench in BENCHES {
        let plan = bench_plan(bench);
        assert_eq!(
            plan.num_microbatches, 1,
            "{}: one microbatch a step",
            bench.name
        );
        let predicted = gib(plan.memory.per_gpu_bytes.total);
        let phase = if plan.memory.per_gpu_bytes.gradients > 0 {
            "update"
        } else {
            "activations"
        };
        let measured = MEASURED.iter().find(|(name, _)| *name == bench.name);
        let (shown, ratio) = match measured {
            Some(&(_, peak)) => (format!("{peak:.1}"), format!("{:.2}", peak / predicted)),
            None => ("—".to_owned(), "—".to_owned()),
        };
        println!(
            "| {} | {predicted:.2} | {phase} | {shown} | {ratio} |",
            bench.name
        );
        if let Some(&(_, peak)) = measured
            && !(0.9..=1.1).contains(&(peak / predicted))
        {
            misses.push(format!(
                "{}: {peak} GiB measured, {predicted:.2} planned",
                bench.name
            ));
        }
    }
    for (name, _) in MEASURED {
        assert!(
            BENCHES.iter().any(|b| b.name == *name),
            "{name} is not a bench row"
        );
    }
    assert!(misses.is_empty(), "{misses:#?}");
}

/// Before its GPU run: the fp8-experts row fits an H100 with every expert's fp8 weight copies,
/// and its routed GEMMs at the fp8 rate shorten the bf16 row's step.
#[test]
fn the_fp8_experts_row_fits_an_h100_and_plans_a_shorter_step() {
    let row = |name: &str| {
        let bench = H100_MOE_BENCHES
            .iter()
            .find(|b| b.name == name)
            .unwrap_or_else(|| panic!("{name} is not a bench row"));
        bench_plan_on(bench, GpuKind::H100)
    };
    let (bf16, fp8) = (
        row("qwen3-30b-a3b-4l-gb16"),
        row("qwen3-30b-a3b-4l-gb16-fp8"),
    );
    let memory = gib(fp8.memory.per_gpu_bytes.total);
    assert!(memory < 79.0, "{memory:.1} GiB");
    assert!(
        memory > gib(bf16.memory.per_gpu_bytes.total),
        "the experts' fp8 copies"
    );
    let (a, b) = (bf16.predicted.step_seconds, fp8.predicted.step_seconds);
    assert!(b < 0.9 * a, "bf16 {a:.3} s, fp8 experts {b:.3} s");
}

#[test]
fn the_fine_grained_moe_rows_are_within_ten_percent_of_their_h100_device_peak() {
    let mut misses = Vec::new();
    println!("| model | predicted GiB | measured GiB | measured/predicted |");
    for &(name, peak) in MEASURED_H100_MOE {
        let bench = H100_MOE_BENCHES
            .iter()
            .find(|b| b.name == name)
            .unwrap_or_else(|| panic!("{name} is not a bench row"));
        let predicted = gib(bench_plan_on(bench, GpuKind::H100)
            .memory
            .per_gpu_bytes
            .total);
        let ratio = peak / predicted;
        println!("| {name} | {predicted:.2} | {peak:.1} | {ratio:.2} |");
        if !(0.9..=1.1).contains(&ratio) {
            misses.push(format!(
                "{name}: {peak} GiB measured, {predicted:.2} planned"
            ));
        }
    }
    assert!(misses.is_empty(), "{misses:#?}");
}

/// Asserts every row's predicted step on `gpu` is within 10 % of its measured one, printing the
/// table.
fn assert_steps_within_ten_percent(rows: &[(&str, Measured)], gpu: GpuKind) {
    assert_steps_within(rows, gpu, 0.1);
}

/// Each row's predicted step within `tolerance` (relative) of its measured one on `gpu`.
fn assert_steps_within(rows: &[(&str, Measured)], gpu: GpuKind, tolerance: f64) {
    let mut misses = Vec::new();
    println!("| model | predicted s | measured s | predicted/measured |");
    for &(name, measured) in rows {
        let bench = BENCHES
            .iter()
            .chain(H100_DENSE_BENCHES)
            .chain(H100_MOE_BENCHES)
            .find(|b| b.name == name)
            .unwrap_or_else(|| panic!("{name} is not a bench row"));
        let plan = bench_plan_on(bench, gpu);
        let measured = match measured {
            Measured::Seconds(seconds) => seconds,
            Measured::Mfu(mfu) => plan.flops_per_iteration / (mfu * 989e12),
        };
        let predicted = plan.predicted.step_seconds;
        let ratio = predicted / measured;
        println!("| {name} | {predicted:.3} | {measured:.3} | {ratio:.2} |");
        if !(1.0 - tolerance..=1.0 + tolerance).contains(&ratio) {
            misses.push(format!(
                "{name}: {measured} s measured, {predicted:.3} s predicted"
            ));
        }
    }
    assert!(misses.is_empty(), "{misses:#?}");
}

#[test]
fn every_timed_dense_bench_row_is_within_ten_percent_of_its_predicted_step() {
    let rows: Vec<_> = MEASURED_STEP
        .iter()
        .map(|&(name, seconds)| (name, Measured::Seconds(seconds)))
        .collect();
    assert_steps_within_ten_percent(&rows, GpuKind::H200);
}

#[test]
fn every_timed_dense_h100_row_is_within_ten_percent_of_its_predicted_step() {
    assert_steps_within_ten_percent(MEASURED_H100_STEP, GpuKind::H100);
}

/// The MoE rows' steps within issue 47's 15 %, on one H100 (`tools/gpu-bench.sh`, tokens a step
/// over tokens/s): the experts one GEMM per expert where each fills the chip (the small MoE,
/// Mixtral's and DeepSeek-V3's shapes; 2026-12-07 09:53–09:56 UTC) and on the device-count
/// kernel where they do not (Qwen3-30B-A3B's 128 experts of ~500 rows, on the TMA kernel: one
/// microbatch at 22:48 UTC, eight at 23:20; DeepSeek-V3's at 23:25).
#[test]
fn the_moe_rows_are_within_fifteen_percent_of_their_predicted_step() {
    let h100 = [
        ("moe-8x-mb16", Measured::Seconds(32768.0 / 284_017.0)),
        ("mixtral-8x7b-2l", Measured::Seconds(16384.0 / 74_396.0)),
        ("deepseek-v3-3l", Measured::Seconds(4096.0 / 27_460.0)),
        ("qwen3-30b-a3b-4l", Measured::Seconds(8192.0 / 73_923.0)),
        (
            "qwen3-30b-a3b-4l-gb16",
            Measured::Seconds(65536.0 / 96_119.0),
        ),
    ];
    assert_steps_within(&h100, GpuKind::H100, 0.15);
}

#[test]
fn the_report_names_the_phase_of_the_peak() {
    let plan_of = |name: &str| bench_plan(BENCHES.iter().find(|b| b.name == name).expect(name));
    let llama = plan_of("llama-1b");
    let human = ferrotron_plan::render_human(&llama);
    assert!(human.contains("; peak in the update phase)"), "{human}");
    assert!(human.contains("weights + new copy"), "{human}");
    let explain = ferrotron_plan::render_explain(&llama);
    for needle in [
        "activations phase: gradient buffer",
        "update phase: gradient buffer",
        "update phase: activation memory the pool keeps and cannot reuse",
    ] {
        assert!(explain.contains(needle), "missing {needle:?} in\n{explain}");
    }
    let small = ferrotron_plan::render_human(&plan_of("gpt2-124m"));
    assert!(
        small.contains("; peak in the activations phase)"),
        "{small}"
    );
}
