//! The norm in front of an fp8 linear or MLP, inside the same node: Transformer Engine's
//! `LayerNormLinear` and `LayerNormMLP`.
//!
//! A pre-norm layer's QKV projection and fc1 read the norm's output only through its fp8 cast.
//! Apart, the norm writes a 16-bit `[tokens, hidden]` output and the cast reads it back;
//! together ([`FusedOps::fp8_quantize_norm`]) the cast normalises the rows as it reads them from
//! the row statistics, and the 16-bit output is never stored. The backward runs the norm's
//! backward on the data gradient the node's GEMM produced, adding the residual branch's share
//! of the input's gradient as the plain norm node does (`op/norm.rs`).
//!
//! [`FusedOps::fp8_quantize_norm`]: crate::FusedOps::fp8_quantize_norm

use burn::backend::Autodiff;
use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Shape, TensorMetadata};

use crate::FusedOps;
use crate::fp8::linear::{Fp8Linear, Fp8Tensor};
use crate::fp8::scaling::Fp8Role;
use crate::op::norm::{NormSpec, NormStats, fold_rows};

/// The norm an fp8 node applies to its input first: `γ`, `β` (LayerNorm with a bias) and which
/// norm.
#[derive(Debug, Clone)]
pub struct Fp8InputNorm<B: Backend> {
    pub gamma: FloatTensor<B>,
    pub beta: Option<FloatTensor<B>>,
    pub spec: NormSpec,
}

impl<B: Backend, C: CheckpointStrategy> Fp8InputNorm<Autodiff<B, C>> {
    /// The norm on the inner backend, after handing γ and β (parents of the node it joins, in
    /// that order) to `parent`.
    pub(crate) fn untracked(
        self,
        mut parent: impl FnMut(&FloatTensor<Autodiff<B, C>>),
    ) -> Fp8InputNorm<B> {
        parent(&self.gamma);
        if let Some(beta) = &self.beta {
            parent(beta);
        }
        Fp8InputNorm {
            gamma: self.gamma.primitive,
            beta: self.beta.map(|b| b.primitive),
            spec: self.spec,
        }
    }
}

/// Default of [`FusedOps::fp8_quantize_norm`]: the norm kernel's 16-bit output, then the cast.
///
/// [`FusedOps::fp8_quantize_norm`]: crate::FusedOps::fp8_quantize_norm
pub fn fp8_quantize_norm_composed<B: FusedOps>(
    x: FloatTensor<B>,
    norm: Fp8InputNorm<B>,
    fp8: &Fp8Linear,
    record: bool,
) -> (Fp8Tensor<B>, NormStats<B>) {
    let saved = B::norm_kernel_forward(x, norm.gamma, norm.beta, norm.spec);
    let stats = NormStats {
        mean: saved.mean,
        rstd: saved.rstd,
    };
    (
        B::fp8_quantize(saved.output, fp8, Fp8Role::Input, record),
        stats,
    )
}

/// What a node with an input norm keeps for the norm's backward: its input (the caller's
/// tensor, whose gradient may already hold the residual branch's share), γ and the row
/// statistics.
pub(crate) struct InputNormState<B: Backend> {
    pub(crate) x: FloatTensor<Autodiff<B>>,
    pub gamma: FloatTensor<B>,
    pub has_beta: bool,
    pub stats: NormStats<B>,
}

impl<B: Backend> Clone for InputNormState<B> {
    fn clone(&self) -> Self {
        InputNormState {
            x: self.x.clone(),
            gamma: self.gamma.clone(),
            has_beta: self.has_beta,
            stats: self.stats.clone(),
        }
    }
}

/// The graph nodes an input norm's gradients go to (`None`: not tracked).
pub(crate) struct InputNormParents {
    pub x: Option<NodeId>,
    pub gamma: Option<NodeId>,
    pub beta: Option<NodeId>,
}

impl InputNormParents {
    /// Whether anything needs the gradient of the norm's output.
    pub(crate) fn any(&self) -> bool {
        self.x.is_some() || self.gamma.is_some() || self.beta.is_some()
    }
}

/// Registers the norm's gradients from `d_normed` (the gradient of its output, any shape with
/// `[.., hidden]` rows).
pub(crate) fn input_norm_backward<B: FusedOps>(
    state: InputNormState<B>,
    d_normed: FloatTensor<B>,
    parents: InputNormParents,
    grads: &mut Gradients,
) {
    let shape: Shape = state.x.primitive.shape();
    let into = parents
        .x
        .and_then(|_| grads.remove::<B>(&state.x))
        .map(fold_rows::<B>);
    let out = B::norm_kernel_backward(
        fold_rows::<B>(state.x.primitive),
        state.gamma,
        state.has_beta,
        state.stats,
        fold_rows::<B>(d_normed),
        into,
    );
    if let Some(id) = parents.x {
        grads.register::<B>(id, B::float_reshape(out.input, shape));
    }
    if let Some(id) = parents.gamma {
        grads.register::<B>(id, out.gamma);
    }
    if let (Some(id), Some(beta)) = (parents.beta, out.beta) {
        grads.register::<B>(id, beta);
    }
}
