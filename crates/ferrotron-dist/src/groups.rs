//! A rank's process groups, built from the [`Plan`]'s rank grid.
//!
//! The planner already computed every group in Megatron's order (tp-cp-ep-dp-pp); this turns
//! the ones containing this rank into communicators. It takes the world communicator rather
//! than a bare rank number because a backend needs one to create sub-communicators (NCCL shares
//! each group's unique id through it).

use ferrotron_plan::Plan;

use crate::communicator::Communicator;
use crate::error::CommError;

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
    pub fn from_plan(plan: &Plan, world: &C) -> Result<ProcessGroups<C>, CommError> {
        if plan.world_size as usize != world.size() {
            return Err(CommError::PlanMismatch {
                detail: format!(
                    "the plan has {} ranks, the world {}",
                    plan.world_size,
                    world.size()
                ),
            });
        }
        let rank = world.global_rank();
        let Some(mine) = plan.groups_of(rank) else {
            return Err(CommError::PlanMismatch {
                detail: format!("rank {rank} is not in the plan's rank table"),
            });
        };
        Ok(ProcessGroups {
            tp: world.new_group("tp", mine.tp)?,
            pp: world.new_group("pp", mine.pp)?,
            dp: world.new_group("dp", mine.dp)?,
            cp: world.new_group("cp", mine.cp)?,
            dp_cp: world.new_group("dp_cp", mine.dp_cp)?,
            ep: world.new_group("ep", mine.ep)?,
            etp: world.new_group("etp", mine.etp)?,
            edp: world.new_group("edp", mine.edp)?,
            embedding: mine
                .embedding
                .map(|ranks| world.new_group("embedding", ranks))
                .transpose()?,
        })
    }
}
