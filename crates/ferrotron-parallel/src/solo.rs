//! [`solo`]: a real communicator of one rank.
//!
//! The single-rank model runs through exactly the code a parallel rank runs, with every group of
//! size one. That needs a communicator that exists outside a `World`: this one checks its
//! arguments like any other (so a bug that would break on N ranks still errors on one) and every
//! collective is then a copy or a no-op.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use ferrotron_dist::{CommError, Communicator, Element, GroupLabel, ReduceOp};

use crate::comm::Comm;

/// A size-1 group (`solo[0]`): every collective is a copy or a no-op.
pub fn solo() -> Comm {
    Arc::new(SoloComm::new("solo", 0))
}

#[derive(Debug)]
struct SoloComm {
    label: GroupLabel,
    /// Messages sent to self, received in order.
    inbox: Mutex<VecDeque<Box<dyn Any + Send>>>,
}

impl SoloComm {
    fn new(name: &str, global_rank: u32) -> SoloComm {
        SoloComm {
            label: GroupLabel {
                name: name.to_owned(),
                ranks: vec![global_rank],
            },
            inbox: Mutex::new(VecDeque::new()),
        }
    }

    fn check(
        &self,
        op: &'static str,
        ok: bool,
        detail: impl FnOnce() -> String,
    ) -> Result<(), CommError> {
        if ok {
            Ok(())
        } else {
            Err(CommError::InvalidArgument {
                op,
                group: self.label.clone(),
                detail: detail(),
            })
        }
    }

    fn check_rank(&self, op: &'static str, rank: usize) -> Result<(), CommError> {
        self.check(op, rank == 0, || {
            format!("rank {rank} is outside a group of 1")
        })
    }

    fn check_lengths(
        &self,
        op: &'static str,
        input: usize,
        output: usize,
    ) -> Result<(), CommError> {
        self.check(op, input == output, || {
            format!("input has {input} elements, output {output} (a group of 1 needs them equal)")
        })
    }
}

impl Communicator for SoloComm {
    fn rank(&self) -> usize {
        0
    }

    fn size(&self) -> usize {
        1
    }

    fn label(&self) -> &GroupLabel {
        &self.label
    }

    fn new_group(&self, name: &str, members: &[u32]) -> Result<Self, CommError> {
        let me = self.label.ranks[0];
        if members != [me] {
            return Err(CommError::NotAMember {
                group: GroupLabel {
                    name: name.to_owned(),
                    ranks: members.to_vec(),
                },
                rank: me,
            });
        }
        Ok(SoloComm::new(name, me))
    }

    fn all_reduce<T: Element>(&self, _buf: &mut [T], _op: ReduceOp) -> Result<(), CommError> {
        Ok(())
    }

    fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<(), CommError> {
        self.check_lengths("all_gather", input.len(), output.len())?;
        output.copy_from_slice(input);
        Ok(())
    }

    fn reduce_scatter<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        _op: ReduceOp,
    ) -> Result<(), CommError> {
        self.check_lengths("reduce_scatter", input.len(), output.len())?;
        output.copy_from_slice(input);
        Ok(())
    }

    fn broadcast<T: Element>(&self, _buf: &mut [T], root: usize) -> Result<(), CommError> {
        self.check_rank("broadcast", root)
    }

    fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<(), CommError> {
        self.check_rank("send", peer)?;
        self.inbox
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(Box::new(buf.to_vec()));
        Ok(())
    }

    fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<(), CommError> {
        self.check_rank("recv", peer)?;
        let message = self
            .inbox
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front();
        // Nobody else can ever send: waiting would hang forever.
        let Some(message) = message else {
            return Err(CommError::Mismatch {
                group: self.label.clone(),
                detail: "recv from self with no message sent".to_owned(),
            });
        };
        let Ok(values) = message.downcast::<Vec<T>>() else {
            return Err(CommError::Mismatch {
                group: self.label.clone(),
                detail: format!("recv of {} but a different type was sent", T::DTYPE),
            });
        };
        self.check_lengths("recv", values.len(), buf.len())?;
        buf.copy_from_slice(&values);
        Ok(())
    }

    fn all_to_all<T: Element>(
        &self,
        input: &[T],
        send_counts: &[usize],
        output: &mut [T],
        recv_counts: &[usize],
    ) -> Result<(), CommError> {
        self.check(
            "all_to_all",
            send_counts.len() == 1 && recv_counts.len() == 1,
            || {
                format!(
                    "a group of 1 needs one count each, got {} send and {} recv counts",
                    send_counts.len(),
                    recv_counts.len()
                )
            },
        )?;
        self.check("all_to_all", send_counts == recv_counts, || {
            format!("send count {send_counts:?} differs from recv count {recv_counts:?}")
        })?;
        self.check_lengths("all_to_all", send_counts[0], input.len())?;
        self.check_lengths("all_to_all", input.len(), output.len())?;
        output.copy_from_slice(input);
        Ok(())
    }

    fn barrier(&self) -> Result<(), CommError> {
        Ok(())
    }
}
