//! The recipe language: the typed recipe every other crate consumes, and the loader that keeps
//! source positions so every diagnostic can point at a line and column.
//!
//! Data flows one way: YAML → [`Recipe`] → plan → runtime. Nothing downstream re-reads YAML.
//! Rules anywhere in the workspace report a [`Finding`] by key path; a [`LoadedRecipe`] turns it
//! into a located diagnostic, which is how the planner's rules plug into `recipe validate`.

mod bounds;
mod degree;
mod diagnostic;
mod files;
mod finding;
mod finite;
mod formats;
mod identity;
mod layer_freq;
mod layers;
mod limits;
mod loader;
mod node;
mod partial;
mod render;
mod rules;
mod schema;
mod source;
mod types;
mod version;
mod yaml;

pub use bounds::*;
pub use degree::{Degree, Degrees};
pub use diagnostic::{Location, Problem, RecipeErrors};
pub use finding::{Finding, Severity};
pub use formats::{
    Checked, github_annotations, github_escape_data, github_escape_property, relative_path,
    sarif_log,
};
pub use identity::{canonical_hash, canonical_json};
pub use layer_freq::{LayerFreq, LayerFreqError};
pub use layers::ENV_PREFIX;
pub use loader::{
    FileSystem, LoadOptions, LoadedRecipe, SourceReader, load, load_str, load_with, read_text,
    text_from, utf8_text,
};
pub use rules::check_rules;
pub use schema::{json_schema, json_schema_pretty};
pub use types::*;
pub use version::{
    Change, Inherited, InheritedDecay, Migration, OLDEST_FORMAT_VERSION, Rename, STEPS, Step,
    ValueChange, inherited, migrate_text, unified_diff,
};
