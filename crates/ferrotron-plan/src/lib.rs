//! Parallelism planner: layout rules, rank grid and process groups, memory, FLOPs and step-time
//! models, auto degrees.

use ferrotron_recipe::{Cluster, Finding, Recipe};

/// Megatron-Core's parallel-layout rules for `recipe` on `cluster`, as findings at key paths.
pub fn check_layout(_recipe: &Recipe, _cluster: Option<&Cluster>) -> Vec<Finding> {
    Vec::new()
}
