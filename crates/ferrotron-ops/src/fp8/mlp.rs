//! An MLP's two fp8 linears and the activation between them as one autodiff node, as
//! Transformer Engine's `LayerNormMLP` runs them: the activation's output exists only as its
//! fp8 cast (fc2's input and, transposed, its weight gradient's operand), and the backward
//! casts the activation's gradient straight from fc2's data gradient, summing fc1's bias
//! gradient in the same pass (`fp8/source.rs`). Two fp8 linear nodes around a 16-bit
//! activation write and read the `[tokens, ffn]` activation and its gradient twice more.
//!
//! The node keeps `xᵀ` and `act(h)ᵀ` in fp8, the pre-activation `h` in 16 bits (the
//! activation's backward reads it, as the unfused graph keeps it) and the step's weight casts.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, TensorMetadata};

use crate::FusedOps;
use crate::fp8::linear::{Fp8Linear, Fp8Operand, Fp8Tensor, fp8_forward};
use crate::fp8::node::in_dtype;
use crate::fp8::norm::{Fp8InputNorm, InputNormParents, InputNormState, input_norm_backward};
use crate::fp8::residual::{Fp8Residual, add_residual};
use crate::fp8::scaling::Fp8Role;
use crate::fp8::source::{Fp8Activation, Fp8Source};
use crate::op::dropout::DropoutMask;
use crate::op::norm::{NormStats, fold_rows};

/// The operands of [`FusedOps::fp8_mlp`]: `x [.., in]` (normalised first by `norm` where given:
/// `LayerNormMLP`, `fp8/norm.rs`), `fc1 [in, f]` (`[in, 2f]` packed for SwiGLU), `fc2 [f,
/// out]`, the biases where the layers have them (fc2's left out where a tensor-parallel
/// reduction adds it after), and each linear's fp8 handle. The output is `[.., out]`.
#[derive(Debug, Clone)]
pub struct Fp8Mlp<B: burn::tensor::backend::Backend> {
    pub x: FloatTensor<B>,
    pub norm: Option<Fp8InputNorm<B>>,
    pub fc1_weight: FloatTensor<B>,
    pub fc1_bias: Option<FloatTensor<B>>,
    pub fc2_weight: FloatTensor<B>,
    pub fc2_bias: Option<FloatTensor<B>>,
    pub activation: Fp8Activation,
    pub fc1: Fp8Linear,
    pub fc2: Fp8Linear,
    /// The residual the output is added to after dropout (`fp8/residual.rs`), if any.
    pub residual: Option<Fp8Residual<B>>,
}

/// What the forward leaves for the backward.
struct Saved<B: burn::tensor::backend::Backend> {
    x_t: Fp8Operand<B>,
    w1: Fp8Tensor<B>,
    pre: FloatTensor<B>,
    act_t: Fp8Operand<B>,
    w2: Fp8Tensor<B>,
    norm_stats: Option<NormStats<B>>,
}

fn forward<B: FusedOps>(
    mlp: Fp8Mlp<B>,
    record: bool,
) -> (FloatTensor<B>, Saved<B>, Option<DropoutMask<B>>) {
    let dtype = mlp.x.dtype();
    let mut shape = mlp.x.shape().to_vec();
    let fc1 = fp8_forward::<B>(
        mlp.x,
        mlp.norm,
        mlp.fc1_weight,
        mlp.fc1_bias,
        &mlp.fc1,
        record,
    );
    let pre = fold_rows::<B>(fc1.output);
    let source = Fp8Source::Activation {
        pre: pre.clone(),
        act: mlp.activation,
    };
    let (act, _) = B::fp8_quantize_source(source, &mlp.fc2, Fp8Role::Input, record, false);
    let w2 = mlp.fc2.weight::<B>(mlp.fc2_weight, record);
    let output = B::fp8_matmul(act.rows(), w2.columns(), mlp.fc2_bias, dtype, true);
    if let Some(last) = shape.last_mut() {
        *last = output.shape().dims::<2>()[1];
    }
    let saved = Saved {
        x_t: fc1.input_t,
        w1: fc1.weight,
        pre,
        act_t: act.columns(),
        w2,
        norm_stats: fc1.norm_stats,
    };
    let output = B::float_reshape(output, Shape::from(shape));
    match mlp.residual {
        Some(r) if record => {
            let (output, mask) = add_residual::<B>(output, r.residual, r.prob);
            (output, saved, Some(mask))
        }
        Some(r) => (B::float_add(r.residual, output), saved, None),
        None => (output, saved, None),
    }
}

/// The forward without autodiff (casts that record nothing).
pub fn fp8_mlp_inference<B: FusedOps>(mlp: Fp8Mlp<B>) -> FloatTensor<B> {
    forward::<B>(mlp, false).0
}

#[derive(Debug)]
struct Fp8MlpOp;

struct State<B: burn::tensor::backend::Backend> {
    saved: Saved<B>,
    activation: Fp8Activation,
    fc1: Fp8Linear,
    fc2: Fp8Linear,
    x_shape: Vec<usize>,
    out_shape: Vec<usize>,
    x_dtype: DType,
    weight_dtypes: [DType; 2],
    bias_dtypes: [Option<DType>; 2],
    norm: Option<InputNormState<B>>,
    /// The residual add's keep mask and dropout probability, with one.
    residual: Option<(DropoutMask<B>, f64)>,
}

impl<B: burn::tensor::backend::Backend> Clone for State<B> {
    fn clone(&self) -> Self {
        State {
            saved: Saved {
                x_t: self.saved.x_t.clone(),
                w1: self.saved.w1.clone(),
                pre: self.saved.pre.clone(),
                act_t: self.saved.act_t.clone(),
                w2: self.saved.w2.clone(),
                norm_stats: self.saved.norm_stats.clone(),
            },
            activation: self.activation,
            fc1: self.fc1.clone(),
            fc2: self.fc2.clone(),
            x_shape: self.x_shape.clone(),
            out_shape: self.out_shape.clone(),
            x_dtype: self.x_dtype,
            weight_dtypes: self.weight_dtypes,
            bias_dtypes: self.bias_dtypes,
            norm: self.norm.clone(),
            residual: self.residual.clone(),
        }
    }
}

impl<B: burn::tensor::backend::Backend> std::fmt::Debug for State<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fp8MlpState({:?}, {:?})", self.fc1, self.fc2)
    }
}

/// Parents: `x`, fc1's weight, fc2's weight, then fc1's bias, fc2's bias, γ, β and the
/// residual where present.
impl<B: FusedOps, const N: usize> Backward<B, N> for Fp8MlpOp {
    type State = State<B>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = fold_rows::<B>(grads.consume::<B>(&ops.node));
        let state = ops.state;
        let saved = state.saved;
        let [b1_dtype, b2_dtype] = state.bias_dtypes;
        let b1_parent = ops.parents.get(3).filter(|_| b1_dtype.is_some());
        let b2_index = 3 + usize::from(b1_dtype.is_some());
        let b2_parent = ops.parents.get(b2_index).filter(|_| b2_dtype.is_some());
        let gamma_index = b2_index + usize::from(b2_dtype.is_some());
        let id = |i: usize| ops.parents.get(i).and_then(|p| p.as_ref()).map(|n| n.id);
        let norm_parents = InputNormParents {
            x: id(0).filter(|_| state.norm.is_some()),
            gamma: state.norm.as_ref().and(id(gamma_index)),
            beta: state
                .norm
                .as_ref()
                .filter(|norm| norm.has_beta)
                .and(id(gamma_index + 1)),
        };
        if let (Some(_), Some(node)) = (&state.residual, N.checked_sub(1).and_then(id)) {
            grads.register::<B>(
                node,
                B::float_reshape(grad.clone(), Shape::from(state.out_shape.clone())),
            );
        }
        let source = match state.residual.clone() {
            Some((mask, prob)) => Fp8Source::DropoutGrad { grad, mask, prob },
            None => Fp8Source::Plain(grad),
        };
        let (dy, db2) = B::fp8_quantize_source(
            source,
            &state.fc2,
            Fp8Role::GradOutput,
            true,
            b2_dtype.is_some(),
        );
        if let (Some(Some(node)), Some(db2), Some(dtype)) = (b2_parent, db2, b2_dtype) {
            grads.register::<B>(node.id, in_dtype::<B>(db2, dtype));
        }
        let d_act = B::fp8_matmul(dy.rows(), saved.w2.rows(), None, state.x_dtype, false);
        if let Some(node) = &ops.parents[2] {
            let dw2 = B::fp8_matmul(
                saved.act_t,
                dy.columns(),
                None,
                state.weight_dtypes[1],
                false,
            );
            grads.register::<B>(node.id, dw2);
        }
        let source = Fp8Source::ActivationGrad {
            grad: d_act,
            pre: saved.pre,
            act: state.activation,
        };
        let (dh, db1) = B::fp8_quantize_source(
            source,
            &state.fc1,
            Fp8Role::GradOutput,
            true,
            b1_dtype.is_some(),
        );
        if let (Some(Some(node)), Some(db1), Some(dtype)) = (b1_parent, db1, b1_dtype) {
            grads.register::<B>(node.id, in_dtype::<B>(db1, dtype));
        }
        if ops.parents[0].is_some() || norm_parents.any() {
            let dx = B::fp8_matmul(dh.rows(), saved.w1.rows(), None, state.x_dtype, false);
            let dx = B::float_reshape(dx, Shape::from(state.x_shape.clone()));
            match state.norm {
                Some(norm) => input_norm_backward::<B>(norm, dx, norm_parents, grads),
                None => {
                    if let Some(node) = &ops.parents[0] {
                        grads.register::<B>(node.id, dx);
                    }
                }
            }
        }
        if let Some(node) = &ops.parents[1] {
            let dw1 = B::fp8_matmul(saved.x_t, dh.columns(), None, state.weight_dtypes[0], false);
            grads.register::<B>(node.id, dw1);
        }
    }
}

fn finish<B: FusedOps, C: CheckpointStrategy, const N: usize>(
    prepared: OpsKind<Fp8MlpOp, B, State<B>, C, N>,
    x: FloatTensor<Autodiff<B, C>>,
    mlp: Fp8Mlp<B>,
) -> FloatTensor<Autodiff<B, C>> {
    let activation = mlp.activation;
    let (fc1, fc2) = (mlp.fc1.clone(), mlp.fc2.clone());
    let x_shape = mlp.x.shape().to_vec();
    let x_dtype = mlp.x.dtype();
    let weight_dtypes = [mlp.fc1_weight.dtype(), mlp.fc2_weight.dtype()];
    let bias_dtypes = [
        mlp.fc1_bias.as_ref().map(TensorMetadata::dtype),
        mlp.fc2_bias.as_ref().map(TensorMetadata::dtype),
    ];
    let norm_input = mlp
        .norm
        .as_ref()
        .map(|norm| (norm.gamma.clone(), norm.beta.is_some()));
    // Untracked too (a recomputed range's first forward): its casts record the amaxes the
    // tracked re-run will, which the max makes harmless.
    let prob = mlp.residual.as_ref().map(|r| r.prob);
    let (output, mut saved, mask) = forward::<B>(mlp, true);
    let residual = mask.zip(prob);
    let out_shape = output.shape().to_vec();
    match prepared {
        OpsKind::Tracked(prep) => {
            let norm = norm_input
                .zip(saved.norm_stats.take())
                .map(|((gamma, has_beta), stats)| InputNormState {
                    x,
                    gamma,
                    has_beta,
                    stats,
                });
            let state = State {
                saved,
                activation,
                fc1,
                fc2,
                x_shape,
                out_shape,
                x_dtype,
                weight_dtypes,
                bias_dtypes,
                norm,
                residual,
            };
            prep.finish(state, output)
        }
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}

/// Records [`FusedOps::fp8_mlp`] as one node on `B`'s fp8 primitives. Public so tests can
/// drive the node with a CPU backend's reference primitives.
pub fn fp8_mlp_node<B: FusedOps, C: CheckpointStrategy>(
    mlp: Fp8Mlp<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let mut parents = vec![
        mlp.x.node.clone(),
        mlp.fc1_weight.node.clone(),
        mlp.fc2_weight.node.clone(),
    ];
    parents.extend(mlp.fc1_bias.as_ref().map(|b| b.node.clone()));
    parents.extend(mlp.fc2_bias.as_ref().map(|b| b.node.clone()));
    let norm = mlp
        .norm
        .map(|norm| norm.untracked(|t| parents.push(t.node.clone())));
    let residual = mlp
        .residual
        .map(|r| r.untracked(|t| parents.push(t.node.clone())));
    let x = mlp.x.clone();
    let inner = Fp8Mlp {
        x: mlp.x.primitive,
        norm,
        fc1_weight: mlp.fc1_weight.primitive,
        fc1_bias: mlp.fc1_bias.map(|b| b.primitive),
        fc2_weight: mlp.fc2_weight.primitive,
        fc2_bias: mlp.fc2_bias.map(|b| b.primitive),
        activation: mlp.activation,
        fc1: mlp.fc1,
        fc2: mlp.fc2,
        residual,
    };
    macro_rules! record {
        ($n:literal) => {{
            let parents: [_; $n] = parents.try_into().expect("parents counted");
            let prepared = Fp8MlpOp.prepare::<C>(parents).compute_bound().stateful();
            finish(prepared, x, inner)
        }};
    }
    match parents.len() {
        3 => record!(3),
        4 => record!(4),
        5 => record!(5),
        6 => record!(6),
        7 => record!(7),
        _ => record!(8),
    }
}
