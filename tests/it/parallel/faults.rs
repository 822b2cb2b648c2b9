//! A failing rank ends the whole world, fast, and every rank says which one failed.
//!
//! Two CPU ranks over TCP (tp2, processes started torchrun-style); rank 1 fails at a fault
//! point (`ferrotron_dist::fault`): before its first collective of training (`rank-joined`),
//! inside one (`tcp-all-reduce`, after its part is sent) and after one (`train-step`), in each
//! of the ways a rank dies: a panic, an exit without unwinding, SIGKILL. Then the hangs: a rank
//! stopped in its own work (`pause`), and a process stopped by SIGSTOP under the local launcher;
//! those end once the distributed timeout passes (here 0.02 minutes) and are named too.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::*;

/// What the issue promises for a rank that dies: every rank ended within this.
const ENDS_WITHIN: Duration = Duration::from_secs(30);

/// How a rank ended, and when.
struct Ended {
    status: ExitStatus,
    stderr: String,
    after: Duration,
}

/// A tp2 world of two processes, `set` on both, `FAILPOINTS=failpoints` on rank 1; each rank's
/// end, killing any still running after a minute (the test then fails on the timing).
fn faulty_world(set: &[&str], failpoints: &str) -> Vec<Ended> {
    let run = RunDir::new(Model::Gpt);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
        .to_string();
    let started = Instant::now();
    let mut children: Vec<_> = (0..2u32)
        .map(|rank| {
            let mut command = run.command(TP2, &[]);
            command.args(["--set", "training.train_iters=40"]);
            for extra in set {
                command.args(["--set", extra]);
            }
            if rank == 1 {
                command.env("FAILPOINTS", failpoints);
            }
            let rank = rank.to_string();
            command
                .envs([
                    ("RANK", rank.as_str()),
                    ("LOCAL_RANK", rank.as_str()),
                    ("WORLD_SIZE", "2"),
                    ("LOCAL_WORLD_SIZE", "2"),
                    ("MASTER_ADDR", "127.0.0.1"),
                    ("MASTER_PORT", port.as_str()),
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            let mut child = command.spawn().expect("the recipe binary starts");
            let mut stderr = child.stderr.take().expect("piped");
            let reader = std::thread::spawn(move || {
                let mut text = String::new();
                let _ = stderr.read_to_string(&mut text);
                text
            });
            (child, Some(reader), None::<(ExitStatus, Duration)>)
        })
        .collect();
    while children.iter().any(|(_, _, ended)| ended.is_none()) {
        for (child, _, ended) in &mut children {
            if ended.is_none()
                && let Some(status) = child.try_wait().expect("wait works")
            {
                *ended = Some((status, started.elapsed()));
            }
        }
        if started.elapsed() > Duration::from_secs(60) {
            for (child, _, ended) in &mut children {
                if ended.is_none() {
                    let _ = child.kill();
                    *ended = Some((child.wait().expect("killed"), started.elapsed()));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    children
        .into_iter()
        .map(|(_, reader, ended)| {
            let (status, after) = ended.expect("ended");
            Ended {
                status,
                stderr: reader.expect("a reader").join().expect("read"),
                after,
            }
        })
        .collect()
}

/// How rank 1 dies.
#[derive(Clone, Copy)]
enum Death {
    Panic,
    Exit,
    Kill,
}

impl Death {
    fn action(self) -> &'static str {
        match self {
            Death::Panic => "panic(injected)",
            Death::Exit => "return(exit:7)",
            Death::Kill => "return(kill)",
        }
    }

    fn check(self, rank1: &Ended) {
        match self {
            Death::Panic => {
                assert_eq!(rank1.status.code(), Some(1), "{}", rank1.stderr);
                assert!(rank1.stderr.contains("injected"), "{}", rank1.stderr);
            }
            Death::Exit => assert_eq!(rank1.status.code(), Some(7), "{}", rank1.stderr),
            Death::Kill => assert_eq!(rank1.status.signal(), Some(9), "{}", rank1.stderr),
        }
    }
}

/// Rank 1 dies at `point` (a `FAILPOINTS` spec without its action, e.g. `train-step=2*off->`).
fn dies(point: &str, death: Death) {
    let ended = faulty_world(&[], &format!("{point}{}", death.action()));
    death.check(&ended[1]);
    let rank0 = &ended[0];
    assert!(
        !rank0.status.success(),
        "rank 0 fails too: {}",
        rank0.stderr
    );
    assert!(
        rank0.stderr.contains("rank 1"),
        "rank 0 names rank 1: {}",
        rank0.stderr
    );
    for (rank, end) in ended.iter().enumerate() {
        assert!(
            end.after < ENDS_WITHIN,
            "rank {rank} ended after {:?}: {}",
            end.after,
            end.stderr
        );
    }
}

const BEFORE: &str = "rank-joined=";
const INSIDE: &str = "tcp-all-reduce=3*off->";
const AFTER: &str = "train-step=2*off->";

#[test]
fn a_rank_panicking_before_a_collective_ends_the_world() {
    dies(BEFORE, Death::Panic);
}

#[test]
fn a_rank_panicking_inside_a_collective_ends_the_world() {
    dies(INSIDE, Death::Panic);
}

#[test]
fn a_rank_panicking_after_a_collective_ends_the_world() {
    dies(AFTER, Death::Panic);
}

#[test]
fn a_rank_exiting_before_a_collective_ends_the_world() {
    dies(BEFORE, Death::Exit);
}

#[test]
fn a_rank_exiting_inside_a_collective_ends_the_world() {
    dies(INSIDE, Death::Exit);
}

#[test]
fn a_rank_exiting_after_a_collective_ends_the_world() {
    dies(AFTER, Death::Exit);
}

#[test]
fn a_rank_killed_before_a_collective_ends_the_world() {
    dies(BEFORE, Death::Kill);
}

#[test]
fn a_rank_killed_inside_a_collective_ends_the_world() {
    dies(INSIDE, Death::Kill);
}

#[test]
fn a_rank_killed_after_a_collective_ends_the_world() {
    dies(AFTER, Death::Kill);
}

/// A rank stuck in its own work (not in a collective) past the distributed timeout: its peer
/// times out naming it, and its own watchdog ends it once the world has failed.
#[test]
fn a_hung_rank_ends_every_rank_once_the_timeout_passes() {
    let ended = faulty_world(
        &["parallel.distributed_timeout_minutes=0.02"],
        &format!("{AFTER}pause"),
    );
    let (rank0, rank1) = (&ended[0], &ended[1]);
    assert!(!rank0.status.success(), "{}", rank0.stderr);
    assert!(
        rank0
            .stderr
            .contains("timed out after 1.2s: rank 1 did not"),
        "rank 0 names the hung rank: {}",
        rank0.stderr
    );
    assert_eq!(rank1.status.code(), Some(1), "{}", rank1.stderr);
    assert!(
        rank1.stderr.contains("ending the process"),
        "the hung rank's watchdog ends it: {}",
        rank1.stderr
    );
    for (rank, end) in ended.iter().enumerate() {
        assert!(end.after < ENDS_WITHIN, "rank {rank}: {:?}", end.after);
    }
}

/// A rank process stopped by SIGSTOP (it cannot act at all): its peer times out naming it, and
/// the launcher kills it.
#[test]
fn a_stopped_rank_ends_the_local_world_once_the_timeout_passes() {
    let world = LocalWorld::start_with(2, &["parallel.distributed_timeout_minutes=0.02"]);
    LocalWorld::signal(&world.rank_pid(1), "-STOP");
    let started = Instant::now();
    let (status, stderr, _run) = world.wait(Duration::from_secs(60));
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("rank 1 did not"),
        "rank 0 names the stopped rank: {stderr}"
    );
    assert!(started.elapsed() < ENDS_WITHIN, "{:?}", started.elapsed());
}
