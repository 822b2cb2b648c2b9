//! [`World`]: N thread ranks running one closure, the way `torchrun` runs N processes.
//!
//! Each rank runs on its own OS thread with a [`RankContext`] holding its world communicator.
//! The first rank to panic or return an error aborts the fabric, which poisons every group, so
//! ranks blocked in a collective return an error at once instead of waiting for a peer that will
//! never come; the world then reports that first rank, which is the cause, not the echoes.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::communicator::Communicator;
use crate::error::{CommError, GroupLabel, WorldError};
use crate::fabric::Fabric;
use crate::groups::{GroupMembers, ProcessGroups};
use crate::recording::{CallLogs, Recording};
use crate::thread_comm::ThreadComm;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a collective waits for the other members by default (Megatron's NCCL default is
/// longer, but a thread rank that has not arrived in 30 s is stuck, not slow).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy)]
pub struct World {
    size: u32,
    timeout: Duration,
}

/// What a rank's closure receives.
#[derive(Debug)]
pub struct RankContext {
    world: ThreadComm,
}

impl RankContext {
    pub fn rank(&self) -> u32 {
        self.world.global_rank()
    }

    pub fn world_size(&self) -> u32 {
        self.world.members().len() as u32
    }

    /// The communicator over every rank (group `world`).
    pub fn world(&self) -> &ThreadComm {
        &self.world
    }

    /// This rank's tp/pp/dp/cp/ep/edp/embedding communicators over `members`.
    pub fn groups(&self, members: &GroupMembers) -> Result<ProcessGroups<ThreadComm>, CommError> {
        ProcessGroups::new(members, &self.world)
    }

    /// The world communicator recording every call into this rank's log of `logs` (one per
    /// rank of the world), as will every group made from it (pass it to
    /// [`ProcessGroups::new`]); [`CallLogs::replay`] then checks the ranks' order.
    pub fn recorded_world(&self, logs: &CallLogs) -> Recording<ThreadComm> {
        Recording::new(self.world.handle(), logs.rank(self.rank()).clone())
    }
}

enum RankFailure {
    Panicked(String),
    Failed(BoxError),
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".to_owned())
}

impl World {
    pub fn new(size: u32) -> World {
        World {
            size,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// How long every collective waits for the other members before it fails.
    pub fn with_timeout(self, timeout: Duration) -> World {
        World { timeout, ..self }
    }

    pub fn size(&self) -> u32 {
        self.size
    }

    /// Runs `body` on every rank and returns the results in rank order, or the first failure.
    ///
    /// `body` returns a `Result` so that a rank's error (bad data, a failed collective) is
    /// reported like a panic: by rank, after releasing every other rank.
    pub fn run<R, E, F>(&self, body: F) -> Result<Vec<R>, WorldError>
    where
        R: Send,
        E: Into<BoxError>,
        F: Fn(RankContext) -> Result<R, E> + Sync,
    {
        if self.size == 0 {
            return Err(WorldError::Empty);
        }
        let fabric = Arc::new(Fabric::new(self.size, self.timeout));
        let world = GroupLabel {
            name: "world".to_owned(),
            ranks: (0..self.size).collect(),
        };
        let body = &body;
        let outcomes: Vec<Result<R, WorldError>> = thread::scope(|scope| {
            let mut handles = Vec::new();
            for rank in 0..self.size {
                let context = RankContext {
                    world: ThreadComm::new(fabric.clone(), world.clone(), rank as usize),
                };
                let shared = fabric.clone();
                let spawned = thread::Builder::new()
                    .name(format!("rank-{rank}"))
                    .spawn_scoped(scope, move || run_rank(&shared, rank, context, body));
                match spawned {
                    Ok(handle) => handles.push((rank, handle)),
                    Err(source) => {
                        fabric.abort(rank, format!("rank {rank} could not be started"));
                        handles.clear();
                        return vec![Err(WorldError::Spawn { rank, source })];
                    }
                }
            }
            handles
                .into_iter()
                .map(|(rank, handle)| match handle.join() {
                    Ok(Ok(result)) => Ok(result),
                    Ok(Err(RankFailure::Panicked(message))) => {
                        Err(WorldError::RankPanicked { rank, message })
                    }
                    Ok(Err(RankFailure::Failed(source))) => {
                        Err(WorldError::RankFailed { rank, source })
                    }
                    Err(payload) => Err(WorldError::RankPanicked {
                        rank,
                        message: panic_message(payload.as_ref()),
                    }),
                })
                .collect()
        });
        let first = fabric.failure().map(|failure| failure.rank);
        let mut results = Vec::with_capacity(outcomes.len());
        let mut errors = Vec::new();
        for outcome in outcomes {
            match outcome {
                Ok(result) => results.push(result),
                Err(err) => errors.push(err),
            }
        }
        if errors.is_empty() {
            return Ok(results);
        }
        let is_first = |err: &WorldError| match err {
            WorldError::RankPanicked { rank, .. } | WorldError::RankFailed { rank, .. } => {
                Some(*rank) == first
            }
            WorldError::Empty | WorldError::Spawn { .. } => true,
        };
        let index = errors.iter().position(is_first).unwrap_or(0);
        Err(errors.swap_remove(index))
    }
}

fn run_rank<R, E, F>(
    fabric: &Fabric,
    rank: u32,
    context: RankContext,
    body: &F,
) -> Result<R, RankFailure>
where
    E: Into<BoxError>,
    F: Fn(RankContext) -> Result<R, E>,
{
    match catch_unwind(AssertUnwindSafe(|| body(context))) {
        Ok(Ok(result)) => Ok(result),
        Ok(Err(err)) => {
            let err: BoxError = err.into();
            fabric.abort(rank, format!("rank {rank} failed: {err}"));
            Err(RankFailure::Failed(err))
        }
        Err(payload) => {
            let message = panic_message(payload.as_ref());
            fabric.abort(rank, format!("rank {rank} panicked: {message}"));
            Err(RankFailure::Panicked(message))
        }
    }
}
