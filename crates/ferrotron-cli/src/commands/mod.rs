//! One module per subcommand, and two that several share: `resolve` (recipe → plan, for
//! `plan`, `run`, `submit` and `hf import`) and `launch` (`run`'s world, backend and training call).

pub(crate) mod diff;
pub(crate) mod hf_export;
pub(crate) mod hf_import;
pub(crate) mod launch;
pub(crate) mod logits;
pub(crate) mod migrate;
pub(crate) mod plan;
pub(crate) mod preprocess;
pub(crate) mod report;
pub(crate) mod resolve;
pub(crate) mod run;
pub(crate) mod sample;
pub(crate) mod schema;
pub(crate) mod show;
pub(crate) mod submit;
pub(crate) mod sweep;
pub(crate) mod validate;
