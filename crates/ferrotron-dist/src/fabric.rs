//! The state the thread ranks of one [`crate::World`] share: the registry of groups and the
//! first failure.
//!
//! Groups are keyed by name *and* members, so `dp` and `dp_cp` stay independent communicators
//! even when they hold the same ranks (as separate NCCL communicators would), and a failure
//! poisons every group, including ones created after it, so no rank can block on a dead world.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::error::GroupLabel;
use crate::rendezvous::Group;

/// The first rank to fail, and why.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub rank: u32,
    pub reason: String,
}

pub(crate) struct Fabric {
    pub world_size: u32,
    pub timeout: Duration,
    groups: Mutex<HashMap<GroupLabel, Arc<Group>>>,
    failure: Mutex<Option<Failure>>,
}

impl Fabric {
    pub(crate) fn new(world_size: u32, timeout: Duration) -> Fabric {
        Fabric {
            world_size,
            timeout,
            groups: Mutex::new(HashMap::new()),
            failure: Mutex::new(None),
        }
    }

    /// The group with this label, created on first use by any member.
    pub(crate) fn group(&self, label: GroupLabel) -> Arc<Group> {
        let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        let poisoned = self.failure().map(|f| f.reason);
        groups
            .entry(label.clone())
            .or_insert_with(|| Arc::new(Group::new(label, self.timeout, poisoned)))
            .clone()
    }

    pub(crate) fn failure(&self) -> Option<Failure> {
        self.failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Records `rank`'s failure (the first one wins) and releases every rank waiting anywhere.
    pub(crate) fn abort(&self, rank: u32, reason: String) {
        let reason = {
            let mut failure = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
            failure
                .get_or_insert(Failure { rank, reason })
                .reason
                .clone()
        };
        let groups: Vec<Arc<Group>> = self
            .groups
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        for group in groups {
            group.poison(&reason);
        }
    }
}
