//! The tensor-parallel region operators: each split computation on N ranks gives the one-rank
//! forward and, per rank, its part of the one-rank gradient.
//!
//! Each test builds the same scalar objective twice: on one rank over the full tensors, and on N
//! ranks as Megatron splits it (every rank backpropagating its local loss; the total loss is the
//! sum of the local ones, or the same on every rank when the result is replicated).

use burn::tensor::Tensor;

use super::{B, assert_close, chunk, flat, fresh, on_ranks, tensor};
use crate::collectives::{
    copy_to_region, gather_from_region, gather_from_sequence_region, reduce_from_region,
    reduce_scatter_to_sequence_region, scatter_to_region,
};

const RANKS: [u32; 2] = [2, 4];

/// Column-parallel linear: `x` replicated through `copy_to_region`, `w` split by columns.
/// One rank: L = Σ (x·w)² ⊙ c.
#[test]
fn copy_to_region_all_reduces_the_input_gradient() {
    let (x_full, w_full, c_full) = (
        tensor([3, 4], 0.1),
        tensor([4, 8], 0.2),
        tensor([3, 8], 0.3),
    );
    let x_ref = x_full.clone().require_grad();
    let w_ref = w_full.clone().require_grad();
    let y_ref = x_ref.clone().matmul(w_ref.clone());
    let grads = (y_ref.clone().powf_scalar(2.0) * c_full.clone())
        .sum()
        .backward();
    let (gx_ref, gw_ref) = (x_ref.grad(&grads).unwrap(), w_ref.grad(&grads).unwrap());
    for n in RANKS {
        let results = on_ranks(n, |comm| {
            let (c_full, w_full, x_full) = (fresh(&c_full), fresh(&w_full), fresh(&x_full));
            let r = comm.rank();
            let x = x_full.clone().require_grad();
            let w = chunk(w_full.clone(), 1, r, n as usize).require_grad();
            let y = copy_to_region(x.clone(), &comm).matmul(w.clone());
            let c = chunk(c_full.clone(), 1, r, n as usize);
            let grads = (y.clone().powf_scalar(2.0) * c).sum().backward();
            (
                flat(y),
                flat(x.grad(&grads).unwrap()),
                flat(w.grad(&grads).unwrap()),
            )
        });
        for (r, (y, gx, gw)) in results.into_iter().enumerate() {
            let n = n as usize;
            assert_close(&y, &flat(chunk(y_ref.clone(), 1, r, n)), "output");
            assert_close(&gx, &flat(gx_ref.clone()), "input grad");
            assert_close(&gw, &flat(chunk(gw_ref.clone(), 1, r, n)), "weight grad");
        }
    }
}

/// Row-parallel linear: `x` split by columns, `w` by rows, partial products summed by
/// `reduce_from_region`. One rank: L = Σ (x·w)² ⊙ c, replicated on every rank.
#[test]
fn reduce_from_region_sums_partial_products_and_passes_the_gradient() {
    let (x_full, w_full, c_full) = (
        tensor([3, 8], 0.4),
        tensor([8, 5], 0.5),
        tensor([3, 5], 0.6),
    );
    let x_ref = x_full.clone().require_grad();
    let y_ref = x_ref.clone().matmul(w_full.clone());
    let grads = (y_ref.clone().powf_scalar(2.0) * c_full.clone())
        .sum()
        .backward();
    let gx_ref = x_ref.grad(&grads).unwrap();
    for n in RANKS {
        let results = on_ranks(n, |comm| {
            let (c_full, w_full, x_full) = (fresh(&c_full), fresh(&w_full), fresh(&x_full));
            let (r, n) = (comm.rank(), n as usize);
            let x = chunk(x_full.clone(), 1, r, n).require_grad();
            let w = chunk(w_full.clone(), 0, r, n);
            let y = reduce_from_region(x.clone().matmul(w), &comm);
            let grads = (y.clone().powf_scalar(2.0) * c_full.clone())
                .sum()
                .backward();
            (flat(y), flat(x.grad(&grads).unwrap()))
        });
        for (r, (y, gx)) in results.into_iter().enumerate() {
            assert_close(&y, &flat(y_ref.clone()), "output");
            assert_close(
                &gx,
                &flat(chunk(gx_ref.clone(), 1, r, n as usize)),
                "input grad",
            );
        }
    }
}

/// One rank: L = Σ x³ ⊙ c over the full tensor; N ranks hold a chunk along `dim`, gather it and
/// compute the same (replicated) L.
#[test]
fn gather_from_region_keeps_the_own_chunk_of_the_gradient() {
    for dim in 0..3 {
        let (x_full, c_full) = (tensor([4, 8, 4], 0.7), tensor([4, 8, 4], 0.8));
        let objective = |x: Tensor<B, 3>, c: Tensor<B, 3>| (x.powf_scalar(3.0) * c).sum();
        let x_ref = x_full.clone().require_grad();
        let grads = objective(x_ref.clone(), c_full.clone()).backward();
        let gx_ref = x_ref.grad(&grads).unwrap();
        for n in RANKS {
            let results = on_ranks(n, |comm| {
                let (c_full, x_full) = (fresh(&c_full), fresh(&x_full));
                let x = chunk(x_full.clone(), dim, comm.rank(), n as usize).require_grad();
                let y = gather_from_region(x.clone(), dim, &comm);
                let grads = objective(y.clone(), c_full).backward();
                (flat(y), flat(x.grad(&grads).unwrap()))
            });
            for (r, (y, gx)) in results.into_iter().enumerate() {
                let what = format!("dim {dim}, {n} ranks");
                assert_close(&y, &flat(x_full.clone()), &what);
                assert_close(&gx, &flat(chunk(gx_ref.clone(), dim, r, n as usize)), &what);
            }
        }
    }
}

/// One rank: L = Σ x³ ⊙ c. N ranks: the replicated `x` scattered, each rank's loss over its
/// chunk; the backward all-gather gives every rank the full gradient.
#[test]
fn scatter_to_region_all_gathers_the_gradient() {
    for dim in 0..3 {
        let (x_full, c_full) = (tensor([4, 4, 8], 0.9), tensor([4, 4, 8], 1.0));
        let x_ref = x_full.clone().require_grad();
        let grads = (x_ref.clone().powf_scalar(3.0) * c_full.clone())
            .sum()
            .backward();
        let gx_ref = x_ref.grad(&grads).unwrap();
        for n in RANKS {
            let results = on_ranks(n, |comm| {
                let (c_full, x_full) = (fresh(&c_full), fresh(&x_full));
                let (r, n) = (comm.rank(), n as usize);
                let x = x_full.clone().require_grad();
                let y = scatter_to_region(x.clone(), dim, &comm);
                let c = chunk(c_full.clone(), dim, r, n);
                let grads = (y.clone().powf_scalar(3.0) * c).sum().backward();
                (flat(y), flat(x.grad(&grads).unwrap()))
            });
            for (r, (y, gx)) in results.into_iter().enumerate() {
                let what = format!("dim {dim}, {n} ranks");
                assert_close(&y, &flat(chunk(x_full.clone(), dim, r, n as usize)), &what);
                assert_close(&gx, &flat(gx_ref.clone()), &what);
            }
        }
    }
}

/// Sequence parallel before a column-parallel layer: `x` split along the sequence (dim 1 of
/// `[batch, seq, hidden]`), gathered, multiplied by this rank's columns of `w`.
/// One rank: L = Σ (x·w)² ⊙ c.
#[test]
fn gather_from_sequence_region_reduce_scatters_the_gradient() {
    let (x_full, w_full, c_full) = (
        tensor([2, 8, 4], 1.1),
        tensor([4, 8], 1.2),
        tensor([2, 8, 8], 1.3),
    );
    let x_ref = x_full.clone().require_grad();
    let w_ref = w_full.clone().require_grad();
    let y_ref = x_ref.clone().matmul(w_ref.clone().unsqueeze::<3>());
    let grads = (y_ref.powf_scalar(2.0) * c_full.clone()).sum().backward();
    let (gx_ref, gw_ref) = (x_ref.grad(&grads).unwrap(), w_ref.grad(&grads).unwrap());
    for n in RANKS {
        let results = on_ranks(n, |comm| {
            let (c_full, w_full, x_full) = (fresh(&c_full), fresh(&w_full), fresh(&x_full));
            let (r, n) = (comm.rank(), n as usize);
            let x = chunk(x_full.clone(), 1, r, n).require_grad();
            let w = chunk(w_full.clone(), 1, r, n).require_grad();
            let gathered = gather_from_sequence_region(x.clone(), 1, &comm);
            let y = gathered.clone().matmul(w.clone().unsqueeze::<3>());
            let c = chunk(c_full.clone(), 2, r, n);
            let grads = (y.powf_scalar(2.0) * c).sum().backward();
            (
                flat(gathered),
                flat(x.grad(&grads).unwrap()),
                flat(w.grad(&grads).unwrap()),
            )
        });
        for (r, (gathered, gx, gw)) in results.into_iter().enumerate() {
            let n = n as usize;
            assert_close(&gathered, &flat(x_full.clone()), "gathered input");
            assert_close(&gx, &flat(chunk(gx_ref.clone(), 1, r, n)), "input grad");
            assert_close(&gw, &flat(chunk(gw_ref.clone(), 1, r, n)), "weight grad");
        }
    }
}

/// Sequence parallel after a row-parallel layer: partial products reduce-scattered along the
/// sequence. One rank: L = Σ (x·w)² ⊙ c.
#[test]
fn reduce_scatter_to_sequence_region_all_gathers_the_gradient() {
    let (x_full, w_full, c_full) = (
        tensor([2, 8, 8], 1.4),
        tensor([8, 3], 1.5),
        tensor([2, 8, 3], 1.6),
    );
    let x_ref = x_full.clone().require_grad();
    let y_ref = x_ref.clone().matmul(w_full.clone().unsqueeze::<3>());
    let grads = (y_ref.clone().powf_scalar(2.0) * c_full.clone())
        .sum()
        .backward();
    let gx_ref = x_ref.grad(&grads).unwrap();
    for n in RANKS {
        let results = on_ranks(n, |comm| {
            let (c_full, w_full, x_full) = (fresh(&c_full), fresh(&w_full), fresh(&x_full));
            let (r, n) = (comm.rank(), n as usize);
            let x = chunk(x_full.clone(), 2, r, n).require_grad();
            let w = chunk(w_full.clone(), 0, r, n);
            let y =
                reduce_scatter_to_sequence_region(x.clone().matmul(w.unsqueeze::<3>()), 1, &comm);
            let c = chunk(c_full.clone(), 1, r, n);
            let grads = (y.clone().powf_scalar(2.0) * c).sum().backward();
            (flat(y), flat(x.grad(&grads).unwrap()))
        });
        for (r, (y, gx)) in results.into_iter().enumerate() {
            let n = n as usize;
            assert_close(&y, &flat(chunk(y_ref.clone(), 1, r, n)), "output");
            assert_close(&gx, &flat(chunk(gx_ref.clone(), 2, r, n)), "input grad");
        }
    }
}

/// Along the last and the first dim too, on a 4-D tensor (any rank, any dim).
#[test]
fn sequence_ops_work_along_any_dim_of_any_rank() {
    for dim in 0..4 {
        let x_full = tensor([4, 4, 8, 4], 1.7);
        for n in RANKS {
            let results = on_ranks(n, |comm| {
                let x_full = fresh(&x_full);
                let (r, n) = (comm.rank(), n as usize);
                let mine = chunk(x_full.clone(), dim, r, n);
                let gathered = gather_from_sequence_region(mine, dim, &comm);
                // Every rank contributes (rank + 1) × x: the sum is n(n+1)/2 × x.
                let scaled = x_full.clone() * (r as f32 + 1.0);
                let reduced = reduce_scatter_to_sequence_region(scaled, dim, &comm);
                (flat(gathered), flat(reduced))
            });
            for (r, (gathered, reduced)) in results.into_iter().enumerate() {
                let (nn, what) = (n as usize, format!("dim {dim}, {n} ranks"));
                assert_close(&gathered, &flat(x_full.clone()), &what);
                let factor = (nn * (nn + 1) / 2) as f32;
                assert_close(
                    &reduced,
                    &flat(chunk(x_full.clone(), dim, r, nn) * factor),
                    &what,
                );
            }
        }
    }
}

/// Under a checkpointing strategy the memory-bound ops around a collective are recomputed in
/// the backward pass, the collective itself never (it is compute-bound): the gradients match
/// the ones without checkpointing.
#[test]
fn balanced_checkpointing_does_not_recompute_collectives() {
    use burn::backend::Autodiff;
    use burn::backend::Flex;
    use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
    type Checkpointed = Autodiff<Flex, BalancedCheckpointing>;

    let x_full = tensor([2, 8, 4], 2.1);
    let results = on_ranks(2, |comm| {
        let r = comm.rank();
        let data = chunk(x_full.clone(), 1, r, 2).to_data();
        let plain = Tensor::<B, 3>::from_data(data.clone(), &Default::default()).require_grad();
        let y = gather_from_sequence_region(plain.clone().exp(), 1, &comm).tanh();
        let g_plain = plain.grad(&(y.clone() * y).sum().backward()).unwrap();
        let ckpt = Tensor::<Checkpointed, 3>::from_data(data, &Default::default()).require_grad();
        let y = gather_from_sequence_region(ckpt.clone().exp(), 1, &comm).tanh();
        let g_ckpt = ckpt.grad(&(y.clone() * y).sum().backward()).unwrap();
        (flat(g_plain), flat(g_ckpt))
    });
    for (plain, ckpt) in results {
        assert_close(&ckpt, &plain, "checkpointed gradient");
    }
}
