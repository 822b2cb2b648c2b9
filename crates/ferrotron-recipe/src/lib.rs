//! The recipe language: the typed recipe every other crate consumes, and (in later modules) the
//! loader that keeps source positions so every diagnostic can point at a line and column.
//!
//! Data flows one way: YAML → [`Recipe`] → plan → runtime. Nothing downstream re-reads YAML.

mod degree;
mod finding;
mod types;

pub use degree::Degree;
pub use finding::{Finding, Severity};
pub use types::*;
