//! The recording communicator and the replay of the ranks' logs: recording changes no result
//! and logs every call in issue order; orders a thread world finishes but NCCL would hang on,
//! and calls that do not match, are found and named.

use super::on_ranks;
use crate::{
    Call, CallLogs, Communicator, DType, GroupLabel, Op, OrderError, ReduceOp, deferred, replay,
};

#[test]
fn recording_changes_no_result_and_logs_every_call_in_issue_order() {
    let logs = CallLogs::new(2);
    let results = on_ranks(2, |ctx| {
        let r = ctx.rank();
        let world = ctx.recorded_world(&logs);
        let tp = world.new_group("tp", &[0, 1])?;
        let mut sum = vec![r as f32 + 1.0; 3];
        tp.all_reduce(&mut sum, ReduceOp::Sum)?;
        let mut gathered = vec![0u32; 4];
        tp.all_gather(&[r, r + 10], &mut gathered)?;
        let mut scattered = vec![0.0f64; 1];
        tp.reduce_scatter(&[1.0, 2.0], &mut scattered, ReduceOp::Max)?;
        let mut broadcast = vec![r as i64; 2];
        tp.broadcast(&mut broadcast, 1)?;
        let mut received = vec![0.0f32; 2];
        if r == 0 {
            tp.send(&[7.0f32, 8.0], 1)?;
            tp.recv(&mut received, 1)?;
        } else {
            tp.recv(&mut received, 0)?;
            tp.send(&[5.0f32, 6.0], 0)?;
        }
        let mut exchanged = vec![0i32; 2];
        tp.all_to_all(&[r as i32; 2], &[1, 1], &mut exchanged, &[1, 1])?;
        let mut bucket = vec![1.0f32; 2];
        deferred(|| tp.all_reduce(&mut bucket, ReduceOp::Sum))?;
        tp.barrier()?;
        Ok((
            sum, gathered, scattered, broadcast, received, exchanged, bucket,
        ))
    });
    assert_eq!(results[0].0, vec![3.0; 3]);
    assert_eq!(results[1].1, vec![0, 10, 1, 11]);
    assert_eq!(results[1].2, vec![2.0]);
    assert_eq!(results[0].3, vec![1, 1]);
    assert_eq!(
        (&results[0].4, &results[1].4),
        (&vec![5.0, 6.0], &vec![7.0, 8.0])
    );
    assert_eq!(results[0].5, vec![0, 1]);
    assert_eq!(results[1].6, vec![2.0; 2]);

    let logs = logs.calls();
    let lines: Vec<String> = logs[0].iter().map(Call::to_string).collect();
    assert_eq!(
        lines,
        [
            "new_group() on tp[0,1]",
            "all_reduce(f32 × 3, sum) on tp[0,1]",
            "all_gather(u32 × 2) on tp[0,1]",
            "reduce_scatter(f64 × 2, max) on tp[0,1]",
            "broadcast(i64 × 2, root 1) on tp[0,1]",
            "send(f32 × 2 to rank 1) on tp[0,1]",
            "recv(f32 × 2 from rank 1) on tp[0,1]",
            "all_to_all(i32 × 2, send [1, 1], recv [1, 1]) on tp[0,1]",
            "deferred all_reduce(f32 × 2, sum) on tp[0,1]",
            "barrier() on tp[0,1]",
        ]
    );
    let replayed = replay(&logs).expect("a consistent order");
    assert_eq!((replayed.calls, replayed.deferred), (20, 2));
}

/// Both ranks send first: the thread transport buffers the sends and finishes; under NCCL each
/// send waits for a receive that is queued behind the other's send.
#[test]
fn sends_first_on_both_sides_finish_on_threads_and_deadlock_under_nccl() {
    let logs = CallLogs::new(2);
    on_ranks(2, |ctx| {
        let r = ctx.rank() as usize;
        let pp = ctx.recorded_world(&logs).new_group("pp", &[0, 1])?;
        pp.send(&[r as f32; 4], 1 - r)?;
        let mut received = [0.0f32; 4];
        pp.recv(&mut received, 1 - r)
    });
    let err = logs.replay().expect_err("a deadlock");
    let OrderError::Deadlock { cycle, blocked, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(cycle, &[0, 1]);
    assert_eq!(blocked.len(), 2);
    assert_eq!(
        err.to_string(),
        "collective order deadlock, no call can complete: \
         rank 0 waits in send(f32 × 4 to rank 1) on pp[0,1] (its call 1 on the group, 1 of its log) for rank 1; \
         rank 1 waits in send(f32 × 4 to rank 0) on pp[0,1] (its call 1 on the group, 1 of its log) for rank 0; \
         cycle: rank 0 → 1 → 0"
    );
}

fn group(name: &str, ranks: &[u32]) -> GroupLabel {
    GroupLabel {
        name: name.to_owned(),
        ranks: ranks.to_vec(),
    }
}

fn sum(group: &GroupLabel, len: usize) -> Call {
    Call {
        group: group.clone(),
        op: Op::AllReduce(ReduceOp::Sum),
        dtype: Some(DType::F32),
        len,
        deferred: false,
    }
}

/// Two ranks that share two groups and issue their collectives in opposite orders: a hang on
/// any transport, so the logs are written by hand rather than run.
#[test]
fn opposite_orders_over_two_groups_are_a_named_cycle() {
    let (tp, dp) = (group("tp", &[0, 1]), group("dp", &[0, 1]));
    let logs = vec![
        vec![sum(&tp, 4), sum(&tp, 8), sum(&dp, 2)],
        vec![sum(&tp, 4), sum(&dp, 2), sum(&tp, 8)],
    ];
    let err = replay(&logs).expect_err("a cycle");
    assert_eq!(
        err.to_string(),
        "collective order deadlock, no call can complete: \
         rank 0 waits in all_reduce(f32 × 8, sum) on tp[0,1] (its call 1 on the group, 1 of its log) for rank 1; \
         rank 1 waits in all_reduce(f32 × 2, sum) on dp[0,1] (its call 0 on the group, 1 of its log) for rank 0; \
         cycle: rank 0 → 1 → 0"
    );
}

/// The same opposite orders with the data-parallel all-reduce deferred: it waits on the data
/// lane's stream while the hosts go on, so the tensor-parallel collectives (model lane) pass it
/// on either rank and nothing hangs; on one stream for both groups this order would.
#[test]
fn a_deferred_data_parallel_call_does_not_hold_back_the_model_lane() {
    let (tp, dp) = (group("tp", &[0, 1]), group("dp", &[0, 1]));
    let bucket = Call {
        deferred: true,
        ..sum(&dp, 2)
    };
    let logs = vec![
        vec![bucket.clone(), sum(&tp, 4), sum(&tp, 8)],
        vec![sum(&tp, 4), sum(&tp, 8), bucket],
    ];
    let replayed = replay(&logs).expect("the lanes are independent");
    assert_eq!((replayed.calls, replayed.deferred), (6, 2));
}

/// An immediate data-parallel call makes its host wait, whatever its lane: rank 0 waits in dp
/// before it issues tp, rank 1 in tp before dp.
#[test]
fn an_immediate_call_on_the_other_lane_still_orders_its_host() {
    let (tp, dp) = (group("tp", &[0, 1]), group("dp", &[0, 1]));
    let logs = vec![
        vec![sum(&dp, 2), sum(&tp, 4)],
        vec![sum(&tp, 4), sum(&dp, 2)],
    ];
    let err = replay(&logs).expect_err("a cycle across the lanes");
    assert!(err.to_string().ends_with("cycle: rank 0 → 1 → 0"), "{err}");
}

/// Three groups of two over three ranks, each rank entering its two groups in an order that is
/// fine pairwise: only the three together wait in a ring.
#[test]
fn a_ring_over_three_groups_is_found() {
    let (a, b, c) = (
        group("ep", &[0, 1]),
        group("etp", &[1, 2]),
        group("edp", &[0, 2]),
    );
    let logs = vec![
        vec![sum(&a, 1), sum(&c, 1)],
        vec![sum(&b, 1), sum(&a, 1)],
        vec![sum(&c, 1), sum(&b, 1)],
    ];
    let OrderError::Deadlock { cycle, .. } = replay(&logs).expect_err("a ring") else {
        panic!("a deadlock expected");
    };
    assert_eq!(cycle, [0, 1, 2]);
}

#[test]
fn another_length_at_the_same_position_is_a_mismatch_naming_each_rank() {
    let (tp, dp) = (group("tp", &[0, 1]), group("dp", &[0, 1]));
    let logs = vec![
        vec![sum(&tp, 4), sum(&dp, 2), sum(&tp, 8)],
        vec![sum(&tp, 4), sum(&dp, 2), sum(&tp, 6)],
    ];
    let err = replay(&logs).expect_err("a mismatch");
    assert_eq!(
        err.to_string(),
        "collective order mismatch on group tp[0,1]: the members' calls differ: \
         rank 0 calls all_reduce(f32 × 8, sum) on tp[0,1] (its call 1 on the group, 2 of its log); \
         rank 1 calls all_reduce(f32 × 6, sum) on tp[0,1] (its call 1 on the group, 2 of its log)"
    );
}

#[test]
fn swapped_collectives_of_one_group_are_a_mismatch() {
    let tp = group("tp", &[0, 1]);
    let gather = Call {
        op: Op::AllGather,
        ..sum(&tp, 4)
    };
    let logs = vec![vec![sum(&tp, 4), gather.clone()], vec![gather, sum(&tp, 4)]];
    let OrderError::Mismatch { group, calls, .. } = replay(&logs).expect_err("a mismatch") else {
        panic!("a mismatch expected");
    };
    assert_eq!(group, tp);
    let ops: Vec<_> = calls.iter().map(|c| (c.rank, c.call.op.name())).collect();
    assert_eq!(ops, [(0, "all_reduce"), (1, "all_gather")]);
}

#[test]
fn point_to_point_and_all_to_all_are_matched_pairwise() {
    let pp = group("pp", &[0, 1, 2]);
    let p2p = |op: Op, len: usize| Call {
        op,
        ..sum(&pp, len)
    };
    // stage 1 receives from 0 and sends to 2 while stage 0 and 2 meet only it
    let chain = vec![
        vec![p2p(Op::Send { peer: 1 }, 4)],
        vec![p2p(Op::Recv { peer: 0 }, 4), p2p(Op::Send { peer: 2 }, 4)],
        vec![p2p(Op::Recv { peer: 1 }, 4)],
    ];
    assert_eq!(replay(&chain).expect("a chain").calls, 4);
    let short = vec![
        vec![p2p(Op::Send { peer: 1 }, 4)],
        vec![p2p(Op::Recv { peer: 0 }, 3)],
        vec![],
    ];
    assert!(
        replay(&short)
            .expect_err("a shorter receive")
            .to_string()
            .contains("rank 0 sends f32 × 4 but rank 1 receives f32 × 3")
    );

    let ep = group("ep", &[0, 1]);
    let exchange = |send_counts: Vec<usize>, recv_counts: Vec<usize>| Call {
        len: send_counts.iter().sum(),
        op: Op::AllToAll {
            send_counts,
            recv_counts,
        },
        ..sum(&ep, 0)
    };
    let counts = vec![
        vec![exchange(vec![1, 2], vec![1, 3])],
        vec![exchange(vec![2, 1], vec![2, 1])],
    ];
    assert!(
        replay(&counts)
            .expect_err("counts that do not agree")
            .to_string()
            .contains("rank 1 sends 2 elements to rank 0, which expects 3")
    );
}

#[test]
fn a_collective_against_a_send_is_a_mismatch_and_a_missing_call_names_the_finished_rank() {
    let pp = group("pp", &[0, 1]);
    let send = Call {
        op: Op::Send { peer: 0 },
        ..sum(&pp, 4)
    };
    let against = vec![vec![sum(&pp, 4)], vec![send]];
    let err = replay(&against).expect_err("a mismatch");
    assert!(
        matches!(&err, OrderError::Mismatch { detail, .. } if detail == "a collective against a send or receive"),
        "{err}"
    );

    let extra = vec![vec![sum(&pp, 4), sum(&pp, 1)], vec![sum(&pp, 4)]];
    let err = replay(&extra).expect_err("rank 0 waits forever");
    let OrderError::Deadlock {
        finished, cycle, ..
    } = &err
    else {
        panic!("{err}");
    };
    assert_eq!(
        (finished.as_slice(), cycle.as_slice()),
        (&[(1, 1)][..], &[][..])
    );
    assert!(
        err.to_string()
            .ends_with("for rank 1; rank 1 has made all its 1 calls"),
        "{err}"
    );
}

#[test]
fn calls_no_communicator_could_make_are_refused() {
    let logs = vec![vec![sum(&group("tp", &[1, 2]), 4)], vec![], vec![]];
    assert_eq!(
        replay(&logs).expect_err("rank 0 is no member").to_string(),
        "rank 0 calls all_reduce(f32 × 4, sum) on tp[1,2] (its call 0 on the group, 0 of its log): \
         rank 0 is not a member of group tp[1,2]"
    );
}

/// Rank 0 waits in a group of three for ranks 1 and 2; rank 1's wait ends at a rank that has
/// finished, rank 2's comes back to rank 0: the cycle is found past the first dead end.
#[test]
fn a_cycle_behind_a_finished_rank_is_found() {
    let (all, finished, back) = (
        group("dp", &[0, 1, 2]),
        group("tp", &[1, 3]),
        group("pp", &[0, 2]),
    );
    let logs = vec![
        vec![sum(&all, 1), sum(&back, 1)],
        vec![sum(&finished, 1), sum(&all, 1)],
        vec![sum(&back, 1), sum(&all, 1)],
        vec![],
    ];
    let OrderError::Deadlock {
        cycle,
        finished: done,
        ..
    } = replay(&logs).expect_err("a cycle")
    else {
        panic!("a deadlock expected");
    };
    assert_eq!(
        (cycle.as_slice(), done.as_slice()),
        (&[0, 2][..], &[(3, 0)][..])
    );
    let _ = finished;
}
