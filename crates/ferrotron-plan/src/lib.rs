//! Parallelism planner: layout rules, rank grid and process groups, memory, FLOPs and step-time
//! models, auto degrees.
//!
//! Pure arithmetic over the typed recipe: no tensors, no I/O except [`Plan::write_to`]. The
//! runtime consumes a [`Plan`]; users read it (`recipe plan`) before they ask for GPUs.

mod bounds;
mod flat_step;
mod flops;
mod fp8;
mod hardware;
mod layout;
mod memory;
mod offload;
mod params;
mod plan;
mod ranks;
mod report;
mod resolve;
mod routed;
mod rules;
mod search;
mod setup;
mod stages;
mod term;
#[cfg(test)]
mod testing;
mod time;

use ferrotron_recipe::{Cluster, Finding, Recipe};

pub use flops::{TokenFlops, flops_per_iteration, token_flops};
pub use hardware::{GpuSpec, gpu_name, peak_flops};
pub use layout::{Degrees, divisors};
pub use memory::{Memory, MemoryBytes};
pub use offload::HostMemory;
pub use params::{ParameterCount, parameter_count};
pub use plan::{Hardware, Plan, PlanOptions, PlanWriteError, effective_cluster, plan};
pub use ranks::{Coordinates, GroupIndices, ProcessGroups, RankGroups, RankInfo, rank_grid};
pub use report::{render_explain, render_human};
pub use resolve::{Unplanned, plan_loaded, vocab_size};
pub use search::{AutoReport, Candidate};
pub use stages::{Chunk, StageInfo};
pub use term::Term;
pub use time::{Breakdown, Predicted};

/// Megatron-Core's parallel-layout rules for `recipe` on `cluster`, as findings at key paths.
///
/// Rules that need the world size run only when a cluster is known; rules whose degrees are
/// `auto` are left to the planner's search.
pub fn check_layout(recipe: &Recipe, cluster: Option<&Cluster>) -> Vec<Finding> {
    let out_of_bounds = bounds::check(recipe, cluster, None);
    if !out_of_bounds.is_empty() {
        return out_of_bounds;
    }
    let open = layout::OpenLayout::from_recipe(recipe, cluster);
    rules::check(recipe, open, cluster.map(|c| c.gpu))
}
