//! Uneven all-to-all of rows (MoE dispatch), the detached all-reduce, the u64 paths of
//! `DynComm`, and what a failing collective reports.

use std::time::Duration;

use burn::tensor::{Tensor, TensorData};
use ferrotron_dist::{CommError, Communicator, World};

use super::{B, assert_close, flat, on_ranks, values};
use crate::collectives::{
    all_reduce_detached, all_to_all_counts, all_to_all_rows, scatter_to_region,
};
use crate::{Comm, ReduceOp};

const COLS: usize = 3;

/// Rows rank `s` sends to rank `d`: uneven, with zeros.
fn count(s: usize, d: usize) -> usize {
    (s * 3 + d * 5) % 4
}

fn rows_of(s: usize, n: usize) -> Vec<f32> {
    let rows: usize = (0..n).map(|d| count(s, d)).sum();
    values(&[rows, COLS], s as f32)
}

/// Rank `d`'s loss is (d + 1)·Σ y²; a row of rank `s` sent to `d` has gradient 2(d + 1)·x.
#[test]
fn all_to_all_rows_exchanges_uneven_rows_and_returns_their_gradients() {
    for n in [2u32, 4] {
        let n = n as usize;
        let results = on_ranks(n as u32, |comm| {
            let r = comm.rank();
            let send: Vec<usize> = (0..n).map(|d| count(r, d)).collect();
            let recv = all_to_all_counts(&send, &comm).unwrap_or_else(|err| panic!("{err}"));
            let mine = rows_of(r, n);
            let x: Tensor<B, 2> = Tensor::<B, 2>::from_data(
                TensorData::new(mine.clone(), [mine.len() / COLS, COLS]),
                &Default::default(),
            )
            .require_grad();
            let y = all_to_all_rows(x.clone(), &send, &recv, &comm);
            let grads = (y.clone().powf_scalar(2.0) * (r as f32 + 1.0))
                .sum()
                .backward();
            (recv, flat(y), flat(x.grad(&grads).unwrap()))
        });
        for (d, (recv, y, gx)) in results.iter().enumerate() {
            let expect_recv: Vec<usize> = (0..n).map(|s| count(s, d)).collect();
            assert_eq!(*recv, expect_recv, "{n} ranks, rank {d}");
            let mut expect_y = Vec::new();
            for s in 0..n {
                let start: usize = (0..d).map(|e| count(s, e)).sum();
                let rows = rows_of(s, n);
                expect_y.extend_from_slice(&rows[start * COLS..(start + count(s, d)) * COLS]);
            }
            assert_close(y, &expect_y, "received rows");
            let mut expect_g = Vec::new();
            for dest in 0..n {
                let start: usize = (0..dest).map(|e| count(d, e)).sum();
                let rows = rows_of(d, n);
                let sent = &rows[start * COLS..(start + count(d, dest)) * COLS];
                expect_g.extend(sent.iter().map(|x| 2.0 * (dest as f32 + 1.0) * x));
            }
            assert_close(gx, &expect_g, "row gradients");
        }
    }
}

#[test]
fn all_reduce_detached_reduces_and_carries_no_gradient() {
    for n in [2u32, 4] {
        let results = on_ranks(n, |comm| {
            let r = comm.rank();
            let x: Tensor<B, 2> = super::tensor([2, 3], r as f32).require_grad();
            let sum = all_reduce_detached(x.clone(), ReduceOp::Sum, &comm);
            let max = all_reduce_detached(x.clone(), ReduceOp::Max, &comm);
            assert!(!sum.is_require_grad() && !max.is_require_grad());
            let grads = (x.clone() * sum.clone()).sum().backward();
            (flat(sum), flat(max), flat(x.grad(&grads).unwrap()))
        });
        let per_rank: Vec<Vec<f32>> = (0..n).map(|r| values(&[2, 3], r as f32)).collect();
        let expect_sum: Vec<f32> = (0..6)
            .map(|i| per_rank.iter().map(|v| v[i]).sum())
            .collect();
        let expect_max: Vec<f32> = (0..6)
            .map(|i| per_rank.iter().map(|v| v[i]).fold(f32::MIN, f32::max))
            .collect();
        for (sum, max, gx) in results {
            assert_close(&sum, &expect_sum, "sum");
            assert_close(&max, &expect_max, "max");
            // d/dx Σ x·s with s detached is s: the reduction is not differentiated.
            assert_close(&gx, &expect_sum, "gradient");
        }
    }
}

#[test]
fn u64_collectives_are_exact_beyond_the_signed_range() {
    let results = on_ranks(2, |comm: Comm| {
        let r = comm.rank() as u64;
        let mut max = [u64::MAX - r, r];
        comm.all_reduce_u64(&mut max, ReduceOp::Max)?;
        let mut sum = [u64::MAX, 5 + r];
        comm.all_reduce_u64(&mut sum, ReduceOp::Sum)?;
        let mut gathered = [0u64; 2];
        comm.all_gather_u64(&[u64::MAX - 1 + r], &mut gathered)?;
        let mut shared = [r + (1 << 63)];
        comm.broadcast_u64(&mut shared, 1)?;
        let peer = 1 - comm.rank();
        comm.send_u64(&[u64::MAX - r], peer)?;
        let mut got = [0u64];
        comm.recv_u64(&mut got, peer)?;
        Ok::<_, CommError>((max, sum, gathered, shared, got))
    });
    for (r, result) in results.into_iter().enumerate() {
        let (max, sum, gathered, shared, got) = result.unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(max, [u64::MAX, 1]);
        assert_eq!(sum, [u64::MAX.wrapping_add(u64::MAX), 11]);
        assert_eq!(gathered, [u64::MAX - 1, u64::MAX]);
        assert_eq!(shared, [1 + (1 << 63)]);
        assert_eq!(got, [u64::MAX - (1 - r as u64)]);
    }
}

#[test]
fn a_bad_split_panics_naming_the_group_and_the_world_reports_the_rank() {
    let err = World::new(2)
        .with_timeout(Duration::from_secs(20))
        .run(|ctx| {
            let comm: Comm = std::sync::Arc::new(ctx.world().new_group("tp", &[0, 1])?);
            let x: Tensor<B, 2> = super::tensor([3, 2], 0.0);
            let _ = scatter_to_region(x, 0, &comm);
            Ok::<_, CommError>(())
        })
        .expect_err("3 rows cannot be split over 2 ranks");
    let message = err.to_string();
    assert!(message.contains("panicked"), "{message}");
    assert!(
        message.contains("tp[0,1]") && message.contains("not divisible"),
        "{message}"
    );
}
