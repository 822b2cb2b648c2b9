//! Errors of collectives and of thread worlds.
//!
//! Every message names the group (with its global ranks), the collective, and the ranks at
//! fault, because a distributed failure without those is a hang someone has to bisect.

use std::fmt;
use std::time::Duration;

/// A group's name and its members as global ranks, displayed `dp[0,2]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupLabel {
    pub name: String,
    pub ranks: Vec<u32>,
}

impl fmt::Display for GroupLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.name)?;
        for (i, rank) in self.ranks.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{rank}")?;
        }
        f.write_str("]")
    }
}

/// "rank 2" or "ranks 2, 3".
pub(crate) struct RankList<'a>(pub &'a [u32]);

impl fmt::Display for RankList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let noun = if self.0.len() == 1 { "rank" } else { "ranks" };
        write!(f, "{noun} ")?;
        for (i, rank) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{rank}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum CommError {
    /// Some members never reached the collective (or never sent) before the deadline.
    #[error(
        "{op} on group {group} timed out after {after:?}: {} did not {verb}",
        RankList(missing)
    )]
    Timeout {
        op: &'static str,
        group: GroupLabel,
        after: Duration,
        missing: Vec<u32>,
        verb: &'static str,
    },
    /// Another rank failed or timed out; this collective can never complete.
    #[error("{op} on group {group} aborted: {reason}")]
    Aborted {
        op: &'static str,
        group: GroupLabel,
        reason: String,
    },
    /// The members called different collectives, or the same one with different shapes.
    #[error("collective mismatch on group {group}: {detail}")]
    Mismatch { group: GroupLabel, detail: String },
    /// A buffer size, count, root or peer that cannot work.
    #[error("{op} on group {group}: {detail}")]
    InvalidArgument {
        op: &'static str,
        group: GroupLabel,
        detail: String,
    },
    #[error("rank {rank} is not a member of group {group}")]
    NotAMember { group: GroupLabel, rank: u32 },
}

/// Why [`crate::World::run`] failed: the first rank that failed, by rank.
#[derive(Debug, thiserror::Error)]
pub enum WorldError {
    #[error("a world needs at least one rank")]
    Empty,
    #[error("rank {rank} panicked: {message}")]
    RankPanicked { rank: u32, message: String },
    #[error("rank {rank} failed: {source}")]
    RankFailed {
        rank: u32,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("could not start the thread of rank {rank}: {source}")]
    Spawn { rank: u32, source: std::io::Error },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_names_the_group_the_collective_and_the_missing_rank() {
        let err = CommError::Timeout {
            op: "all_reduce",
            group: GroupLabel {
                name: "dp".into(),
                ranks: vec![0, 2],
            },
            after: Duration::from_secs(30),
            missing: vec![2],
            verb: "arrive",
        };
        assert_eq!(
            err.to_string(),
            "all_reduce on group dp[0,2] timed out after 30s: rank 2 did not arrive"
        );
    }
}
