//! One module per subcommand.

pub mod plan;
pub mod preprocess;
pub mod report;
pub mod resolve;
pub mod run;
pub mod sample;
pub mod schema;
pub mod show;
pub mod sweep;
pub mod validate;
