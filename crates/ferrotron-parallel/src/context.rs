//! [`ParallelContext`]: the groups one rank computes in.
//!
//! One type for every transport (threads, TCP, NCCL), so model and runtime code is not generic
//! over the communicator. The single-rank run is the same code with every group [`solo`]: there
//! is no separate "non-parallel" path to drift apart from the parallel one.

use ferrotron_dist::{Communicator, ProcessGroups};
use std::sync::Arc;

use crate::comm::Comm;
use crate::solo::solo;

#[derive(Clone, Debug)]
pub struct ParallelContext {
    /// Tensor parallel (also the sequence-parallel group).
    pub tp: Comm,
    /// Context parallel.
    pub cp: Comm,
    /// Expert parallel.
    pub ep: Comm,
    /// Expert tensor parallel.
    pub etp: Comm,
    /// Data parallel without context-parallel ranks.
    pub dp: Comm,
    /// Data × context parallel: where dense gradients are reduced.
    pub dp_cp: Comm,
    /// Expert data parallel: where expert gradients are reduced.
    pub edp: Comm,
    /// Pipeline parallel (stage rank = `pp.rank()`).
    pub pp: Comm,
    /// First and last pipeline stage (tied embeddings); `None` on middle stages.
    pub embedding: Option<Comm>,
    /// Activations between blocks are split along the sequence over `tp`.
    pub sequence_parallel: bool,
}

impl ParallelContext {
    /// One rank: every group a fresh [`solo`], the embedding group too (first = last stage).
    pub fn single() -> ParallelContext {
        ParallelContext {
            tp: solo(),
            cp: solo(),
            ep: solo(),
            etp: solo(),
            dp: solo(),
            dp_cp: solo(),
            edp: solo(),
            pp: solo(),
            embedding: Some(solo()),
            sequence_parallel: false,
        }
    }

    pub fn from_groups<C: Communicator + Sync + std::fmt::Debug + 'static>(
        groups: ProcessGroups<C>,
        sequence_parallel: bool,
    ) -> ParallelContext {
        fn erase<C: Communicator + Sync + std::fmt::Debug + 'static>(comm: C) -> Comm {
            Arc::new(comm)
        }
        ParallelContext {
            tp: erase(groups.tp),
            cp: erase(groups.cp),
            ep: erase(groups.ep),
            etp: erase(groups.etp),
            dp: erase(groups.dp),
            dp_cp: erase(groups.dp_cp),
            edp: erase(groups.edp),
            pp: erase(groups.pp),
            embedding: groups.embedding.map(erase),
            sequence_parallel,
        }
    }

    /// Every group's members agree they issued the same collectives so far
    /// ([`ferrotron_dist::Communicator::agree_on_order`]), checked group by group in one fixed
    /// order on every rank.
    pub fn agree_on_order(&self) -> Result<(), ferrotron_dist::CommError> {
        let groups = [
            &self.tp,
            &self.cp,
            &self.ep,
            &self.etp,
            &self.dp,
            &self.dp_cp,
            &self.edp,
            &self.pp,
        ];
        for comm in groups.into_iter().chain(&self.embedding) {
            comm.agree_on_order()?;
        }
        Ok(())
    }

    pub fn tp_rank(&self) -> usize {
        self.tp.rank()
    }
    pub fn tp_size(&self) -> usize {
        self.tp.size()
    }
    pub fn cp_rank(&self) -> usize {
        self.cp.rank()
    }
    pub fn cp_size(&self) -> usize {
        self.cp.size()
    }
    pub fn ep_rank(&self) -> usize {
        self.ep.rank()
    }
    pub fn ep_size(&self) -> usize {
        self.ep.size()
    }
    pub fn etp_rank(&self) -> usize {
        self.etp.rank()
    }
    pub fn etp_size(&self) -> usize {
        self.etp.size()
    }
    pub fn dp_rank(&self) -> usize {
        self.dp.rank()
    }
    pub fn dp_size(&self) -> usize {
        self.dp.size()
    }
    pub fn dp_cp_rank(&self) -> usize {
        self.dp_cp.rank()
    }
    pub fn dp_cp_size(&self) -> usize {
        self.dp_cp.size()
    }
    pub fn edp_rank(&self) -> usize {
        self.edp.rank()
    }
    pub fn edp_size(&self) -> usize {
        self.edp.size()
    }
    pub fn pp_rank(&self) -> usize {
        self.pp.rank()
    }
    pub fn pp_size(&self) -> usize {
        self.pp.size()
    }
    pub fn is_first_stage(&self) -> bool {
        self.pp.rank() == 0
    }
    pub fn is_last_stage(&self) -> bool {
        self.pp.rank() + 1 == self.pp.size()
    }
    /// Whether sequence parallelism is on and actually splits (tp > 1).
    pub fn sequence_split(&self) -> bool {
        self.sequence_parallel && self.tp.size() > 1
    }
    /// This rank's global rank.
    pub fn global_rank(&self) -> u32 {
        self.tp.global_rank()
    }
}
