//! The rank grid and its process groups, in Megatron-Core's order.
//!
//! A port of `RankGenerator` / `generate_masked_orthogonal_rank_groups`
//! (megatron/core/parallel_state.py): ranks are laid out with the first-named axis fastest
//! (`tp-cp-ep-dp-pp`), and the group of axes `A` holds the ranks that differ only along `A`.
//! The dense grid is `tp-cp-dp-pp` (ep = 1), the expert grid `etp-ep-edp-pp` (cp = 1). Using
//! the same order as Megatron keeps TP groups inside a node and makes checkpoints and rank
//! logs comparable.
//!
//! Groups are stored once, in [`ProcessGroups`]; each [`RankInfo`] holds indices into them, so a
//! 16,384-rank plan stays a few megabytes.

use serde::{Deserialize, Serialize};

use crate::layout::Degrees;

/// Where one rank sits on every axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coordinates {
    pub tp: u32,
    pub cp: u32,
    pub dp: u32,
    pub pp: u32,
    pub ep: u32,
    pub etp: u32,
    pub edp: u32,
}

/// Indices of a rank's groups in [`ProcessGroups`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupIndices {
    pub tp: u32,
    pub pp: u32,
    pub dp: u32,
    pub cp: u32,
    pub dp_cp: u32,
    pub ep: u32,
    pub etp: u32,
    pub edp: u32,
    /// The embedding group (first and last pipeline stage), for ranks on those stages.
    pub embedding: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankInfo {
    pub rank: u32,
    pub node: u32,
    pub local_rank: u32,
    pub coords: Coordinates,
    pub groups: GroupIndices,
}

/// Every process group of the run, each a list of ranks.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ProcessGroups {
    pub tp: Vec<Vec<u32>>,
    pub pp: Vec<Vec<u32>>,
    /// Data parallel, excluding context-parallel ranks.
    pub dp: Vec<Vec<u32>>,
    pub cp: Vec<Vec<u32>>,
    /// Data × context parallel: where dense gradients are reduced.
    pub dp_cp: Vec<Vec<u32>>,
    pub ep: Vec<Vec<u32>>,
    pub etp: Vec<Vec<u32>>,
    /// Expert data parallel: where expert gradients are reduced.
    pub edp: Vec<Vec<u32>>,
    /// First and last pipeline stage of each pipeline group (tied embedding gradients).
    pub embedding: Vec<Vec<u32>>,
}

/// The groups of one rank, resolved to rank lists.
#[derive(Debug, Clone, Copy)]
pub struct RankGroups<'a> {
    pub tp: &'a [u32],
    pub pp: &'a [u32],
    pub dp: &'a [u32],
    pub cp: &'a [u32],
    pub dp_cp: &'a [u32],
    pub ep: &'a [u32],
    pub etp: &'a [u32],
    pub edp: &'a [u32],
    pub embedding: Option<&'a [u32]>,
}

impl ProcessGroups {
    pub fn of(&self, rank: &RankInfo) -> RankGroups<'_> {
        let g = rank.groups;
        RankGroups {
            tp: at(&self.tp, g.tp),
            pp: at(&self.pp, g.pp),
            dp: at(&self.dp, g.dp),
            cp: at(&self.cp, g.cp),
            dp_cp: at(&self.dp_cp, g.dp_cp),
            ep: at(&self.ep, g.ep),
            etp: at(&self.etp, g.etp),
            edp: at(&self.edp, g.edp),
            embedding: g.embedding.map(|i| at(&self.embedding, i)),
        }
    }
}

fn at(table: &[Vec<u32>], index: u32) -> &[u32] {
    &table[index as usize]
}

/// One of Megatron's rank generators: axis sizes in order, fastest first.
struct Generator {
    /// (name, size) in layout order.
    axes: [(&'static str, u32); 5],
    world: u32,
}

impl Generator {
    fn dense(d: &Degrees) -> Generator {
        Generator {
            axes: [
                ("tp", d.tp),
                ("cp", d.cp),
                ("ep", 1),
                ("dp", d.dp),
                ("pp", d.pp),
            ],
            world: d.world_size(),
        }
    }

    fn expert(d: &Degrees) -> Generator {
        Generator {
            axes: [
                ("tp", d.etp),
                ("cp", 1),
                ("ep", d.ep),
                ("dp", d.edp),
                ("pp", d.pp),
            ],
            world: d.world_size(),
        }
    }

    /// `generate_masked_orthogonal_rank_groups` for the axes named in `token` ("tp-pp").
    fn groups(&self, token: &str) -> Vec<Vec<u32>> {
        let names: Vec<&str> = token.split('-').collect();
        let mut stride = 1;
        let mut masked = Vec::new();
        let mut unmasked = Vec::new();
        for (name, size) in self.axes {
            if names.contains(&name) {
                masked.push((size, stride));
            } else {
                unmasked.push((size, stride));
            }
            stride *= size;
        }
        let group_size: u32 = masked.iter().map(|(s, _)| s).product();
        let count = self.world / group_size;
        (0..count)
            .map(|group| {
                let base = compose(group, &unmasked);
                (0..group_size)
                    .map(|member| base + compose(member, &masked))
                    .collect()
            })
            .collect()
    }

    /// A rank's coordinate on `axis`.
    fn coordinate(&self, rank: u32, axis: &str) -> u32 {
        let mut stride = 1;
        for (name, size) in self.axes {
            if name == axis {
                return (rank / stride) % size;
            }
            stride *= size;
        }
        0
    }
}

/// Maps `index` (mixed-radix over the axes' sizes) to a rank offset with the axes' strides.
fn compose(mut index: u32, axes: &[(u32, u32)]) -> u32 {
    let mut rank = 0;
    for &(size, stride) in axes {
        rank += (index % size) * stride;
        index /= size;
    }
    rank
}

/// Index of the group each rank belongs to.
fn membership(groups: &[Vec<u32>], world: u32) -> Vec<u32> {
    let mut of = vec![0; world as usize];
    for (index, group) in groups.iter().enumerate() {
        for &rank in group {
            of[rank as usize] = index as u32;
        }
    }
    of
}

/// The grid of `degrees` on nodes of `gpus_per_node` ranks.
pub fn rank_grid(degrees: &Degrees, gpus_per_node: u32) -> (Vec<RankInfo>, ProcessGroups) {
    let dense = Generator::dense(degrees);
    let expert = Generator::expert(degrees);
    let world = degrees.world_size();
    let pp = dense.groups("pp");
    let embedding: Vec<Vec<u32>> = pp
        .iter()
        .map(|stages| {
            let (first, last) = (stages[0], stages[stages.len() - 1]);
            if first == last {
                vec![first]
            } else {
                vec![first, last]
            }
        })
        .collect();
    let groups = ProcessGroups {
        tp: dense.groups("tp"),
        dp: dense.groups("dp"),
        cp: dense.groups("cp"),
        dp_cp: dense.groups("cp-dp"),
        ep: expert.groups("ep"),
        etp: expert.groups("tp"),
        edp: expert.groups("dp"),
        pp,
        embedding,
    };
    let of = |table: &[Vec<u32>]| membership(table, world);
    let (tp, pp_of, dp, cp, dp_cp) = (
        of(&groups.tp),
        of(&groups.pp),
        of(&groups.dp),
        of(&groups.cp),
        of(&groups.dp_cp),
    );
    let (ep, etp, edp) = (of(&groups.ep), of(&groups.etp), of(&groups.edp));
    let ranks = (0..world)
        .map(|rank| {
            let r = rank as usize;
            let pp_coord = dense.coordinate(rank, "pp");
            let on_embedding_stage = pp_coord == 0 || pp_coord == degrees.pp - 1;
            RankInfo {
                rank,
                node: rank / gpus_per_node.max(1),
                local_rank: rank % gpus_per_node.max(1),
                coords: Coordinates {
                    tp: dense.coordinate(rank, "tp"),
                    cp: dense.coordinate(rank, "cp"),
                    dp: dense.coordinate(rank, "dp"),
                    pp: pp_coord,
                    ep: expert.coordinate(rank, "ep"),
                    etp: expert.coordinate(rank, "tp"),
                    edp: expert.coordinate(rank, "dp"),
                },
                groups: GroupIndices {
                    tp: tp[r],
                    pp: pp_of[r],
                    dp: dp[r],
                    cp: cp[r],
                    dp_cp: dp_cp[r],
                    ep: ep[r],
                    etp: etp[r],
                    edp: edp[r],
                    embedding: on_embedding_stage.then_some(pp_of[r]),
                },
            }
        })
        .collect();
    (ranks, groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn degrees(tp: u32, pp: u32, cp: u32, dp: u32, ep: u32, etp: u32) -> Degrees {
        let world = tp * pp * cp * dp;
        Degrees {
            tp,
            pp,
            vpp: 1,
            cp,
            ep,
            etp,
            dp,
            edp: world / (etp * ep * pp),
        }
    }

    #[test]
    fn sixteen_ranks_tp2_pp2_dp4_match_megatron() {
        // Megatron's docstring example (parallel_state.initialize_model_parallel): 16 GPUs,
        // tp 2, pp 4 there; here tp 2, pp 2, dp 4 in order tp-cp-ep-dp-pp: rank = tp + 2·dp + 8·pp.
        let (ranks, groups) = rank_grid(&degrees(2, 2, 1, 4, 1, 2), 8);
        assert_eq!(
            groups.tp,
            vec![
                vec![0, 1],
                vec![2, 3],
                vec![4, 5],
                vec![6, 7],
                vec![8, 9],
                vec![10, 11],
                vec![12, 13],
                vec![14, 15]
            ]
        );
        assert_eq!(
            groups.dp,
            vec![
                vec![0, 2, 4, 6],
                vec![1, 3, 5, 7],
                vec![8, 10, 12, 14],
                vec![9, 11, 13, 15]
            ]
        );
        assert_eq!(
            groups.pp,
            vec![
                vec![0, 8],
                vec![1, 9],
                vec![2, 10],
                vec![3, 11],
                vec![4, 12],
                vec![5, 13],
                vec![6, 14],
                vec![7, 15]
            ]
        );
        assert_eq!(groups.embedding, groups.pp);
        assert_eq!(groups.dp_cp, groups.dp);
        let r13 = &ranks[13];
        assert_eq!((r13.coords.tp, r13.coords.dp, r13.coords.pp), (1, 2, 1));
        assert_eq!((r13.node, r13.local_rank), (1, 5));
        let mine = groups.of(r13);
        assert_eq!(mine.tp, &[12, 13]);
        assert_eq!(mine.dp, &[9, 11, 13, 15]);
        assert_eq!(mine.pp, &[5, 13]);
    }

    #[test]
    fn megatron_docstring_tp2_pp4_dp2() {
        // "Let's say we have a total of 16 GPUs denoted by g0 ... g15 and we use 2 GPUs to
        // parallelize the model tensor, and 4 GPUs to parallelize the model pipeline. The present
        // function will create 8 tensor model-parallel groups, 4 pipeline model-parallel groups
        // and 8 data-parallel groups as:
        //   8 data_parallel groups: [g0, g2], [g1, g3], [g4, g6], [g5, g7], [g8, g10], [g9, g11], [g12, g14], [g13, g15]
        //   8 tensor model-parallel groups: [g0, g1], [g2, g3], ...
        //   4 pipeline model-parallel groups: [g0, g4, g8, g12], [g1, g5, g9, g13], [g2, g6, g10, g14], [g3, g7, g11, g15]"
        let (_, groups) = rank_grid(&degrees(2, 4, 1, 2, 1, 2), 8);
        assert_eq!(
            groups.dp,
            vec![
                vec![0, 2],
                vec![1, 3],
                vec![4, 6],
                vec![5, 7],
                vec![8, 10],
                vec![9, 11],
                vec![12, 14],
                vec![13, 15]
            ]
        );
        assert_eq!(
            groups.pp,
            vec![
                vec![0, 4, 8, 12],
                vec![1, 5, 9, 13],
                vec![2, 6, 10, 14],
                vec![3, 7, 11, 15]
            ]
        );
        assert_eq!(groups.embedding[0], vec![0, 12]);
    }

    #[test]
    fn context_parallel_sits_between_tensor_and_data() {
        // tp 2, cp 2, dp 2: rank = tp + 2·cp + 4·dp.
        let (ranks, groups) = rank_grid(&degrees(2, 1, 2, 2, 1, 2), 8);
        assert_eq!(
            groups.cp,
            vec![vec![0, 2], vec![1, 3], vec![4, 6], vec![5, 7]]
        );
        assert_eq!(
            groups.dp,
            vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]
        );
        assert_eq!(groups.dp_cp, vec![vec![0, 2, 4, 6], vec![1, 3, 5, 7]]);
        assert_eq!(ranks[6].coords.cp, 1);
        assert_eq!(ranks[6].coords.dp, 1);
        assert_eq!(
            groups.embedding,
            vec![
                vec![0],
                vec![1],
                vec![2],
                vec![3],
                vec![4],
                vec![5],
                vec![6],
                vec![7]
            ]
        );
    }

    #[test]
    fn expert_grid_uses_its_own_order() {
        // 8 ranks, tp 2, ep 4, etp 1: expert grid etp-ep-edp-pp = 1 × 4 × 2 × 1.
        let (ranks, groups) = rank_grid(&degrees(2, 1, 1, 4, 4, 1), 8);
        assert_eq!(groups.ep, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        assert_eq!(
            groups.edp,
            vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]
        );
        assert_eq!(groups.etp.len(), 8);
        assert_eq!(ranks[6].coords.ep, 2);
        assert_eq!(ranks[6].coords.edp, 1);
    }

    #[test]
    fn every_rank_is_in_exactly_one_group_of_each_kind() {
        let d = degrees(4, 4, 2, 4, 1, 4);
        let (_, groups) = rank_grid(&d, 8);
        for table in [
            &groups.tp,
            &groups.pp,
            &groups.dp,
            &groups.cp,
            &groups.dp_cp,
            &groups.edp,
        ] {
            let mut all: Vec<u32> = table.iter().flatten().copied().collect();
            all.sort_unstable();
            assert_eq!(all, (0..128).collect::<Vec<u32>>());
        }
    }
}
