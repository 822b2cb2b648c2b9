//! One module per subcommand.

pub mod backend;
pub mod diff;
pub mod hf_export;
pub mod hf_import;
pub mod local_launcher;
pub mod logits;
pub mod migrate;
pub mod plan;
pub mod preprocess;
pub mod report;
pub mod resolve;
pub mod run;
pub mod sample;
pub mod schema;
pub mod show;
pub mod submit;
pub mod sweep;
pub mod validate;
pub mod world;
