//! How the processes of a run start and find each other: a rank's place read from its
//! launcher's environment (srun, torchrun-style variables), the local launcher that is
//! `recipe run --nproc-per-node`, and Slurm's side (host lists, sbatch scripts from the plan,
//! submission).
//!
//! Ferrotron does not bring a cluster launcher of its own. Inside an allocation, `srun recipe
//! run RECIPE` starts one process per rank and each learns its rank, the world size and the
//! rendezvous address from Slurm ([`LaunchEnv::detect`], host lists expanded with
//! [`expand_hostlist`]); on one machine [`local::launch`] starts the ranks with torchrun's
//! variables, so every rank takes the same path whoever started it. The processes then form a
//! [`ferrotron_dist::TcpComm`] world (or, on GPUs, NCCL). `recipe submit` writes the batch script
//! that asks for what the plan needs ([`SbatchScript`]) and hands it to `sbatch` ([`submit`]).

mod env;
mod gpu;
pub mod local;
mod slurm;

#[cfg(test)]
mod tests;

pub use env::{LaunchEnv, LaunchError, Launcher, PORT_BASE, PORT_SPAN, port_for_job};
pub use gpu::{CUDA_VISIBLE_DEVICES, GpuChoice, gpu_ordinal};
pub use slurm::{
    ArrayTask, HostlistError, JobShape, SbatchScript, SlurmOptions, SubmitError, TaskCommand,
    expand_hostlist, parse_job_id, shell_quote, submit,
};
