//! LayerNorm and RMSNorm over `[rows, hidden]` on burn-flex, a row at a time.
//!
//! Composed under autodiff, a LayerNorm is eight to ten element-wise nodes (mean, centring,
//! variance, square root, reciprocal, two multiplies and an add, with broadcasts) and about as
//! many more backward, each a single-threaded pass allocating its result: at the quick start's
//! 512 × 64 rows that is per-op overhead rather than arithmetic, and it stayed on one thread
//! while the GEMMs around it ran on all of them. Here the forward normalises each row in one
//! pass and keeps its mean and `1/σ`; the backward writes the input's gradient row by row and
//! sums γ's and β's over the rows.
//!
//! Rows go to tasks in blocks of [`ROWS_PER_TASK`], each block's γ and β sums are kept apart and
//! added in block order: the numbers do not depend on the number of threads.

use burn::backend::Flex;
use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType, Shape};
use rayon::prelude::*;

use crate::op::norm::{NormGrads, NormKind, NormSaved, NormSpec, NormStats};

/// Rows per parallel task (and per partial sum of γ's and β's gradients).
const ROWS_PER_TASK: usize = 64;

/// Whether the kernels take these: f32 `x [rows, hidden]` and f32 `γ [hidden]`.
pub(super) fn supports(x: &FlexTensor, gamma: &FlexTensor) -> bool {
    let (xs, gs) = (x.layout().shape(), gamma.layout().shape());
    x.dtype() == DType::F32
        && gamma.dtype() == DType::F32
        && xs.num_dims() == 2
        && gs.num_dims() == 1
        && xs[1] == gs[0]
        && xs[1] > 0
}

/// The normalised rows and their statistics (`mean` for LayerNorm, `1/σ`), `[rows, 1]` f32.
pub(super) fn forward(
    x: FlexTensor,
    gamma: FlexTensor,
    beta: Option<FlexTensor>,
    spec: NormSpec,
) -> NormSaved<Flex> {
    let hidden = gamma.layout().shape()[0];
    let (x, gamma, beta) = (floats(x), floats(gamma), beta.map(floats));
    let rows = x.len() / hidden;
    let layer = spec.kind == NormKind::Layer;
    let mut out = vec![0.0f32; x.len()];
    let mut mean = vec![0.0f32; rows];
    let mut rstd = vec![0.0f32; rows];
    out.par_chunks_mut(ROWS_PER_TASK * hidden)
        .zip(mean.par_chunks_mut(ROWS_PER_TASK))
        .zip(rstd.par_chunks_mut(ROWS_PER_TASK))
        .zip(x.par_chunks(ROWS_PER_TASK * hidden))
        .for_each(|(((out, mean), rstd), x)| {
            for (((y, m), r), x) in out
                .chunks_mut(hidden)
                .zip(mean.iter_mut())
                .zip(rstd.iter_mut())
                .zip(x.chunks(hidden))
            {
                *m = if layer {
                    x.iter().sum::<f32>() / hidden as f32
                } else {
                    0.0
                };
                let var = x.iter().map(|&v| (v - *m) * (v - *m)).sum::<f32>() / hidden as f32;
                *r = 1.0 / (var + spec.epsilon as f32).sqrt();
                for (j, (y, &v)) in y.iter_mut().zip(x).enumerate() {
                    *y = (v - *m) * *r * gamma[j] + beta.as_ref().map_or(0.0, |b| b[j]);
                }
            }
        });
    let rows_shape = [rows, 1];
    NormSaved {
        output: tensor(out, vec![rows, hidden]),
        mean: layer.then(|| tensor(mean, rows_shape.to_vec())),
        rstd: tensor(rstd, rows_shape.to_vec()),
    }
}

/// `dx = r·(g − mean(g) − x̂·mean(g·x̂))` with `g = dy·γ` (RMSNorm: no `mean(g)`), plus `into`
/// where given, `dγ = Σ dy·x̂`, `dβ = Σ dy` over the rows.
pub(super) fn backward(
    x: FlexTensor,
    gamma: FlexTensor,
    has_beta: bool,
    stats: NormStats<Flex>,
    grad_output: FlexTensor,
    into: Option<FlexTensor>,
) -> NormGrads<Flex> {
    let hidden = gamma.layout().shape()[0];
    let layer = stats.mean.is_some();
    let (x, gamma, dy, rstd) = (
        floats(x),
        floats(gamma),
        floats(grad_output),
        floats(stats.rstd),
    );
    let mean = stats.mean.map_or_else(|| vec![0.0; rstd.len()], floats);
    assert_eq!(dy.len(), x.len(), "norm backward: dy and x differ in size");
    // dx starts as `into` and each row adds its own term: `into + term`, the sum autodiff
    // would form (addition commutes, so the bits are the same).
    let mut dx = into.map_or_else(|| vec![0.0f32; x.len()], floats);
    assert_eq!(
        dx.len(),
        x.len(),
        "norm backward: into and x differ in size"
    );
    let block = ROWS_PER_TASK * hidden;
    let partials: Vec<(Vec<f32>, Vec<f32>)> = dx
        .par_chunks_mut(block)
        .zip(x.par_chunks(block))
        .zip(dy.par_chunks(block))
        .zip(mean.par_chunks(ROWS_PER_TASK))
        .zip(rstd.par_chunks(ROWS_PER_TASK))
        .map(|((((dx, x), dy), mean), rstd)| {
            let mut d_gamma = vec![0.0f32; hidden];
            let mut d_beta = vec![0.0f32; hidden];
            let rows = dx
                .chunks_mut(hidden)
                .zip(x.chunks(hidden))
                .zip(dy.chunks(hidden));
            for (((dx, x), dy), (&m, &r)) in rows.zip(mean.iter().zip(rstd)) {
                let (mut sum_g, mut sum_gx) = (0.0f32, 0.0f32);
                for j in 0..hidden {
                    let x_hat = (x[j] - m) * r;
                    let g = dy[j] * gamma[j];
                    sum_g += g;
                    sum_gx += g * x_hat;
                    d_gamma[j] += dy[j] * x_hat;
                    d_beta[j] += dy[j];
                }
                let mean_g = if layer { sum_g / hidden as f32 } else { 0.0 };
                let mean_gx = sum_gx / hidden as f32;
                for j in 0..hidden {
                    let x_hat = (x[j] - m) * r;
                    dx[j] += (dy[j] * gamma[j] - mean_g - x_hat * mean_gx) * r;
                }
            }
            (d_gamma, d_beta)
        })
        .collect();
    let mut d_gamma = vec![0.0f32; hidden];
    let mut d_beta = vec![0.0f32; hidden];
    for (g, b) in &partials {
        d_gamma.iter_mut().zip(g).for_each(|(sum, v)| *sum += v);
        d_beta.iter_mut().zip(b).for_each(|(sum, v)| *sum += v);
    }
    NormGrads {
        input: tensor(dx, vec![x.len() / hidden, hidden]),
        gamma: tensor(d_gamma, vec![hidden]),
        beta: has_beta.then(|| tensor(d_beta, vec![hidden])),
    }
}

/// A tensor's elements as f32, row-major.
fn floats(t: FlexTensor) -> Vec<f32> {
    match t.as_slice::<f32>() {
        Some(values) => values.to_vec(),
        None => t
            .into_data()
            .convert::<f32>()
            .into_vec()
            .expect("a float tensor converts to f32"),
    }
}

fn tensor(values: Vec<f32>, shape: Vec<usize>) -> FlexTensor {
    FlexTensor::new(
        Bytes::from_elems(values),
        Layout::contiguous(Shape::from(shape)),
        DType::F32,
    )
}
