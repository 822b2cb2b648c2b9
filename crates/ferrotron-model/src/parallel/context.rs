//! Context parallelism's sequence split. Causal attention makes late tokens cost more than early
//! ones, so Megatron cuts the sequence into 2·cp chunks and gives rank r chunks r and 2cp−1−r:
//! every rank then does the same amount of attention work. The model needs the same mapping to
//! know each local token's global position (position embeddings, RoPE, the causal mask).

use burn::tensor::backend::Backend;
use burn::tensor::{BasicOps, Int, Tensor, TensorKind};

use crate::ModelError;

/// Global positions of the tokens cp rank `cp_rank` of `cp_size` holds of a `seq`-token
/// sequence, in local order.
pub fn context_parallel_positions(
    seq: usize,
    cp_rank: usize,
    cp_size: usize,
) -> Result<Vec<usize>, ModelError> {
    check(seq, cp_rank, cp_size)?;
    if cp_size == 1 {
        return Ok((0..seq).collect());
    }
    let chunk = seq / (2 * cp_size);
    let first = cp_rank * chunk;
    let second = (2 * cp_size - 1 - cp_rank) * chunk;
    Ok((first..first + chunk)
        .chain(second..second + chunk)
        .collect())
}

/// This cp rank's part of `x` (`[batch, seq]`: tokens, labels or a loss mask), along dim 1.
pub fn context_parallel_slice<B: Backend, K: TensorKind<B> + BasicOps<B>>(
    x: Tensor<B, 2, K>,
    cp_rank: usize,
    cp_size: usize,
) -> Result<Tensor<B, 2, K>, ModelError> {
    let [_, seq] = x.dims();
    check(seq, cp_rank, cp_size)?;
    if cp_size == 1 {
        return Ok(x);
    }
    let chunk = seq / (2 * cp_size);
    let first = cp_rank * chunk;
    let second = (2 * cp_size - 1 - cp_rank) * chunk;
    Ok(Tensor::cat(
        vec![
            x.clone().slice_dim(1, first..first + chunk),
            x.slice_dim(1, second..second + chunk),
        ],
        1,
    ))
}

/// Token ids and their labels, both `[batch, seq]`.
pub type TokensAndLabels<B> = (Tensor<B, 2, Int>, Tensor<B, 2, Int>);

/// A microbatch's tokens and labels (`[batch, seq]`) cut for cp rank `cp_rank` of `cp_size`.
pub fn split_for_context_parallel<B: Backend>(
    tokens: Tensor<B, 2, Int>,
    labels: Tensor<B, 2, Int>,
    cp_rank: usize,
    cp_size: usize,
) -> Result<TokensAndLabels<B>, ModelError> {
    Ok((
        context_parallel_slice(tokens, cp_rank, cp_size)?,
        context_parallel_slice(labels, cp_rank, cp_size)?,
    ))
}

fn check(seq: usize, cp_rank: usize, cp_size: usize) -> Result<(), ModelError> {
    if cp_size == 0 || cp_rank >= cp_size {
        return Err(ModelError::Layout(format!(
            "context-parallel rank {cp_rank} is outside a group of {cp_size}"
        )));
    }
    if cp_size > 1 && !seq.is_multiple_of(2 * cp_size) {
        return Err(ModelError::Layout(format!(
            "context parallelism over {cp_size} ranks cuts the sequence into {} chunks; {seq} tokens do not divide evenly",
            2 * cp_size
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{Cpu, tokens, values};

    #[test]
    fn ranks_hold_mirrored_chunks_and_cover_the_sequence_once() {
        assert_eq!(
            context_parallel_positions(8, 0, 2).unwrap(),
            vec![0, 1, 6, 7]
        );
        assert_eq!(
            context_parallel_positions(8, 1, 2).unwrap(),
            vec![2, 3, 4, 5]
        );
        let mut all: Vec<usize> = (0..4)
            .flat_map(|rank| context_parallel_positions(16, rank, 4).unwrap())
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..16).collect::<Vec<_>>());
    }

    #[test]
    fn tensors_are_cut_like_the_positions() {
        let row: Vec<u32> = (10..18).collect();
        let (t, l) =
            split_for_context_parallel::<Cpu>(tokens(&[&row, &row]), tokens(&[&row, &row]), 1, 2)
                .unwrap();
        assert_eq!(t.dims(), [2, 4]);
        let ids: Vec<i64> = t.into_data().iter::<i64>().collect();
        assert_eq!(&ids[..4], &[12, 13, 14, 15]);
        assert_eq!(values(l.float())[4..], [12.0, 13.0, 14.0, 15.0]);
    }

    #[test]
    fn uneven_sequences_are_refused() {
        let error = context_parallel_positions(10, 0, 2).unwrap_err();
        assert!(error.to_string().contains("4 chunks"), "{error}");
        assert!(context_parallel_positions(8, 2, 2).is_err());
    }
}
