//! The communicator trait every parallel layout is written against.
//!
//! It works on flat, rank-local buffers of one [`Element`] type rather than on burn tensors,
//! because that is the shape of the real thing: NCCL takes a device pointer, an element count
//! and a data type. A NCCL backend (one process per GPU) can implement this trait call for call,
//! and the in-process [`crate::ThreadComm`] used by tests and CPU runs implements it the same
//! way; moving a tensor into and out of a buffer is a thin helper in the runtime.
//!
//! Ranks passed to a communicator (`root`, `peer`) are ranks *within its group*; the members'
//! global ranks are [`Communicator::members`]. Every call is blocking and returns an error
//! (never hangs) when a member fails or does not arrive before the timeout.

use crate::element::{Element, ReduceOp};
use crate::error::{CommError, GroupLabel};

pub trait Communicator: Send + Sized {
    /// This rank's index in the group.
    fn rank(&self) -> usize;

    fn size(&self) -> usize;

    /// The group's name and members (global ranks), e.g. `dp[0,2]`.
    fn label(&self) -> &GroupLabel;

    /// This rank's global rank.
    fn global_rank(&self) -> u32 {
        self.label().ranks[self.rank()]
    }

    /// Global ranks of the members, in group-rank order.
    fn members(&self) -> &[u32] {
        &self.label().ranks
    }

    /// A communicator over `members` (global ranks, in the order that gives group ranks).
    ///
    /// Collective over the members only; non-members must not call it. Groups are identified by
    /// name and members, so two differently named groups with the same ranks are independent.
    fn new_group(&self, name: &str, members: &[u32]) -> Result<Self, CommError>;

    /// Combines `buf` element-wise across the group; every member ends with the result.
    /// Sums are taken in group-rank order regardless of arrival, so they are deterministic.
    fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<(), CommError>;

    /// Concatenates every member's `input` in rank order into `output` (`size × input.len()`).
    fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<(), CommError>;

    /// Reduces `input` (`size × output.len()`) across the group; member `i` receives chunk `i`.
    fn reduce_scatter<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError>;

    /// Copies `buf` of group rank `root` into every member's `buf`.
    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<(), CommError>;

    /// Sends `buf` to group rank `peer`. Messages between a pair arrive in the order sent.
    ///
    /// [`crate::ThreadComm`] buffers the message and returns at once; a NCCL send may block
    /// until the peer posts the matching `recv`, so schedules must order (or batch) their
    /// sends and receives as they would for NCCL.
    fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<(), CommError>;

    /// Receives the next message from group rank `peer` into `buf` (its length must match).
    fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<(), CommError>;

    /// Personalised exchange with uneven splits (MoE token dispatch): the first `send_counts[0]`
    /// elements of `input` go to rank 0, the next `send_counts[1]` to rank 1, …; `output`
    /// receives `recv_counts[j]` elements from each rank `j`, in rank order. Counts must agree
    /// pairwise (exchange them first with an all-to-all of counts, as Megatron does).
    fn all_to_all<T: Element>(
        &self,
        input: &[T],
        send_counts: &[usize],
        output: &mut [T],
        recv_counts: &[usize],
    ) -> Result<(), CommError>;

    /// Returns once every member has called it.
    fn barrier(&self) -> Result<(), CommError>;

    /// Whether the members are threads of this one process (they then share process-wide
    /// state, such as burn-autodiff's graph registry, that ranks of their own never do).
    fn members_are_threads(&self) -> bool {
        false
    }

    /// Checks that every member issued the same calls on this group so far (collective over
    /// the members). Transports that compare each call as it happens (threads, TCP) have
    /// nothing to check; NCCL compares [`crate::OrderDigest`]s.
    fn agree_on_order(&self) -> Result<(), CommError> {
        Ok(())
    }
}
