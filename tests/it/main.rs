//! The end-to-end tests of the `recipe` binary, one test binary for all of them: one link instead
//! of ten on a 2-core CI, and the helpers every module needs written once (`common`). Each module
//! is one command or concern; insta names their snapshots `it__<module>__<name>.snap`.

mod common;

mod hf;
mod parallel;
mod plan;
mod preprocess;
mod report;
mod review;
mod run;
mod slurm;
mod sweep;
mod validate;
