//! Every operator on 2 and 4 thread ranks against the one-rank computation, forward and
//! gradient; shard specs; the size-1 group.

mod dispatch;
mod plain;
mod regions;
mod shards;
mod single;

use std::sync::Arc;
use std::time::Duration;

use burn::backend::{Autodiff, Flex};
use burn::tensor::{Tensor, TensorData};
use ferrotron_dist::{CommError, Communicator, World};

use crate::Comm;

pub(crate) type B = Autodiff<Flex>;

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

/// Deterministic values every rank can build identically.
pub(crate) fn values(shape: &[usize], seed: f32) -> Vec<f32> {
    let n: usize = shape.iter().product();
    (0..n)
        .map(|i| ((i as f32 + 1.0) * 0.731 + seed).sin())
        .collect()
}

pub(crate) fn tensor<const D: usize>(shape: [usize; D], seed: f32) -> Tensor<B, D> {
    Tensor::from_data(
        TensorData::new(values(&shape, seed), shape),
        &Default::default(),
    )
}

/// A copy of `t` with its own autodiff node: rank threads must never share a node, or their
/// graphs merge into one whose lock the first backward holds while it waits in a collective.
pub(crate) fn fresh<const D: usize>(t: &Tensor<B, D>) -> Tensor<B, D> {
    Tensor::from_data(t.to_data(), &Default::default())
}

pub(crate) fn flat<Bk: burn::tensor::backend::Backend, const D: usize>(
    t: Tensor<Bk, D>,
) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .unwrap_or_else(|err| panic!("{err:?}"))
}

pub(crate) fn assert_close(actual: &[f32], expected: &[f32], what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: lengths differ");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (a - e).abs() <= 1e-5 * (1.0 + e.abs()),
            "{what}: element {i} is {a}, expected {e}"
        );
    }
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
