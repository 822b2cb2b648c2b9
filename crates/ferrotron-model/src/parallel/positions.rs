//! Where a rank's tokens sit in the global sequence. With context parallelism a rank holds two
//! non-adjacent chunks, so position embeddings, RoPE and the causal mask must all use global
//! positions; on one rank they are `0..seq` and the cheap paths (a table slice, the fused causal
//! attention) are kept, so the one-rank arithmetic is unchanged.

use std::ops::Range;

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor, TensorData};

use super::context_parallel_positions;
use crate::ModelError;

#[derive(Debug, Clone)]
pub struct SequencePositions<B: Backend> {
    /// Tokens this cp rank holds.
    len: usize,
    /// Their global positions, `[len]`; `None` when they are `0..len`.
    global: Option<Tensor<B, 1, Int>>,
    /// `[len, len·cp]`: true where a key gathered from every cp rank (in rank order) lies in the
    /// query's future; `None` for plain causal attention.
    future: Option<Tensor<B, 2, Bool>>,
    /// The global positions of the keys gathered from every cp rank, `[len·cp]`, in rank order.
    keys: Option<Tensor<B, 1, Int>>,
}

impl<B: Backend> SequencePositions<B> {
    /// Positions of the `len` tokens cp rank `cp_rank` of `cp_size` holds.
    pub fn new(
        len: usize,
        cp_rank: usize,
        cp_size: usize,
        device: &B::Device,
    ) -> Result<Self, ModelError> {
        if cp_size == 1 {
            return Ok(SequencePositions {
                len,
                global: None,
                future: None,
                keys: None,
            });
        }
        let seq = len * cp_size;
        let queries = context_parallel_positions(seq, cp_rank, cp_size)?;
        let mut keys = Vec::with_capacity(seq);
        for rank in 0..cp_size {
            keys.extend(context_parallel_positions(seq, rank, cp_size)?);
        }
        let future: Vec<bool> = queries
            .iter()
            .flat_map(|&q| keys.iter().map(move |&k| k > q))
            .collect();
        let ids: Vec<i64> = queries.iter().map(|&p| p as i64).collect();
        let keys: Vec<i64> = keys.iter().map(|&p| p as i64).collect();
        Ok(SequencePositions {
            len,
            global: Some(Tensor::from_data(TensorData::new(ids, [len]), device)),
            future: Some(Tensor::from_data(
                TensorData::new(future, [len, seq]),
                device,
            )),
            keys: Some(Tensor::from_data(TensorData::new(keys, [seq]), device)),
        })
    }

    /// Tokens this rank holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The highest global position plus one.
    pub fn extent(&self) -> usize {
        match &self.future {
            Some(future) => future.dims()[1],
            None => self.len,
        }
    }

    /// Rows of a `[positions, d]` table for local tokens `range`.
    pub fn rows(&self, table: Tensor<B, 2>, range: Range<usize>) -> Tensor<B, 2> {
        match &self.global {
            Some(global) => table.select(0, global.clone().slice_dim(0, range)),
            None => table.slice_dim(0, range),
        }
    }

    /// The mask for attention over keys gathered from every cp rank, `None` for plain causal.
    pub fn future(&self) -> Option<&Tensor<B, 2, Bool>> {
        self.future.as_ref()
    }

    /// The keys gathered from every cp rank each query does not see, `[len, len·cp]` (true:
    /// hidden): its future and, with a sliding `window` (the left size), every key more than
    /// `window` positions behind it. `None` for plain causal attention (one cp rank).
    pub fn hidden_keys(&self, window: Option<usize>) -> Option<Tensor<B, 2, Bool>> {
        let (Some(future), Some(queries), Some(keys)) = (&self.future, &self.global, &self.keys)
        else {
            return None;
        };
        let Some(left) = window else {
            return Some(future.clone());
        };
        let shape = future.dims();
        let queries = queries.clone().unsqueeze_dim::<2>(1).expand(shape);
        let keys = keys.clone().unsqueeze_dim::<2>(0).expand(shape);
        let behind = (keys + left as i64).lower(queries);
        Some(future.clone().bool_or(behind))
    }
}
