//! Sweeps and reports: many runs of one recipe, and a look at how they went.
//!
//! A sweep is a base recipe plus axes over dot-paths. Every member goes through the recipe
//! loader with `--set`-style overrides, so a member is exactly what `recipe run` would train and
//! an invalid one gets the loader's own diagnostics. Members run as child processes of the
//! `recipe` binary, each in its own directory with a provenance manifest, which is what lets a
//! sweep resume by skipping members that finished. Reports read the metrics files those runs
//! write; they never talk to a running process.

mod error;
mod expand;
mod metrics_log;
mod paths;
mod report;
mod resolve;
mod results;
mod runner;
mod spec;
mod submit;

pub use error::SweepError;
pub use expand::{MemberSpec, expand, override_string, short_key, short_value};
pub use metrics_log::{MetricsLog, StepPoint};
pub use report::{ReportOptions, RunMetrics, collect_runs, smoothed, write_report};
pub use resolve::{
    Invalid, METRICS_FILE, Member, SHORT_HASH_LEN, TENSORBOARD_DIR, ValidMember, member_recipe,
    resolve,
};
pub use results::{
    RESULTS_CSV, RESULTS_MD, ResultRow, changed_values, plan_line, render_csv, render_markdown,
    result_rows, write_results,
};
pub use runner::{
    LOG_FILE, MemberStatus, RECIPE_FILE, RunnerOptions, member_dir, recipe_yaml, run_members,
};
pub use spec::{Axis, SEED_KEY, SweepSpec};
pub use submit::{ArraySubmission, prepare_array};
