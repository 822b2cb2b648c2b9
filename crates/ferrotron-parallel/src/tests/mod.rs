//! Every operator on 2 and 4 thread ranks against the one-rank computation, forward and
//! gradient; shard specs; the size-1 group.

mod dispatch;
mod plain;
mod regions;
mod shards;
mod single;

use std::sync::Arc;
use std::time::Duration;

use burn::tensor::Tensor;
use ferrotron_dist::{CommError, Communicator, World};

use crate::Comm;

pub(crate) use ferrotron_ops::testing::{B, assert_close, flat, fresh, tensor, values};

/// Runs `body` on `n` thread ranks, each with a communicator over all of them.
pub(crate) fn on_ranks<R: Send>(n: u32, body: impl Fn(Comm) -> R + Sync) -> Vec<R> {
    World::new(n)
        .with_timeout(Duration::from_secs(20))
        .run(|ctx| {
            let ranks: Vec<u32> = (0..n).collect();
            let comm: Comm = Arc::new(ctx.world().new_group("test", &ranks)?);
            Ok::<_, CommError>(body(comm))
        })
        .unwrap_or_else(|err| panic!("{n} ranks: {err}"))
}

/// Chunk `index` of `count` of `t` along `dim`.
pub(crate) fn chunk<Bk: burn::tensor::backend::Backend, const D: usize>(
    t: Tensor<Bk, D>,
    dim: usize,
    index: usize,
    count: usize,
) -> Tensor<Bk, D> {
    let piece = t.dims()[dim] / count;
    t.narrow(dim, index * piece, piece)
}
