//! [`TcpComm`] on loopback: each rank a thread with its own TCP world (sockets, reader threads
//! and all, exactly what separate processes use), checked against the thread communicator, plus
//! the failures a process world has (a peer that dies, never arrives, or disagrees).

use std::net::TcpListener;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use half::bf16;

use super::on_ranks;
use crate::{
    CommError, Communicator, GroupMembers, ProcessGroups, ReduceOp, TcpComm, TcpConfig, TcpError,
};

/// Runs `body` on `n` ranks, each a thread holding its own TCP world on 127.0.0.1; returns every
/// rank's result in rank order.
pub(crate) fn on_tcp_ranks<R: Send>(
    n: u32,
    timeout: Duration,
    body: impl Fn(TcpComm) -> Result<R, CommError> + Sync,
) -> Vec<Result<R, CommError>> {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let port = listener.local_addr().expect("bound").port();
    let config = |rank| TcpConfig {
        timeout,
        connect_timeout: Duration::from_secs(20),
        ..TcpConfig::new(rank, n, "127.0.0.1", port)
    };
    let body = &body;
    thread::scope(|scope| {
        let mut listener = Some(listener);
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let listener = if rank == 0 { listener.take() } else { None };
                let config = config(rank);
                scope.spawn(move || {
                    let comm = match listener {
                        Some(listener) => TcpComm::serve(listener, &config),
                        None => TcpComm::connect(&config),
                    }
                    .unwrap_or_else(|e| panic!("rank {rank} joins: {e}"));
                    body(comm)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

fn all_ok<R>(results: Vec<Result<R, CommError>>) -> Vec<R> {
    results
        .into_iter()
        .enumerate()
        .map(|(rank, r)| r.unwrap_or_else(|e| panic!("rank {rank}: {e}")))
        .collect()
}

pub(super) const LONG: Duration = Duration::from_secs(20);

/// Values whose sum depends on the order of addition in f32.
fn awkward(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let scale = [1e8f32, 1.0, -1e8, 3.5e-3][(rank + i) % 4];
            scale * (1.0 + (i as f32 * 0.37 + rank as f32).sin())
        })
        .collect()
}

/// Every collective, as one rank of a group of `n`; the same code runs on both communicators.
pub(super) fn exercise<C: Communicator>(comm: &C) -> Result<Vec<String>, CommError> {
    let (me, n) = (comm.rank(), comm.size());
    let mut out = Vec::new();
    let mut sum = awkward(me, 11);
    comm.all_reduce(&mut sum, ReduceOp::Sum)?;
    out.push(format!(
        "{:?}",
        sum.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    ));
    let mut max: Vec<i64> = (0..5).map(|i| (me as i64 - 1) * i).collect();
    comm.all_reduce(&mut max, ReduceOp::Max)?;
    out.push(format!("{max:?}"));
    let mut b = vec![bf16::from_f32(me as f32 + 0.5); 3];
    comm.all_reduce(&mut b, ReduceOp::Sum)?;
    out.push(format!("{b:?}"));
    let mut gathered = vec![0u32; 3 * n];
    comm.all_gather(&[me as u32, 7, 9], &mut gathered)?;
    out.push(format!("{gathered:?}"));
    let input: Vec<f64> = (0..2 * n).map(|i| me as f64 * 100.0 + i as f64).collect();
    let mut scattered = [0.0f64; 2];
    comm.reduce_scatter(&input, &mut scattered, ReduceOp::Sum)?;
    out.push(format!("{scattered:?}"));
    let mut root_buf = vec![me as i32; 4];
    comm.broadcast(&mut root_buf, n - 1)?;
    out.push(format!("{root_buf:?}"));
    let count = |s: usize, d: usize| (s + 2 * d) % 3;
    let send_counts: Vec<usize> = (0..n).map(|d| count(me, d)).collect();
    let recv_counts: Vec<usize> = (0..n).map(|s| count(s, me)).collect();
    let input: Vec<i64> = (0..n)
        .flat_map(|d| (0..count(me, d)).map(move |k| (1000 * me + 10 * d + k) as i64))
        .collect();
    let mut output = vec![-1i64; recv_counts.iter().sum()];
    comm.all_to_all(&input, &send_counts, &mut output, &recv_counts)?;
    out.push(format!("{output:?}"));
    let (next, previous) = ((me + 1) % n, (me + n - 1) % n);
    if n > 1 {
        for message in 0..3u32 {
            comm.send(&[me as u32, message], next)?;
        }
        for _ in 0..3 {
            let mut buf = [0u32; 2];
            comm.recv(&mut buf, previous)?;
            out.push(format!("{buf:?}"));
        }
    }
    comm.barrier()?;
    let mut empty: Vec<f32> = Vec::new();
    comm.all_reduce(&mut empty, ReduceOp::Sum)?;
    Ok(out)
}

#[test]
fn every_collective_matches_the_thread_communicator_bit_for_bit() {
    for n in 1..=4u32 {
        let threads = on_ranks(n, |ctx| exercise(ctx.world()));
        let tcp = all_ok(on_tcp_ranks(n, LONG, |comm| exercise(&comm)));
        assert_eq!(tcp, threads, "{n} ranks");
    }
}

#[test]
fn large_all_reduce_is_the_rank_order_sum() {
    let len = 300_007;
    let results = all_ok(on_tcp_ranks(3, LONG, |comm| {
        let mut buf = awkward(comm.rank(), len);
        comm.all_reduce(&mut buf, ReduceOp::Sum)?;
        Ok(buf)
    }));
    let inputs: Vec<Vec<f32>> = (0..3).map(|r| awkward(r, len)).collect();
    let expect: Vec<f32> = (0..len)
        .map(|i| (inputs[0][i] + inputs[1][i]) + inputs[2][i])
        .collect();
    for buf in results {
        assert!(buf == expect, "not the sequential rank-order sum");
    }
}

/// The groups of `rank` in a tp2·pp2·dp2 world of 8, in Megatron's order (tp-cp-ep-dp-pp:
/// rank = tp + 2·dp + 4·pp), written out as the planner would give them.
fn tp2_pp2_dp2_members(rank: u32) -> GroupMembers {
    let (tp, dp, pp) = (rank % 2, rank / 2 % 2, rank / 4);
    let at = |tp: u32, dp: u32, pp: u32| tp + 2 * dp + 4 * pp;
    let tp_group = vec![at(0, dp, pp), at(1, dp, pp)];
    let dp_group = vec![at(tp, 0, pp), at(tp, 1, pp)];
    let pp_group = vec![at(tp, dp, 0), at(tp, dp, 1)];
    GroupMembers {
        tp: tp_group.clone(),
        pp: pp_group.clone(),
        dp: dp_group.clone(),
        cp: vec![rank],
        dp_cp: dp_group.clone(),
        ep: vec![rank],
        etp: tp_group,
        edp: dp_group,
        embedding: Some(pp_group),
    }
}

#[test]
fn groups_gather_exactly_their_members() {
    let results = all_ok(on_tcp_ranks(8, LONG, |world| {
        let groups = ProcessGroups::new(&tp2_pp2_dp2_members(world.global_rank()), &world)?;
        let mut seen = Vec::new();
        for group in [&groups.tp, &groups.pp, &groups.dp, &groups.dp_cp] {
            let mut out = vec![0u32; group.size()];
            group.all_gather(&[world.global_rank()], &mut out)?;
            seen.push((out, group.members().to_vec()));
        }
        Ok(seen)
    }));
    for (rank, seen) in results.iter().enumerate() {
        for (gathered, members) in seen {
            assert_eq!(gathered, members, "rank {rank}");
            assert!(members.contains(&(rank as u32)));
        }
    }
}

#[test]
fn a_rank_that_never_arrives_is_named_in_the_timeout() {
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let done_rx = std::sync::Mutex::new(done_rx);
    let done_tx = std::sync::Mutex::new(done_tx);
    let results = on_tcp_ranks(3, Duration::from_millis(400), |comm| {
        if comm.rank() == 2 {
            // Alive (connections open) but never calls the collective.
            let _ = done_rx.lock().map(|rx| rx.recv_timeout(LONG));
            return Ok(());
        }
        let mut buf = [1.0f32; 4];
        let result = comm.all_reduce(&mut buf, ReduceOp::Sum);
        if comm.rank() == 0 {
            thread::sleep(Duration::from_millis(300));
            let _ = done_tx.lock().map(|tx| tx.send(()));
        }
        result
    });
    let messages: Vec<String> = results[..2]
        .iter()
        .map(|r| r.as_ref().expect_err("must fail").to_string())
        .collect();
    let expected = "all_reduce on group world[0,1,2] timed out after 400ms: rank 2 did not arrive";
    assert!(
        messages.iter().any(|m| m == expected),
        "no timeout naming rank 2: {messages:?}"
    );
}

#[test]
fn a_peer_that_dies_fails_the_collective_at_once() {
    let started = Instant::now();
    let results = on_tcp_ranks(3, LONG, |comm| {
        if comm.rank() == 1 {
            drop(comm); // the process "exits": its connections close
            return Ok(());
        }
        let mut buf = [1.0f32; 4];
        comm.all_reduce(&mut buf, ReduceOp::Sum)
    });
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "waited for the timeout"
    );
    for rank in [0, 2] {
        let message = results[rank].as_ref().expect_err("must fail").to_string();
        assert!(
            message.starts_with("all_reduce on group world[0,1,2] aborted:")
                && message.contains("rank 1"),
            "rank {rank}: {message}"
        );
    }
}

#[test]
fn an_aborting_rank_releases_the_others_with_its_reason() {
    let results = on_tcp_ranks(2, LONG, |comm| {
        if comm.rank() == 1 {
            comm.abort("out of memory");
            thread::sleep(Duration::from_millis(200));
            return Ok(());
        }
        let mut buf = [0u32; 2];
        comm.broadcast(&mut buf, 1)
    });
    let message = results[0].as_ref().expect_err("must fail").to_string();
    assert_eq!(
        message,
        "broadcast on group world[0,1] aborted: rank 1 failed: rank 1: out of memory"
    );
}

#[test]
fn different_collectives_are_a_mismatch_not_garbage() {
    let results = on_tcp_ranks(2, LONG, |comm| {
        let mut buf = [0.0f32; 4];
        if comm.rank() == 0 {
            comm.all_reduce(&mut buf, ReduceOp::Sum)
        } else {
            comm.broadcast(&mut buf, 0)
        }
    });
    let message = results[1].as_ref().expect_err("must fail").to_string();
    assert_eq!(
        message,
        "collective mismatch on group world[0,1]: rank 1 called broadcast(f32 × 4, root 0) but rank 0 called all_reduce(f32 × 4, sum)"
    );
}

#[test]
fn recv_timeout_names_the_sender_and_shapes_are_checked() {
    let results = on_tcp_ranks(2, Duration::from_millis(300), |comm| {
        if comm.rank() == 0 {
            comm.send(&[1.0f32, 2.0], 1)?;
            thread::sleep(Duration::from_millis(600));
            return Ok(Vec::new());
        }
        let mut wrong = [0.0f32; 3];
        let shape = comm.recv(&mut wrong, 0).expect_err("wrong length");
        let mut buf = [0.0f32; 2];
        let silent = comm.recv(&mut buf, 0).expect_err("nothing sent");
        Ok(vec![shape.to_string(), silent.to_string()])
    });
    let messages = results[1].as_ref().expect("rank 1 reports");
    assert_eq!(
        messages[0],
        "recv on group world[0,1]: rank 0 sent f32 × 2, rank 1 expected f32 × 3"
    );
    assert!(
        messages[1] == "recv on group world[0,1] timed out after 300ms: rank 0 did not send"
            || messages[1].starts_with("recv on group world[0,1] aborted"),
        "{}",
        messages[1]
    );
}

#[test]
fn new_group_waits_for_every_member() {
    let results = on_tcp_ranks(3, Duration::from_millis(300), |world| {
        // Rank 2 builds a different group: ranks 0 and 1 wait for it in vain.
        let members: &[u32] = if world.rank() == 2 { &[2] } else { &[0, 1, 2] };
        let group = world.new_group("dp", members).map(drop);
        thread::sleep(Duration::from_millis(500));
        group
    });
    let message = results[0].as_ref().expect_err("must fail").to_string();
    assert!(
        message == "new_group on group dp[0,1,2] timed out after 300ms: rank 2 did not arrive"
            || message.starts_with("new_group on group dp[0,1,2] aborted"),
        "{message}"
    );
    assert!(results[2].is_ok());
}

#[test]
fn rendezvous_names_the_ranks_that_never_connect() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let port = listener.local_addr().expect("bound").port();
    let config = move |rank| TcpConfig {
        connect_timeout: Duration::from_millis(500),
        ..TcpConfig::new(rank, 3, "127.0.0.1", port)
    };
    let joiner = thread::spawn(move || TcpComm::connect(&config(1)).map(drop));
    let err = TcpComm::serve(listener, &config(0)).expect_err("rank 2 never comes");
    assert!(
        matches!(&err, TcpError::Timeout { missing, .. } if missing == &[2]),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        format!("rendezvous at 127.0.0.1:{port} timed out after 500ms: rank 2 did not connect")
    );
    let _ = joiner.join();
}

/// What listens at `MASTER_PORT` when it is not rank 0: a joining rank says so at once instead
/// of reading the reply as the address table until the connect deadline.
#[test]
fn a_rank_refuses_a_master_port_that_is_not_rank_0() {
    type Answer = fn(&mut std::net::TcpStream) -> std::io::Result<()>;
    fn echo_own_greeting(stream: &mut std::net::TcpStream) -> std::io::Result<()> {
        let mut hello = [0u8; 18];
        std::io::Read::read_exact(stream, &mut hello)?;
        std::io::Write::write_all(stream, &hello)
    }
    fn answer_http(stream: &mut std::net::TcpStream) -> std::io::Result<()> {
        std::io::Write::write_all(stream, b"HTTP/1.1 400 Bad Request\r\n\r\n")
    }
    let cases: [(Answer, &str); 2] = [
        (
            echo_own_greeting,
            "the process listening there is rank 1 of a world of 2, not rank 0",
        ),
        (
            answer_http,
            "the process listening there is not a ferrotron rank 0 (it answered with other bytes)",
        ),
    ];
    for (answer, expected) in cases {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = listener.local_addr().expect("bound").port();
        let started = Instant::now();
        let err = thread::scope(|scope| {
            scope.spawn(|| {
                let (mut stream, _) = listener.accept().expect("the rank connects");
                answer(&mut stream).expect("answered");
                thread::sleep(Duration::from_millis(200));
            });
            let config = TcpConfig {
                connect_timeout: Duration::from_secs(60),
                ..TcpConfig::new(1, 2, "127.0.0.1", port)
            };
            TcpComm::connect(&config).expect_err("not rank 0")
        });
        assert_eq!(
            err.to_string(),
            format!("rendezvous at 127.0.0.1:{port}: {expected}")
        );
        assert!(started.elapsed() < Duration::from_secs(10), "{err}");
    }
}

#[test]
fn a_rank_outside_the_world_is_refused() {
    let err = TcpComm::connect(&TcpConfig::new(4, 4, "127.0.0.1", 1)).expect_err("rank 4 of 4");
    assert_eq!(err.to_string(), "rank 4 is outside a world of 4");
}

#[test]
fn ranks_with_another_plan_hash_are_named_on_every_rank() {
    let results = on_tcp_ranks(3, LONG, |world| {
        let hash = if world.rank() == 2 { "beef" } else { "c0ffee" };
        Ok(crate::check_agreement(&world, "plan hash", hash).map_err(|e| e.to_string()))
    });
    for (rank, result) in all_ok(results).into_iter().enumerate() {
        assert_eq!(
            result,
            Err(
                "plan hash differs across the ranks: rank 2 has beef but rank 0 has c0ffee \
                 (all that differ from rank 0: rank 2)"
                    .to_owned()
            ),
            "rank {rank}"
        );
    }
}

#[test]
fn agreement_holds_in_groups_and_for_empty_values() {
    let results = on_tcp_ranks(4, LONG, |world| {
        let everyone = crate::check_agreement(&world, "plan hash", "same");
        let empty = crate::check_agreement(&world, "nothing", "");
        let odd = [1, 3];
        let group = if odd.contains(&world.global_rank()) {
            let group = world.new_group("dp", &odd)?;
            let mine = format!("v{}", world.global_rank());
            Some(crate::check_agreement(&group, "value", &mine).map_err(|e| e.to_string()))
        } else {
            None
        };
        Ok((everyone.is_ok() && empty.is_ok(), group))
    });
    for (rank, (agreed, group)) in all_ok(results).into_iter().enumerate() {
        assert!(agreed, "rank {rank}");
        let expected = (rank % 2 == 1).then(|| {
            Err(
                "value differs across the ranks: rank 3 has v3 but rank 1 has v1 (all that \
                 differ from rank 1: rank 3)"
                    .to_owned(),
            )
        });
        assert_eq!(group, expected, "rank {rank}");
    }
}

/// Groups share the world's connections and its deadline: a sub-group's collective times out
/// after the world's timeout, naming the sub-group and the member that did not arrive.
#[test]
fn sub_groups_time_out_with_the_worlds_deadline() {
    let results = on_tcp_ranks(3, Duration::from_millis(300), |world| {
        let rank = world.global_rank();
        let result = if rank < 2 {
            let dp = world.new_group("dp", &[0, 1])?;
            let mut buf = [1.0f32; 2];
            if rank == 0 {
                dp.all_reduce(&mut buf, ReduceOp::Sum)
            } else {
                Ok(())
            }
        } else {
            Ok(())
        };
        // Alive (connections open) until rank 0 has timed out.
        thread::sleep(Duration::from_millis(700));
        result
    });
    assert_eq!(
        results[0]
            .as_ref()
            .expect_err("rank 1 never calls it")
            .to_string(),
        "all_reduce on group dp[0,1] timed out after 300ms: rank 1 did not arrive"
    );
}

/// A rank whose run ended says so before its connections close (`Bye`): its peer, still busy
/// (say, writing its last checkpoint), sees a world in health, not a lost peer.
#[test]
fn a_rank_that_leaves_after_its_last_collective_is_no_failure() {
    let results = on_tcp_ranks(2, LONG, |comm| {
        comm.barrier()?;
        if comm.rank() == 1 {
            drop(comm);
            return Ok(None);
        }
        // The peer's connection closes right after its `Bye`; give the reader time to see both.
        thread::sleep(Duration::from_secs(1));
        Ok(Some(comm.health()))
    });
    let health = all_ok(results)
        .into_iter()
        .flatten()
        .next()
        .expect("rank 0's view");
    assert_eq!(health, crate::watchdog::Health::Fine);
}
