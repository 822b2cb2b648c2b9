//! Errors are raised when a recipe's model section asks for something the model cannot build, so
//! a bad combination fails before any tensor is allocated rather than deep inside a forward pass.

use thiserror::Error;

/// Why a model could not be built from a recipe or plan.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ModelError {
    /// A size field that must be positive is zero.
    #[error("model.{field} must be at least 1, got 0")]
    ZeroSize { field: &'static str },

    /// A field that must divide another does not.
    #[error(
        "model.{numerator_field} ({numerator}) must be divisible by model.{denominator_field} ({denominator})"
    )]
    NotDivisible {
        numerator_field: &'static str,
        numerator: u32,
        denominator_field: &'static str,
        denominator: u32,
    },

    /// A value outside its allowed range.
    #[error("model.{field} = {value} is out of range: {expected}")]
    OutOfRange {
        field: &'static str,
        value: f64,
        expected: &'static str,
    },

    /// The padded vocabulary is smaller than the real one.
    #[error("padded vocabulary ({padded}) is smaller than the vocabulary ({vocab})")]
    VocabularyTooLarge { vocab: u32, padded: u32 },

    /// Learned positions cannot cover the training sequence.
    #[error(
        "model.seq_length ({seq_length}) exceeds model.max_position_embeddings ({max_positions}) with learned position embeddings"
    )]
    SequenceTooLong { seq_length: u32, max_positions: u32 },

    /// Two options that cannot be combined.
    #[error("{0}")]
    Incompatible(String),

    /// The expert loads handed to `update_expert_bias` do not match the model's MoE layers.
    #[error(
        "expert loads describe {given} MoE layers of {given_experts} experts; the model has {expected} of {expected_experts}"
    )]
    ExpertLoadsMismatch {
        given: usize,
        given_experts: usize,
        expected: usize,
        expected_experts: usize,
    },

    /// The parallel layout cannot split this model, or a shard source is incomplete.
    #[error("{0}")]
    Layout(String),

    /// A pipeline chunk was run with the wrong input.
    #[error("{0}")]
    Chunk(String),

    /// A shard could not be cut.
    #[error(transparent)]
    Shard(#[from] ferrotron_parallel::ShardError),
}
