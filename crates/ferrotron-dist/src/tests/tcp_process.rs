//! [`TcpComm`] across real processes: this test binary re-runs itself as ranks 1..n (the ignored
//! `child_rank` test is their entry point), the parent is rank 0. One run computes every
//! collective; another kills a child mid-world and expects the survivors to fail at once.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::on_ranks;
use super::tcp::{LONG, exercise};
use crate::{CommError, Communicator, ReduceOp, TcpComm, TcpConfig};

const CHILD_ENV: &str = "FERROTRON_TCP_TEST_CHILD";

fn spawn_child(rank: u32, world: u32, port: u16, mode: &str) -> Child {
    let exe = std::env::current_exe().expect("the test binary");
    Command::new(exe)
        .args([
            "--exact",
            "tests::tcp_process::child_rank",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_ENV, format!("{rank},{world},{port},{mode}"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning a child rank")
}

fn parent_config(world: u32) -> (TcpListener, TcpConfig) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let port = listener.local_addr().expect("bound").port();
    let config = TcpConfig {
        timeout: LONG,
        connect_timeout: LONG,
        ..TcpConfig::new(0, world, "127.0.0.1", port)
    };
    (listener, config)
}

#[test]
fn collectives_across_processes_match_the_thread_world() {
    let world = 3;
    let (listener, config) = parent_config(world);
    let children: Vec<Child> = (1..world)
        .map(|rank| spawn_child(rank, world, config.master_port, "exercise"))
        .collect();
    let comm = TcpComm::serve(listener, &config).expect("rank 0 forms the world");
    let mine = exercise(&comm).expect("rank 0 runs every collective");
    comm.barrier()
        .expect("every child reports before the world ends");
    drop(comm);
    let expected = on_ranks(world, |ctx| exercise(ctx.world()));
    assert_eq!(mine, expected[0]);
    for (child, rank) in children.into_iter().zip(1..) {
        let output = child.wait_with_output().expect("child output");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "rank {rank} failed: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let line = stdout
            .lines()
            .find_map(|l| l.strip_prefix("TCP-RESULT "))
            .unwrap_or_else(|| panic!("rank {rank} printed no result: {stdout}"));
        assert_eq!(
            line,
            format!("{:?}", expected[rank as usize]),
            "rank {rank}"
        );
    }
}

#[test]
fn a_child_process_that_exits_fails_the_others_at_once() {
    let world = 3;
    let (listener, config) = parent_config(world);
    let mut children: Vec<Child> = (1..world)
        .map(|rank| {
            let mode = if rank == 2 { "exit" } else { "sum8" };
            spawn_child(rank, world, config.master_port, mode)
        })
        .collect();
    let comm = TcpComm::serve(listener, &config).expect("rank 0 forms the world");
    let started = Instant::now();
    let mut buf = [1.0f32; 8];
    let err = comm
        .all_reduce(&mut buf, ReduceOp::Sum)
        .expect_err("rank 2 is gone");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "waited for the timeout"
    );
    let message = err.to_string();
    assert!(
        message.starts_with("all_reduce on group world[0,1,2] aborted:")
            && message.contains("rank 2"),
        "{message}"
    );
    drop(comm);
    let statuses: Vec<_> = children
        .iter_mut()
        .map(|c| c.wait().expect("child exits"))
        .collect();
    assert_eq!(statuses[1].code(), Some(7), "rank 2 exits as told");
    assert!(!statuses[0].success(), "rank 1 must fail too");
}

/// Entry point of the child processes (does nothing when run by hand without the variable).
#[test]
#[ignore = "entry point of the child ranks spawned by the multi-process tests"]
fn child_rank() -> Result<(), CommError> {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return Ok(());
    };
    let parts: Vec<&str> = spec.split(',').collect();
    let number = |i: usize| parts[i].parse::<u32>().expect("a number");
    let config = TcpConfig {
        timeout: LONG,
        connect_timeout: LONG,
        ..TcpConfig::new(number(0), number(1), "127.0.0.1", number(2) as u16)
    };
    let comm = TcpComm::connect(&config).expect("the child joins");
    if parts[3] == "exit" {
        std::process::exit(7);
    }
    if parts[3] == "sum8" {
        let mut buf = [1.0f32; 8];
        return comm.all_reduce(&mut buf, ReduceOp::Sum);
    }
    let out = exercise(&comm)?;
    println!("TCP-RESULT {out:?}");
    comm.barrier()
}
