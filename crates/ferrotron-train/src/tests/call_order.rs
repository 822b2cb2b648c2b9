//! The replay of a real run's calls under NCCL's rules (`ferrotron_dist::replay`, which
//! `fixture::train_world` runs after every test layout, and this file on a layout the
//! equivalence tests do not train), and faults in one rank's calls: a
//! rank that issues two collectives of groups it shares with another rank in the other order
//! is a deadlock naming it, one that issues a collective with another length a mismatch naming
//! the group, the position and every member's call. The faults are made in the recorded calls
//! rather than run: the swap would hang the thread world until its timeout (the hang the replay
//! is there to foresee), and the thread transport refuses the other length on the spot.

use ferrotron_dist::{Call, Op, OrderError, replay};
use serde_json::json;

use super::fixture::{Layout, options, plan, train_world, train_world_recorded, write_data};

/// Whether `call` moves data between the members of a group of several (not its creation).
fn exchanges(call: &Call) -> bool {
    call.group.ranks.len() > 1 && call.op != Op::NewGroup
}

/// The first collective `i` of `rank` whose group shares another rank with the group of the
/// first later call `j` on another group, that call being a collective too: swapping them makes
/// `rank` wait in `j` for a rank that waits in `i` for it.
fn swappable(calls: &[Call], rank: u32) -> (usize, usize) {
    let shares = |a: &Call, b: &Call| {
        a.group != b.group
            && a.group
                .ranks
                .iter()
                .any(|r| *r != rank && b.group.ranks.contains(r))
    };
    (0..calls.len())
        .filter(|&i| exchanges(&calls[i]) && !calls[i].op.is_point_to_point())
        .find_map(|i| {
            let j = (i + 1..calls.len()).find(|&j| shares(&calls[i], &calls[j]))?;
            (exchanges(&calls[j]) && !calls[j].op.is_point_to_point()).then_some((i, j))
        })
        .expect("two collectives of groups sharing a rank")
}

#[test]
fn a_rank_that_swaps_or_resizes_a_collective_is_caught_and_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_data(dir.path());
    let layout = Layout {
        tp: 2,
        pp: 2,
        vpp: 1,
        dp: 1,
        ..Layout::default()
    };
    let sequence_parallel = json!({"parallel": {"sequence_parallel": true}});
    let plan = plan(dir.path(), layout, 4, 2, sequence_parallel);
    let (_, calls) =
        train_world_recorded(&plan, &options(dir.path())).expect("the parallel run trains");
    let replayed = replay(&calls).expect("the run's own order");
    assert!(replayed.calls > 100, "{replayed:?}");

    // rank 1 (tp rank 1 of the first stage) swaps two collectives
    let rank = 1;
    let (first, later) = swappable(&calls[rank], rank as u32);
    let mut swapped = calls.clone();
    swapped[rank].swap(first, later);
    let err = replay(&swapped).expect_err("the swapped order hangs");
    eprintln!("{err}");
    let OrderError::Deadlock { blocked, cycle, .. } = &err else {
        panic!("a deadlock expected: {err}");
    };
    let waiting = blocked
        .iter()
        .find(|b| b.waiting.rank == rank as u32)
        .unwrap_or_else(|| panic!("rank {rank} is named: {err}"));
    assert_eq!(waiting.waiting.index, first, "{err}");
    assert_eq!(waiting.waiting.call, calls[rank][later], "{err}");
    assert!(cycle.contains(&(rank as u32)), "{err}");

    // rank 1 gives the first all-reduce of its second half one element more
    let index = (calls[rank].len() / 2..calls[rank].len())
        .find(|&i| exchanges(&calls[rank][i]) && matches!(calls[rank][i].op, Op::AllReduce(_)))
        .expect("an all-reduce in the second half");
    let mut resized = calls.clone();
    resized[rank][index].len += 1;
    let err = replay(&resized).expect_err("the longer all-reduce mismatches");
    eprintln!("{err}");
    let OrderError::Mismatch {
        group,
        calls: issued,
        ..
    } = &err
    else {
        panic!("a mismatch expected: {err}");
    };
    assert_eq!(*group, calls[rank][index].group, "{err}");
    let ranks: Vec<u32> = issued.iter().map(|i| i.rank).collect();
    assert_eq!(ranks, group.ranks, "{err}");
    assert!(
        issued.iter().all(|i| i.position == issued[0].position),
        "{err}"
    );
    let faulty = issued
        .iter()
        .find(|i| i.rank == rank as u32)
        .expect("the faulty rank");
    assert_eq!((faulty.index, &faulty.call), (index, &resized[rank][index]));
}

/// Experts cut over the tensor-parallel pair (etp 2 with sequence parallelism) and split over
/// the two data ranks (ep 2), under ZeRO-1 with both overlaps: the expert all-to-alls, the etp
/// partial sums, the expert and dense buckets' deferred reduce-scatters and gathers keep one
/// order on every rank. (`train_world` replays it; this layout's numbers are compared with one
/// rank's per layer, in ferrotron-model's `moe_parallel` tests.)
#[test]
fn expert_tensor_parallel_moe_with_overlaps_issues_one_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_data(dir.path());
    let layout = Layout {
        tp: 2,
        ep: 2,
        pp: 1,
        vpp: 1,
        dp: 2,
        distributed_optimizer: true,
        ..Layout::default()
    };
    let settings = json!({
        "model": {"moe": {"num_experts": 2, "router_topk": 2}},
        "parallel": {
            "sequence_parallel": true, "ddp_bucket_size": 1,
            "overlap_grad_reduce": true, "overlap_param_gather": true
        }
    });
    let plan = plan(dir.path(), layout, 2, 2, settings);
    train_world(&plan, &options(dir.path())).expect("the parallel run trains");
}
