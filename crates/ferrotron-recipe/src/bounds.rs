//! Upper bounds of the recipe's sizes. Each is far above any model or cluster built so far
//! (LLaMA 3.1 405B: 126 layers, hidden 16,384, vocabulary 128,256; DeepSeek-V3: 256 experts)
//! and low enough that every count the planner derives from them — parameters, bytes, ranks,
//! the padded vocabulary — fits its integer type with room to spare. Without them a value like
//! `vocab_size: 4294967295` wrapped the padded vocabulary to 0 in a release build and
//! validated. The schema states them (a located error, an editor squiggle); the planner checks
//! the values that reach it from elsewhere (command-line flags, the tokenizer).

pub const MAX_LAYERS: u32 = 1 << 10;
pub const MAX_HIDDEN: u32 = 1 << 17;
pub const MAX_FFN_HIDDEN: u32 = 1 << 19;
pub const MAX_HEADS: u32 = 1 << 12;
pub const MAX_KV_CHANNELS: u32 = 1 << 14;
pub const MAX_VOCAB: u32 = 1 << 24;
pub const MAX_VOCAB_MULTIPLE: u32 = 1 << 12;
pub const MAX_SEQ_LENGTH: u32 = 1 << 24;
pub const MAX_EXPERTS: u32 = 1 << 12;
pub const MAX_NODES: u32 = 1 << 16;
pub const MAX_GPUS_PER_NODE: u32 = 1 << 10;
/// Ranks of one cluster (nodes × GPUs per node). The plan holds a record per rank, so planning
/// time and memory grow with it: 2²⁰ ranks is about ten times the largest cluster built.
pub const MAX_WORLD: u64 = 1 << 20;
pub const MAX_BATCH: u32 = 1 << 24;
pub const MAX_DEGREE: u32 = 1 << 16;
