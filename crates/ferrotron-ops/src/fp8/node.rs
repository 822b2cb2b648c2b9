//! The fp8 linear's autodiff node (see `fp8/linear.rs`): the forward's fp8 GEMM, and a backward
//! that casts the output gradient once (`dy` and `dyᵀ`, e5m2 in the hybrid format) for both
//! gradient GEMMs. The node keeps `xᵀ` in fp8 and the step's weight casts, not the 16-bit `x`
//! burn's linear keeps. The bias gradient is the column sum of the 16-bit `dy`, summed by the
//! cast that reads it (`FusedOps::fp8_quantize_source`), as Transformer Engine does.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, TensorMetadata};

use crate::FusedOps;
use crate::fp8::linear::{Fp8Linear, Fp8Operand, Fp8Tensor, fp8_forward};
use crate::fp8::norm::{Fp8InputNorm, InputNormParents, InputNormState, input_norm_backward};
use crate::fp8::residual::{Fp8Residual, add_residual};
use crate::fp8::rope::{Fp8Rope, rotate_output};
use crate::fp8::scaling::Fp8Role;
use crate::fp8::source::Fp8Source;
use crate::op::dropout::DropoutMask;

#[derive(Debug)]
struct Fp8LinearOp;

/// What the backward needs: `xᵀ` and the weight in fp8, the layer, the input's shape and the
/// dtypes the gradients are handed back in; with an input norm, what its backward needs.
struct Fp8LinearState<B: burn::tensor::backend::Backend> {
    input_t: Fp8Operand<B>,
    weight: Fp8Tensor<B>,
    fp8: Fp8Linear,
    input_shape: Vec<usize>,
    input_dtype: DType,
    weight_dtype: DType,
    bias_dtype: Option<DType>,
    norm: Option<InputNormState<B>>,
    rope: Option<Fp8Rope<B>>,
    /// The residual add's keep mask and dropout probability, with one.
    residual: Option<(DropoutMask<B>, f64)>,
}

impl<B: burn::tensor::backend::Backend> Clone for Fp8LinearState<B> {
    fn clone(&self) -> Self {
        Fp8LinearState {
            input_t: self.input_t.clone(),
            weight: self.weight.clone(),
            fp8: self.fp8.clone(),
            input_shape: self.input_shape.clone(),
            input_dtype: self.input_dtype,
            weight_dtype: self.weight_dtype,
            bias_dtype: self.bias_dtype,
            norm: self.norm.clone(),
            rope: self.rope.clone(),
            residual: self.residual.clone(),
        }
    }
}

impl<B: burn::tensor::backend::Backend> std::fmt::Debug for Fp8LinearState<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fp8LinearState({:?})", self.fp8)
    }
}

/// Parents are `x`, the weight, then the bias, γ, β and the residual where present.
impl<B: FusedOps, const N: usize> Backward<B, N> for Fp8LinearOp {
    type State = Fp8LinearState<B>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let state = ops.state;
        let id = |i: usize| ops.parents.get(i).and_then(|p| p.as_ref()).map(|n| n.id);
        let bias = state.bias_dtype.map(|_| 2);
        let gamma = state.norm.as_ref().map(|_| 2 + usize::from(bias.is_some()));
        let beta = state
            .norm
            .as_ref()
            .filter(|norm| norm.has_beta)
            .and(gamma.map(|g| g + 1));
        if let (Some(_), Some(node)) = (&state.residual, N.checked_sub(1).and_then(id)) {
            grads.register::<B>(node, grad.clone());
        }
        let n = state.weight.width();
        let m = grad.shape().num_elements() / n.max(1);
        let grad = B::float_reshape(grad, Shape::new([m, n]));
        let source = match (state.rope.clone(), state.residual.clone()) {
            (Some(rope), _) => Fp8Source::RopeGrad { grad, rope },
            (None, Some((mask, prob))) => Fp8Source::DropoutGrad { grad, mask, prob },
            (None, None) => Fp8Source::Plain(grad),
        };
        let (cast, db) = B::fp8_quantize_source(
            source,
            &state.fp8,
            Fp8Role::GradOutput,
            true,
            state.bias_dtype.is_some(),
        );
        let norm_parents = InputNormParents {
            x: id(0).filter(|_| state.norm.is_some()),
            gamma: gamma.and_then(id),
            beta: beta.and_then(id),
        };
        if id(0).is_some() || norm_parents.any() {
            let dx = B::fp8_matmul(
                cast.rows(),
                state.weight.rows(),
                None,
                state.input_dtype,
                false,
            );
            let dx = B::float_reshape(dx, Shape::from(state.input_shape.clone()));
            match state.norm {
                Some(norm) => input_norm_backward::<B>(norm, dx, norm_parents, grads),
                None => {
                    if let Some(node) = id(0) {
                        grads.register::<B>(node, dx);
                    }
                }
            }
        }
        if let Some(node) = id(1) {
            let dw = B::fp8_matmul(
                state.input_t,
                cast.columns(),
                None,
                state.weight_dtype,
                false,
            );
            grads.register::<B>(node, dw);
        }
        if let (Some(node), Some(db), Some(dtype)) = (bias.and_then(id), db, state.bias_dtype) {
            grads.register::<B>(node, in_dtype::<B>(db, dtype));
        }
    }
}

/// `x` in `dtype` (a gradient handed back in its parameter's dtype).
pub(crate) fn in_dtype<B: FusedOps>(x: FloatTensor<B>, dtype: DType) -> FloatTensor<B> {
    if x.dtype() == dtype {
        x
    } else {
        B::float_cast(x, dtype.into())
    }
}

impl<B: burn::tensor::backend::Backend> Fp8Tensor<B> {
    /// Columns of the `[rows, cols]` tensor (a weight's output features).
    fn width(&self) -> usize {
        self.data.shape().dims::<2>()[1]
    }
}

fn finish<B: FusedOps, C: CheckpointStrategy, const N: usize>(
    prepared: OpsKind<Fp8LinearOp, B, Fp8LinearState<B>, C, N>,
    x: FloatTensor<Autodiff<B, C>>,
    norm: Option<Fp8InputNorm<B>>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    (rope, residual): (Option<Fp8Rope<B>>, Option<Fp8Residual<B>>),
    fp8: &Fp8Linear,
) -> FloatTensor<Autodiff<B, C>> {
    let input_shape = x.primitive.shape().to_vec();
    let input_dtype = x.primitive.dtype();
    let weight_dtype = weight.dtype();
    let bias_dtype = bias.as_ref().map(TensorMetadata::dtype);
    let norm_input = norm
        .as_ref()
        .map(|norm| (norm.gamma.clone(), norm.beta.is_some()));
    // Untracked too (a recomputed range's first forward): its casts record the same amaxes
    // the tracked re-run will, which the max makes harmless.
    let forward = fp8_forward::<B>(x.primitive.clone(), norm, weight, bias, fp8, true);
    let output = match &rope {
        Some(rope) => rotate_output::<B>(forward.output, rope),
        None => forward.output,
    };
    let (output, residual) = match residual {
        Some(r) => {
            let (output, mask) = add_residual::<B>(output, r.residual, r.prob);
            (output, Some((mask, r.prob)))
        }
        None => (output, None),
    };
    match prepared {
        OpsKind::Tracked(prep) => {
            let norm = norm_input
                .zip(forward.norm_stats)
                .map(|((gamma, has_beta), stats)| InputNormState {
                    x,
                    gamma,
                    has_beta,
                    stats,
                });
            let state = Fp8LinearState {
                input_t: forward.input_t,
                weight: forward.weight,
                fp8: fp8.clone(),
                input_shape,
                input_dtype,
                weight_dtype,
                bias_dtype,
                norm,
                rope,
                residual,
            };
            prep.finish(state, output)
        }
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}

/// Records `norm(x) [.., in] · weight [in, out] + bias` (`x` itself without a norm), rotated by
/// `rope` or added to `residual` after dropout where given, as one node on `B`'s fp8
/// primitives. Public so tests can drive the node with a CPU backend's reference primitives.
///
/// # Panics
/// With both `rope` and `residual` (no layer ends in both).
pub fn fp8_linear_node<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    norm: Option<Fp8InputNorm<Autodiff<B, C>>>,
    weight: FloatTensor<Autodiff<B, C>>,
    bias: Option<FloatTensor<Autodiff<B, C>>>,
    rope: Option<Fp8Rope<Autodiff<B, C>>>,
    residual: Option<Fp8Residual<Autodiff<B, C>>>,
    fp8: &Fp8Linear,
) -> FloatTensor<Autodiff<B, C>> {
    assert!(
        rope.is_none() || residual.is_none(),
        "an fp8 linear's output is rotated or added to a residual, not both"
    );
    let mut parents = vec![x.node.clone(), weight.node.clone()];
    parents.extend(bias.as_ref().map(|b| b.node.clone()));
    let norm = norm.map(|norm| norm.untracked(|t| parents.push(t.node.clone())));
    let residual = residual.map(|r| r.untracked(|t| parents.push(t.node.clone())));
    let (weight, bias) = (weight.primitive, bias.map(|b| b.primitive));
    let rope = rope.map(|rope| Fp8Rope {
        cos: rope.cos.primitive,
        sin: rope.sin.primitive,
        groups: rope.groups,
        slots: rope.slots,
        head_dim: rope.head_dim,
    });
    macro_rules! record {
        ($n:literal) => {{
            let parents: [_; $n] = parents.try_into().expect("parents counted");
            let prepared = Fp8LinearOp.prepare::<C>(parents).compute_bound().stateful();
            finish(prepared, x, norm, weight, bias, (rope, residual), fp8)
        }};
    }
    match parents.len() {
        2 => record!(2),
        3 => record!(3),
        4 => record!(4),
        5 => record!(5),
        _ => record!(6),
    }
}
