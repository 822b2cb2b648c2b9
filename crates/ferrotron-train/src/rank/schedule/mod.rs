//! Pipeline schedules as plain data: the list of operations (compute and point-to-point) one
//! stage performs for one optimizer step. Keeping the schedule free of tensors lets it be checked
//! exhaustively without a model: every microbatch goes forward and backward through every chunk
//! once, in dependency order, and the sends and receives of neighbouring stages pair up in FIFO
//! order without deadlocking even when a send blocks until its receive is posted (NCCL semantics;
//! the thread communicator buffers sends, so it would hide such a bug).
//!
//! Deadlock freedom comes from Megatron's unbatched `_p2p_ops` ordering: between two computes, an
//! even stage sends before it receives and an odd stage receives before it sends, so every
//! exchange between neighbours has one side ready to take what the other offers. Activations
//! always travel to the next stage and gradients to the previous one (the ring wraps for virtual
//! stages: the last stage's chunk `v` feeds the first stage's chunk `v + 1`).

mod interleaved;
mod one_f_one_b;

use crate::TrainError;

/// Forward or backward of one microbatch through one local model chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Compute {
    pub forward: bool,
    /// Local chunk index (virtual stage) on this pipeline stage.
    pub chunk: usize,
    pub microbatch: usize,
}

impl Compute {
    pub(crate) fn forward(chunk: usize, microbatch: usize) -> Self {
        Compute {
            forward: true,
            chunk,
            microbatch,
        }
    }

    pub(crate) fn backward(chunk: usize, microbatch: usize) -> Self {
        Compute {
            forward: false,
            chunk,
            microbatch,
        }
    }

    #[cfg(test)]
    pub(crate) fn is_forward(&self) -> bool {
        self.forward
    }
}

/// One step of a stage's schedule. Sends and receives name the (chunk, microbatch) whose boundary
/// tensor they carry, as seen from this stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Compute(Compute),
    /// This chunk's output activation, to the next stage.
    SendActivation {
        chunk: usize,
        microbatch: usize,
    },
    /// This chunk's input activation, from the previous stage.
    RecvActivation {
        chunk: usize,
        microbatch: usize,
    },
    /// The gradient of this chunk's input, to the previous stage.
    SendGrad {
        chunk: usize,
        microbatch: usize,
    },
    /// The gradient of this chunk's output, from the next stage.
    RecvGrad {
        chunk: usize,
        microbatch: usize,
    },
}

/// A stage's computes in order; the first `warmup` are forwards run before the first backward
/// could be, then forwards and backwards alternate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Order {
    pub computes: Vec<Compute>,
    pub warmup: usize,
}

/// Where a stage sits in the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StagePosition {
    pub stage: usize,
    pub stages: usize,
    /// Model chunks (virtual stages) per stage.
    pub chunks: usize,
}

impl StagePosition {
    /// Index of local chunk `chunk` in the model's sequence of pieces (chunk-major, Megatron's
    /// layer-offset order).
    pub(crate) fn piece(&self, chunk: usize) -> usize {
        chunk * self.stages + self.stage
    }

    /// The chunk holds the embedding: its input is tokens, not a received activation.
    pub(crate) fn is_first_piece(&self, chunk: usize) -> bool {
        self.piece(chunk) == 0
    }

    /// The chunk computes the loss: it sends no activation and receives no gradient.
    pub(crate) fn is_last_piece(&self, chunk: usize) -> bool {
        self.piece(chunk) == self.stages * self.chunks - 1
    }

    /// Group rank (in the pipeline group) activations go to and gradients come from.
    pub(crate) fn next_stage(&self) -> usize {
        (self.stage + 1) % self.stages
    }

    /// Group rank activations come from and gradients go to.
    pub(crate) fn previous_stage(&self) -> usize {
        (self.stage + self.stages - 1) % self.stages
    }
}

/// The operations of `position` for one step of `microbatches`.
pub(crate) fn build(position: StagePosition, microbatches: usize) -> Result<Vec<Op>, TrainError> {
    let StagePosition {
        stage,
        stages,
        chunks,
    } = position;
    if stages == 0 || chunks == 0 || stage >= stages {
        return Err(TrainError::Config(format!(
            "pipeline stage {stage} of {stages} with {chunks} chunks is not a pipeline position"
        )));
    }
    if microbatches == 0 {
        return Err(TrainError::Config(
            "a pipeline step needs at least one microbatch".into(),
        ));
    }
    if chunks > 1 && !microbatches.is_multiple_of(stages) {
        return Err(TrainError::Config(format!(
            "the interleaved schedule needs the microbatches per step to be a multiple of the \
             pipeline stages ({microbatches} microbatches, {stages} stages), as Megatron's does; \
             change training.global_batch_size or micro_batch_size"
        )));
    }
    let order = if chunks == 1 {
        one_f_one_b::order(stage, stages, microbatches)
    } else {
        interleaved::order(stage, stages, chunks, microbatches)
    };
    Ok(with_exchanges(position, &order, chunks > 1))
}

/// The receives a compute needs just before it runs.
fn receives(position: StagePosition, compute: &Compute) -> Option<Op> {
    let (chunk, microbatch) = (compute.chunk, compute.microbatch);
    if compute.forward {
        (!position.is_first_piece(chunk)).then_some(Op::RecvActivation { chunk, microbatch })
    } else {
        (!position.is_last_piece(chunk)).then_some(Op::RecvGrad { chunk, microbatch })
    }
}

/// The sends a compute owes right after it ran.
fn sends(position: StagePosition, compute: &Compute) -> Option<Op> {
    let (chunk, microbatch) = (compute.chunk, compute.microbatch);
    if compute.forward {
        (!position.is_last_piece(chunk)).then_some(Op::SendActivation { chunk, microbatch })
    } else {
        (!position.is_first_piece(chunk)).then_some(Op::SendGrad { chunk, microbatch })
    }
}

/// Megatron's rank of an operation within one exchange: even stages
/// `send_next, recv_prev, send_prev, recv_next`; odd stages `recv_prev, send_next, recv_next,
/// send_prev`.
fn exchange_rank(op: &Op, even: bool) -> u8 {
    match (op, even) {
        (Op::SendActivation { .. }, true) | (Op::RecvActivation { .. }, false) => 0,
        (Op::RecvActivation { .. }, true) | (Op::SendActivation { .. }, false) => 1,
        (Op::SendGrad { .. }, true) | (Op::RecvGrad { .. }, false) => 2,
        (Op::RecvGrad { .. }, true) | (Op::SendGrad { .. }, false) => 3,
        (Op::Compute(_), _) => 4,
    }
}

/// Puts the exchanges between slots of computes. 1F1B exchanges after every compute (Megatron's
/// `send_forward_recv_backward` / `send_backward_recv_forward`); the interleaved schedule pairs
/// each steady-state forward with its backward and exchanges after the pair, receiving ahead the
/// inputs of the next pair (`send_forward_backward_recv_forward_backward`), which is what keeps
/// the ring of virtual stages from waiting on itself.
fn with_exchanges(position: StagePosition, order: &Order, paired: bool) -> Vec<Op> {
    let even = position.stage.is_multiple_of(2);
    let slots = slots(&order.computes, order.warmup, paired);
    let mut out = Vec::with_capacity(order.computes.len() * 3);
    let mut owed: Vec<Op> = Vec::new();
    for slot in &slots {
        let mut exchange = std::mem::take(&mut owed);
        exchange.extend(slot.iter().filter_map(|c| receives(position, c)));
        exchange.sort_by_key(|op| exchange_rank(op, even));
        out.extend(exchange);
        out.extend(slot.iter().map(|c| Op::Compute(*c)));
        owed = slot.iter().filter_map(|c| sends(position, c)).collect();
    }
    out.extend(owed);
    out
}

/// Groups computes that share an exchange: with `paired`, each steady-state forward with the
/// backward that follows it (the 1F1B steps after the `warmup` forwards); every other compute
/// alone. A short step whose warm-up covers every forward (Megatron's `all_warmup_microbatches`)
/// has no pairs.
fn slots(order: &[Compute], warmup: usize, paired: bool) -> Vec<Vec<Compute>> {
    let forwards = order.iter().filter(|c| c.forward).count();
    let pairs = if paired { forwards - warmup } else { 0 };
    let mut slots = Vec::with_capacity(order.len());
    slots.extend(order[..warmup].iter().map(|c| vec![*c]));
    let steady_end = warmup + 2 * pairs;
    slots.extend(order[warmup..steady_end].chunks(2).map(<[Compute]>::to_vec));
    slots.extend(order[steady_end..].iter().map(|c| vec![*c]));
    slots
}

#[cfg(test)]
mod tests;
