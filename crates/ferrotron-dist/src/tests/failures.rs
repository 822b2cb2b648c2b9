//! Nothing hangs: timeouts name the missing ranks, a failing rank releases the others.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::{CommError, Communicator, ReduceOp, World, WorldError};

fn quick(n: u32) -> World {
    World::new(n).with_timeout(Duration::from_millis(200))
}

#[test]
fn a_timeout_names_the_group_the_collective_and_the_missing_rank() {
    let outcomes = quick(3)
        .run(|ctx| {
            if ctx.rank() == 2 {
                return Ok::<_, CommError>(None);
            }
            // Rank 0 joins dp[0,2]; rank 2 never does.
            if ctx.rank() == 0 {
                let dp = ctx.world().new_group("dp", &[0, 2])?;
                let mut buf = [1.0f32];
                return Ok(dp.all_reduce(&mut buf, ReduceOp::Sum).err());
            }
            Ok(None)
        })
        .expect("every rank returns");
    let err = outcomes[0].as_ref().expect("rank 0 timed out");
    assert_eq!(
        err.to_string(),
        "all_reduce on group dp[0,2] timed out after 200ms: rank 2 did not arrive"
    );
}

#[test]
fn a_timeout_lists_every_missing_rank_and_fails_the_world() {
    let err = quick(3)
        .run(|ctx| {
            if ctx.rank() == 0 {
                ctx.world().barrier()?;
            }
            Ok::<_, CommError>(())
        })
        .expect_err("rank 0 times out");
    assert_eq!(
        err.to_string(),
        "rank 0 failed: barrier on group world[0,1,2] timed out after 200ms: ranks 1, 2 did not arrive"
    );
}

#[test]
fn a_recv_timeout_names_the_silent_sender() {
    let err = quick(2)
        .run(|ctx| {
            if ctx.rank() == 1 {
                let mut buf = [0i64; 4];
                ctx.world().recv(&mut buf, 0)?;
            }
            Ok::<_, CommError>(())
        })
        .expect_err("rank 1 times out");
    assert_eq!(
        err.to_string(),
        "rank 1 failed: recv on group world[0,1] timed out after 200ms: rank 0 did not send"
    );
}

#[test]
fn a_panicking_rank_releases_the_others_with_an_error() {
    let released = Mutex::new(Vec::new());
    let start = Instant::now();
    // A long timeout: only the abort can release the waiting ranks in time.
    let err = World::new(4)
        .with_timeout(Duration::from_secs(60))
        .run(|ctx| {
            if ctx.rank() == 2 {
                std::thread::sleep(Duration::from_millis(50));
                panic!("boom");
            }
            let mut buf = [1.0f32; 16];
            let result = if ctx.rank() == 3 {
                let mut msg = [0.0f32; 1];
                ctx.world().recv(&mut msg, 2)
            } else {
                ctx.world().all_reduce(&mut buf, ReduceOp::Sum)
            };
            if let Err(err) = &result {
                released
                    .lock()
                    .expect("test lock")
                    .push((ctx.rank(), err.to_string()));
            }
            result
        })
        .expect_err("rank 2 panicked");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "released promptly"
    );
    assert!(
        matches!(&err, WorldError::RankPanicked { rank: 2, message } if message == "boom"),
        "{err}"
    );
    let mut released = released.into_inner().expect("test lock");
    released.sort();
    assert_eq!(
        released,
        vec![
            (
                0,
                "all_reduce on group world[0,1,2,3] aborted: rank 2 panicked: boom".to_owned()
            ),
            (
                1,
                "all_reduce on group world[0,1,2,3] aborted: rank 2 panicked: boom".to_owned()
            ),
            (
                3,
                "recv on group world[0,1,2,3] aborted: rank 2 panicked: boom".to_owned()
            ),
        ]
    );
}

#[derive(Debug, thiserror::Error)]
#[error("the data file is missing")]
struct MissingData;

#[test]
fn an_error_of_one_rank_is_reported_by_rank_and_releases_sub_groups() {
    let err = World::new(4)
        .with_timeout(Duration::from_secs(60))
        .run(
            |ctx| -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
                let members = if ctx.rank() % 2 == 0 { [0, 2] } else { [1, 3] };
                let pair = ctx.world().new_group("dp", &members)?;
                if ctx.rank() == 1 {
                    return Err(MissingData.into());
                }
                pair.barrier()?;
                Ok(())
            },
        )
        .expect_err("rank 1 failed");
    assert_eq!(err.to_string(), "rank 1 failed: the data file is missing");
}

#[test]
fn an_empty_world_is_an_error() {
    let err = World::new(0)
        .run(|_| Ok::<_, CommError>(()))
        .expect_err("no ranks");
    assert!(matches!(err, WorldError::Empty));
}
