//! Test inputs and comparisons shared by this crate's op tests and ferrotron-parallel's
//! collective tests (feature `testing`): the same deterministic values on every rank, autodiff
//! copies that never share a node, and one tolerance.

use burn::backend::{Autodiff, Flex};
use burn::tensor::{Tensor, TensorData};

pub type B = Autodiff<Flex>;

/// Deterministic values every rank can build identically.
pub fn values(shape: &[usize], seed: f32) -> Vec<f32> {
    let n: usize = shape.iter().product();
    (0..n)
        .map(|i| ((i as f32 + 1.0) * 0.731 + seed).sin())
        .collect()
}

pub fn tensor<const D: usize>(shape: [usize; D], seed: f32) -> Tensor<B, D> {
    Tensor::from_data(
        TensorData::new(values(&shape, seed), shape),
        &Default::default(),
    )
}

/// A copy of `t` with its own autodiff node: rank threads must never share a node, or their
/// graphs merge into one whose lock the first backward holds while it waits in a collective.
pub fn fresh<const D: usize>(t: &Tensor<B, D>) -> Tensor<B, D> {
    Tensor::from_data(t.to_data(), &Default::default())
}

pub fn flat<Bk: burn::tensor::backend::Backend, const D: usize>(t: Tensor<Bk, D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .unwrap_or_else(|err| panic!("{err:?}"))
}

pub fn assert_close(actual: &[f32], expected: &[f32], what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: lengths differ");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (a - e).abs() <= 1e-5 * (1.0 + e.abs()),
            "{what}: element {i} is {a}, expected {e}"
        );
    }
}
