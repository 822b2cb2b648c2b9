//! The exit codes of `recipe`: one meaning each, the same for every command, so CI jobs,
//! schedulers and scripts can act on them without reading the output.
//!
//! A run that stops early on a signal or at `--exit-interval` after saving its checkpoint exits
//! 0, as Megatron's does: the stop was asked for, Slurm records the job as COMPLETED and
//! `--dependency=afterok` chains continue. Whether it finished or stopped is in the run manifest
//! (`status: finished | stopped`) and the closing line. What a script must tell apart from
//! success, and from other failures, gets a code of its own.

use std::process::ExitCode;

/// Everything asked for was done (valid recipes; a run finished, or stopped cleanly and saved).
pub(crate) const SUCCESS: u8 = 0;
/// An invalid recipe (located diagnostics on stderr), or a run, sweep member or submission
/// that failed while working.
pub(crate) const FAILED: u8 = 1;
/// Bad usage or unreadable input: unknown flags, a recipe file that cannot be read, a backend
/// this binary was built without.
pub(crate) const USAGE: u8 = 2;
/// Training diverged: a non-finite loss or gradient norm. Nothing of that step was applied or
/// saved; the newest checkpoint is intact (lower the learning rate, or resume from it).
pub(crate) const DIVERGED: u8 = 3;

/// `code` as the process's exit status.
pub(crate) fn code(code: u8) -> ExitCode {
    ExitCode::from(code)
}
