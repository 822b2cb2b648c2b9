use std::sync::Mutex;

use super::*;

/// A communicator whose health a test sets, recording the aborts it receives.
#[derive(Default)]
struct Fake {
    health: Mutex<Option<Health>>,
    silent: Vec<(u32, Duration)>,
    aborts: Mutex<Vec<String>>,
}

impl Watched for Fake {
    fn health(&self) -> Health {
        self.health.lock().unwrap().clone().unwrap_or(Health::Fine)
    }
    fn abort(&self, reason: &str) {
        self.aborts.lock().unwrap().push(reason.to_owned());
    }
    fn silent_peers(&self, _quiet: Duration) -> Vec<(u32, Duration)> {
        self.silent.clone()
    }
}

fn armed(timeout: Duration, grace: Duration) -> Arc<Watchdog> {
    let dog = Arc::new(Watchdog {
        stuck_grace: grace,
        last_resort: None,
        ..Watchdog::default()
    });
    dog.arm(2, timeout);
    dog
}

fn watched(dog: &Watchdog, fake: Fake) -> Arc<Fake> {
    let fake = Arc::new(fake);
    let as_watched: Arc<dyn Watched> = fake.clone();
    dog.watch(Arc::downgrade(&as_watched));
    fake
}

/// Polls until `fake` was aborted (or fails after 5 s) and returns the first reason.
fn first_abort(fake: &Fake) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(reason) = fake.aborts.lock().unwrap().first() {
            return reason.clone();
        }
        assert!(Instant::now() < deadline, "the watchdog did not abort");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_wait_past_the_deadline_aborts_every_communicator_naming_the_silent_peer() {
    let dog = armed(Duration::from_millis(200), Duration::from_secs(60));
    let tp = watched(
        &dog,
        Fake {
            silent: vec![(3, Duration::from_secs(7))],
            ..Fake::default()
        },
    );
    let dp = watched(&dog, Fake::default());
    let started = Instant::now();
    let _waiting = dog.waiting("copying the loss to the host");
    let reason = first_abort(&tp);
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(
        reason,
        "rank 2 waited 200ms (parallel.distributed_timeout_minutes) for copying the loss to the \
         host; rank 3 has been silent for 7s (stopped or hung)"
    );
    assert_eq!(first_abort(&dp), reason, "every communicator is aborted");
    assert_eq!(dog.failure().as_deref(), Some(reason.as_str()));
}

#[test]
fn long_host_work_without_a_wait_never_times_out() {
    let dog = armed(Duration::from_millis(50), Duration::from_secs(60));
    let comm = watched(&dog, Fake::default());
    {
        let _done_quickly = dog.waiting("a short read");
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(comm.aborts.lock().unwrap().is_empty());
    assert_eq!(dog.failure(), None);
}

#[test]
fn a_peer_gone_fails_the_world_only_while_this_process_waits() {
    let dog = armed(Duration::from_secs(600), Duration::from_secs(60));
    let comm = watched(&dog, Fake::default());
    *comm.health.lock().unwrap() = Some(Health::PeerGone(
        "rank 1 closed its connection (exited or failed)".to_owned(),
    ));
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        comm.aborts.lock().unwrap().is_empty(),
        "a peer that exits after the last collective is the end of a run"
    );
    let _waiting = dog.waiting("the gradient norm");
    assert_eq!(
        first_abort(&comm),
        "rank 1 closed its connection (exited or failed)"
    );
}

#[test]
fn a_failed_communicator_aborts_the_others_at_once() {
    let dog = armed(Duration::from_secs(600), Duration::from_secs(60));
    let nccl = watched(&dog, Fake::default());
    let tcp = watched(&dog, Fake::default());
    *tcp.health.lock().unwrap() = Some(Health::Failed("rank 1 failed: panicked".to_owned()));
    assert_eq!(first_abort(&nccl), "rank 1 failed: panicked");
}

#[test]
fn a_wait_that_outlives_the_abort_ends_through_the_stuck_handler() {
    let dog = armed(Duration::from_millis(100), Duration::from_millis(200));
    let _comm = watched(&dog, Fake::default());
    let (told, heard) = std::sync::mpsc::channel();
    dog.on_stuck(Box::new(move |reason| {
        let _ = told.send(reason.to_owned());
    }));
    let _blocked = dog.waiting("a kernel that never finishes");
    let reason = heard
        .recv_timeout(Duration::from_secs(5))
        .expect("the stuck handler ran");
    assert!(
        reason.ends_with("(a kernel that never finishes did not return after the abort)"),
        "{reason}"
    );
    assert!(reason.starts_with("rank 2 waited 100ms"), "{reason}");
}

#[test]
fn a_rank_alive_long_after_its_world_failed_is_ended() {
    let dog = armed(Duration::from_secs(600), Duration::from_millis(200));
    let _comm = watched(&dog, Fake::default());
    let (told, heard) = std::sync::mpsc::channel();
    dog.on_stuck(Box::new(move |reason| {
        let _ = told.send(reason.to_owned());
    }));
    dog.abort_all("rank 0 failed: timed out");
    let reason = heard
        .recv_timeout(Duration::from_secs(5))
        .expect("the stuck handler ran");
    assert_eq!(
        reason,
        "rank 0 failed: timed out (the rank did not end within 200ms)"
    );
}

#[test]
fn an_unarmed_watchdog_tracks_nothing() {
    let dog = Watchdog::default();
    let _waiting = dog.waiting("anything");
    assert!(dog.lock().waits.is_empty());
}

#[test]
fn the_timeout_reason_without_silent_peers_says_every_peer_is_alive() {
    assert_eq!(
        timeout_reason(0, "a pipeline receive", Duration::from_secs(600), &[]),
        "rank 0 waited 600s (parallel.distributed_timeout_minutes) for a pipeline receive; \
         every peer is alive (a rank may be in long host work or issue another collective)"
    );
}
