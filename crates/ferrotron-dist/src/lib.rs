//! The communicator every parallel layout runs on.
//!
//! Layouts (tensor, pipeline, data, context, expert parallelism, ZeRO-1) are written once
//! against [`Communicator`], a trait over flat rank-local buffers with the collectives they
//! need. Implementations sit behind it: [`ThreadComm`], one OS thread per rank in one process
//! (tests, CPU runs, the equivalence tests of every layout); [`TcpComm`], one process per rank
//! over TCP (Slurm and torchrun-style launches on CPU, keeping the same bit-identical reductions);
//! and `ferrotron_cuda::nccl::NcclComm`, one process per GPU, which uses [`TcpComm`] to share
//! its NCCL unique ids. [`ProcessGroups::new`] gives a rank its
//! tp/pp/dp/cp/ep/edp/embedding communicators from the members of its groups ([`GroupMembers`],
//! which the runtime takes from the plan: this crate knows nothing of plans).
//!
//! [`Recording`] wraps any communicator to log the calls of each rank, and [`replay`] plays
//! every rank's log under NCCL's rules (one queue per GPU, blocking sends) to find the orders
//! that would hang or corrupt a GPU run: the thread-rank equivalence tests replay each layout.
//!
//! Two promises matter more than speed: reductions are deterministic (summed in rank order, so
//! a parallel run can be compared bit for bit with a sequential reference), and nothing hangs
//! (every wait has a timeout naming the group, the collective and the missing ranks; a failing
//! rank releases the others with an error).

mod agreement;
pub mod arguments;
mod communicator;
mod digest;
mod element;
mod error;
mod fabric;
pub mod fault;
mod groups;
mod lane;
mod recording;
mod recycle;
mod rendezvous;
mod replay;
mod tcp_comm;
mod tcp_comm_mesh;
mod tcp_comm_rendezvous;
mod tcp_comm_wire;
mod thread_comm;
pub mod watchdog;
mod world;

#[cfg(test)]
mod tests;

pub use agreement::{AgreementError, check_agreement};
pub use communicator::Communicator;
pub use digest::{OrderDigest, agree_on_digest};
pub use element::{DType, Element, ReduceOp};
pub use error::{CommError, GroupLabel, WorldError};
pub use groups::{GroupMembers, ProcessGroups};
pub use half::bf16;
pub use lane::Lane;
pub use recording::{Call, CallLog, CallLogs, Op, Recording, deferred};
pub use replay::{Blocked, Issued, OrderError, Replayed, replay};
pub use tcp_comm::{DEFAULT_CONNECT_TIMEOUT, TcpComm, TcpConfig};
pub use tcp_comm_rendezvous::TcpError;
pub use thread_comm::ThreadComm;
pub use world::{DEFAULT_TIMEOUT, RankContext, World};
