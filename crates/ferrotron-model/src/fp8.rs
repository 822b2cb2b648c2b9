//! fp8 GEMMs in the transformer layers (issue 17): which linears take them, and the call.
//!
//! Transformer Engine's split: the four GEMMs of a layer (attention's QKV and output
//! projections, the MLP's fc1 — SwiGLU's packed gate and up — and fc2) run in fp8 through
//! `FusedOps::fp8_linear`; norms, attention itself, the activation, the residual stream, the
//! embedding, the output (logits) layer and the loss stay in the model's dtype, as do the MoE
//! experts' grouped GEMMs unless `precision.fp8_experts` puts them in fp8 too (one slot for each
//! linear's routed rows, one for each expert's weight: `ferrotron_ops`'s `fp8/experts.rs`). A
//! chunk's fp8 linears share one `Fp8State`, named by their weights' parameter paths
//! (`layers.3.attention.qkv`) so checkpoints keep each layer's scales.

use std::sync::Arc;

use burn::nn::Linear;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};
use ferrotron_ops::fp8::scaling::Fp8Settings;
use ferrotron_ops::{Fp8InputNorm, Fp8Linear, Fp8Residual, Fp8Rope, Fp8State, FusedOps};
use ferrotron_parallel::ParallelOps;

use crate::block::TransformerBlock;
use crate::parallel::TensorParallel;

/// `linear(x)`, in fp8 when the layer has a handle.
pub(crate) fn linear<B: FusedOps, const D: usize>(
    layer: &Linear<B>,
    x: Tensor<B, D>,
    fp8: Option<&Fp8Linear>,
) -> Tensor<B, D> {
    match fp8 {
        Some(fp8) => fused_linear(layer, x, None, (None, None), fp8),
        None => layer.forward(x),
    }
}

/// `layer(norm(x))` in fp8, the norm inside the linear's node (`Norm::fp8_input`) where given,
/// and its output rotated there too where `rope` is (a packed QKV projection) or added to
/// `residual` after dropout where that is (a block's output projection).
pub(crate) fn fused_linear<B: FusedOps, const D: usize>(
    layer: &Linear<B>,
    x: Tensor<B, D>,
    norm: Option<Fp8InputNorm<B>>,
    (rope, residual): (Option<Fp8Rope<B>>, Option<Fp8Residual<B>>),
    fp8: &Fp8Linear,
) -> Tensor<B, D> {
    let bias = layer
        .bias
        .as_ref()
        .map(|b| b.val().into_primitive().tensor());
    Tensor::from_primitive(TensorPrimitive::Float(B::fp8_fused_linear(
        x.into_primitive().tensor(),
        norm,
        layer.weight.val().into_primitive().tensor(),
        bias,
        rope,
        residual,
        fp8,
    )))
}

/// A row-parallel layer ([`TensorParallel::row_parallel`]) in fp8 when it has a handle: the
/// partial products joined over the group, the bias added once.
pub(crate) fn row_parallel<B: ParallelOps, const D: usize>(
    tp: &TensorParallel,
    layer: &Linear<B>,
    x: Tensor<B, D>,
    fp8: Option<&Fp8Linear>,
) -> Tensor<B, D> {
    let bias = layer.bias.as_ref().map(|b| b.val());
    match fp8 {
        None => tp.row_parallel(x, layer.weight.val(), bias),
        Some(_) if tp.size() == 1 => linear(layer, x, fp8),
        Some(fp8) => {
            let unbiased = Linear {
                weight: layer.weight.clone(),
                bias: None,
            };
            let output = tp.exit(linear(&unbiased, x, Some(fp8)));
            match bias {
                Some(bias) => output + bias.unsqueeze(),
                None => output,
            }
        }
    }
}

/// `layers` (the first is global layer `first`) with fp8 handles in those `in_fp8` picks (their
/// routed experts' too with `experts`), and their shared state (`None` when no layer is picked).
pub(crate) fn assign<B: Backend>(
    layers: Vec<TransformerBlock<B>>,
    first: usize,
    settings: Fp8Settings,
    in_fp8: impl Fn(usize) -> bool,
    experts: bool,
) -> (Vec<TransformerBlock<B>>, Option<Arc<Fp8State>>) {
    let picked = |i: usize| in_fp8(first + i);
    let names: Vec<String> = layers
        .iter()
        .enumerate()
        .filter(|(i, _)| picked(*i))
        .flat_map(|(i, layer)| {
            layer
                .fp8_linears(experts)
                .into_iter()
                .map(move |name| format!("layers.{}.{name}", first + i))
        })
        .collect();
    if names.is_empty() {
        return (layers, None);
    }
    let state = Fp8State::new(settings, names);
    let mut slot = 0;
    let layers = layers
        .into_iter()
        .enumerate()
        .map(|(i, layer)| {
            if !picked(i) {
                return layer;
            }
            let count = layer.fp8_linears(experts).len();
            let handles = (slot..slot + count)
                .map(|s| Fp8Linear::new(&state, s))
                .collect();
            slot += count;
            layer.with_fp8(handles)
        })
        .collect();
    (layers, Some(state))
}
