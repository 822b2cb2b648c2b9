//! Recipes of well-known models, written as JSON so the tests read like the presets.

use ferrotron_recipe::Recipe;
use serde_json::{Value, json};

pub(crate) fn recipe(model: Value, parallel: Value, training: Value) -> Recipe {
    let mut recipe: Recipe = serde_json::from_value(json!({
        "version": 2,
        "name": "test",
        "model": model,
        "parallel": parallel,
        "training": training,
    }))
    .expect("test recipe deserializes");
    recipe.model.vocab_size.get_or_insert(50257);
    recipe
}

pub(crate) fn gpt2_small() -> Recipe {
    recipe(
        json!({"num_layers": 12, "hidden_size": 768, "num_attention_heads": 12,
               "seq_length": 1024, "max_position_embeddings": 1024}),
        json!({}),
        json!({"micro_batch_size": 4, "global_batch_size": 32, "train_iters": 10}),
    )
}

pub(crate) fn llama3_8b() -> Recipe {
    recipe(
        json!({"num_layers": 32, "hidden_size": 4096, "ffn_hidden_size": 14336,
               "num_attention_heads": 32, "num_query_groups": 8, "vocab_size": 128256,
               "seq_length": 8192, "position_embedding": "rope", "normalization": "rmsnorm",
               "activation": "swiglu", "tie_embeddings": false, "add_bias_linear": false}),
        json!({}),
        json!({"micro_batch_size": 1, "global_batch_size": 128, "train_iters": 10}),
    )
}

pub(crate) fn mixtral_8x7b() -> Recipe {
    recipe(
        json!({"num_layers": 32, "hidden_size": 4096, "ffn_hidden_size": 14336,
               "num_attention_heads": 32, "num_query_groups": 8, "vocab_size": 32000,
               "seq_length": 4096, "position_embedding": "rope", "normalization": "rmsnorm",
               "activation": "swiglu", "tie_embeddings": false, "add_bias_linear": false,
               "moe": {"num_experts": 8, "router_topk": 2}}),
        json!({}),
        json!({"micro_batch_size": 1, "global_batch_size": 256, "train_iters": 10}),
    )
}

/// GPT-3 175B (Brown et al.): 96 layers, hidden 12288, 96 heads, 2048 tokens.
pub(crate) fn gpt3_175b() -> Recipe {
    recipe(
        json!({"num_layers": 96, "hidden_size": 12288, "num_attention_heads": 96,
               "seq_length": 2048}),
        json!({}),
        json!({"micro_batch_size": 1, "global_batch_size": 1536, "train_iters": 10}),
    )
}
