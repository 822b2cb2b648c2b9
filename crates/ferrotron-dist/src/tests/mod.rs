//! Multi-rank tests: every collective on 1–4 thread ranks, failures, determinism, groups, the
//! recorded call order and its replay.

mod collectives;
mod determinism;
mod failures;
mod order;
mod tcp;
mod tcp_process;

use std::time::Duration;

use crate::{RankContext, World};

/// Runs `body` on `n` thread ranks with a short timeout, panicking with the world's error.
pub(crate) fn on_ranks<R: Send>(
    n: u32,
    body: impl Fn(RankContext) -> Result<R, crate::CommError> + Sync,
) -> Vec<R> {
    World::new(n)
        .with_timeout(Duration::from_secs(10))
        .run(body)
        .unwrap_or_else(|err| panic!("{n} ranks: {err}"))
}
