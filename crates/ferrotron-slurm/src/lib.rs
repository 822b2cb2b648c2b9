//! Slurm for real: a rank's place from its launcher's environment, sbatch scripts from the
//! plan, and submission.
//!
//! Ferrotron does not bring a cluster launcher of its own. Inside an allocation, `srun recipe
//! run RECIPE` starts one process per rank and each learns its rank, the world size and the
//! rendezvous address from Slurm ([`LaunchEnv::detect`], host lists expanded with
//! [`expand_hostlist`]); the processes then form a [`ferrotron_dist::TcpComm`] world (or, on
//! GPUs, NCCL). `recipe submit` writes the batch script that asks for what the plan needs
//! ([`SbatchScript`]) and hands it to `sbatch` ([`submit`]).

mod gpu;
mod hostlist;
mod launch;
mod sbatch;
mod submit;

#[cfg(test)]
mod tests;

pub use gpu::{CUDA_VISIBLE_DEVICES, GpuChoice, gpu_ordinal};
pub use hostlist::{HostlistError, expand_hostlist};
pub use launch::{LaunchEnv, LaunchError, Launcher, PORT_BASE, PORT_SPAN, port_for_job};
pub use sbatch::{ArrayTask, JobShape, SbatchScript, SlurmOptions, TaskCommand, shell_quote};
pub use submit::{SubmitError, parse_job_id, submit};
