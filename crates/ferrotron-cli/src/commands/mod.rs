//! One module per subcommand.

pub mod plan;
pub mod preprocess;
pub mod run;
pub mod sample;
pub mod schema;
pub mod show;
pub mod validate;
