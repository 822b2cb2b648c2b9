//! [`ThreadComm`]: the in-process communicator for thread ranks.
//!
//! Contributions are copied into the rendezvous, so no rank ever reads another thread's stack
//! (the workspace forbids `unsafe`). All-reduce is a reduce-scatter then an all-gather: each
//! member reduces one contiguous chunk over all inputs in rank order (element `i` is always
//! `((x₀ + x₁) + x₂) + …`, bit-identical to a sequential loop over ranks), so the work is split
//! between the threads and the result does not depend on who arrived first.

use std::ops::Range;
use std::sync::Arc;

use crate::arguments;
use crate::communicator::Communicator;
use crate::element::{Element, ReduceOp};
use crate::error::{CommError, GroupLabel};
use crate::fabric::Fabric;
use crate::recycle::Recycler;
use crate::rendezvous::{Deposit, Group, Message, Payload, Signature};

/// One rank's handle on one group of a [`crate::World`].
pub struct ThreadComm {
    fabric: Arc<Fabric>,
    group: Arc<Group>,
    rank: usize,
    recycler: Recycler,
}

impl std::fmt::Debug for ThreadComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ThreadComm({} rank {})", self.group.label, self.rank)
    }
}

/// The split of `len` elements into `parts` contiguous chunks, the first `len % parts` one longer.
fn chunk(len: usize, parts: usize, index: usize) -> Range<usize> {
    let (base, extra) = (len / parts, len % parts);
    let start = index * base + index.min(extra);
    start..start + base + usize::from(index < extra)
}

/// The `Vec<T>` a deposit carries (all members agreed on `T` when the round closed).
fn contents<T: Element>(deposit: &Deposit) -> &[T] {
    deposit
        .payload
        .downcast_ref::<Vec<T>>()
        .map_or(&[], Vec::as_slice)
}

/// `acc[i] = acc[i] ∘ x[i]`, with the operator chosen outside the loop so it vectorises.
fn accumulate<T: Element>(acc: &mut [T], x: &[T], op: ReduceOp) {
    let pairs = acc.iter_mut().zip(x);
    match op {
        ReduceOp::Sum => pairs.for_each(|(a, &b)| *a = a.sum(b)),
        ReduceOp::Max => pairs.for_each(|(a, &b)| *a = Element::max(*a, b)),
    }
}

/// What an all-to-all member contributes: its counts travel with its data.
struct Scatter<T> {
    send_counts: Vec<usize>,
    data: Vec<T>,
}

impl ThreadComm {
    pub(crate) fn new(fabric: Arc<Fabric>, label: GroupLabel, rank: usize) -> ThreadComm {
        let group = fabric.group(label);
        ThreadComm {
            fabric,
            group,
            rank,
            recycler: Recycler::default(),
        }
    }

    /// Another handle of this rank on the same group, with deposit buffers of its own.
    pub(crate) fn handle(&self) -> ThreadComm {
        ThreadComm {
            fabric: self.fabric.clone(),
            group: self.group.clone(),
            rank: self.rank,
            recycler: Recycler::default(),
        }
    }

    fn signature<T: Element>(&self, op: &'static str) -> Signature {
        Signature {
            op,
            dtype: Some(T::DTYPE),
            len: None,
            reduce: None,
            root: None,
        }
    }

    fn invalid(&self, op: &'static str, detail: String) -> CommError {
        CommError::InvalidArgument {
            op,
            group: self.group.label.clone(),
            detail,
        }
    }

    fn check_peer(&self, op: &'static str, peer: usize) -> Result<(), CommError> {
        arguments::peer(peer, self.size()).map_err(|detail| self.invalid(op, detail))
    }

    fn exchange<P: Send + Sync + 'static>(
        &self,
        signature: Signature,
        payload: P,
    ) -> Result<Arc<Vec<Deposit>>, CommError> {
        let payload: Payload = Arc::new(payload);
        self.recycler.keep(&payload);
        self.group.exchange(self.rank, signature, payload)
    }
}

impl Communicator for ThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.group.size()
    }

    fn label(&self) -> &GroupLabel {
        &self.group.label
    }

    fn new_group(&self, name: &str, members: &[u32]) -> Result<ThreadComm, CommError> {
        let label = GroupLabel {
            name: name.to_owned(),
            ranks: members.to_vec(),
        };
        let invalid = |detail: String| CommError::InvalidArgument {
            op: "new_group",
            group: label.clone(),
            detail,
        };
        if let Some(&outside) = members.iter().find(|&&r| r >= self.fabric.world_size) {
            return Err(invalid(format!(
                "rank {outside} is outside a world of {}",
                self.fabric.world_size
            )));
        }
        let mut sorted = members.to_vec();
        sorted.sort_unstable();
        if let Some(pair) = sorted.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(invalid(format!("rank {} is listed twice", pair[0])));
        }
        let me = self.global_rank();
        let Some(rank) = members.iter().position(|&r| r == me) else {
            return Err(CommError::NotAMember {
                group: label,
                rank: me,
            });
        };
        Ok(ThreadComm::new(self.fabric.clone(), label, rank))
    }

    fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<(), CommError> {
        let (n, len) = (self.size(), buf.len());
        let signature = Signature {
            len: Some(len),
            reduce: Some(op),
            ..self.signature::<T>("all_reduce")
        };
        let inputs = self.exchange(signature, self.recycler.copy_of(buf))?;
        let mine = chunk(len, n, self.rank);
        let mut reduced = self
            .recycler
            .copy_of(&contents::<T>(&inputs[0])[mine.clone()]);
        for input in &inputs[1..] {
            accumulate(&mut reduced, &contents::<T>(input)[mine.clone()], op);
        }
        drop(inputs);
        let chunks = self.exchange(self.signature::<T>("all_reduce (gather)"), reduced)?;
        for (index, reduced) in chunks.iter().enumerate() {
            buf[chunk(len, n, index)].copy_from_slice(contents::<T>(reduced));
        }
        Ok(())
    }

    fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<(), CommError> {
        let (n, len) = (self.size(), input.len());
        arguments::gathered(n, len, output.len())
            .map_err(|detail| self.invalid("all_gather", detail))?;
        let signature = Signature {
            len: Some(len),
            ..self.signature::<T>("all_gather")
        };
        let inputs = self.exchange(signature, self.recycler.copy_of(input))?;
        for (slot, input) in output.chunks_exact_mut(len.max(1)).zip(inputs.iter()) {
            slot.copy_from_slice(contents::<T>(input));
        }
        Ok(())
    }

    fn reduce_scatter<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let (n, len) = (self.size(), output.len());
        arguments::scattered(n, input.len(), len)
            .map_err(|detail| self.invalid("reduce_scatter", detail))?;
        let signature = Signature {
            len: Some(input.len()),
            reduce: Some(op),
            ..self.signature::<T>("reduce_scatter")
        };
        let inputs = self.exchange(signature, self.recycler.copy_of(input))?;
        let mine = self.rank * len..(self.rank + 1) * len;
        output.copy_from_slice(&contents::<T>(&inputs[0])[mine.clone()]);
        for input in &inputs[1..] {
            accumulate(output, &contents::<T>(input)[mine.clone()], op);
        }
        Ok(())
    }

    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<(), CommError> {
        self.check_peer("broadcast", root)?;
        let signature = Signature {
            len: Some(buf.len()),
            root: Some(root),
            ..self.signature::<T>("broadcast")
        };
        let payload = if self.rank == root {
            buf.to_vec()
        } else {
            Vec::new()
        };
        let deposits = self.exchange(signature, payload)?;
        if self.rank != root {
            buf.copy_from_slice(contents::<T>(&deposits[root]));
        }
        Ok(())
    }

    fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<(), CommError> {
        self.check_peer("send", peer)?;
        let message = Message {
            dtype: T::DTYPE,
            len: buf.len(),
            payload: Arc::new(buf.to_vec()),
        };
        self.group.send(self.rank, peer, message)
    }

    fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<(), CommError> {
        self.check_peer("recv", peer)?;
        let message = self.group.recv(peer, self.rank)?;
        let data = message.payload.downcast_ref::<Vec<T>>();
        match data {
            Some(data) if data.len() == buf.len() => {
                buf.copy_from_slice(data);
                Ok(())
            }
            _ => Err(self.invalid(
                "recv",
                format!(
                    "rank {} sent {} × {}, rank {} expected {} × {}",
                    self.members()[peer],
                    message.dtype,
                    message.len,
                    self.global_rank(),
                    T::DTYPE,
                    buf.len()
                ),
            )),
        }
    }

    fn all_to_all<T: Element>(
        &self,
        input: &[T],
        send_counts: &[usize],
        output: &mut [T],
        recv_counts: &[usize],
    ) -> Result<(), CommError> {
        let n = self.size();
        arguments::all_to_all(n, send_counts, input.len(), recv_counts, output.len())
            .map_err(|detail| self.invalid("all_to_all", detail))?;
        let scatter = Scatter {
            send_counts: send_counts.to_vec(),
            data: input.to_vec(),
        };
        let deposits = self.exchange(self.signature::<T>("all_to_all"), scatter)?;
        let mut offset = 0;
        for (source, deposit) in deposits.iter().enumerate() {
            let Some(theirs) = deposit.payload.downcast_ref::<Scatter<T>>() else {
                return Err(self.invalid("all_to_all", "inconsistent payloads".to_owned()));
            };
            let sent = theirs.send_counts[self.rank];
            if sent != recv_counts[source] {
                return Err(self.invalid(
                    "all_to_all",
                    format!(
                        "rank {} sends {sent} elements to rank {}, which expects {}",
                        self.members()[source],
                        self.global_rank(),
                        recv_counts[source]
                    ),
                ));
            }
            let start: usize = theirs.send_counts[..self.rank].iter().sum();
            output[offset..offset + sent].copy_from_slice(&theirs.data[start..start + sent]);
            offset += sent;
        }
        Ok(())
    }

    fn barrier(&self) -> Result<(), CommError> {
        let signature = Signature {
            dtype: None,
            ..self.signature::<u32>("barrier")
        };
        self.exchange(signature, ()).map(drop)
    }

    fn members_are_threads(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::chunk;

    #[test]
    fn chunks_cover_the_buffer_without_gaps() {
        for len in 0..20 {
            for parts in 1..5 {
                let ranges: Vec<_> = (0..parts).map(|i| chunk(len, parts, i)).collect();
                assert_eq!(ranges[0].start, 0);
                assert_eq!(ranges[parts - 1].end, len);
                for pair in ranges.windows(2) {
                    assert_eq!(pair[0].end, pair[1].start);
                }
            }
        }
    }
}
