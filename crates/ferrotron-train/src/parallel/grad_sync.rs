//! Gradient synchronisation after the last microbatch, in Megatron's order of concerns:
//! sequence-parallel partial gradients (norms, row-parallel biases, router) summed over tp, the
//! tied embedding summed between first and last stage, then every gradient averaged over the
//! ranks that hold the same parameter — dense over dp×cp, expert over expert-dp — bucket by
//! bucket, all-reduced (plain optimizer) or reduce-scattered into this rank's shard (distributed
//! optimizer). Averaging the per-rank means (each rank's loss already divided by its own
//! microbatch count) gives exactly the one-rank mean over the global batch.

use std::collections::HashMap;

use burn::module::ParamId;
use ferrotron_parallel::{Comm, ReduceOp};

use super::flat::FlatLayout;
use crate::TrainError;
use crate::error::comm_error;

/// A flat gradient buffer and, per slot, whether any rank produced a gradient for it (a
/// parameter without one — an expert no token reached — is skipped by the optimizer, as on one
/// rank).
#[derive(Debug, Clone)]
pub(super) struct GradBuffer {
    pub values: Vec<f32>,
    pub has_grad: Vec<f32>,
}

/// Copy the chunks' gradients into `layout`'s buffer (missing ones stay zero).
pub(super) fn fill(layout: &FlatLayout, grads: &[HashMap<ParamId, Vec<f32>>]) -> GradBuffer {
    let mut values = vec![0.0; layout.len];
    let mut has_grad = vec![0.0; layout.slots.len()];
    for (i, slot) in layout.slots.iter().enumerate() {
        if let Some(grad) = grads[slot.chunk].get(&slot.id) {
            values[slot.range()].copy_from_slice(grad);
            has_grad[i] = 1.0;
        }
    }
    GradBuffer { values, has_grad }
}

/// All-reduce (sum) the slots selected by `pick` over `comm`, packed into one message.
fn reduce_slots(
    comm: &Comm,
    layout: &FlatLayout,
    buffer: &mut GradBuffer,
    pick: impl Fn(&super::flat::Slot) -> bool,
    what: &'static str,
) -> Result<(), TrainError> {
    if comm.size() == 1 {
        return Ok(());
    }
    let picked: Vec<usize> = (0..layout.slots.len())
        .filter(|&i| pick(&layout.slots[i]))
        .collect();
    if picked.is_empty() {
        return Ok(());
    }
    let mut packed = Vec::new();
    for &i in &picked {
        packed.extend_from_slice(&buffer.values[layout.slots[i].range()]);
    }
    comm.all_reduce_f32(&mut packed, ReduceOp::Sum)
        .map_err(|e| comm_error(what, e))?;
    let mut flags: Vec<f32> = picked.iter().map(|&i| buffer.has_grad[i]).collect();
    comm.all_reduce_f32(&mut flags, ReduceOp::Max)
        .map_err(|e| comm_error(what, e))?;
    let mut at = 0;
    for (&i, flag) in picked.iter().zip(flags) {
        let range = layout.slots[i].range();
        let len = range.len();
        buffer.values[range].copy_from_slice(&packed[at..at + len]);
        buffer.has_grad[i] = flag;
        at += len;
    }
    Ok(())
}

/// Sum the sequence-parallel partial gradients over tp.
pub(super) fn reduce_tp_partial(
    tp: &Comm,
    layout: &FlatLayout,
    buffer: &mut GradBuffer,
) -> Result<(), TrainError> {
    reduce_slots(
        tp,
        layout,
        buffer,
        |slot| slot.role.tp_partial,
        "tensor-parallel gradient all-reduce",
    )
}

/// Sum the tied word embedding's gradient between the first and the last stage.
pub(super) fn reduce_tied_embedding(
    embedding: Option<&Comm>,
    layout: &FlatLayout,
    buffer: &mut GradBuffer,
) -> Result<(), TrainError> {
    let Some(comm) = embedding else {
        return Ok(());
    };
    reduce_slots(
        comm,
        layout,
        buffer,
        |slot| slot.role.tied_embedding,
        "embedding-group gradient all-reduce",
    )
}

/// Sum over the data-parallel group `comm` and divide by `data_ranks`: in place, bucket by
/// bucket (`shard` false), or into this rank's shard (`shard` true; the result is the
/// concatenation of its bucket parts). The has-grad flags are combined (max) over the group.
///
/// `data_ranks` is the number of data × context ranks for both kinds of parameters: a dense
/// gradient is a mean of that many per-rank means; an expert, reduced over the smaller
/// expert-data group, has already seen the tokens of its expert-parallel peers' data through the
/// all-to-all, so its sum also covers every data rank (Megatron's
/// `expert_gradient_scaling_factor`).
pub(super) fn average(
    comm: &Comm,
    layout: &FlatLayout,
    buffer: &mut GradBuffer,
    shard: bool,
    data_ranks: usize,
) -> Result<Option<Vec<f32>>, TrainError> {
    let size = comm.size();
    let what = "data-parallel gradient reduction";
    if size > 1 && !buffer.has_grad.is_empty() {
        comm.all_reduce_f32(&mut buffer.has_grad, ReduceOp::Max)
            .map_err(|e| comm_error(what, e))?;
    }
    let scale = 1.0 / data_ranks as f32;
    let rescale = data_ranks > 1;
    if !shard {
        for bucket in &layout.buckets {
            let values = &mut buffer.values[bucket.clone()];
            if size > 1 {
                comm.all_reduce_f32(values, ReduceOp::Sum)
                    .map_err(|e| comm_error(what, e))?;
            }
            if rescale {
                values.iter_mut().for_each(|v| *v *= scale);
            }
        }
        return Ok(None);
    }
    let mut out = Vec::with_capacity(layout.shard_len());
    for (b, bucket) in layout.buckets.iter().enumerate() {
        let part = layout.shard_of(b);
        let mut mine = if size == 1 {
            buffer.values[part].to_vec()
        } else {
            let mut mine = vec![0.0; part.len()];
            comm.reduce_scatter_f32(&buffer.values[bucket.clone()], &mut mine, ReduceOp::Sum)
                .map_err(|e| comm_error(what, e))?;
            mine
        };
        if rescale {
            mine.iter_mut().for_each(|v| *v *= scale);
        }
        out.extend_from_slice(&mine);
    }
    Ok(Some(out))
}
