//! The warm-up plan on whole worlds of ranks, without a GPU: the members of a group issue the
//! same operations on it in the same order, and pipeline neighbours pair up.

use std::collections::HashMap;

use ferrotron_dist::GroupMembers;

use super::*;

/// Degrees of a test world; ranks are laid out tp fastest, then cp, dp, pp (Megatron's
/// `tp-cp-dp-pp`); the expert groups cut data × context into `ep` consecutive ranks.
#[derive(Clone, Copy)]
struct Grid {
    tp: u32,
    cp: u32,
    dp: u32,
    pp: u32,
    ep: u32,
}

impl Grid {
    fn world(self) -> u32 {
        self.tp * self.cp * self.dp * self.pp
    }

    fn rank(self, [t, c, d, p]: [u32; 4]) -> u32 {
        t + self.tp * (c + self.cp * (d + self.dp * p))
    }

    fn coords(self, rank: u32) -> [u32; 4] {
        [
            rank % self.tp,
            rank / self.tp % self.cp,
            rank / (self.tp * self.cp) % self.dp,
            rank / (self.tp * self.cp * self.dp),
        ]
    }

    /// The ranks that differ from `rank` only along the dims `vary`.
    fn along(self, rank: u32, vary: &[usize]) -> Vec<u32> {
        let sizes = [self.tp, self.cp, self.dp, self.pp];
        let mut out = vec![self.coords(rank)];
        for &dim in vary {
            out = out
                .into_iter()
                .flat_map(|c| {
                    (0..sizes[dim]).map(move |i| {
                        let mut c = c;
                        c[dim] = i;
                        c
                    })
                })
                .collect();
        }
        let mut ranks: Vec<u32> = out.into_iter().map(|c| self.rank(c)).collect();
        ranks.sort_unstable();
        ranks
    }

    fn members(self, rank: u32) -> GroupMembers {
        let [_, _, _, stage] = self.coords(rank);
        let dp_cp = self.along(rank, &[1, 2]);
        let at = dp_cp.iter().position(|&r| r == rank).unwrap();
        let ep_size = self.ep as usize;
        let ep = dp_cp[at / ep_size * ep_size..][..ep_size].to_vec();
        let edp = dp_cp
            .iter()
            .copied()
            .skip(at % ep_size)
            .step_by(ep_size)
            .collect();
        let mut pp = self.along(rank, &[3]);
        pp.sort_by_key(|&r| self.coords(r)[3]);
        let embedding = (stage == 0 || stage + 1 == self.pp).then(|| {
            let mut ends = vec![pp[0], pp[pp.len() - 1]];
            ends.dedup();
            ends
        });
        GroupMembers {
            tp: self.along(rank, &[0]),
            pp,
            dp: self.along(rank, &[2]),
            cp: self.along(rank, &[1]),
            dp_cp,
            ep,
            etp: self.along(rank, &[0]),
            edp,
            embedding,
        }
    }
}

/// An operation as the NCCL rule sees it: which communicator (kind and members) and what is
/// called on it (pipeline peers as global ranks, so they can be matched across ranks).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    AllReduce,
    Neighbours(Vec<u32>),
    AllToAll,
}

fn calls(grid: Grid, wraps: bool) -> HashMap<u32, Vec<(GroupKind, Vec<u32>, Call)>> {
    (0..grid.world())
        .map(|rank| {
            let members = grid.members(rank);
            let plan = warmup_plan(&members, rank, wraps).unwrap();
            let calls = plan
                .into_iter()
                .map(|op| {
                    let kind = op.group();
                    let ranks = kind.members(&members).unwrap().to_vec();
                    let call = match op {
                        WarmupOp::AllReduce(_) => Call::AllReduce,
                        WarmupOp::AllToAll(_) => Call::AllToAll,
                        WarmupOp::Neighbours { peers, .. } => {
                            Call::Neighbours(peers.iter().map(|&p| ranks[p]).collect())
                        }
                    };
                    (kind, ranks, call)
                })
                .collect();
            (rank, calls)
        })
        .collect()
}

const GRIDS: [Grid; 4] = [
    Grid {
        tp: 2,
        cp: 1,
        dp: 2,
        pp: 2,
        ep: 2,
    },
    Grid {
        tp: 1,
        cp: 2,
        dp: 2,
        pp: 4,
        ep: 4,
    },
    Grid {
        tp: 2,
        cp: 2,
        dp: 2,
        pp: 3,
        ep: 2,
    },
    Grid {
        tp: 1,
        cp: 1,
        dp: 4,
        pp: 1,
        ep: 1,
    },
];

#[test]
fn members_of_a_group_issue_the_same_calls_in_the_same_order() {
    for grid in GRIDS {
        for wraps in [false, true] {
            let all = calls(grid, wraps);
            for (&rank, mine) in &all {
                for (&other, theirs) in &all {
                    // The calls on communicators both ranks hold, in each rank's order; the
                    // pipeline exchange differs per stage and is checked by the pairing test.
                    let shared = |calls: &[(GroupKind, Vec<u32>, Call)], peer: u32| {
                        calls
                            .iter()
                            .filter(|(_, ranks, _)| ranks.contains(&peer))
                            .map(|(kind, ranks, call)| {
                                let call = match call {
                                    Call::Neighbours(_) => Call::Neighbours(Vec::new()),
                                    other => other.clone(),
                                };
                                (*kind, ranks.clone(), call)
                            })
                            .collect::<Vec<_>>()
                    };
                    assert_eq!(
                        shared(mine, other),
                        shared(theirs, rank),
                        "ranks {rank} and {other} disagree on their shared groups"
                    );
                }
            }
        }
    }
}

#[test]
fn pipeline_neighbours_pair_up_both_ways() {
    for grid in GRIDS {
        for wraps in [false, true] {
            let all = calls(grid, wraps);
            for (&rank, mine) in &all {
                let peers_of = |calls: &[(GroupKind, Vec<u32>, Call)]| {
                    calls
                        .iter()
                        .find_map(|(_, _, call)| match call {
                            Call::Neighbours(peers) => Some(peers.clone()),
                            _ => None,
                        })
                        .unwrap_or_default()
                };
                let peers = peers_of(mine);
                assert!(!peers.contains(&rank), "rank {rank} exchanges with itself");
                for peer in &peers {
                    // the peer sends back and receives from this rank in the same group call
                    assert!(
                        peers_of(&all[peer]).contains(&rank),
                        "rank {rank} exchanges with {peer}, which does not answer"
                    );
                }
                let stages = grid.pp as usize;
                let expected = match (stages, wraps) {
                    (1, _) => 0,
                    (2, _) => 1,
                    (_, true) => 2,
                    (_, false) => {
                        let stage = grid.coords(rank)[3] as usize;
                        if stage == 0 || stage + 1 == stages {
                            1
                        } else {
                            2
                        }
                    }
                };
                assert_eq!(peers.len(), expected, "rank {rank}: {peers:?}");
            }
        }
    }
}

#[test]
fn neighbours_of_a_stage() {
    assert_eq!(pipeline_neighbours(0, 1, true), Vec::<usize>::new());
    assert_eq!(pipeline_neighbours(0, 2, false), vec![1]);
    assert_eq!(pipeline_neighbours(1, 2, true), vec![0]);
    assert_eq!(pipeline_neighbours(0, 4, false), vec![1]);
    assert_eq!(pipeline_neighbours(0, 4, true), vec![1, 3]);
    assert_eq!(pipeline_neighbours(2, 4, false), vec![1, 3]);
    assert_eq!(pipeline_neighbours(3, 4, false), vec![2]);
    assert_eq!(pipeline_neighbours(3, 4, true), vec![0, 2]);
}

#[test]
fn a_rank_alone_has_nothing_to_warm() {
    let grid = Grid {
        tp: 1,
        cp: 1,
        dp: 1,
        pp: 1,
        ep: 1,
    };
    assert_eq!(warmup_plan(&grid.members(0), 0, true).unwrap(), Vec::new());
}

#[test]
fn the_plan_follows_the_group_order() {
    let grid = GRIDS[0];
    let plan = warmup_plan(&grid.members(0), 0, false).unwrap();
    let expected = vec![
        WarmupOp::AllReduce(GroupKind::Tp),
        WarmupOp::AllReduce(GroupKind::Pp),
        WarmupOp::Neighbours {
            group: GroupKind::Pp,
            peers: vec![1],
        },
        WarmupOp::AllReduce(GroupKind::Dp),
        WarmupOp::AllReduce(GroupKind::DpCp),
        WarmupOp::AllReduce(GroupKind::Ep),
        WarmupOp::AllToAll(GroupKind::Ep),
        WarmupOp::AllReduce(GroupKind::Etp),
        WarmupOp::AllReduce(GroupKind::Embedding),
    ];
    assert_eq!(plan, expected);
}

#[test]
fn a_rank_outside_its_pipeline_group_is_an_error() {
    let mut members = GRIDS[0].members(0);
    members.pp = vec![5, 7];
    let err = warmup_plan(&members, 0, false).unwrap_err();
    assert!(err.to_string().contains("pp"), "{err}");
}
