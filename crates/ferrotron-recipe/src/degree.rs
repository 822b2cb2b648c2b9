//! A parallel degree (or batch size) that is either fixed or left to the planner, and the
//! degrees once the planner has fixed them.
//!
//! Megatron users write integers; Ferrotron also accepts `auto`, which the planner resolves by
//! searching every valid layout for the cluster. Keeping both in one type makes "which fields may
//! be auto" a property of the schema rather than of ad-hoc parsing. [`Degrees`] lives here, beside
//! the recipe's vocabulary, because the plan, the run manifest and the checkpoint manifest all
//! record it and only the first of them knows the planner.

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

/// The resolved parallel degrees of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Degrees {
    /// Tensor parallel.
    pub tp: u32,
    /// Pipeline parallel.
    pub pp: u32,
    /// Virtual pipeline stages (model chunks) per pipeline rank.
    pub vpp: u32,
    /// Context parallel.
    pub cp: u32,
    /// Expert parallel.
    pub ep: u32,
    /// Expert tensor parallel.
    pub etp: u32,
    /// Data parallel (dense part): world / (tp·pp·cp).
    pub dp: u32,
    /// Expert data parallel: world / (etp·ep·pp).
    pub edp: u32,
}

impl Degrees {
    /// One rank: every degree 1.
    pub const ONE: Degrees = Degrees {
        tp: 1,
        pp: 1,
        vpp: 1,
        cp: 1,
        ep: 1,
        etp: 1,
        dp: 1,
        edp: 1,
    };

    pub fn world_size(&self) -> u32 {
        self.tp * self.pp * self.cp * self.dp
    }
}
