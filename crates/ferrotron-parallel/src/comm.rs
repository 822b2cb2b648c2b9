//! [`DynComm`]: the communicator as a trait object.
//!
//! `ferrotron_dist::Communicator` is generic over the element type (as NCCL is over its data
//! type), which makes it impossible to hold as `dyn`. The model and runtime want one concrete
//! context type whatever the transport, so this trait fixes the element types they actually move
//! (f32 activations and gradients, f64 loss and norm sums, u64 counts) and is implemented once for
//! every communicator.

use std::fmt;
use std::sync::Arc;

use ferrotron_dist::{CommError, Communicator, GroupLabel, ReduceOp};

/// Object-safe view of a [`Communicator`], implemented for every
/// `C: Communicator + Sync + Debug + 'static`.
pub trait DynComm: Send + Sync + fmt::Debug {
    /// This rank's index in the group.
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// The group's name and members (global ranks), e.g. `tp[0,1]`.
    fn label(&self) -> &GroupLabel;
    /// This rank's global rank.
    fn global_rank(&self) -> u32 {
        self.label().ranks[self.rank()]
    }
    /// A sub-group over `members` (global ranks); collective over the members only.
    fn new_group(&self, name: &str, members: &[u32]) -> Result<Comm, CommError>;

    fn all_reduce_f32(&self, buf: &mut [f32], op: ReduceOp) -> Result<(), CommError>;
    fn all_reduce_f64(&self, buf: &mut [f64], op: ReduceOp) -> Result<(), CommError>;
    fn all_reduce_u64(&self, buf: &mut [u64], op: ReduceOp) -> Result<(), CommError>;
    /// `output` is `size × input.len()`, the members' inputs in rank order.
    fn all_gather_f32(&self, input: &[f32], output: &mut [f32]) -> Result<(), CommError>;
    fn all_gather_u64(&self, input: &[u64], output: &mut [u64]) -> Result<(), CommError>;
    /// `input` is `size × output.len()`; member `i` receives the reduction of chunk `i`.
    fn reduce_scatter_f32(
        &self,
        input: &[f32],
        output: &mut [f32],
        op: ReduceOp,
    ) -> Result<(), CommError>;
    fn broadcast_f32(&self, buf: &mut [f32], root: usize) -> Result<(), CommError>;
    fn broadcast_u64(&self, buf: &mut [u64], root: usize) -> Result<(), CommError>;
    fn send_f32(&self, buf: &[f32], peer: usize) -> Result<(), CommError>;
    fn recv_f32(&self, buf: &mut [f32], peer: usize) -> Result<(), CommError>;
    fn send_u64(&self, buf: &[u64], peer: usize) -> Result<(), CommError>;
    fn recv_u64(&self, buf: &mut [u64], peer: usize) -> Result<(), CommError>;
    /// Uneven personalised exchange; counts are elements and must agree pairwise.
    fn all_to_all_f32(
        &self,
        input: &[f32],
        send_counts: &[usize],
        output: &mut [f32],
        recv_counts: &[usize],
    ) -> Result<(), CommError>;
    fn all_to_all_u64(
        &self,
        input: &[u64],
        send_counts: &[usize],
        output: &mut [u64],
        recv_counts: &[usize],
    ) -> Result<(), CommError>;
    fn barrier(&self) -> Result<(), CommError>;
    /// [`Communicator::members_are_threads`].
    fn members_are_threads(&self) -> bool;
    /// [`Communicator::agree_on_order`].
    fn agree_on_order(&self) -> Result<(), CommError>;

    /// The concrete communicator, so a backend can take a faster path for a transport it knows
    /// (the CUDA backend's device-side NCCL collectives downcast to its `NcclComm`).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// A shared, type-erased communicator: what a [`crate::ParallelContext`] holds.
pub type Comm = Arc<dyn DynComm>;

/// u64 travels as i64 (the communicator's integer types are signed or 32-bit). Sums wrap
/// identically in both; for max, flipping the sign bit maps unsigned order onto signed order.
fn u64_to_wire(values: &[u64], op: ReduceOp) -> Vec<i64> {
    let flip = wire_flip(op);
    values.iter().map(|&v| (v ^ flip) as i64).collect()
}

fn u64_from_wire(wire: &[i64], op: ReduceOp, out: &mut [u64]) {
    let flip = wire_flip(op);
    for (o, &w) in out.iter_mut().zip(wire) {
        *o = (w as u64) ^ flip;
    }
}

fn wire_flip(op: ReduceOp) -> u64 {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Max => 1 << 63,
    }
}

/// Moves u64 payloads (no reduction): any bijection works, the plain cast is used.
const MOVE: ReduceOp = ReduceOp::Sum;

impl<C: Communicator + Sync + fmt::Debug + 'static> DynComm for C {
    fn rank(&self) -> usize {
        Communicator::rank(self)
    }
    fn size(&self) -> usize {
        Communicator::size(self)
    }
    fn label(&self) -> &GroupLabel {
        Communicator::label(self)
    }
    fn new_group(&self, name: &str, members: &[u32]) -> Result<Comm, CommError> {
        Ok(Arc::new(Communicator::new_group(self, name, members)?))
    }
    fn all_reduce_f32(&self, buf: &mut [f32], op: ReduceOp) -> Result<(), CommError> {
        self.all_reduce(buf, op)
    }
    fn all_reduce_f64(&self, buf: &mut [f64], op: ReduceOp) -> Result<(), CommError> {
        self.all_reduce(buf, op)
    }
    fn all_reduce_u64(&self, buf: &mut [u64], op: ReduceOp) -> Result<(), CommError> {
        let mut wire = u64_to_wire(buf, op);
        self.all_reduce(&mut wire, op)?;
        u64_from_wire(&wire, op, buf);
        Ok(())
    }
    fn all_gather_f32(&self, input: &[f32], output: &mut [f32]) -> Result<(), CommError> {
        self.all_gather(input, output)
    }
    fn all_gather_u64(&self, input: &[u64], output: &mut [u64]) -> Result<(), CommError> {
        let mut wire = vec![0i64; output.len()];
        self.all_gather(&u64_to_wire(input, MOVE), &mut wire)?;
        u64_from_wire(&wire, MOVE, output);
        Ok(())
    }
    fn reduce_scatter_f32(
        &self,
        input: &[f32],
        output: &mut [f32],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        self.reduce_scatter(input, output, op)
    }
    fn broadcast_f32(&self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        self.broadcast(buf, root)
    }
    fn broadcast_u64(&self, buf: &mut [u64], root: usize) -> Result<(), CommError> {
        let mut wire = u64_to_wire(buf, MOVE);
        self.broadcast(&mut wire, root)?;
        u64_from_wire(&wire, MOVE, buf);
        Ok(())
    }
    fn send_f32(&self, buf: &[f32], peer: usize) -> Result<(), CommError> {
        self.send(buf, peer)
    }
    fn recv_f32(&self, buf: &mut [f32], peer: usize) -> Result<(), CommError> {
        self.recv(buf, peer)
    }
    fn send_u64(&self, buf: &[u64], peer: usize) -> Result<(), CommError> {
        self.send(&u64_to_wire(buf, MOVE), peer)
    }
    fn recv_u64(&self, buf: &mut [u64], peer: usize) -> Result<(), CommError> {
        let mut wire = vec![0i64; buf.len()];
        self.recv(&mut wire, peer)?;
        u64_from_wire(&wire, MOVE, buf);
        Ok(())
    }
    fn all_to_all_f32(
        &self,
        input: &[f32],
        send_counts: &[usize],
        output: &mut [f32],
        recv_counts: &[usize],
    ) -> Result<(), CommError> {
        self.all_to_all(input, send_counts, output, recv_counts)
    }
    fn all_to_all_u64(
        &self,
        input: &[u64],
        send_counts: &[usize],
        output: &mut [u64],
        recv_counts: &[usize],
    ) -> Result<(), CommError> {
        let mut wire = vec![0i64; output.len()];
        self.all_to_all(
            &u64_to_wire(input, MOVE),
            send_counts,
            &mut wire,
            recv_counts,
        )?;
        u64_from_wire(&wire, MOVE, output);
        Ok(())
    }
    fn barrier(&self) -> Result<(), CommError> {
        Communicator::barrier(self)
    }
    fn members_are_threads(&self) -> bool {
        Communicator::members_are_threads(self)
    }
    fn agree_on_order(&self) -> Result<(), CommError> {
        Communicator::agree_on_order(self)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
