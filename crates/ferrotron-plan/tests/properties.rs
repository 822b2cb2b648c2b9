//! Property tests of the planner over extreme sizes (issue 19). Release builds do not check
//! integer overflow, and this test is built with the checks on, so an overflow anywhere in the
//! rules or the plan is a panic here. Whatever the recipe and cluster, the planner returns a plan
//! whose numbers are consistent, or findings — never a wrapped "1 ranks" or "fits in 0.25 GiB".
//!
//! CI runs a few dozen cases; `PROPTEST_CASES=1000000 tools/fuzz.sh` runs a million.

use ferrotron_plan::{PlanOptions, plan};
use ferrotron_recipe::{
    Cluster, Degree, GpuKind, LoadOptions, MAX_BATCH, MAX_GPUS_PER_NODE, MAX_HIDDEN, MAX_LAYERS,
    MAX_NODES, MAX_SEQ_LENGTH, MAX_VOCAB, Recipe, load_str,
};
use proptest::prelude::*;

const BASE: &str = "version: 2\nname: p\nmodel: {num_layers: 4, hidden_size: 256, num_attention_heads: 8, seq_length: 128}\ntraining: {micro_batch_size: 1, global_batch_size: 64, train_iters: 10}\ndata:\n  tokenizer: {type: gpt2-bpe, vocab_file: v.json, merge_file: m.txt}\n  blend: [{path: d.jsonl}]\n";

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn base() -> Recipe {
    load_str("p.yaml", BASE, &LoadOptions::default())
        .expect("base recipe loads")
        .recipe
}

/// Sizes from 1 to `u32::MAX`, mostly within `max` (the recipe's bound, where the planner must
/// compute) and weighted to the edges where arithmetic breaks.
fn size(max: u32) -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => 1u32..=64,
        2 => Just(max),
        2 => 1..=max,
        1 => (0u32..32).prop_map(|shift| 1 << shift),
        1 => Just(u32::MAX),
        1 => any::<u32>().prop_map(|v| v.max(1)),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    layers: u32,
    hidden: u32,
    heads: u32,
    vocab: u32,
    seq: u32,
    gbs: u32,
    tp: u32,
    nodes: u32,
    gpus: u32,
}

/// Mostly recipes the layout rules accept (heads divide by tp, the world by tp, the batch by
/// the world), so the arithmetic behind them runs; sometimes sizes past every bound.
fn case() -> impl Strategy<Value = Case> {
    let tp = prop::sample::select(vec![1u32, 2, 4, 8]);
    (
        tp,
        (
            size(64),
            size(256),
            size(MAX_LAYERS),
            size(MAX_VOCAB),
            size(MAX_SEQ_LENGTH),
        ),
        // Small clusters: planning holds a record per rank, and a large world within the
        // bounds takes minutes in this unoptimised build; clusters past them are below.
        (1u32..=4, prop::sample::select(vec![1u32, 2, 4, 8]), size(8)),
        any::<bool>(),
    )
        .prop_flat_map(
            |(tp, (heads, head_dim, layers, vocab, seq), (nodes, gpus, k), wild)| {
                let heads = heads.saturating_mul(tp);
                let gpus = gpus.saturating_mul(tp);
                let world = nodes.saturating_mul(gpus);
                let tame = Case {
                    layers,
                    hidden: heads.saturating_mul(head_dim),
                    heads,
                    vocab,
                    seq,
                    gbs: world.saturating_mul(k),
                    tp,
                    nodes,
                    gpus,
                };
                let base = tame.clone();
                let past = |max: u32| prop_oneof![1..=4u32, Just(max + 1), Just(u32::MAX)];
                let wild_case = (
                    past(MAX_NODES),
                    past(MAX_GPUS_PER_NODE),
                    size(MAX_HIDDEN),
                    size(MAX_BATCH),
                )
                    .prop_map(move |(nodes, gpus, hidden, gbs)| Case {
                        nodes,
                        gpus,
                        hidden,
                        gbs,
                        ..base.clone()
                    });
                if wild {
                    wild_case.boxed()
                } else {
                    Just(tame).boxed()
                }
            },
        )
}

fn check(case: &Case) -> Result<(), TestCaseError> {
    let mut recipe = base();
    recipe.model.num_layers = case.layers;
    recipe.model.hidden_size = case.hidden;
    recipe.model.num_attention_heads = case.heads;
    recipe.model.seq_length = case.seq;
    recipe.training.global_batch_size = case.gbs;
    recipe.parallel.tensor = Degree::Fixed(case.tp);
    let cluster = Cluster {
        nodes: case.nodes,
        gpus_per_node: case.gpus,
        gpu: GpuKind::H100,
    };
    let options = PlanOptions {
        cluster: Some(cluster),
        vocab_size: case.vocab,
    };
    let Ok(plan) = plan(&recipe, &options) else {
        return Ok(());
    };
    prop_assert_eq!(
        u64::from(plan.world_size),
        u64::from(case.nodes) * u64::from(case.gpus)
    );
    prop_assert_eq!(plan.ranks.len(), plan.world_size as usize);
    let multiple =
        u64::from(recipe.model.make_vocab_size_divisible_by) * u64::from(plan.degrees.tp);
    prop_assert!(plan.padded_vocab_size >= case.vocab);
    prop_assert_eq!(u64::from(plan.padded_vocab_size) % multiple, 0);
    prop_assert!(plan.parameters.total >= plan.parameters.embedding);
    prop_assert!(plan.parameters.total > 0);
    let bytes = &plan.memory.per_gpu_bytes;
    prop_assert!(bytes.total >= bytes.weights);
    // Weights alone: at least 2 bytes for each parameter a GPU holds.
    prop_assert!(bytes.weights >= plan.memory.parameters_per_gpu);
    prop_assert!(plan.flops_per_iteration.is_finite() && plan.flops_per_iteration > 0.0);
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn extreme_sizes_plan_consistently_or_are_refused(case in case()) {
        check(&case)?;
    }
}

/// The values the issue found, each once.
#[test]
fn the_reported_overflows_are_refused() {
    let reported = [
        // `--nodes 4294967295 --gpus-per-node 4294967295` planned "1 ranks"
        (u32::MAX, u32::MAX, 50_257, 4, 256),
        // 65536 × 65536 was "cluster is 0"
        (65_536, 65_536, 50_257, 4, 256),
        // `vocab_size: 4294967295` padded to 0
        (1, 1, u32::MAX, 4, 256),
        // 2³²−1 layers of hidden 2³²−4 "fit in 0.25 GiB"
        (1, 1, 50_257, u32::MAX, u32::MAX - 3),
    ];
    for (nodes, gpus, vocab, layers, hidden) in reported {
        let mut recipe = base();
        recipe.model.num_layers = layers;
        recipe.model.hidden_size = hidden;
        let options = PlanOptions {
            cluster: Some(Cluster {
                nodes,
                gpus_per_node: gpus,
                gpu: GpuKind::H100,
            }),
            vocab_size: vocab,
        };
        let findings = plan(&recipe, &options).expect_err("refused");
        assert!(
            findings.iter().any(|f| f.code == "plan::bounds"),
            "{findings:?}"
        );
    }
    let text = BASE.replace("seq_length: 128", "seq_length: 128, vocab_size: 4294967295");
    let errors = load_str("p.yaml", &text, &LoadOptions::default()).expect_err("schema bound");
    assert!(
        errors.problems()[0].message().contains("16777216"),
        "{errors:?}"
    );
}
