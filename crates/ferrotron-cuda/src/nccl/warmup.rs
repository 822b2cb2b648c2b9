//! Connecting a rank's communicators before the model exists (issue 44).
//!
//! **Why.** NCCL connects lazily: a communicator allocates its connection buffers (per channel,
//! per peer, per algorithm) the first time a collective needs them, so without a warm-up they
//! arrive at the worst moments: the first pipeline send, the first gradient-bucket all-reduce at
//! the backward pass's memory peak, the first expert all-to-all. The device pool keeps everything
//! it frees (`POOL_RELEASE_THRESHOLD = u64::MAX`), so by then the memory NCCL asks the driver
//! for may be held by the pool, and the run fails with an out-of-memory error in NCCL rather
//! than in a tensor. Warming every communicator right after it exists, while the device is still
//! empty, moves those allocations ahead of the model's.
//!
//! **What.** [`warmup_plan`] lists the operations from the plan's groups alone (pure, tested
//! without a GPU): per group of more than one rank a one-element all-reduce (connects the
//! algorithm NCCL picks for small reductions); on the pipeline group one element to and from
//! each neighbouring stage (the ring's wrap too where virtual stages use it); on the expert
//! group a one-element-per-peer all-to-all. [`warm_up`] runs it and waits once at the end.
//!
//! **Order.** NCCL needs the members of a communicator to reach its collectives in the same
//! order, and a rank's collectives of different groups run one after another on the one
//! communication stream. Every rank walks the groups in the same fixed order ([`GroupKind::ALL`],
//! the order of `ProcessGroups`), and the groups of one kind partition the world, so when every
//! rank has finished kind `k`, every group of kind `k + 1` has all its members waiting and
//! completes: no cycle. The pipeline exchange is one NCCL group call (sends and receives to both
//! neighbours at once), so no send waits on a receive queued behind it.
//!
//! The world communicator is not warmed: the runtime never calls a collective on it after the
//! groups exist (it is only their bootstrap and the abort path), and warming it would allocate
//! buffers nothing uses.

use std::time::{Duration, Instant};

use ferrotron_dist::{CommError, Communicator, GroupMembers, ProcessGroups, ReduceOp};

use crate::engine::dtype::DType;
use crate::engine::tensor::CudaTensor;
use crate::nccl::comm::NcclComm;
use crate::nccl::tensor::RecvSpec;

/// The kinds of groups a rank belongs to, as `ProcessGroups` holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupKind {
    Tp,
    Pp,
    Dp,
    Cp,
    DpCp,
    Ep,
    Etp,
    Edp,
    Embedding,
}

impl GroupKind {
    /// The order every rank warms its groups in (that of `ProcessGroups`).
    pub const ALL: [GroupKind; 9] = [
        GroupKind::Tp,
        GroupKind::Pp,
        GroupKind::Dp,
        GroupKind::Cp,
        GroupKind::DpCp,
        GroupKind::Ep,
        GroupKind::Etp,
        GroupKind::Edp,
        GroupKind::Embedding,
    ];

    /// The group's name (that of its communicator's label).
    pub fn name(self) -> &'static str {
        match self {
            GroupKind::Tp => "tp",
            GroupKind::Pp => "pp",
            GroupKind::Dp => "dp",
            GroupKind::Cp => "cp",
            GroupKind::DpCp => "dp_cp",
            GroupKind::Ep => "ep",
            GroupKind::Etp => "etp",
            GroupKind::Edp => "edp",
            GroupKind::Embedding => "embedding",
        }
    }

    /// The members of this kind of group in `members` (`None`: the rank has none, as a middle
    /// stage has no embedding group).
    pub fn members(self, members: &GroupMembers) -> Option<&[u32]> {
        Some(match self {
            GroupKind::Tp => &members.tp,
            GroupKind::Pp => &members.pp,
            GroupKind::Dp => &members.dp,
            GroupKind::Cp => &members.cp,
            GroupKind::DpCp => &members.dp_cp,
            GroupKind::Ep => &members.ep,
            GroupKind::Etp => &members.etp,
            GroupKind::Edp => &members.edp,
            GroupKind::Embedding => members.embedding.as_deref()?,
        })
    }

    /// This kind's communicator in `groups`.
    pub fn comm<C>(self, groups: &ProcessGroups<C>) -> Option<&C> {
        Some(match self {
            GroupKind::Tp => &groups.tp,
            GroupKind::Pp => &groups.pp,
            GroupKind::Dp => &groups.dp,
            GroupKind::Cp => &groups.cp,
            GroupKind::DpCp => &groups.dp_cp,
            GroupKind::Ep => &groups.ep,
            GroupKind::Etp => &groups.etp,
            GroupKind::Edp => &groups.edp,
            GroupKind::Embedding => groups.embedding.as_ref()?,
        })
    }
}

/// One warm-up operation on one of the rank's groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WarmupOp {
    /// A one-element sum over the group.
    AllReduce(GroupKind),
    /// One element sent to and received from each of `peers` (ranks within the group), all in
    /// one NCCL group call.
    Neighbours { group: GroupKind, peers: Vec<usize> },
    /// One element to and from every member (grouped send/recv, as the expert dispatch).
    AllToAll(GroupKind),
}

impl WarmupOp {
    pub fn group(&self) -> GroupKind {
        match self {
            WarmupOp::AllReduce(group)
            | WarmupOp::AllToAll(group)
            | WarmupOp::Neighbours { group, .. } => *group,
        }
    }
}

/// The pipeline stages `stage` exchanges with among `stages`: the previous and the next, and
/// across the ring's wrap (last ↔ first) when `wraps` (virtual stages feed the first stage's
/// next chunk from the last stage). Ascending, without `stage` itself or repeats.
pub fn pipeline_neighbours(stage: usize, stages: usize, wraps: bool) -> Vec<usize> {
    let mut peers = Vec::new();
    if stages > 1 {
        if stage > 0 {
            peers.push(stage - 1);
        } else if wraps {
            peers.push(stages - 1);
        }
        if stage + 1 < stages {
            peers.push(stage + 1);
        } else if wraps {
            peers.push(0);
        }
    }
    peers.sort_unstable();
    peers.dedup();
    peers.retain(|&p| p != stage);
    peers
}

/// The warm-up of global rank `me` with the groups `members` (see the module docs for the order
/// and why it cannot deadlock); `pipeline_wraps` when the schedule sends from the last stage to
/// the first (virtual pipeline stages). Groups of one rank have nothing to connect.
pub fn warmup_plan(
    members: &GroupMembers,
    me: u32,
    pipeline_wraps: bool,
) -> Result<Vec<WarmupOp>, CommError> {
    let mut ops = Vec::new();
    for kind in GroupKind::ALL {
        let Some(ranks) = kind.members(members) else {
            continue;
        };
        if ranks.len() < 2 {
            continue;
        }
        ops.push(WarmupOp::AllReduce(kind));
        match kind {
            GroupKind::Pp => {
                let stage =
                    ranks
                        .iter()
                        .position(|&r| r == me)
                        .ok_or_else(|| CommError::NotAMember {
                            group: ferrotron_dist::GroupLabel {
                                name: kind.name().to_owned(),
                                ranks: ranks.to_vec(),
                            },
                            rank: me,
                        })?;
                ops.push(WarmupOp::Neighbours {
                    group: kind,
                    peers: pipeline_neighbours(stage, ranks.len(), pipeline_wraps),
                });
            }
            GroupKind::Ep => ops.push(WarmupOp::AllToAll(kind)),
            _ => {}
        }
    }
    Ok(ops)
}

/// The members of every group of `groups` (read from their communicators).
fn members_of(groups: &ProcessGroups<NcclComm>) -> GroupMembers {
    GroupMembers {
        tp: groups.tp.members().to_vec(),
        pp: groups.pp.members().to_vec(),
        dp: groups.dp.members().to_vec(),
        cp: groups.cp.members().to_vec(),
        dp_cp: groups.dp_cp.members().to_vec(),
        ep: groups.ep.members().to_vec(),
        etp: groups.etp.members().to_vec(),
        edp: groups.edp.members().to_vec(),
        embedding: groups.embedding.as_ref().map(|c| c.members().to_vec()),
    }
}

/// Free and total device memory in MiB for a log line; `None` when the driver cannot tell.
fn free_total_mib(comm: &NcclComm) -> Option<(usize, usize)> {
    comm.device()
        .memory_info()
        .ok()
        .map(|(free, total)| (free >> 20, total >> 20))
}

/// Connects every communicator of `groups` ([`warmup_plan`]) and waits once for all of it
/// (polled, with the communicators' deadline); logs free device memory before and after, and the
/// time it took. Returns that time.
pub fn warm_up(
    groups: &ProcessGroups<NcclComm>,
    pipeline_wraps: bool,
) -> Result<Duration, CommError> {
    let rank = groups.tp.global_rank();
    let ops = warmup_plan(&members_of(groups), rank, pipeline_wraps)?;
    if let Some((free_mib, total_mib)) = free_total_mib(&groups.tp) {
        tracing::info!(
            rank,
            free_mib,
            total_mib,
            "device memory before the NCCL warm-up"
        );
    }
    let elapsed = run_warmup(groups, &ops)?;
    let (free_mib, total_mib) = free_total_mib(&groups.tp).unzip();
    tracing::info!(
        rank,
        ops = ops.len(),
        ms = elapsed.as_secs_f64() * 1e3,
        free_mib,
        total_mib,
        "NCCL communicators warmed up"
    );
    Ok(elapsed)
}

/// Queues `ops` on their groups' communicators in order, then waits for the communication
/// stream (which every communicator of the device shares) to run them all.
pub fn run_warmup(
    groups: &ProcessGroups<NcclComm>,
    ops: &[WarmupOp],
) -> Result<Duration, CommError> {
    let start = Instant::now();
    let mut last = None;
    for op in ops {
        let kind = op.group();
        let comm = kind
            .comm(groups)
            .ok_or_else(|| CommError::InvalidArgument {
                op: "warm_up",
                group: groups.tp.label().clone(),
                detail: format!("this rank has no {} group", kind.name()),
            })?;
        let one = |rows: usize| {
            CudaTensor::from_bytes(
                comm.device(),
                &vec![0u8; rows * DType::F32.size_in_bytes()],
                &[rows, 1],
                DType::F32,
            )
            .map_err(|e| comm.fail("warm_up", e.to_string()))
        };
        match op {
            WarmupOp::AllReduce(_) => {
                comm.all_reduce_tensor(&one(1)?, ReduceOp::Sum)?;
            }
            WarmupOp::Neighbours { peers, .. } => {
                let x = one(1)?;
                let sends: Vec<_> = peers.iter().map(|&p| (&x, p)).collect();
                let recvs: Vec<_> = peers
                    .iter()
                    .map(|&peer| RecvSpec {
                        shape: vec![1, 1],
                        dtype: DType::F32,
                        peer,
                    })
                    .collect();
                comm.send_recv_tensors(&sends, &recvs)?;
            }
            WarmupOp::AllToAll(_) => {
                let size = comm.size();
                comm.all_to_all_rows_tensor(&one(size)?, &vec![1; size], &vec![1; size])?;
            }
        }
        last = Some(comm);
    }
    if let Some(comm) = last {
        // The compute stream waits for every collective above, on either lane.
        let event = comm.device().stream().record_event(None).map_err(|e| {
            comm.fail(
                "warm_up",
                format!("CUDA error while recording an event: {e:?}"),
            )
        })?;
        comm.wait_for("warm_up", &event)?;
    }
    Ok(start.elapsed())
}

#[cfg(test)]
#[path = "warmup_tests.rs"]
mod tests;
