//! The model split over ranks (Megatron's tensor, sequence, context and pipeline parallelism).
//! The one-rank model is the same code with every group of size one; a rank's model is cut out
//! of the full one-rank model, so both start from the same numbers.

mod chunk;
mod context;
mod positions;
mod shard;
mod tensor_parallel;
mod vocab;

pub use chunk::{ChunkData, ChunkInput, ChunkOutput, ChunkSpec};
pub use context::{
    TokensAndLabels, context_parallel_positions, context_parallel_slice, split_for_context_parallel,
};
pub(crate) use positions::SequencePositions;
pub(crate) use shard::{Placement, cut_module, roles_of};
pub use tensor_parallel::TensorParallel;
pub(crate) use vocab::{VocabShard, vocab_parallel_cross_entropy, vocab_parallel_lookup};
