//! A rank's process groups from a plain description of their members.
//!
//! The planner computes every group in Megatron's order (tp-cp-ep-dp-pp); the runtime hands
//! this crate the members of the groups one rank belongs to ([`GroupMembers`]), so the
//! communicators know nothing of plans. Building them takes the world communicator rather than a
//! bare rank number because a backend needs one to create sub-communicators (NCCL shares each
//! group's unique id through it).

use crate::communicator::Communicator;
use crate::error::CommError;

/// The members (global ranks, in group order) of every group one rank belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMembers {
    pub tp: Vec<u32>,
    pub pp: Vec<u32>,
    /// Data parallel without context parallel ranks.
    pub dp: Vec<u32>,
    pub cp: Vec<u32>,
    /// Data × context parallel: where dense gradients are reduced.
    pub dp_cp: Vec<u32>,
    pub ep: Vec<u32>,
    pub etp: Vec<u32>,
    /// Expert data parallel: where expert gradients are reduced.
    pub edp: Vec<u32>,
    /// First and last pipeline stage (tied embeddings); `None` on middle stages.
    pub embedding: Option<Vec<u32>>,
}

/// This rank's communicators, one per kind of group (Megatron's `parallel_state`).
#[derive(Debug)]
pub struct ProcessGroups<C> {
    pub tp: C,
    pub pp: C,
    /// Data parallel without context parallel ranks.
    pub dp: C,
    pub cp: C,
    /// Data × context parallel: where dense gradients are reduced.
    pub dp_cp: C,
    pub ep: C,
    pub etp: C,
    /// Expert data parallel: where expert gradients are reduced.
    pub edp: C,
    /// First and last pipeline stage (tied embeddings); `None` on middle stages.
    pub embedding: Option<C>,
}

impl<C: Communicator> ProcessGroups<C> {
    /// The communicators of `members` (which must each contain this rank) over `world`.
    pub fn new(members: &GroupMembers, world: &C) -> Result<ProcessGroups<C>, CommError> {
        Ok(ProcessGroups {
            tp: world.new_group("tp", &members.tp)?,
            pp: world.new_group("pp", &members.pp)?,
            dp: world.new_group("dp", &members.dp)?,
            cp: world.new_group("cp", &members.cp)?,
            dp_cp: world.new_group("dp_cp", &members.dp_cp)?,
            ep: world.new_group("ep", &members.ep)?,
            etp: world.new_group("etp", &members.etp)?,
            edp: world.new_group("edp", &members.edp)?,
            embedding: members
                .embedding
                .as_deref()
                .map(|ranks| world.new_group("embedding", ranks))
                .transpose()?,
        })
    }
}
