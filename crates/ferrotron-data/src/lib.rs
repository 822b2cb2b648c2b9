//! Tokenizers, Megatron-compatible indexed datasets, GPT samples and weighted blends
