//! [`OrderDigest`]: what a rank has issued on one communicator, in one number, so the members
//! can check once a step that they issued the same collectives in the same order.
//!
//! NCCL checks nothing: members that issue different operations on a communicator hang it or
//! corrupt each other's buffers, far from the cause. The TCP and thread transports compare
//! every call's signature as they go; NCCL's device collectives never reach the host again. So
//! the NCCL communicator folds each call into a digest as it queues it, and in debug builds the
//! members compare their digests over the communicator's TCP bootstrap after every step
//! ([`agree_on_digest`]); [`crate::replay`] checks whole runs of thread ranks in the tests.

use crate::communicator::Communicator;
use crate::error::{CommError, GroupLabel};

/// A count of calls and an FNV-1a hash of their operations and sizes, in issue order. Equal
/// on every member as long as they issued the same calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderDigest {
    pub calls: u64,
    pub hash: u64,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

impl Default for OrderDigest {
    fn default() -> Self {
        OrderDigest {
            calls: 0,
            hash: FNV_OFFSET,
        }
    }
}

impl OrderDigest {
    /// Folds in one call: its operation's name and the bytes it moves.
    pub fn add(&mut self, op: &str, bytes: u64) {
        for byte in op.bytes().chain([0]).chain(bytes.to_le_bytes()) {
            self.hash ^= u64::from(byte);
            self.hash = self.hash.wrapping_mul(FNV_PRIME);
        }
        self.calls += 1;
    }
}

/// Gathers every member's digest of `group` over `bootstrap` (a communicator of the same
/// members) and fails, naming the members that differ from the lowest rank, unless all agree.
pub fn agree_on_digest<C: Communicator>(
    bootstrap: &C,
    group: &GroupLabel,
    mine: OrderDigest,
) -> Result<(), CommError> {
    // The same 64 bits as i64 (the communicators carry no u64).
    let mut all = vec![0i64; 2 * bootstrap.size()];
    bootstrap.all_gather(&[mine.calls as i64, mine.hash as i64], &mut all)?;
    let digests: Vec<OrderDigest> = all
        .chunks_exact(2)
        .map(|pair| OrderDigest {
            calls: pair[0] as u64,
            hash: pair[1] as u64,
        })
        .collect();
    let first = digests[0];
    let differ: Vec<String> = digests
        .iter()
        .enumerate()
        .filter(|(_, digest)| **digest != first)
        .map(|(member, digest)| {
            format!(
                "rank {} issued {} calls (digest {:016x})",
                group.ranks[member], digest.calls, digest.hash
            )
        })
        .collect();
    if differ.is_empty() {
        return Ok(());
    }
    Err(CommError::Mismatch {
        group: group.clone(),
        detail: format!(
            "the members issued different collectives: rank {} issued {} calls (digest {:016x}) but {}",
            group.ranks[0],
            first.calls,
            first.hash,
            differ.join(", ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::World;

    #[test]
    fn equal_orders_agree_and_a_rank_that_skipped_a_call_is_named() {
        let world = World::new(3);
        let outcome = world.run(|ctx| {
            let comm = ctx.world();
            let mut digest = OrderDigest::default();
            digest.add("all_reduce", 4096);
            if comm.rank() != 2 {
                digest.add("all_gather", 128);
            }
            agree_on_digest(comm, comm.label(), digest)
        });
        let err = outcome.expect_err("rank 2 differs").to_string();
        assert!(err.contains("but rank 2 issued 1 calls (digest "), "{err}");
        let agreed = world.run(|ctx| {
            let comm = ctx.world();
            let mut digest = OrderDigest::default();
            digest.add("all_reduce", 4096);
            agree_on_digest(comm, comm.label(), digest)
        });
        assert!(agreed.is_ok());
    }

    #[test]
    fn the_digest_depends_on_order_and_sizes() {
        let digest = |calls: &[(&str, u64)]| {
            let mut d = OrderDigest::default();
            for (op, bytes) in calls {
                d.add(op, *bytes);
            }
            d
        };
        let a = digest(&[("all_reduce", 8), ("all_gather", 8)]);
        assert_ne!(a, digest(&[("all_gather", 8), ("all_reduce", 8)]));
        assert_ne!(a, digest(&[("all_reduce", 8), ("all_gather", 16)]));
        assert_eq!(a, digest(&[("all_reduce", 8), ("all_gather", 8)]));
    }
}
