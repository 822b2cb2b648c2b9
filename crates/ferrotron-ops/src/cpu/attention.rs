//! Attention straight from the packed QKV projection on burn-flex, one task per sample and
//! key/value group.
//!
//! Composed, attention is the projection's three slices copied out, scores by a batched matmul,
//! the causal mask filled in, a softmax and a second matmul forward, and autodiff's backward of
//! each (zero-padded slice gradients, copies of swapped views, the mask's fill again): some twenty
//! single-threaded passes per layer. At the quick start's 64 × 64 scores per head they were
//! little arithmetic but, once the output layer's GEMMs ran on every core, among the largest
//! parts of what ran on one thread. Here a task gathers its group's keys and values and each query head into
//! small local buffers, and computes scores, softmax and context row by row; the backward
//! recomputes the probabilities from the kept log-sum-exp (as a flash-attention backward does)
//! and writes one packed gradient.
//!
//! Each task sums in a fixed order over its own rows, so the numbers do not depend on the number
//! of threads; a key/value group's gradient is summed over its query heads inside its task. The
//! keys and values are transposed so a query's products with all keys vectorise along the keys
//! (each product still summed over `d` in order), and each task is compiled for the widest
//! vectors the CPU has (`exp.rs`'s `widest!`; every width gives the same bits).

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType, Shape};
use rayon::prelude::*;

use super::exp::{self, widest};
use crate::{AttentionSaved, AttentionSpec};

/// Whether the kernels take this projection: f32 `[batch, seq, groups, per_group + 2, d]`,
/// without dropout (which only the composed graph draws).
pub(super) fn supports(qkv: &FlexTensor, spec: &AttentionSpec) -> bool {
    let shape = qkv.layout().shape();
    qkv.dtype() == DType::F32
        && shape.num_dims() == 5
        && shape[3] >= 3
        && shape.num_elements() > 0
        && spec.dropout == 0.0
}

/// The packed projection's geometry.
#[derive(Clone, Copy)]
pub(super) struct Packed {
    batch: usize,
    seq: usize,
    groups: usize,
    per_group: usize,
    dim: usize,
    scale: f32,
    causal: bool,
    window: Option<usize>,
}

impl Packed {
    fn of(qkv: &FlexTensor, spec: &AttentionSpec) -> Self {
        let shape = qkv.layout().shape();
        Self {
            batch: shape[0],
            seq: shape[1],
            groups: shape[2],
            per_group: shape[3] - 2,
            dim: shape[4],
            scale: spec.scale_for(shape[4]) as f32,
            causal: spec.causal,
            window: spec.window,
        }
    }

    fn slots(&self) -> usize {
        self.per_group + 2
    }

    fn heads(&self) -> usize {
        self.groups * self.per_group
    }

    /// The keys query row `i` sees: `first..end`.
    fn keys(&self, i: usize) -> (usize, usize) {
        let first = self.window.map_or(0, |left| i.saturating_sub(left));
        (first, if self.causal { i + 1 } else { self.seq })
    }

    /// Slot `slot` of group `g` of sample `b`, for every position: `[seq, dim]`.
    fn gather(&self, qkv: &[f32], b: usize, g: usize, slot: usize) -> Vec<f32> {
        let (d, row) = (self.dim, self.groups * self.slots() * self.dim);
        let start = (b * self.seq * self.groups + g) * self.slots() * d + slot * d;
        rows(qkv, start, row, self.seq, d)
    }

    /// Rows `[seq, dim]` of head `h` of sample `b` in a `[batch, seq, heads, dim]` tensor.
    fn head_rows(&self, x: &[f32], b: usize, h: usize) -> Vec<f32> {
        let (d, row) = (self.dim, self.heads() * self.dim);
        let start = b * self.seq * row + h * d;
        rows(x, start, row, self.seq, d)
    }
}

/// `count` rows of `width` elements, the first at `start`, one every `stride`: `[count, width]`.
fn rows(x: &[f32], start: usize, stride: usize, count: usize, width: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(count * width);
    for i in 0..count {
        out.extend_from_slice(&x[start + i * stride..start + i * stride + width]);
    }
    out
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `x [seq, dim]` as `[dim, seq]`, so a query's products with every key run along a row.
fn transposed(x: &[f32], seq: usize, dim: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    for (i, row) in x.chunks(dim).enumerate() {
        for (t, &v) in row.iter().enumerate() {
            out[t * seq + i] = v;
        }
    }
    out
}

/// `out[j] = scale · Σ_t q[t] · xt[t][j]` for the first `out.len()` columns of `xt [dim, seq]`
/// (`&xt[first..]` starts at column `first`: a sliding window's first key): every column summed
/// in the order `t = 0, 1, …`, so the loop vectorises over `j`.
#[inline(always)]
fn products(q: &[f32], xt: &[f32], seq: usize, scale: f32, out: &mut [f32]) {
    out.fill(0.0);
    for (t, &qt) in q.iter().enumerate() {
        for (o, &x) in out.iter_mut().zip(&xt[t * seq..]) {
            *o += qt * x;
        }
    }
    out.iter_mut().for_each(|o| *o *= scale);
}

/// `y += a · x`.
#[inline(always)]
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    y.iter_mut().zip(x).for_each(|(y, &x)| *y += a * x);
}

/// The context `[batch, seq, heads, d]` and the per-row log-sum-exp `[batch, heads, seq, 1]`.
pub(super) fn forward(
    qkv: FlexTensor,
    spec: &AttentionSpec,
) -> AttentionSaved<burn::backend::Flex> {
    let p = Packed::of(&qkv, spec);
    let qkv = contiguous(qkv);
    let data = qkv
        .as_slice::<f32>()
        .expect("contiguous f32 (checked above)");
    let tasks: Vec<(Vec<f32>, Vec<f32>)> = (0..p.batch * p.groups)
        .into_par_iter()
        .map(|task| forward_task(data, &p, task / p.groups, task % p.groups))
        .collect();
    let (d, per_group) = (p.dim, p.per_group);
    let mut output = vec![0.0f32; p.batch * p.seq * p.heads() * d];
    output
        .par_chunks_mut(p.seq * p.heads() * d)
        .enumerate()
        .for_each(|(b, sample)| {
            for (g, (out, _)) in tasks[b * p.groups..(b + 1) * p.groups].iter().enumerate() {
                for i in 0..p.seq {
                    let to = (i * p.heads() + g * per_group) * d;
                    let from = i * per_group * d;
                    sample[to..to + per_group * d]
                        .copy_from_slice(&out[from..from + per_group * d]);
                }
            }
        });
    // Tasks run sample-major, group-minor, and a group's heads are consecutive: the statistics
    // of the tasks in order are the `[batch, heads, seq]` layout.
    let stats: Vec<f32> = tasks.into_iter().flat_map(|(_, lse)| lse).collect();
    AttentionSaved {
        output: tensor(output, [p.batch, p.seq, p.heads(), d]),
        stats: tensor(stats, [p.batch, p.heads(), p.seq, 1]),
        rng: [0, 0],
    }
}

widest! {
    /// Sample `b`, group `g`: the context `[seq, per_group, d]` and log-sum-exps
    /// `[per_group, seq]`.
    fn forward_task(qkv: &[f32], p: &Packed, b: usize, g: usize) -> (Vec<f32>, Vec<f32>) {
        let (d, s) = (p.dim, p.seq);
        let key = transposed(&p.gather(qkv, b, g, p.per_group), s, d);
        let value = p.gather(qkv, b, g, p.per_group + 1);
        let mut out = vec![0.0f32; s * p.per_group * d];
        let mut lse = vec![0.0f32; p.per_group * s];
        let mut weights = vec![0.0f32; s];
        for h in 0..p.per_group {
            let query = p.gather(qkv, b, g, h);
            for i in 0..s {
                let (first, end) = p.keys(i);
                let weights = &mut weights[..end - first];
                products(&query[i * d..(i + 1) * d], &key[first..], s, p.scale, weights);
                let max = weights.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                weights.iter_mut().for_each(|w| *w = exp::exp(*w - max));
                let sum = weights.iter().sum::<f32>();
                let row = &mut out[(i * p.per_group + h) * d..(i * p.per_group + h + 1) * d];
                for (j, &w) in (first..).zip(weights.iter()) {
                    axpy(row, w, &value[j * d..(j + 1) * d]);
                }
                let inverse = 1.0 / sum;
                row.iter_mut().for_each(|o| *o *= inverse);
                lse[h * s + i] = max + sum.ln();
            }
        }
        (out, lse)
    }
}

/// The packed projection's gradient `[batch, seq, groups, per_group + 2, d]` from the context's.
pub(super) fn backward(
    qkv: FlexTensor,
    saved: AttentionSaved<burn::backend::Flex>,
    grad_output: FlexTensor,
    spec: &AttentionSpec,
) -> FlexTensor {
    let p = Packed::of(&qkv, spec);
    let tensors = [qkv, saved.output, saved.stats, grad_output].map(contiguous);
    let [data, output, stats, grad] = tensors
        .each_ref()
        .map(|t| t.as_slice::<f32>().expect("contiguous f32 attention state"));
    assert_eq!(
        grad.len(),
        p.batch * p.seq * p.heads() * p.dim,
        "attention backward: a [batch, seq, heads, d] output gradient"
    );
    let state = State {
        qkv: data,
        output,
        stats,
        grad,
    };
    let tasks: Vec<Vec<f32>> = (0..p.batch * p.groups)
        .into_par_iter()
        .map(|task| backward_task(&state, &p, task / p.groups, task % p.groups))
        .collect();
    let width = p.slots() * p.dim;
    let mut packed = vec![0.0f32; p.batch * p.seq * p.groups * width];
    packed
        .par_chunks_mut(p.seq * p.groups * width)
        .enumerate()
        .for_each(|(b, sample)| {
            for (g, local) in tasks[b * p.groups..(b + 1) * p.groups].iter().enumerate() {
                for i in 0..p.seq {
                    let to = (i * p.groups + g) * width;
                    sample[to..to + width].copy_from_slice(&local[i * width..(i + 1) * width]);
                }
            }
        });
    tensor(packed, [p.batch, p.seq, p.groups, p.slots(), p.dim])
}

/// What every backward task reads.
pub(super) struct State<'a> {
    qkv: &'a [f32],
    output: &'a [f32],
    stats: &'a [f32],
    grad: &'a [f32],
}

widest! {
    /// Sample `b`, group `g`: the gradient of its slots `[seq, per_group + 2, d]`.
    fn backward_task(state: &State<'_>, p: &Packed, b: usize, g: usize) -> Vec<f32> {
        let (d, s) = (p.dim, p.seq);
        let key = p.gather(state.qkv, b, g, p.per_group);
        let (key_t, value_t) = (
            transposed(&key, s, d),
            transposed(&p.gather(state.qkv, b, g, p.per_group + 1), s, d),
        );
        let mut d_key = vec![0.0f32; s * d];
        let mut d_value = vec![0.0f32; s * d];
        let mut local = vec![0.0f32; s * p.slots() * d];
        let (mut probs, mut d_scores) = (vec![0.0f32; s], vec![0.0f32; s]);
        for h in 0..p.per_group {
            let head = g * p.per_group + h;
            let query = p.gather(state.qkv, b, g, h);
            let out = p.head_rows(state.output, b, head);
            let d_out = p.head_rows(state.grad, b, head);
            let lse = &state.stats[(b * p.heads() + head) * s..][..s];
            for i in 0..s {
                let (q, d_o) = (&query[i * d..(i + 1) * d], &d_out[i * d..(i + 1) * d]);
                let (first, end) = p.keys(i);
                let (probs, d_scores) = (&mut probs[..end - first], &mut d_scores[..end - first]);
                products(q, &key_t[first..], s, p.scale, probs);
                probs.iter_mut().for_each(|x| *x = exp::exp(*x - lse[i]));
                // dS = P ∘ (dO·vᵀ − rowsum(dO ∘ O)), scaled for q·kᵀ's gradients
                products(d_o, &value_t[first..], s, 1.0, d_scores);
                let delta = dot(d_o, &out[i * d..(i + 1) * d]);
                for (ds, &prob) in d_scores.iter_mut().zip(probs.iter()) {
                    *ds = prob * (*ds - delta) * p.scale;
                }
                let d_q = &mut local[(i * p.slots() + h) * d..(i * p.slots() + h + 1) * d];
                for (j, (&prob, &ds)) in (first..).zip(probs.iter().zip(d_scores.iter())) {
                    axpy(&mut d_value[j * d..(j + 1) * d], prob, d_o);
                    axpy(d_q, ds, &key[j * d..(j + 1) * d]);
                    axpy(&mut d_key[j * d..(j + 1) * d], ds, q);
                }
            }
        }
        for i in 0..s {
            let row = &mut local[i * p.slots() * d..(i + 1) * p.slots() * d];
            row[p.per_group * d..(p.per_group + 1) * d].copy_from_slice(&d_key[i * d..(i + 1) * d]);
            row[(p.per_group + 1) * d..].copy_from_slice(&d_value[i * d..(i + 1) * d]);
        }
        local
    }
}

fn contiguous(t: FlexTensor) -> FlexTensor {
    if t.as_slice::<f32>().is_some() {
        t
    } else {
        t.to_contiguous()
    }
}

fn tensor<const D: usize>(values: Vec<f32>, shape: [usize; D]) -> FlexTensor {
    FlexTensor::new(
        Bytes::from_elems(values),
        Layout::contiguous(Shape::new(shape)),
        DType::F32,
    )
}
