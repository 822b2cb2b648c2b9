//! One module per subcommand, and two that several share: `resolve` (recipe → plan, for
//! `plan`, `run`, `submit` and `hf import`) and `launch` (`run`'s world, backend and training call).

pub mod diff;
pub mod hf_export;
pub mod hf_import;
pub mod launch;
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
