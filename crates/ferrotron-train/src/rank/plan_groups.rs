//! The edge between the plan and the communicators: the members of one rank's groups, read from
//! the planner's rank grid, for `ferrotron_dist::ProcessGroups::new` (the communicator crate
//! knows nothing of plans).

use ferrotron_dist::GroupMembers;
use ferrotron_plan::Plan;

use crate::TrainError;

/// The members of every group `rank` belongs to in `plan`, for a world of `world_size` ranks.
pub fn group_members(
    plan: &Plan,
    rank: u32,
    world_size: usize,
) -> Result<GroupMembers, TrainError> {
    if plan.world_size as usize != world_size {
        return Err(TrainError::Config(format!(
            "the plan does not match this world: the plan has {} ranks, the world {world_size}",
            plan.world_size
        )));
    }
    let mine = plan.groups_of(rank).ok_or_else(|| {
        TrainError::Config(format!(
            "the plan does not match this world: rank {rank} is not in the plan's rank table"
        ))
    })?;
    Ok(GroupMembers {
        tp: mine.tp.to_vec(),
        pp: mine.pp.to_vec(),
        dp: mine.dp.to_vec(),
        cp: mine.cp.to_vec(),
        dp_cp: mine.dp_cp.to_vec(),
        ep: mine.ep.to_vec(),
        etp: mine.etp.to_vec(),
        edp: mine.edp.to_vec(),
        embedding: mine.embedding.map(<[u32]>::to_vec),
    })
}
