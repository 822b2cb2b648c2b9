//! A named, explained number: how `recipe plan --explain` shows its work.

use serde::{Deserialize, Serialize};

/// One term of the memory or time model: its value and the formula that produced it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Term {
    pub name: String,
    pub value: f64,
    /// The formula, with the numbers substituted where that helps.
    pub formula: String,
}

impl Term {
    pub fn new(name: &str, value: f64, formula: String) -> Term {
        Term {
            name: name.to_owned(),
            value,
            formula,
        }
    }
}
