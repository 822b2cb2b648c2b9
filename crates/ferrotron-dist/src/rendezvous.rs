//! Where the thread ranks of one group meet.
//!
//! Every collective is one or two *exchanges*: each member deposits a copy of its contribution,
//! the last to arrive closes the round, and every member then reads all contributions in rank
//! order without holding the lock. Reading by rank index, never by arrival, is what makes
//! reductions deterministic. A round also checks that all members called the same collective
//! with the same shape, so a schedule bug is an error instead of garbage or a hang.
//!
//! Waiting is bounded: a member that waits past the group's timeout poisons the group with a
//! message naming the ranks that did not arrive, which releases every other waiting member.
//! [`crate::World`] poisons every group when a rank fails, for the same reason.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::element::{DType, ReduceOp};
use crate::error::{CommError, GroupLabel};

/// A type-erased contribution (a `Vec<T>` or a struct of them).
pub(crate) type Payload = Arc<dyn Any + Send + Sync>;

/// What a member called, compared across the members of a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Signature {
    pub op: &'static str,
    /// `None` for collectives that move no data (barrier).
    pub dtype: Option<DType>,
    /// Elements per rank where the collective needs them equal.
    pub len: Option<usize>,
    pub reduce: Option<ReduceOp>,
    pub root: Option<usize>,
}

impl std::fmt::Display for Signature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}(", self.op)?;
        if let Some(dtype) = self.dtype {
            write!(f, "{dtype}")?;
        }
        if let Some(len) = self.len {
            write!(f, " × {len}")?;
        }
        if let Some(reduce) = self.reduce {
            write!(f, ", {reduce}")?;
        }
        if let Some(root) = self.root {
            write!(f, ", root {root}")?;
        }
        f.write_str(")")
    }
}

pub(crate) struct Deposit {
    pub signature: Signature,
    pub payload: Payload,
}

/// A point-to-point message waiting for its `recv`.
pub(crate) struct Message {
    pub dtype: DType,
    pub payload: Payload,
    pub len: usize,
}

type Outcome = Result<Arc<Vec<Deposit>>, CommError>;

struct State {
    poisoned: Option<String>,
    open: Vec<Option<Deposit>>,
    arrived: usize,
    /// Rounds completed so far; a waiter is done once this passes the round it joined.
    completed: u64,
    /// The last round's outcome and how many members have yet to read it.
    last: Option<(Outcome, usize)>,
    /// FIFO queues per (sender, receiver) group rank.
    mailboxes: HashMap<(usize, usize), VecDeque<Message>>,
}

pub(crate) struct Group {
    pub label: GroupLabel,
    timeout: Duration,
    state: Mutex<State>,
    changed: Condvar,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Group {
    pub(crate) fn new(label: GroupLabel, timeout: Duration, poisoned: Option<String>) -> Group {
        let size = label.ranks.len();
        Group {
            label,
            timeout,
            state: Mutex::new(State {
                poisoned,
                open: (0..size).map(|_| None).collect(),
                arrived: 0,
                completed: 0,
                last: None,
                mailboxes: HashMap::new(),
            }),
            changed: Condvar::new(),
        }
    }

    pub(crate) fn size(&self) -> usize {
        self.label.ranks.len()
    }

    /// Makes every current and future call on this group fail with `reason` (first reason wins).
    pub(crate) fn poison(&self, reason: &str) {
        let mut state = lock(&self.state);
        state.poisoned.get_or_insert_with(|| reason.to_owned());
        drop(state);
        self.changed.notify_all();
    }

    fn aborted(&self, op: &'static str, reason: &str) -> CommError {
        CommError::Aborted {
            op,
            group: self.label.clone(),
            reason: reason.to_owned(),
        }
    }

    /// Deposits `payload` as group rank `me` and returns every member's deposit, in rank order.
    pub(crate) fn exchange(
        &self,
        me: usize,
        signature: Signature,
        payload: Payload,
    ) -> Result<Arc<Vec<Deposit>>, CommError> {
        let op = signature.op;
        let deadline = Instant::now() + self.timeout;
        let mut state = lock(&self.state);
        if let Some(reason) = &state.poisoned {
            return Err(self.aborted(op, reason));
        }
        let round = state.completed;
        state.open[me] = Some(Deposit { signature, payload });
        state.arrived += 1;
        if state.arrived == self.size() {
            let deposits: Vec<Deposit> = state.open.iter_mut().filter_map(Option::take).collect();
            state.arrived = 0;
            state.completed += 1;
            let outcome = self.check(deposits).map(Arc::new);
            state.last = (self.size() > 1).then(|| (outcome.clone(), self.size() - 1));
            drop(state);
            self.changed.notify_all();
            return outcome;
        }
        loop {
            if state.completed > round {
                return Self::read_last(&mut state);
            }
            if let Some(reason) = &state.poisoned {
                return Err(self.aborted(op, reason));
            }
            let now = Instant::now();
            if now >= deadline {
                let missing = self.missing(&state.open);
                let err = CommError::Timeout {
                    op,
                    group: self.label.clone(),
                    after: self.timeout,
                    missing,
                    verb: "arrive",
                };
                return Err(self.fail(state, err));
            }
            state = self
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn read_last(state: &mut State) -> Outcome {
        let (outcome, readers_left) = state
            .last
            .as_mut()
            .expect("a completed round keeps its outcome until every member has read it");
        let outcome = outcome.clone();
        *readers_left -= 1;
        if *readers_left == 0 {
            state.last = None;
        }
        outcome
    }

    /// Poisons the group with `err` so every rank still waiting in it returns an error too.
    fn fail(&self, mut state: MutexGuard<'_, State>, err: CommError) -> CommError {
        state.poisoned = Some(err.to_string());
        drop(state);
        self.changed.notify_all();
        err
    }

    fn missing(&self, open: &[Option<Deposit>]) -> Vec<u32> {
        open.iter()
            .zip(&self.label.ranks)
            .filter(|(deposit, _)| deposit.is_none())
            .map(|(_, &rank)| rank)
            .collect()
    }

    /// All members must have called the same collective with the same shape.
    fn check(&self, deposits: Vec<Deposit>) -> Result<Vec<Deposit>, CommError> {
        let first = &deposits[0].signature;
        if let Some(odd) = deposits.iter().position(|d| d.signature != *first) {
            return Err(CommError::Mismatch {
                group: self.label.clone(),
                detail: format!(
                    "rank {} called {} but rank {} called {}",
                    self.label.ranks[0], first, self.label.ranks[odd], deposits[odd].signature
                ),
            });
        }
        Ok(deposits)
    }

    /// Queues a message from group rank `from` to `to`; messages between a pair arrive in order.
    pub(crate) fn send(&self, from: usize, to: usize, message: Message) -> Result<(), CommError> {
        let mut state = lock(&self.state);
        if let Some(reason) = &state.poisoned {
            return Err(self.aborted("send", reason));
        }
        state
            .mailboxes
            .entry((from, to))
            .or_default()
            .push_back(message);
        drop(state);
        self.changed.notify_all();
        Ok(())
    }

    /// The next message from `from` to `to`, waiting at most the group's timeout.
    pub(crate) fn recv(&self, from: usize, to: usize) -> Result<Message, CommError> {
        let deadline = Instant::now() + self.timeout;
        let mut state = lock(&self.state);
        loop {
            if let Some(message) = state
                .mailboxes
                .get_mut(&(from, to))
                .and_then(VecDeque::pop_front)
            {
                return Ok(message);
            }
            if let Some(reason) = &state.poisoned {
                return Err(self.aborted("recv", reason));
            }
            let now = Instant::now();
            if now >= deadline {
                let err = CommError::Timeout {
                    op: "recv",
                    group: self.label.clone(),
                    after: self.timeout,
                    missing: vec![self.label.ranks[from]],
                    verb: "send",
                };
                return Err(self.fail(state, err));
            }
            state = self
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}
