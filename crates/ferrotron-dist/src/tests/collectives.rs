//! Every collective on 1, 2, 3 and 4 ranks against values computed by hand.

use std::sync::atomic::{AtomicUsize, Ordering};

use half::bf16;

use super::on_ranks;
use crate::{CommError, Communicator, ReduceOp};

const SIZES: [u32; 4] = [1, 2, 3, 4];

#[test]
fn all_reduce_sums_and_maxes_every_element_type() {
    for n in SIZES {
        // 7 elements: not a multiple of 2, 3 or 4, so the reduce chunks are uneven.
        let results = on_ranks(n, |ctx| {
            let r = ctx.rank();
            let comm = ctx.world();
            let mut f = (0..7).map(|i| (r * 10 + i) as f32).collect::<Vec<_>>();
            comm.all_reduce(&mut f, ReduceOp::Sum)?;
            let mut m = (0..7).map(|i| (r as i64 - 2) * i).collect::<Vec<_>>();
            comm.all_reduce(&mut m, ReduceOp::Max)?;
            let mut b = vec![bf16::from_f32(r as f32 + 0.5); 3];
            comm.all_reduce(&mut b, ReduceOp::Sum)?;
            let mut empty: Vec<u32> = Vec::new();
            comm.all_reduce(&mut empty, ReduceOp::Sum)?;
            Ok((f, m, b))
        });
        let ranks: Vec<i64> = (0..n as i64).collect();
        for (f, m, b) in results {
            let expect_f: Vec<f32> = (0..7)
                .map(|i| ranks.iter().map(|&r| (r * 10 + i) as f32).sum())
                .collect();
            assert_eq!(f, expect_f, "{n} ranks");
            let expect_m: Vec<i64> = (0..7).map(|i| (n as i64 - 3) * i).collect();
            assert_eq!(m, expect_m, "{n} ranks");
            let expect_b: f32 = ranks.iter().map(|&r| r as f32 + 0.5).sum();
            assert!(b.iter().all(|x| x.to_f32() == expect_b), "{n} ranks: {b:?}");
        }
    }
}

#[test]
fn all_gather_concatenates_in_rank_order() {
    for n in SIZES {
        let results = on_ranks(n, |ctx| {
            let r = ctx.rank();
            let mut out = vec![0u32; 3 * n as usize];
            ctx.world().all_gather(&[r, r + 100, r + 200], &mut out)?;
            Ok(out)
        });
        let expect: Vec<u32> = (0..n).flat_map(|r| [r, r + 100, r + 200]).collect();
        assert!(results.iter().all(|out| *out == expect), "{n} ranks");
    }
}

#[test]
fn reduce_scatter_gives_each_rank_its_reduced_chunk() {
    for n in SIZES {
        let results = on_ranks(n, |ctx| {
            let r = ctx.rank() as f64;
            let input: Vec<f64> = (0..2 * n).map(|i| r * 100.0 + f64::from(i)).collect();
            let mut sum = [0.0; 2];
            ctx.world()
                .reduce_scatter(&input, &mut sum, ReduceOp::Sum)?;
            let mut max = [0.0; 2];
            ctx.world()
                .reduce_scatter(&input, &mut max, ReduceOp::Max)?;
            Ok((sum, max))
        });
        let rank_sum: f64 = (0..n).map(|r| f64::from(r) * 100.0).sum();
        for (me, (sum, max)) in results.iter().enumerate() {
            for k in 0..2 {
                let i = (2 * me + k) as f64;
                assert_eq!(sum[k], rank_sum + f64::from(n) * i, "{n} ranks, rank {me}");
                assert_eq!(max[k], f64::from(n - 1) * 100.0 + i, "{n} ranks, rank {me}");
            }
        }
    }
}

#[test]
fn broadcast_copies_the_root_buffer_from_every_root() {
    for n in SIZES {
        for root in 0..n as usize {
            let results = on_ranks(n, |ctx| {
                let mut buf = vec![ctx.rank() as i32; 5];
                ctx.world().broadcast(&mut buf, root)?;
                Ok(buf)
            });
            assert!(
                results.iter().all(|b| *b == vec![root as i32; 5]),
                "{n} ranks"
            );
        }
    }
}

#[test]
fn send_and_recv_keep_the_order_of_each_pair() {
    for n in SIZES {
        // A ring: every rank sends three messages to the next one and receives three from the
        // previous one; they must come out in the order sent.
        let results = on_ranks(n, |ctx| {
            let comm = ctx.world();
            let (me, size) = (comm.rank(), comm.size());
            let (next, previous) = ((me + 1) % size, (me + size - 1) % size);
            for message in 0..3u32 {
                comm.send(&[me as u32, message], next)?;
            }
            let mut got = Vec::new();
            for _ in 0..3 {
                let mut buf = [0u32; 2];
                comm.recv(&mut buf, previous)?;
                got.push(buf);
            }
            Ok((previous as u32, got))
        });
        for (previous, got) in results {
            assert_eq!(got, vec![[previous, 0], [previous, 1], [previous, 2]]);
        }
    }
}

#[test]
fn recv_rejects_a_message_of_another_shape() {
    let results = on_ranks(2, |ctx| {
        let comm = ctx.world();
        if comm.rank() == 0 {
            comm.send(&[1.0f32, 2.0], 1)?;
            Ok(String::new())
        } else {
            let mut buf = [0.0f32; 3];
            Ok(comm
                .recv(&mut buf, 0)
                .expect_err("wrong length")
                .to_string())
        }
    });
    assert_eq!(
        results[1],
        "recv on group world[0,1]: rank 0 sent f32 × 2, rank 1 expected f32 × 3"
    );
}

#[test]
fn all_to_all_moves_uneven_splits() {
    for n in SIZES {
        let results = on_ranks(n, |ctx| {
            let (me, size) = (ctx.world().rank(), ctx.world().size());
            // Rank s sends (s + d) % 3 elements to rank d, each tagged 1000·s + 10·d + k.
            let count = |s: usize, d: usize| (s + d) % 3;
            let send_counts: Vec<usize> = (0..size).map(|d| count(me, d)).collect();
            let recv_counts: Vec<usize> = (0..size).map(|s| count(s, me)).collect();
            let input: Vec<i64> = (0..size)
                .flat_map(|d| (0..count(me, d)).map(move |k| (1000 * me + 10 * d + k) as i64))
                .collect();
            let mut output = vec![-1i64; recv_counts.iter().sum()];
            ctx.world()
                .all_to_all(&input, &send_counts, &mut output, &recv_counts)?;
            let expect: Vec<i64> = (0..size)
                .flat_map(|s| (0..count(s, me)).map(move |k| (1000 * s + 10 * me + k) as i64))
                .collect();
            Ok((output, expect))
        });
        for (output, expect) in results {
            assert_eq!(output, expect, "{n} ranks");
        }
    }
}

#[test]
fn all_to_all_reports_counts_that_do_not_agree() {
    let errors = on_ranks(2, |ctx| {
        let me = ctx.world().rank();
        // Rank 0 sends 2 elements to rank 1, which expects 1.
        let (send, recv) = if me == 0 {
            (vec![1, 2], vec![1, 1])
        } else {
            (vec![1, 1], vec![1, 1])
        };
        let input = vec![0u32; send.iter().sum()];
        let mut output = vec![0u32; recv.iter().sum()];
        let result = ctx.world().all_to_all(&input, &send, &mut output, &recv);
        Ok(result.err().map(|e| e.to_string()))
    });
    assert_eq!(
        errors[1].as_deref(),
        Some("all_to_all on group world[0,1]: rank 0 sends 2 elements to rank 1, which expects 1")
    );
}

#[test]
fn barrier_lets_no_rank_through_before_all_arrive() {
    for n in SIZES {
        let arrived = AtomicUsize::new(0);
        let seen = on_ranks(n, |ctx| {
            std::thread::sleep(std::time::Duration::from_millis(u64::from(ctx.rank()) * 5));
            arrived.fetch_add(1, Ordering::SeqCst);
            ctx.world().barrier()?;
            Ok(arrived.load(Ordering::SeqCst))
        });
        assert!(seen.iter().all(|&count| count == n as usize), "{n} ranks");
    }
}

#[test]
fn different_collectives_on_one_group_are_a_mismatch_error() {
    let errors = on_ranks(2, |ctx| {
        let mut buf = [1.0f32; 4];
        let result = if ctx.rank() == 0 {
            ctx.world().all_reduce(&mut buf, ReduceOp::Sum)
        } else {
            ctx.world().broadcast(&mut buf, 0)
        };
        Ok(result.expect_err("mismatch").to_string())
    });
    assert_eq!(
        errors[0],
        "collective mismatch on group world[0,1]: rank 0 called all_reduce(f32 × 4, sum) \
         but rank 1 called broadcast(f32 × 4, root 0)"
    );
    assert_eq!(errors[0], errors[1]);
}

#[test]
fn bad_sizes_and_groups_are_errors() {
    let errors = on_ranks(2, |ctx| {
        let comm = ctx.world();
        let mut short = [0.0f32; 3];
        let gather = comm.all_gather(&[1.0f32, 2.0], &mut short);
        let root = comm.broadcast(&mut short, 5);
        let outsider = comm.new_group("tp", &[1 - ctx.rank()]);
        let twice = comm.new_group("tp", &[0, 0, 1]);
        Ok([gather.err(), root.err(), outsider.err(), twice.err()]
            .map(|e: Option<CommError>| e.map(|e| e.to_string()).unwrap_or_default()))
    });
    assert_eq!(
        errors[0],
        [
            "all_gather on group world[0,1]: output holds 3 elements, 2 ranks × 2 needed",
            "broadcast on group world[0,1]: rank 5 is outside a group of 2",
            "rank 0 is not a member of group tp[1]",
            "new_group on group tp[0,0,1]: rank 0 is listed twice",
        ]
    );
}
