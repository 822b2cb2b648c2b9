//! [`replay`]: every rank's log of calls ([`crate::Recording`]) played against the others'
//! under NCCL's rules, to find the orders that would hang or corrupt a GPU run before one does.
//!
//! The model is the NCCL transport's: a GPU queues each communicator's collectives on its
//! lane's communication stream ([`crate::Lane`]: data-parallel groups on one, the others on
//! the other), in issue order, and a queued collective completes once every member of its
//! group has it at the head of that stream; a send completes together with the peer's matching
//! receive (a NCCL send may wait for it; the thread transport's buffered send does not, which
//! is how a thread world can finish an order a GPU world would hang on). The host issues a
//! deferred call and goes on; after an immediate one it waits until the call completed (exact
//! for the host-slice collectives, conservative for device ones, whose enqueue returns at
//! once: the replay may report a hang a GPU would escape, never the reverse). So each rank is
//! a host cursor and two queues, and the replay repeatedly issues what the hosts can and
//! completes whatever can complete at the heads, until either everything is done or nothing
//! can move:
//!
//! - **Mismatch**: every member of a group has a call on that group at its head but they
//!   disagree (operation, dtype, length, reduce op, root; all-to-all counts pairwise; a send's
//!   length and dtype against the receive's). NCCL would compute garbage or hang.
//! - **Deadlock**: no head can complete, e.g. two ranks that issue collectives of two shared
//!   groups in opposite orders, or two pipeline stages that both send first. The error names
//!   every blocked rank, the call it waits in and the ranks it waits for, and a cycle of them
//!   when there is one.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;

use crate::element::{DType, ReduceOp};
use crate::error::GroupLabel;
use crate::lane::Lane;
use crate::recording::{Call, Op};

/// A replay that completed every call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replayed {
    /// Calls completed, summed over the ranks.
    pub calls: usize,
    /// Of those, the calls issued deferred.
    pub deferred: usize,
}

/// A call as one rank issued it, and where it stands in that rank's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    /// Global rank.
    pub rank: u32,
    /// Index in the rank's log (0-based).
    pub index: usize,
    /// How many calls the rank made on the same group before this one.
    pub position: usize,
    pub call: Call,
}

impl fmt::Display for Issued {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {} calls {} (its call {} on the group, {} of its log)",
            self.rank, self.call, self.position, self.index
        )
    }
}

/// A rank that cannot go on, and whom it waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    pub waiting: Issued,
    /// Global ranks whose heads do not match (yet).
    pub waits_for: Vec<u32>,
}

/// What the replay found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OrderError {
    /// The members of `group` reached calls on it that do not match.
    #[error(
        "collective order mismatch on group {group}: {detail}: {}",
        Listed(calls)
    )]
    Mismatch {
        group: GroupLabel,
        detail: String,
        calls: Vec<Issued>,
    },
    /// No call at any rank's head can complete.
    #[error("{}", Deadlock { blocked, finished, cycle })]
    Deadlock {
        blocked: Vec<Blocked>,
        /// Ranks waited for that have no calls left: (rank, calls in its log).
        finished: Vec<(u32, usize)>,
        /// Ranks each waiting for the next, the last for the first; empty when the waits end
        /// at finished ranks instead.
        cycle: Vec<u32>,
    },
    /// A call no communicator could make: a group that does not hold the rank or names ranks
    /// outside the world, a peer or root outside the group, all-to-all counts of another size.
    #[error("{issued}: {detail}")]
    Malformed { issued: Box<Issued>, detail: String },
}

struct Listed<'a>(&'a [Issued]);

impl fmt::Display for Listed<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, issued) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{issued}")?;
        }
        Ok(())
    }
}

struct Deadlock<'a> {
    blocked: &'a [Blocked],
    finished: &'a [(u32, usize)],
    cycle: &'a [u32],
}

impl fmt::Display for Deadlock<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("collective order deadlock, no call can complete: ")?;
        for (i, blocked) in self.blocked.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            let issued = &blocked.waiting;
            write!(
                f,
                "rank {} waits in {} (its call {} on the group, {} of its log) for {}",
                issued.rank,
                issued.call,
                issued.position,
                issued.index,
                crate::error::RankList(&blocked.waits_for)
            )?;
        }
        for (rank, calls) in self.finished {
            write!(f, "; rank {rank} has made all its {calls} calls")?;
        }
        if let Some(first) = self.cycle.first() {
            f.write_str("; cycle: rank")?;
            for rank in self.cycle {
                write!(f, " {rank} →")?;
            }
            write!(f, " {first}")?;
        }
        Ok(())
    }
}

/// Plays `logs` (global rank `r`'s calls at index `r`) against each other; see the module docs.
pub fn replay(logs: &[Vec<Call>]) -> Result<Replayed, OrderError> {
    let replay = Replay::new(logs)?;
    replay.run()
}

struct Replay<'a> {
    logs: &'a [Vec<Call>],
    /// For every call, how many calls its rank made on its group before it.
    positions: Vec<Vec<usize>>,
    /// The index of each rank's next call to issue.
    next: Vec<usize>,
    /// Each rank's issued, unfinished calls (log indices) on each lane's stream, in issue order.
    queues: Vec<[VecDeque<usize>; 2]>,
    /// The immediate call each rank's host waits for before it issues another.
    waiting: Vec<Option<usize>>,
}

/// What the call at the head of a rank's lane can do now.
enum Step {
    /// These global ranks' heads (on that lane) complete together.
    Complete(Vec<u32>),
    Wait,
}

fn lane_of(call: &Call) -> usize {
    match Lane::of_group(&call.group.name) {
        Lane::Model => 0,
        Lane::Data => 1,
    }
}

impl<'a> Replay<'a> {
    fn new(logs: &'a [Vec<Call>]) -> Result<Replay<'a>, OrderError> {
        let mut positions = Vec::with_capacity(logs.len());
        for (rank, log) in logs.iter().enumerate() {
            let mut seen: HashMap<&GroupLabel, usize> = HashMap::new();
            let mut ranks_positions = Vec::with_capacity(log.len());
            for (index, call) in log.iter().enumerate() {
                let count = seen.entry(&call.group).or_default();
                ranks_positions.push(*count);
                *count += 1;
                if let Err(detail) = well_formed(call, rank as u32, logs.len()) {
                    return Err(OrderError::Malformed {
                        issued: Box::new(Issued {
                            rank: rank as u32,
                            index,
                            position: ranks_positions[index],
                            call: call.clone(),
                        }),
                        detail,
                    });
                }
            }
            positions.push(ranks_positions);
        }
        Ok(Replay {
            logs,
            positions,
            next: vec![0; logs.len()],
            queues: vec![Default::default(); logs.len()],
            waiting: vec![None; logs.len()],
        })
    }

    fn run(mut self) -> Result<Replayed, OrderError> {
        let mut done = Replayed {
            calls: 0,
            deferred: 0,
        };
        loop {
            self.issue();
            let mut progressed = false;
            for rank in 0..self.logs.len() as u32 {
                for lane in 0..2 {
                    while let Step::Complete(ranks) = self.step(rank, lane)? {
                        for r in ranks {
                            let index = self.queues[r as usize][lane]
                                .pop_front()
                                .expect("a completed head");
                            done.calls += 1;
                            done.deferred += usize::from(self.logs[r as usize][index].deferred);
                            if self.waiting[r as usize] == Some(index) {
                                self.waiting[r as usize] = None;
                            }
                        }
                        progressed = true;
                    }
                }
            }
            if self.pending().next().is_none() && self.all_issued() {
                return Ok(done);
            }
            if !progressed {
                return Err(self.stuck());
            }
        }
    }

    /// Every host issues calls onto its lanes until it reaches an immediate one (which it waits
    /// for: conservative for device collectives, exact for host ones) or its log's end; a
    /// deferred call only queues.
    fn issue(&mut self) {
        for rank in 0..self.logs.len() {
            while self.waiting[rank].is_none() && self.next[rank] < self.logs[rank].len() {
                let index = self.next[rank];
                let call = &self.logs[rank][index];
                self.queues[rank][lane_of(call)].push_back(index);
                if !call.deferred {
                    self.waiting[rank] = Some(index);
                }
                self.next[rank] += 1;
            }
        }
    }

    fn all_issued(&self) -> bool {
        (0..self.logs.len()).all(|r| self.next[r] == self.logs[r].len())
    }

    /// Every queued head: rank, lane, call.
    fn pending(&self) -> impl Iterator<Item = (u32, usize, &'a Call)> {
        (0..self.logs.len() as u32).flat_map(move |r| {
            (0..2).filter_map(move |lane| self.head(r, lane).map(|call| (r, lane, call)))
        })
    }

    fn head(&self, rank: u32, lane: usize) -> Option<&'a Call> {
        self.queues[rank as usize][lane]
            .front()
            .map(|&index| &self.logs[rank as usize][index])
    }

    fn issued(&self, rank: u32, lane: usize) -> Option<Issued> {
        let index = *self.queues[rank as usize][lane].front()?;
        Some(Issued {
            rank,
            index,
            position: self.positions[rank as usize][index],
            call: self.logs[rank as usize][index].clone(),
        })
    }

    fn step(&self, rank: u32, lane: usize) -> Result<Step, OrderError> {
        let Some(call) = self.head(rank, lane) else {
            return Ok(Step::Wait);
        };
        let group = &call.group;
        if group.ranks.len() == 1 {
            return Ok(Step::Complete(vec![rank]));
        }
        match call.op {
            Op::Send { peer } => self.pair(rank, group.ranks[peer], lane),
            Op::Recv { peer } => self.pair(group.ranks[peer], rank, lane),
            _ => self.collective(group, lane),
        }
    }

    /// `sender`'s send to `receiver` against `receiver`'s receive from `sender`, if both are
    /// at the heads of their `lane`.
    fn pair(&self, sender: u32, receiver: u32, lane: usize) -> Result<Step, OrderError> {
        let (Some(send), Some(recv)) = (self.head(sender, lane), self.head(receiver, lane)) else {
            return Ok(Step::Wait);
        };
        let matched = |call: &Call, op_peer: Option<usize>, other: u32| {
            call.group == send.group && op_peer.map(|p| call.group.ranks[p]) == Some(other)
        };
        let send_peer = match send.op {
            Op::Send { peer } => Some(peer),
            _ => None,
        };
        let recv_peer = match recv.op {
            Op::Recv { peer } => Some(peer),
            _ => None,
        };
        if !matched(send, send_peer, receiver) || !matched(recv, recv_peer, sender) {
            return Ok(Step::Wait);
        }
        if (send.dtype, send.len) != (recv.dtype, recv.len) {
            return Err(self.mismatch(
                &send.group,
                lane,
                &[sender, receiver],
                format!(
                    "rank {sender} sends {} but rank {receiver} receives {}",
                    Shape(send.dtype, send.len),
                    Shape(recv.dtype, recv.len)
                ),
            ));
        }
        Ok(Step::Complete(vec![sender, receiver]))
    }

    /// Every member's head on `lane`, if each is a collective call on `group`.
    fn collective(&self, group: &GroupLabel, lane: usize) -> Result<Step, OrderError> {
        let mut calls = Vec::with_capacity(group.ranks.len());
        for &member in &group.ranks {
            match self.head(member, lane) {
                Some(call) if call.group == *group && !call.op.is_point_to_point() => {
                    calls.push(call);
                }
                _ => return Ok(Step::Wait),
            }
        }
        if let Some(detail) = disagreement(group, &calls) {
            return Err(self.mismatch(group, lane, &group.ranks, detail));
        }
        Ok(Step::Complete(group.ranks.clone()))
    }

    fn mismatch(
        &self,
        group: &GroupLabel,
        lane: usize,
        ranks: &[u32],
        detail: String,
    ) -> OrderError {
        OrderError::Mismatch {
            group: group.clone(),
            detail,
            calls: ranks.iter().filter_map(|&r| self.issued(r, lane)).collect(),
        }
    }

    /// Whether `rank` has nothing left: every call issued and finished.
    fn finished(&self, rank: u32) -> bool {
        let r = rank as usize;
        self.next[r] == self.logs[r].len() && self.queues[r].iter().all(VecDeque::is_empty)
    }

    /// Why nothing can complete: a group whose members all stand at calls on it that cannot
    /// go together (a collective against a send) is a mismatch; anything else a deadlock.
    fn stuck(&self) -> OrderError {
        let mut blocked = Vec::new();
        for (rank, lane, call) in self.pending() {
            let group = &call.group;
            let on_group = |r: u32| self.head(r, lane).is_some_and(|c| c.group == *group);
            let waits_for: Vec<u32> = match call.op {
                Op::Send { peer } | Op::Recv { peer } => vec![group.ranks[peer]],
                _ => {
                    if group.ranks.iter().all(|&r| on_group(r)) {
                        return self.mismatch(
                            group,
                            lane,
                            &group.ranks,
                            "a collective against a send or receive".to_owned(),
                        );
                    }
                    let collective_here = |r: u32| {
                        self.head(r, lane)
                            .is_some_and(|c| c.group == *group && !c.op.is_point_to_point())
                    };
                    group
                        .ranks
                        .iter()
                        .copied()
                        .filter(|&r| r != rank && !collective_here(r))
                        .collect()
                }
            };
            blocked.push(Blocked {
                waiting: self.issued(rank, lane).expect("a queued head"),
                waits_for,
            });
        }
        let mut finished: Vec<(u32, usize)> = blocked
            .iter()
            .flat_map(|b| b.waits_for.iter().copied())
            .filter(|&r| self.finished(r))
            .map(|r| (r, self.logs[r as usize].len()))
            .collect();
        finished.sort_unstable();
        finished.dedup();
        let cycle = cycle(&blocked);
        OrderError::Deadlock {
            blocked,
            finished,
            cycle,
        }
    }
}

/// A cycle of blocked ranks each waiting for the next (depth-first from the lowest blocked
/// rank on), or none when every chain of waits ends at a rank that has no calls left.
fn cycle(blocked: &[Blocked]) -> Vec<u32> {
    let waits: HashMap<u32, Vec<u32>> = blocked
        .iter()
        .map(|b| (b.waiting.rank, b.waits_for.clone()))
        .collect();
    let successors = |rank: u32| -> Vec<u32> {
        waits[&rank]
            .iter()
            .rev()
            .copied()
            .filter(|r| waits.contains_key(r))
            .collect()
    };
    let mut explored: HashSet<u32> = HashSet::new();
    for start in blocked.iter().map(|b| b.waiting.rank) {
        if explored.contains(&start) {
            continue;
        }
        // the current chain of waits, each rank with the successors still to try (last first)
        let mut chain: Vec<(u32, Vec<u32>)> = vec![(start, successors(start))];
        explored.insert(start);
        while let Some((_, next)) = chain.last_mut() {
            let Some(rank) = next.pop() else {
                chain.pop();
                continue;
            };
            if let Some(at) = chain.iter().position(|(r, _)| *r == rank) {
                return chain[at..].iter().map(|(r, _)| *r).collect();
            }
            if explored.insert(rank) {
                chain.push((rank, successors(rank)));
            }
        }
    }
    Vec::new()
}

/// `f32 × 4`, or `nothing` for a call without data.
struct Shape(Option<DType>, usize);

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(dtype) => write!(f, "{dtype} × {}", self.1),
            None => f.write_str("nothing"),
        }
    }
}

/// What the members of a collective must agree on besides all-to-all counts: operation, reduce
/// op, root, dtype, and the length where every member passes the same.
fn signature(
    call: &Call,
) -> (
    &'static str,
    Option<ReduceOp>,
    Option<usize>,
    Option<DType>,
    Option<usize>,
) {
    let (reduce, root, same_len) = match call.op {
        Op::AllReduce(reduce) | Op::ReduceScatter(reduce) => (Some(reduce), None, true),
        Op::Broadcast { root } => (None, Some(root), true),
        Op::AllGather => (None, None, true),
        _ => (None, None, false),
    };
    (
        call.op.name(),
        reduce,
        root,
        call.dtype,
        same_len.then_some(call.len),
    )
}

/// Why the members' calls (in group-rank order) cannot run as one collective, if they cannot.
fn disagreement(group: &GroupLabel, calls: &[&Call]) -> Option<String> {
    let first = signature(calls[0]);
    if calls[1..].iter().any(|call| signature(call) != first) {
        return Some("the members' calls differ".to_owned());
    }
    let counts: Vec<(&[usize], &[usize])> = calls
        .iter()
        .filter_map(|call| match &call.op {
            Op::AllToAll {
                send_counts,
                recv_counts,
            } => Some((send_counts.as_slice(), recv_counts.as_slice())),
            _ => None,
        })
        .collect();
    for (i, (send, _)) in counts.iter().enumerate() {
        for (j, (_, recv)) in counts.iter().enumerate() {
            if send[j] != recv[i] {
                return Some(format!(
                    "rank {} sends {} elements to rank {}, which expects {}",
                    group.ranks[i], send[j], group.ranks[j], recv[i]
                ));
            }
        }
    }
    None
}

/// The checks a communicator makes before it talks to anyone, on a recorded call of `rank`.
fn well_formed(call: &Call, rank: u32, world: usize) -> Result<(), String> {
    let group = &call.group;
    if let Some(outside) = group.ranks.iter().find(|&&r| r as usize >= world) {
        return Err(format!("rank {outside} is outside a world of {world}"));
    }
    if !group.ranks.contains(&rank) {
        return Err(format!("rank {rank} is not a member of group {group}"));
    }
    let size = group.ranks.len();
    match &call.op {
        Op::Send { peer: r } | Op::Recv { peer: r } | Op::Broadcast { root: r } => {
            crate::arguments::peer(*r, size)
        }
        Op::AllToAll {
            send_counts,
            recv_counts,
        } => {
            let received = recv_counts.iter().sum();
            crate::arguments::all_to_all(size, send_counts, call.len, recv_counts, received)
        }
        _ => Ok(()),
    }
}
