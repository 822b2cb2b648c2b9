//! Fused normalisation (GPT-2's LayerNorm, LLaMA's RMSNorm) for [`FusedOps`].
//!
//! Under autodiff burn records a norm as eight to ten element-wise nodes, each keeping its
//! activations for the backward: on the GPU a norm costs more time and memory than the GEMM
//! beside it. A kernel pair normalises a row in one pass, keeps only the row statistics
//! (`mean`, `1/σ` in f32) and computes all three gradients in its backward.
//!
//! [`norm`] is what the model calls: without a kernel it is exactly burn's `LayerNorm` /
//! `RmsNorm` forward on the caller's tensor (so CPU numbers do not move); with one, the
//! backend's kernel (or autodiff node) runs on the rows folded to `[rows, hidden]` inside it.
//!
//! The node takes the caller's tensor itself as its parent, not a folded copy, because of the
//! residual stream: a pre-norm layer's input `h` feeds the norm and, unchanged, the residual
//! add, so its gradient is the sum of both branches'. The add's backward runs first and leaves
//! its share in the gradient container; the norm's backward takes it out and its kernel adds
//! it while writing `dx` (`into`), instead of autodiff adding the two `[rows, hidden]`
//! gradients in a pass of its own (2.3 % of an fp8 gpt-1.3b step on the H200).
//!
//! [`FusedOps`]: crate::FusedOps

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, Tensor, TensorMetadata};

use crate::FusedOps;
use crate::primitive::{unwrap, wrap};

/// Which normalisation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NormKind {
    /// `(x − mean) / sqrt(var + ε) · γ + β` (biased variance).
    Layer,
    /// `x / sqrt(mean(x²) + ε) · γ`.
    Rms,
}

/// One normalisation over the last dimension.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NormSpec {
    pub kind: NormKind,
    pub epsilon: f64,
}

/// What a norm kernel's forward keeps for its backward, besides x and γ.
#[derive(Debug, Clone)]
pub struct NormSaved<B: Backend> {
    /// `[rows, hidden]`, the input's dtype.
    pub output: FloatTensor<B>,
    /// Row means `[rows, 1]` in f32 (LayerNorm only).
    pub mean: Option<FloatTensor<B>>,
    /// Row `1/sqrt(var + ε)` (or `1/rms`) `[rows, 1]` in f32.
    pub rstd: FloatTensor<B>,
}

/// The row statistics a norm's backward reads.
#[derive(Debug, Clone)]
pub struct NormStats<B: Backend> {
    /// Row means `[rows, 1]` in f32 (LayerNorm only).
    pub mean: Option<FloatTensor<B>>,
    /// Row `1/sqrt(var + ε)` (or `1/rms`) `[rows, 1]` in f32.
    pub rstd: FloatTensor<B>,
}

impl<B: Backend> NormSaved<B> {
    /// What the backward needs of this forward (the output is not).
    pub fn into_stats(self) -> NormStats<B> {
        NormStats {
            mean: self.mean,
            rstd: self.rstd,
        }
    }
}

/// Gradients of a norm: input `[rows, hidden]`, γ and β `[hidden]` in their own dtypes.
#[derive(Debug, Clone)]
pub struct NormGrads<B: Backend> {
    pub input: FloatTensor<B>,
    pub gamma: FloatTensor<B>,
    pub beta: Option<FloatTensor<B>>,
}

/// The model's normalisation: burn's modules' arithmetic, or the backend's fused kernel.
pub fn norm<B: FusedOps, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    beta: Option<Tensor<B, 1>>,
    spec: NormSpec,
) -> Tensor<B, D> {
    let x_primitive = x.clone().into_primitive().tensor();
    let gamma_primitive = gamma.clone().into_primitive().tensor();
    if !B::has_norm_kernel(&x_primitive, &gamma_primitive, &spec) {
        return composed_norm(x, gamma, beta, spec);
    }
    wrap(B::fused_norm(
        x_primitive,
        gamma_primitive,
        beta.map(unwrap),
        spec,
    ))
}

/// `x [.., hidden]` as `[rows, hidden]` (a view of a contiguous tensor).
pub(crate) fn fold_rows<B: Backend>(x: FloatTensor<B>) -> FloatTensor<B> {
    let dims = x.shape().to_vec();
    let hidden = dims.last().copied().unwrap_or(1);
    let rows = dims.iter().product::<usize>() / hidden.max(1);
    B::float_reshape(x, Shape::new([rows, hidden]))
}

/// burn 0.21's `LayerNorm::forward` (the backend's `layer_norm`) and `RmsNorm::forward`.
pub fn composed_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    beta: Option<Tensor<B, 1>>,
    spec: NormSpec,
) -> Tensor<B, D> {
    match spec.kind {
        NormKind::Layer => wrap(B::layer_norm(
            unwrap(x),
            unwrap(gamma),
            beta.map(unwrap),
            spec.epsilon,
        )),
        NormKind::Rms => {
            let dtype = x.dtype();
            let rms = (x.clone().cast(DType::F32).square().mean_dim(D - 1) + spec.epsilon).sqrt();
            (x / rms.cast(dtype)) * gamma.unsqueeze()
        }
    }
}

/// Reference of [`FusedOps::norm_kernel_forward`] on `[rows, hidden]`, statistics in f32.
#[cfg_attr(not(feature = "reference"), allow(unreachable_pub))]
pub fn norm_forward_reference<B: Backend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: Option<FloatTensor<B>>,
    spec: NormSpec,
) -> NormSaved<B> {
    let x: Tensor<B, 2> = wrap(x);
    let dtype = x.dtype();
    let x = x.cast(DType::F32);
    let gamma: Tensor<B, 1> = wrap(gamma);
    let (centered, mean) = match spec.kind {
        NormKind::Layer => {
            let mean = x.clone().mean_dim(1);
            (x - mean.clone(), Some(mean))
        }
        NormKind::Rms => (x, None),
    };
    let rstd = (centered.clone().square().mean_dim(1) + spec.epsilon)
        .sqrt()
        .recip();
    let mut y = centered * rstd.clone() * gamma.cast(DType::F32).unsqueeze();
    if let Some(beta) = beta {
        y = y + wrap::<B, 1>(beta).cast(DType::F32).unsqueeze();
    }
    NormSaved {
        output: unwrap(y.cast(dtype)),
        mean: mean.map(unwrap),
        rstd: unwrap(rstd),
    }
}

/// Reference of [`FusedOps::norm_kernel_backward`]: with `x̂ = (x − mean)·r` and
/// `g = dy·γ`, `dx = r·(g − mean(g) − x̂·mean(g·x̂))` (RMSNorm: no `mean(g)` term) plus `into`
/// where given, `dγ = Σ_rows dy·x̂`, `dβ = Σ_rows dy`.
#[cfg_attr(not(feature = "reference"), allow(unreachable_pub))]
pub fn norm_backward_reference<B: Backend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    has_beta: bool,
    stats: NormStats<B>,
    grad_output: FloatTensor<B>,
    into: Option<FloatTensor<B>>,
) -> NormGrads<B> {
    let x: Tensor<B, 2> = wrap(x);
    let dtype = x.dtype();
    let [_, hidden] = x.dims();
    let layer = stats.mean.is_some();
    let gamma: Tensor<B, 1> = wrap(gamma);
    let gamma_dtype = gamma.dtype();
    let rstd: Tensor<B, 2> = wrap(stats.rstd);
    let x = x.cast(DType::F32);
    let centered = match stats.mean {
        Some(mean) => x - wrap::<B, 2>(mean),
        None => x,
    };
    let x_hat = centered * rstd.clone();
    let dy = wrap::<B, 2>(grad_output).cast(DType::F32);
    let g = dy.clone() * gamma.cast(DType::F32).unsqueeze();
    let projection = x_hat.clone() * (g.clone() * x_hat.clone()).mean_dim(1);
    let g = if layer { g.clone() - g.mean_dim(1) } else { g };
    let input = (g - projection) * rstd;
    let input = match into {
        Some(into) => input + wrap::<B, 2>(into).cast(DType::F32),
        None => input,
    };
    let gamma_grad = (dy.clone() * x_hat).sum_dim(0).reshape([hidden]);
    let beta = has_beta.then(|| unwrap(dy.sum_dim(0).reshape([hidden]).cast(gamma_dtype)));
    NormGrads {
        input: unwrap(input.cast(dtype)),
        gamma: unwrap(gamma_grad.cast(gamma_dtype)),
        beta,
    }
}

#[derive(Debug)]
struct NormOp;

/// State of one norm node: x (the caller's tensor, whose node may already hold a gradient from
/// the residual branch when the backward runs), γ and the row statistics.
type NormState<B> = (FloatTensor<Autodiff<B>>, FloatTensor<B>, NormStats<B>);

/// Parents are x, γ and, for a LayerNorm with a bias, β (`N` = 3).
impl<B: FusedOps, const N: usize> Backward<B, N> for NormOp {
    type State = NormState<B>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (x, gamma, stats) = ops.state;
        let shape = x.primitive.shape();
        // The residual branch's share of x's gradient, added by the kernel (op/norm.rs).
        let into = ops.parents[0]
            .as_ref()
            .and_then(|_| grads.remove::<B>(&x))
            .map(fold_rows::<B>);
        let out = B::norm_kernel_backward(
            fold_rows::<B>(x.primitive),
            gamma,
            N == 3,
            stats,
            fold_rows::<B>(grad),
            into,
        );
        let [node_x, node_gamma] = [&ops.parents[0], &ops.parents[1]];
        if let Some(node) = node_x {
            grads.register::<B>(node.id, B::float_reshape(out.input, shape));
        }
        if let Some(node) = node_gamma {
            grads.register::<B>(node.id, out.gamma);
        }
        if let (Some(Some(node)), Some(beta)) = (ops.parents.get(2), out.beta) {
            grads.register::<B>(node.id, beta);
        }
    }
}

fn finish_norm<B: FusedOps, C: CheckpointStrategy, const N: usize>(
    prepared: OpsKind<NormOp, B, NormState<B>, C, N>,
    x: FloatTensor<Autodiff<B>>,
    gamma: FloatTensor<B>,
    beta: Option<FloatTensor<B>>,
    spec: NormSpec,
) -> FloatTensor<Autodiff<B, C>> {
    let shape = x.primitive.shape();
    let rows = fold_rows::<B>(x.primitive.clone());
    match prepared {
        OpsKind::Tracked(prep) => {
            let saved = B::norm_kernel_forward(rows, gamma.clone(), beta, spec);
            let output = B::float_reshape(saved.output.clone(), shape);
            prep.finish((x, gamma, saved.into_stats()), output)
        }
        OpsKind::UnTracked(prep) => {
            let output = B::norm_kernel_forward(rows, gamma, beta, spec).output;
            prep.finish(B::float_reshape(output, shape))
        }
    }
}

/// Records a norm of `x [.., hidden]` as one node whose forward and backward are `B`'s norm
/// kernels on the rows, and whose backward adds the gradient x already has (see
/// `op/norm.rs`). Public so tests can drive the node with a CPU backend's reference kernels.
pub fn norm_node<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    gamma: FloatTensor<Autodiff<B, C>>,
    beta: Option<FloatTensor<Autodiff<B, C>>>,
    spec: NormSpec,
) -> FloatTensor<Autodiff<B, C>> {
    match beta {
        Some(beta) => {
            let prepared = NormOp
                .prepare::<C>([x.node.clone(), gamma.node.clone(), beta.node.clone()])
                .compute_bound()
                .stateful();
            finish_norm(prepared, x, gamma.primitive, Some(beta.primitive), spec)
        }
        None => {
            let prepared = NormOp
                .prepare::<C>([x.node.clone(), gamma.node.clone()])
                .compute_bound()
                .stateful();
            finish_norm(prepared, x, gamma.primitive, None, spec)
        }
    }
}
