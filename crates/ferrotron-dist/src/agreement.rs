//! One check that every rank of a world holds the same value (a plan's hash) before it builds
//! groups.
//!
//! Ranks of a process world each load the recipe and plan it on their own. When they disagree
//! (one started with another `--set`, another recipe file, another environment override), they
//! build different groups or call different collectives, and the run fails far from the cause:
//! a collective mismatch, a timeout in `new_group`, or worse, a run that trains with mismatched
//! shapes. Gathering every rank's digest once, right after the world forms, turns that into one
//! error naming the ranks and both values. Every rank gathers the same table, so every rank
//! decides the same way and exits at once with the same message, without an abort round.

use crate::communicator::Communicator;
use crate::error::{CommError, RankList};

/// Why the ranks do not agree.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AgreementError {
    /// The gathering collective failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// Some ranks hold another value than the group's first rank.
    #[error(
        "{what} differs across the ranks: rank {rank} has {theirs} but rank {reference} has \
         {ours} (all that differ from rank {reference}: {})",
        RankList(differing)
    )]
    Differs {
        what: String,
        /// The first differing rank (global) and its value.
        rank: u32,
        theirs: String,
        /// The group's first rank (global) and its value.
        reference: u32,
        ours: String,
        /// Every global rank whose value differs from the reference's.
        differing: Vec<u32>,
    },
}

/// Checks that every member of `comm` passes the same `value` (named `what` in the error).
/// Collective: every member must call it. Two all-gathers: the lengths, then the bytes.
pub fn check_agreement<C: Communicator>(
    comm: &C,
    what: &str,
    value: &str,
) -> Result<(), AgreementError> {
    let size = comm.size();
    let bytes = value.as_bytes();
    let mut lengths = vec![0u32; size];
    comm.all_gather(&[bytes.len() as u32], &mut lengths)?;
    let width = lengths.iter().copied().max().unwrap_or(0) as usize;
    let mut mine: Vec<u32> = bytes.iter().map(|&byte| u32::from(byte)).collect();
    mine.resize(width, 0);
    let mut all = vec![0u32; width * size];
    comm.all_gather(&mine, &mut all)?;
    let values: Vec<String> = (0..size)
        .map(|r| {
            let words = &all[r * width..r * width + lengths[r] as usize];
            let bytes: Vec<u8> = words.iter().map(|&word| word as u8).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        })
        .collect();
    let members = comm.members();
    let differing: Vec<usize> = (1..size).filter(|&r| values[r] != values[0]).collect();
    let Some(&first) = differing.first() else {
        return Ok(());
    };
    Err(AgreementError::Differs {
        what: what.to_owned(),
        rank: members[first],
        theirs: values[first].clone(),
        reference: members[0],
        ours: values[0].clone(),
        differing: differing.iter().map(|&r| members[r]).collect(),
    })
}
