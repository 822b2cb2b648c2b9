//! [`Recording`]: a communicator that keeps an ordered log of every call its rank makes.
//!
//! NCCL needs the members of each communicator to issue the same operations in the same order,
//! and a GPU's collectives run one after another on its lane's communication stream
//! ([`crate::Lane`]), so a rank that issues collectives of two groups of a lane (or an
//! immediate one of either) in another order than its peers hangs the job, and one that issues a different
//! length on a group corrupts it. The thread and TCP transports catch the second kind call by
//! call, but not the first whenever their buffering lets the run through (a thread rank's
//! `send` never waits for the `recv`). So the calls are recorded, one log per rank shared by all
//! of the rank's communicators, in the order the rank issued them, and
//! [`crate::replay`] plays every rank's log against the others' under NCCL's rules.
//!
//! The wrapper changes no result: it records, then forwards the call to the communicator it
//! wraps (also when that call then fails, so the log holds what the rank tried last).
//!
//! The `*_started` collectives of the runtime (data-parallel gradient buckets, ZeRO-1's
//! parameter gather, which the caller waits for only later) reach a communicator through the
//! same trait methods as blocking ones; only their caller knows it will wait later, so it runs
//! them inside [`deferred`], and the log marks them: the host goes on past a deferred call
//! (it waits on its lane's stream) but waits for an immediate one, and the replay models both.

use std::cell::Cell;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use crate::communicator::Communicator;
use crate::element::{DType, Element, ReduceOp};
use crate::error::{CommError, GroupLabel};

/// What a call did, with the arguments its members must agree on. Ranks inside an operation
/// (`root`, `peer`) are group ranks, as the communicator takes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// The communicator's creation: collective over its members (NCCL's `ncclCommInitRank`).
    NewGroup,
    AllReduce(ReduceOp),
    AllGather,
    ReduceScatter(ReduceOp),
    Broadcast {
        root: usize,
    },
    Send {
        peer: usize,
    },
    Recv {
        peer: usize,
    },
    AllToAll {
        send_counts: Vec<usize>,
        recv_counts: Vec<usize>,
    },
    Barrier,
}

impl Op {
    /// The operation's name, as the communicator's errors spell it.
    pub fn name(&self) -> &'static str {
        match self {
            Op::NewGroup => "new_group",
            Op::AllReduce(_) => "all_reduce",
            Op::AllGather => "all_gather",
            Op::ReduceScatter(_) => "reduce_scatter",
            Op::Broadcast { .. } => "broadcast",
            Op::Send { .. } => "send",
            Op::Recv { .. } => "recv",
            Op::AllToAll { .. } => "all_to_all",
            Op::Barrier => "barrier",
        }
    }

    /// Send or receive: matched pairwise, not by every member.
    pub fn is_point_to_point(&self) -> bool {
        matches!(self, Op::Send { .. } | Op::Recv { .. })
    }
}

/// One call of one rank on one of its communicators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub group: GroupLabel,
    pub op: Op,
    /// `None` for calls that move no data (`new_group`, `barrier`).
    pub dtype: Option<DType>,
    /// Elements this rank passes in: the buffer of an all-reduce, broadcast, send or receive,
    /// the input of an all-gather, reduce-scatter or all-to-all; 0 when nothing moves.
    pub len: usize,
    /// Issued inside [`deferred`]: the caller orders later work after it only when it waits.
    pub deferred: bool,
}

impl Call {
    /// The global rank behind a group rank of this call's group (for messages).
    fn global(&self, group_rank: usize) -> String {
        self.group
            .ranks
            .get(group_rank)
            .map_or_else(|| format!("group rank {group_rank}"), u32::to_string)
    }
}

/// `deferred all_reduce(f32 × 4, sum) on dp[0,2]`, `send(f32 × 8 to rank 3) on pp[1,3]`.
impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.deferred {
            f.write_str("deferred ")?;
        }
        write!(f, "{}(", self.op.name())?;
        if let Some(dtype) = self.dtype {
            write!(f, "{dtype} × {}", self.len)?;
        }
        match &self.op {
            Op::NewGroup | Op::AllGather | Op::Barrier => {}
            Op::AllReduce(reduce) | Op::ReduceScatter(reduce) => write!(f, ", {reduce}")?,
            Op::Broadcast { root } => write!(f, ", root {}", self.global(*root))?,
            Op::Send { peer } => write!(f, " to rank {}", self.global(*peer))?,
            Op::Recv { peer } => write!(f, " from rank {}", self.global(*peer))?,
            Op::AllToAll {
                send_counts,
                recv_counts,
            } => write!(f, ", send {send_counts:?}, recv {recv_counts:?}")?,
        }
        write!(f, ") on {}", self.group)
    }
}

/// One rank's calls, in issue order; every communicator of the rank shares it.
#[derive(Debug, Clone, Default)]
pub struct CallLog(Arc<Mutex<Vec<Call>>>);

impl CallLog {
    /// The calls recorded so far.
    pub fn calls(&self) -> Vec<Call> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn push(&self, call: Call) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(call);
    }
}

/// One [`CallLog`] per rank of a world, in rank order: what [`crate::replay`] takes.
#[derive(Debug, Clone)]
pub struct CallLogs(Vec<CallLog>);

impl CallLogs {
    /// `ranks` empty logs (each its own: a [`CallLog`] clone shares its calls).
    pub fn new(ranks: usize) -> CallLogs {
        CallLogs((0..ranks).map(|_| CallLog::default()).collect())
    }

    /// Global rank `rank`'s log.
    pub fn rank(&self, rank: u32) -> &CallLog {
        &self.0[rank as usize]
    }

    /// Every rank's calls so far, rank by rank.
    pub fn calls(&self) -> Vec<Vec<Call>> {
        self.0.iter().map(CallLog::calls).collect()
    }

    /// [`crate::replay`] of [`CallLogs::calls`].
    pub fn replay(&self) -> Result<crate::Replayed, crate::OrderError> {
        crate::replay(&self.calls())
    }
}

thread_local! {
    static DEFERRED: Cell<bool> = const { Cell::new(false) };
}

/// Puts the thread's mark back when [`deferred`]'s closure returns or unwinds.
struct Restore(bool);

impl Drop for Restore {
    fn drop(&mut self) {
        DEFERRED.set(self.0);
    }
}

/// Runs `issue`, whose collectives the caller waits for only later: a [`Recording`] on this
/// thread marks them [`Call::deferred`]. Nothing else changes.
pub fn deferred<R>(issue: impl FnOnce() -> R) -> R {
    let _restore = Restore(DEFERRED.replace(true));
    issue()
}

/// `C` with every call recorded into a [`CallLog`] before it is made.
pub struct Recording<C> {
    inner: C,
    log: CallLog,
}

impl<C: fmt::Debug> fmt::Debug for Recording<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Recording({:?})", self.inner)
    }
}

impl<C: Communicator> Recording<C> {
    /// `inner` recording into `log`, and so will every group created from it.
    pub fn new(inner: C, log: CallLog) -> Recording<C> {
        Recording { inner, log }
    }

    fn record(&self, op: Op, dtype: Option<DType>, len: usize) {
        self.log.push(Call {
            group: self.inner.label().clone(),
            op,
            dtype,
            len,
            deferred: DEFERRED.get(),
        });
    }
}

impl<C: Communicator> Communicator for Recording<C> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn label(&self) -> &GroupLabel {
        self.inner.label()
    }

    fn new_group(&self, name: &str, members: &[u32]) -> Result<Self, CommError> {
        self.log.push(Call {
            group: GroupLabel {
                name: name.to_owned(),
                ranks: members.to_vec(),
            },
            op: Op::NewGroup,
            dtype: None,
            len: 0,
            deferred: DEFERRED.get(),
        });
        Ok(Recording {
            inner: self.inner.new_group(name, members)?,
            log: self.log.clone(),
        })
    }

    fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<(), CommError> {
        self.record(Op::AllReduce(op), Some(T::DTYPE), buf.len());
        self.inner.all_reduce(buf, op)
    }

    fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<(), CommError> {
        self.record(Op::AllGather, Some(T::DTYPE), input.len());
        self.inner.all_gather(input, output)
    }

    fn reduce_scatter<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        self.record(Op::ReduceScatter(op), Some(T::DTYPE), input.len());
        self.inner.reduce_scatter(input, output, op)
    }

    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<(), CommError> {
        self.record(Op::Broadcast { root }, Some(T::DTYPE), buf.len());
        self.inner.broadcast(buf, root)
    }

    fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<(), CommError> {
        self.record(Op::Send { peer }, Some(T::DTYPE), buf.len());
        self.inner.send(buf, peer)
    }

    fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<(), CommError> {
        self.record(Op::Recv { peer }, Some(T::DTYPE), buf.len());
        self.inner.recv(buf, peer)
    }

    fn all_to_all<T: Element>(
        &self,
        input: &[T],
        send_counts: &[usize],
        output: &mut [T],
        recv_counts: &[usize],
    ) -> Result<(), CommError> {
        let op = Op::AllToAll {
            send_counts: send_counts.to_vec(),
            recv_counts: recv_counts.to_vec(),
        };
        self.record(op, Some(T::DTYPE), input.len());
        self.inner
            .all_to_all(input, send_counts, output, recv_counts)
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.record(Op::Barrier, None, 0);
        self.inner.barrier()
    }

    fn members_are_threads(&self) -> bool {
        self.inner.members_are_threads()
    }
}
