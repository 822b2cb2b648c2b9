//! The recipe's size bounds ([`ferrotron_recipe::MAX_NODES`] and the rest) for the values that
//! reach the planner without passing the schema: `--nodes`/`--gpus-per-node`, a recipe or
//! cluster built in code, the vocabulary read from a tokenizer. Past them the planner's integer arithmetic could
//! wrap (`--nodes 65536 --gpus-per-node 65536` was "cluster is 0"), so they are refused first.

use ferrotron_recipe::{
    Cluster, Finding, MAX_BATCH, MAX_EXPERTS, MAX_FFN_HIDDEN, MAX_GPUS_PER_NODE, MAX_HEADS,
    MAX_HIDDEN, MAX_KV_CHANNELS, MAX_LAYERS, MAX_NODES, MAX_SEQ_LENGTH, MAX_VOCAB,
    MAX_VOCAB_MULTIPLE, MAX_WORLD, Recipe,
};

/// Errors for every size of `recipe`, `cluster` and `vocab` past its bound.
pub(crate) fn check(
    recipe: &Recipe,
    cluster: Option<&Cluster>,
    vocab: Option<u32>,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    let mut bound = |path: &str, value: u32, max: u32, what: &str| {
        if value > max {
            findings.push(
                Finding::error(
                    "plan::bounds",
                    path,
                    format!("{what} is {value}; the planner handles at most {max}"),
                )
                .with_help("check the value: no cluster or model comes near this"),
            );
        }
    };
    let m = &recipe.model;
    let sizes = [
        ("model.num_layers", Some(m.num_layers), MAX_LAYERS),
        ("model.hidden_size", Some(m.hidden_size), MAX_HIDDEN),
        ("model.ffn_hidden_size", m.ffn_hidden_size, MAX_FFN_HIDDEN),
        (
            "model.num_attention_heads",
            Some(m.num_attention_heads),
            MAX_HEADS,
        ),
        ("model.num_query_groups", m.num_query_groups, MAX_HEADS),
        ("model.kv_channels", m.kv_channels, MAX_KV_CHANNELS),
        (
            "model.make_vocab_size_divisible_by",
            Some(m.make_vocab_size_divisible_by),
            MAX_VOCAB_MULTIPLE,
        ),
        ("model.seq_length", Some(m.seq_length), MAX_SEQ_LENGTH),
        (
            "model.max_position_embeddings",
            m.max_position_embeddings,
            MAX_SEQ_LENGTH,
        ),
        (
            "model.moe.num_experts",
            m.moe.as_ref().map(|e| e.num_experts),
            MAX_EXPERTS,
        ),
        (
            "model.moe.ffn_hidden_size",
            m.moe.as_ref().and_then(|e| e.ffn_hidden_size),
            MAX_FFN_HIDDEN,
        ),
        (
            "model.moe.shared_expert_ffn_hidden_size",
            m.moe.as_ref().and_then(|e| e.shared_expert_ffn_hidden_size),
            MAX_FFN_HIDDEN,
        ),
        (
            "training.global_batch_size",
            Some(recipe.training.global_batch_size),
            MAX_BATCH,
        ),
    ];
    for (path, value, max) in sizes {
        if let Some(value) = value {
            bound(path, value, max, &format!("`{path}`"));
        }
    }
    if let Some(cluster) = cluster {
        bound("cluster.nodes", cluster.nodes, MAX_NODES, "the node count");
        bound(
            "cluster.gpus_per_node",
            cluster.gpus_per_node,
            MAX_GPUS_PER_NODE,
            "the GPU count per node",
        );
    }
    if let Some(vocab) = vocab {
        bound("model.vocab_size", vocab, MAX_VOCAB, "the vocabulary");
    }
    if let Some(cluster) = cluster {
        let world = u64::from(cluster.nodes) * u64::from(cluster.gpus_per_node);
        if world > MAX_WORLD {
            findings.push(
                Finding::error(
                    "plan::bounds",
                    "cluster",
                    format!(
                        "the cluster has {world} ranks ({} nodes × {}); the planner handles at most {MAX_WORLD}",
                        cluster.nodes, cluster.gpus_per_node
                    ),
                )
                .with_help("check the node and GPU counts"),
            );
        }
    }
    findings
}
