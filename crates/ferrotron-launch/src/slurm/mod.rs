//! Slurm's side of a launch: its host-list syntax, batch scripts rendered from the plan, and
//! submission with `sbatch`.

mod hostlist;
mod sbatch;
mod submit;

pub use hostlist::{HostlistError, expand_hostlist};
pub use sbatch::{ArrayTask, JobShape, SbatchScript, SlurmOptions, TaskCommand, shell_quote};
pub use submit::{SubmitError, parse_job_id, submit};
