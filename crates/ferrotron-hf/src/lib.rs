//! Hugging Face interop: a checkpoint of any parallel layout exported as a transformers model
//! folder (`GPT2LMHeadModel`, `LlamaForCausalLM`, `MixtralForCausalLM`, `MistralForCausalLM`,
//! `Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `Qwen3MoeForCausalLM`, `DeepseekV3ForCausalLM`), and
//! such a folder imported as a checkpoint to start training from.
//!
//! Both directions go through one table ([`names::pieces`]): each transformers tensor is a
//! selection (rows, column ranges, transpose) of one of our global tensors, so import is the
//! exact inverse of export. Checkpoints already store global tensors with shard specs, so
//! neither direction knows about parallel layouts: export assembles global tensors from any
//! layout's shards, import writes whole tensors that the trainer's loader cuts for any layout.
//! Both stream tensor by tensor through the `safetensors` crate.

mod check;
mod checkpoint_tensors;
mod config;
mod error;
mod export;
mod family;
mod import;
pub mod names;
mod rope_config;
mod safetensors_file;
mod sink;

pub use config::{CONFIG_FILE, HfConfig};
pub use error::HfError;
pub use export::{DEFAULT_MAX_SHARD_BYTES, ExportOptions, Exported, INDEX_FILE, export};
pub use family::{Family, Refusal};
pub use import::{HfModel, IMPORTED_ITERATION};
pub use sink::OutDtype;
