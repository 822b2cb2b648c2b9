//! A parallel degree (or batch size) that is either fixed or left to the planner.
//!
//! Megatron users write integers; Ferrotron also accepts `auto`, which the planner resolves by
//! searching every valid layout for the cluster. Keeping both in one type makes "which fields may
//! be auto" a property of the schema rather than of ad-hoc parsing.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `auto` or a positive integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Degree {
    /// A fixed value (at least 1).
    Fixed(#[schemars(range(min = 1, max = crate::bounds::MAX_DEGREE))] u32),
    /// Chosen by the planner.
    Auto(AutoKeyword),
}

/// The literal string `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum AutoKeyword {
    #[serde(rename = "auto")]
    Auto,
}

impl Degree {
    pub const AUTO: Degree = Degree::Auto(AutoKeyword::Auto);
    pub const ONE: Degree = Degree::Fixed(1);

    /// The fixed value, or `None` when the planner must choose.
    pub fn fixed(self) -> Option<u32> {
        match self {
            Degree::Fixed(v) => Some(v),
            Degree::Auto(_) => None,
        }
    }

    pub fn is_auto(self) -> bool {
        matches!(self, Degree::Auto(_))
    }
}

impl Default for Degree {
    fn default() -> Self {
        Degree::ONE
    }
}

impl From<u32> for Degree {
    fn from(v: u32) -> Self {
        Degree::Fixed(v)
    }
}

impl std::fmt::Display for Degree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Degree::Fixed(v) => write!(f, "{v}"),
            Degree::Auto(_) => f.write_str("auto"),
        }
    }
}
