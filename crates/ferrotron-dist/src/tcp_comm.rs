//! [`TcpComm`]: the communicator for ranks that are processes (Slurm's `srun`, torchrun-style
//! launches) on CPU.
//!
//! It keeps [`crate::ThreadComm`]'s promises across processes, because the runtime and the
//! equivalence tests rely on them: all-reduce is a reduce-scatter then an all-gather in which
//! every chunk is reduced over the members *in rank order* (`((x₀ + x₁) + x₂) + …`), so a
//! process world computes bit for bit what a thread world does; every frame carries its
//! collective's signature so disagreeing ranks get a `Mismatch` error; every wait has a
//! deadline whose error names the group, the collective and the ranks that did not arrive; a
//! peer whose process dies is an error at once (its connection closes), and a rank that fails
//! tells the others (an abort frame) so they stop instead of waiting out the timeout.
//!
//! Groups live on the one mesh of connections: a frame names its group by a hash of the group's
//! name and members, so `dp` and `dp_cp` with the same ranks stay independent, as separate NCCL
//! communicators would. `new_group` is a handshake among the members only.

use std::net::TcpListener;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::arguments;
use crate::communicator::Communicator;
use crate::element::{Element, ReduceOp};
use crate::error::{CommError, GroupLabel};
use crate::rendezvous::Signature;
use crate::tcp_comm_mesh::{Mesh, WaitError, connect};
use crate::tcp_comm_rendezvous::TcpError;
use crate::tcp_comm_wire::{Channel, Header, decode, element_bytes, encode, group_key};
use crate::world::DEFAULT_TIMEOUT;

/// Where and how a process joins a TCP world.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpConfig {
    pub rank: u32,
    pub world_size: u32,
    /// Host name or IP of rank 0 (`MASTER_ADDR`).
    pub master_addr: String,
    /// The port rank 0 listens on (`MASTER_PORT`).
    pub master_port: u16,
    /// How long one collective waits for the other members.
    pub timeout: Duration,
    /// How long the rendezvous waits for every rank to show up (Slurm may start tasks of a
    /// step seconds apart; a node may still be booting).
    pub connect_timeout: Duration,
}

/// Default rendezvous wait.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(300);

impl TcpConfig {
    pub fn new(rank: u32, world_size: u32, master_addr: &str, master_port: u16) -> TcpConfig {
        TcpConfig {
            rank,
            world_size,
            master_addr: master_addr.to_owned(),
            master_port,
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }
}

/// One process's handle on one group of a TCP world.
pub struct TcpComm {
    mesh: Arc<Mesh>,
    label: GroupLabel,
    key: u64,
    rank: usize,
}

impl std::fmt::Debug for TcpComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TcpComm({} rank {})", self.label, self.rank)
    }
}

/// The split of `len` elements into `parts` contiguous chunks, the first `len % parts` one longer
/// (the same split as the thread communicator, so both reduce the same elements together).
fn chunk(len: usize, parts: usize, index: usize) -> Range<usize> {
    let (base, extra) = (len / parts, len % parts);
    let start = index * base + index.min(extra);
    start..start + base + usize::from(index < extra)
}

fn accumulate<T: Element>(acc: &mut [T], x: &[T], op: ReduceOp) {
    for (a, &b) in acc.iter_mut().zip(x) {
        *a = a.combine(b, op);
    }
}

impl TcpComm {
    /// Joins the world described by `config` and returns its `world` communicator. Rank 0
    /// listens on `master_port` (all interfaces); the others connect to `master_addr`.
    pub fn connect(config: &TcpConfig) -> Result<TcpComm, TcpError> {
        Ok(TcpComm::world(connect(config, None)?))
    }

    /// Rank 0 with a listener bound by the caller (port 0 in tests, or a socket handed over by a
    /// launcher); `config.master_port` is only used in messages.
    pub fn serve(listener: TcpListener, config: &TcpConfig) -> Result<TcpComm, TcpError> {
        Ok(TcpComm::world(connect(config, Some(listener))?))
    }

    fn world(mesh: Mesh) -> TcpComm {
        let ranks: Vec<u32> = (0..mesh.world_size).collect();
        let label = GroupLabel {
            name: "world".to_owned(),
            ranks,
        };
        let mesh = Arc::new(mesh);
        if mesh.world_size > 1 {
            Mesh::beat_while_alive(Arc::downgrade(&mesh));
            let watched: Arc<dyn crate::watchdog::Watched> = mesh.clone();
            crate::watchdog::global().watch(Arc::downgrade(&watched));
        }
        TcpComm {
            key: group_key(&label.name, &label.ranks),
            rank: mesh.rank as usize,
            label,
            mesh,
        }
    }

    /// How long every wait of this world lasts before it fails (the recipe's distributed
    /// timeout).
    pub fn timeout(&self) -> Duration {
        self.mesh.timeout
    }

    /// What the watchdog sees of this world (tests).
    #[cfg(test)]
    pub(crate) fn health(&self) -> crate::watchdog::Health {
        crate::watchdog::Watched::health(&*self.mesh)
    }

    /// Tells every process of the world that this one is failing: their waiting collectives
    /// return `Aborted` with `reason` at once instead of timing out.
    pub fn abort(&self, reason: &str) {
        self.mesh
            .abort(&format!("rank {}: {reason}", self.mesh.rank));
    }

    fn invalid(&self, op: &'static str, detail: String) -> CommError {
        CommError::InvalidArgument {
            op,
            group: self.label.clone(),
            detail,
        }
    }

    fn check_peer(&self, op: &'static str, peer: usize) -> Result<(), CommError> {
        arguments::peer(peer, self.size()).map_err(|detail| self.invalid(op, detail))
    }

    fn signature<T: Element>(op: &'static str) -> Signature {
        Signature {
            op,
            dtype: Some(T::DTYPE),
            len: None,
            reduce: None,
            root: None,
        }
    }

    /// Fails the collective and the world: the others learn why instead of timing out.
    fn fail(&self, err: CommError) -> CommError {
        if !matches!(err, CommError::Aborted { .. }) {
            self.abort(&err.to_string());
        }
        err
    }

    /// Sends `values` to group rank `peer` as part of `signature`'s collective.
    fn post<T: Element>(
        &self,
        channel: Channel,
        signature: &Signature,
        values: &[T],
        peer: usize,
    ) -> Result<(), CommError> {
        let header = Header {
            channel,
            group: self.key,
            signature: signature.clone(),
            count: values.len() as u64,
            payload_bytes: (values.len() * element_bytes(T::DTYPE)) as u64,
        };
        let mut frame = header.frame();
        encode(values, &mut frame);
        let target = self.label.ranks[peer];
        self.mesh.send(target, &frame).map_err(|reason| {
            self.fail(CommError::Aborted {
                op: signature.op,
                group: self.label.clone(),
                reason,
            })
        })
    }

    /// Sends to every other member: `values_for(peer)` is what `peer` gets.
    fn post_all<'a, T: Element>(
        &self,
        signature: &Signature,
        values_for: impl Fn(usize) -> &'a [T],
    ) -> Result<(), CommError> {
        for peer in (0..self.size()).filter(|&p| p != self.rank) {
            self.post(Channel::Collective, signature, values_for(peer), peer)?;
        }
        Ok(())
    }

    /// The next collective frame of this group from group rank `peer`, checked against what
    /// this rank called, as `T`s.
    fn fetch<T: Element>(
        &self,
        signature: &Signature,
        peer: usize,
        deadline: Instant,
    ) -> Result<Vec<T>, CommError> {
        let op = signature.op;
        let source = self.label.ranks[peer];
        let frame = self
            .mesh
            .take(self.key, Channel::Collective, source, deadline)
            .map_err(|why| self.wait_error(op, Channel::Collective, peer, why))?;
        if frame.header.signature != *signature {
            return Err(self.fail(CommError::Mismatch {
                group: self.label.clone(),
                detail: format!(
                    "rank {} called {} but rank {} called {}",
                    self.global_rank(),
                    signature,
                    source,
                    frame.header.signature
                ),
            }));
        }
        let Some(values) = decode::<T>(&frame.payload) else {
            return Err(self.fail(self.invalid(
                op,
                format!(
                    "rank {source} sent {} bytes, not a whole number of {}",
                    frame.payload.len(),
                    T::DTYPE
                ),
            )));
        };
        Ok(values)
    }

    /// The error for a wait on group rank `peer` that ended without a frame. Collectives
    /// consume members in rank order, so the ones that did not arrive are among `peer` and the
    /// ranks after it.
    fn wait_error(
        &self,
        op: &'static str,
        channel: Channel,
        peer: usize,
        why: WaitError,
    ) -> CommError {
        let err = match why {
            WaitError::TimedOut => {
                let (candidates, verb): (Vec<u32>, _) = match channel {
                    Channel::PointToPoint => (vec![self.label.ranks[peer]], "send"),
                    _ => (
                        (peer..self.size())
                            .filter(|&p| p != self.rank)
                            .map(|p| self.label.ranks[p])
                            .collect(),
                        "arrive",
                    ),
                };
                CommError::Timeout {
                    op,
                    group: self.label.clone(),
                    after: self.mesh.timeout,
                    missing: self.mesh.missing(self.key, channel, &candidates),
                    verb,
                }
            }
            WaitError::Closed(reason) | WaitError::Aborted(reason) => CommError::Aborted {
                op,
                group: self.label.clone(),
                reason,
            },
        };
        self.fail(err)
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.mesh.timeout
    }

    fn refuse_if_aborted(&self, op: &'static str) -> Result<(), CommError> {
        match self.mesh.aborted() {
            Some(reason) => Err(CommError::Aborted {
                op,
                group: self.label.clone(),
                reason,
            }),
            None => Ok(()),
        }
    }

    /// Reduces `mine`'s chunk of every member's contribution in rank order; `own` is this rank's.
    fn reduce_in_rank_order<T: Element>(
        &self,
        signature: &Signature,
        own: &[T],
        expected: usize,
        op: ReduceOp,
    ) -> Result<Vec<T>, CommError> {
        let deadline = self.deadline();
        let mut acc: Option<Vec<T>> = None;
        for source in 0..self.size() {
            let values = if source == self.rank {
                own.to_vec()
            } else {
                let values = self.fetch::<T>(signature, source, deadline)?;
                if values.len() != expected {
                    return Err(self.fail(self.invalid(
                        signature.op,
                        format!(
                            "rank {} sent {} elements, {expected} expected",
                            self.label.ranks[source],
                            values.len()
                        ),
                    )));
                }
                values
            };
            match &mut acc {
                None => acc = Some(values),
                Some(acc) => accumulate(acc, &values, op),
            }
        }
        Ok(acc.unwrap_or_default())
    }
}

impl Communicator for TcpComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.label.ranks.len()
    }

    fn label(&self) -> &GroupLabel {
        &self.label
    }

    fn new_group(&self, name: &str, members: &[u32]) -> Result<TcpComm, CommError> {
        let label = GroupLabel {
            name: name.to_owned(),
            ranks: members.to_vec(),
        };
        let invalid = |detail: String| CommError::InvalidArgument {
            op: "new_group",
            group: label.clone(),
            detail,
        };
        let world_size = self.mesh.world_size;
        if let Some(&outside) = members.iter().find(|&&r| r >= world_size) {
            return Err(invalid(format!(
                "rank {outside} is outside a world of {world_size}"
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
        let group = TcpComm {
            mesh: self.mesh.clone(),
            key: group_key(name, members),
            label,
            rank,
        };
        // Every member must create the group: a member that does not (or lists other members,
        // which is another key) shows up here as the rank that did not arrive.
        group.handshake("new_group")?;
        Ok(group)
    }

    fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<(), CommError> {
        self.refuse_if_aborted("all_reduce")?;
        let (n, len) = (self.size(), buf.len());
        if n == 1 {
            return Ok(());
        }
        let scatter = Signature {
            len: Some(len),
            reduce: Some(op),
            ..Self::signature::<T>("all_reduce")
        };
        self.post_all(&scatter, |peer| &buf[chunk(len, n, peer)])?;
        // Inside the collective: this rank's part is sent, the others wait for the rest.
        fail::fail_point!("tcp-all-reduce", |what| -> Result<(), CommError> {
            crate::fault::die(what)
        });
        let mine = chunk(len, n, self.rank);
        let reduced = self.reduce_in_rank_order(&scatter, &buf[mine.clone()], mine.len(), op)?;
        let gather = Signature {
            len: Some(len),
            ..Self::signature::<T>("all_reduce (gather)")
        };
        self.post_all(&gather, |_| &reduced)?;
        let deadline = self.deadline();
        for source in (0..n).filter(|&s| s != self.rank) {
            let values = self.fetch::<T>(&gather, source, deadline)?;
            let range = chunk(len, n, source);
            if values.len() != range.len() {
                return Err(self.fail(self.invalid(
                    "all_reduce",
                    format!(
                        "rank {} sent a chunk of {} elements, {} expected",
                        self.label.ranks[source],
                        values.len(),
                        range.len()
                    ),
                )));
            }
            buf[range].copy_from_slice(&values);
        }
        buf[mine].copy_from_slice(&reduced);
        Ok(())
    }

    fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<(), CommError> {
        let (n, len) = (self.size(), input.len());
        arguments::gathered(n, len, output.len())
            .map_err(|detail| self.invalid("all_gather", detail))?;
        self.refuse_if_aborted("all_gather")?;
        let signature = Signature {
            len: Some(len),
            ..Self::signature::<T>("all_gather")
        };
        self.post_all(&signature, |_| input)?;
        let deadline = self.deadline();
        for source in 0..n {
            let slot = &mut output[source * len..(source + 1) * len];
            if source == self.rank {
                slot.copy_from_slice(input);
            } else {
                let values = self.fetch::<T>(&signature, source, deadline)?;
                slot.copy_from_slice(&values);
            }
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
        self.refuse_if_aborted("reduce_scatter")?;
        let signature = Signature {
            len: Some(input.len()),
            reduce: Some(op),
            ..Self::signature::<T>("reduce_scatter")
        };
        self.post_all(&signature, |peer| &input[peer * len..(peer + 1) * len])?;
        let mine = &input[self.rank * len..(self.rank + 1) * len];
        let reduced = self.reduce_in_rank_order(&signature, mine, len, op)?;
        output.copy_from_slice(&reduced);
        Ok(())
    }

    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<(), CommError> {
        self.check_peer("broadcast", root)?;
        self.refuse_if_aborted("broadcast")?;
        let signature = Signature {
            len: Some(buf.len()),
            root: Some(root),
            ..Self::signature::<T>("broadcast")
        };
        if self.rank == root {
            return self.post_all(&signature, |_| &*buf);
        }
        let values = self.fetch::<T>(&signature, root, self.deadline())?;
        buf.copy_from_slice(&values);
        Ok(())
    }

    fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<(), CommError> {
        self.check_peer("send", peer)?;
        self.refuse_if_aborted("send")?;
        let signature = Signature {
            len: Some(buf.len()),
            ..Self::signature::<T>("send")
        };
        self.post(Channel::PointToPoint, &signature, buf, peer)
    }

    fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<(), CommError> {
        self.check_peer("recv", peer)?;
        self.refuse_if_aborted("recv")?;
        let source = self.label.ranks[peer];
        let frame = self
            .mesh
            .take(self.key, Channel::PointToPoint, source, self.deadline())
            .map_err(|why| self.wait_error("recv", Channel::PointToPoint, peer, why))?;
        let sent = &frame.header.signature;
        match decode::<T>(&frame.payload) {
            Some(values) if sent.dtype == Some(T::DTYPE) && values.len() == buf.len() => {
                buf.copy_from_slice(&values);
                Ok(())
            }
            _ => Err(self.fail(self.invalid(
                "recv",
                format!(
                    "rank {source} sent {} × {}, rank {} expected {} × {}",
                    sent.dtype.map_or_else(|| "nothing".to_owned(), |d| d.to_string()),
                    frame.header.count,
                    self.global_rank(),
                    T::DTYPE,
                    buf.len()
                ),
            ))),
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
        self.refuse_if_aborted("all_to_all")?;
        let starts: Vec<usize> = send_counts
            .iter()
            .scan(0, |offset, &count| {
                let start = *offset;
                *offset += count;
                Some(start)
            })
            .collect();
        let signature = Self::signature::<T>("all_to_all");
        self.post_all(&signature, |peer| {
            &input[starts[peer]..starts[peer] + send_counts[peer]]
        })?;
        let deadline = self.deadline();
        let mut offset = 0;
        for source in 0..n {
            let expected = recv_counts[source];
            let values = if source == self.rank {
                input[starts[source]..starts[source] + send_counts[source]].to_vec()
            } else {
                self.fetch::<T>(&signature, source, deadline)?
            };
            if values.len() != expected {
                return Err(self.fail(self.invalid(
                    "all_to_all",
                    format!(
                        "rank {} sends {} elements to rank {}, which expects {expected}",
                        self.label.ranks[source],
                        values.len(),
                        self.global_rank(),
                    ),
                )));
            }
            output[offset..offset + expected].copy_from_slice(&values);
            offset += expected;
        }
        Ok(())
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.handshake("barrier")
    }
}

impl TcpComm {
    /// An empty message to and from every member.
    fn handshake(&self, op: &'static str) -> Result<(), CommError> {
        self.refuse_if_aborted(op)?;
        let signature = Signature {
            dtype: None,
            ..Self::signature::<u32>(op)
        };
        let empty: &[u32] = &[];
        self.post_all(&signature, |_| empty)?;
        let deadline = self.deadline();
        for source in (0..self.size()).filter(|&s| s != self.rank) {
            self.fetch::<u32>(&signature, source, deadline)?;
        }
        Ok(())
    }
}
