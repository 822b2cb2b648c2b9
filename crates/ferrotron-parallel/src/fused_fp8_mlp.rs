//! An MLP's two fp8 linears and the activation between them as one autodiff node, as
//! Transformer Engine's `LayerNormMLP` runs them: the activation's output exists only as its
//! fp8 cast (fc2's input and, transposed, its weight gradient's operand), and the backward
//! casts the activation's gradient straight from fc2's data gradient, summing fc1's bias
//! gradient in the same pass (`fused_fp8_source.rs`). Two fp8 linear nodes around a 16-bit
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
use burn::tensor::{DType, TensorMetadata};

use crate::FusedOps;
use crate::fp8_scaling::Fp8Role;
use crate::fused_fp8::{Fp8Linear, Fp8Operand, Fp8Tensor, fp8_forward};
use crate::fused_fp8_node::in_dtype;
use crate::fused_fp8_source::{Fp8Activation, Fp8Source};

/// The operands of [`FusedOps::fp8_mlp`]: `x [rows, in]`, `fc1 [in, f]` (`[in, 2f]` packed for
/// SwiGLU), `fc2 [f, out]`, the biases where the layers have them (fc2's left out where a
/// tensor-parallel reduction adds it after), and each linear's fp8 handle.
#[derive(Debug, Clone)]
pub struct Fp8Mlp<B: burn::tensor::backend::Backend> {
    pub x: FloatTensor<B>,
    pub fc1_weight: FloatTensor<B>,
    pub fc1_bias: Option<FloatTensor<B>>,
    pub fc2_weight: FloatTensor<B>,
    pub fc2_bias: Option<FloatTensor<B>>,
    pub activation: Fp8Activation,
    pub fc1: Fp8Linear,
    pub fc2: Fp8Linear,
}

/// What the forward leaves for the backward.
struct Saved<B: burn::tensor::backend::Backend> {
    x_t: Fp8Operand<B>,
    w1: Fp8Tensor<B>,
    pre: FloatTensor<B>,
    act_t: Fp8Operand<B>,
    w2: Fp8Tensor<B>,
}

fn forward<B: FusedOps>(mlp: Fp8Mlp<B>, record: bool) -> (FloatTensor<B>, Saved<B>) {
    let dtype = mlp.x.dtype();
    let fc1 = fp8_forward::<B>(mlp.x, mlp.fc1_weight, mlp.fc1_bias, &mlp.fc1, record);
    let source = Fp8Source::Activation {
        pre: fc1.output.clone(),
        act: mlp.activation,
    };
    let (act, _) = B::fp8_quantize_source(source, &mlp.fc2, Fp8Role::Input, record, false);
    let w2 = mlp.fc2.weight::<B>(mlp.fc2_weight, record);
    let output = B::fp8_matmul(act.rows(), w2.columns(), mlp.fc2_bias, dtype, true);
    let saved = Saved {
        x_t: fc1.input_t,
        w1: fc1.weight,
        pre: fc1.output,
        act_t: act.columns(),
        w2,
    };
    (output, saved)
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
    x_dtype: DType,
    weight_dtypes: [DType; 2],
    bias_dtypes: [Option<DType>; 2],
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
            },
            activation: self.activation,
            fc1: self.fc1.clone(),
            fc2: self.fc2.clone(),
            x_dtype: self.x_dtype,
            weight_dtypes: self.weight_dtypes,
            bias_dtypes: self.bias_dtypes,
        }
    }
}

impl<B: burn::tensor::backend::Backend> std::fmt::Debug for State<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fp8MlpState({:?}, {:?})", self.fc1, self.fc2)
    }
}

/// Parents: `x`, fc1's weight, fc2's weight, then fc1's bias and fc2's bias where present.
impl<B: FusedOps, const N: usize> Backward<B, N> for Fp8MlpOp {
    type State = State<B>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let state = ops.state;
        let saved = state.saved;
        let [b1_dtype, b2_dtype] = state.bias_dtypes;
        let b1_parent = ops.parents.get(3).filter(|_| b1_dtype.is_some());
        let b2_parent = ops.parents.get(3 + usize::from(b1_dtype.is_some()));
        let (dy, db2) = B::fp8_quantize_source(
            Fp8Source::Plain(grad),
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
        if let Some(node) = &ops.parents[0] {
            let dx = B::fp8_matmul(dh.rows(), saved.w1.rows(), None, state.x_dtype, false);
            grads.register::<B>(node.id, dx);
        }
        if let Some(node) = &ops.parents[1] {
            let dw1 = B::fp8_matmul(saved.x_t, dh.columns(), None, state.weight_dtypes[0], false);
            grads.register::<B>(node.id, dw1);
        }
    }
}

fn finish<B: FusedOps, C: CheckpointStrategy, const N: usize>(
    prepared: OpsKind<Fp8MlpOp, B, State<B>, C, N>,
    mlp: Fp8Mlp<B>,
) -> FloatTensor<Autodiff<B, C>> {
    let activation = mlp.activation;
    let (fc1, fc2) = (mlp.fc1.clone(), mlp.fc2.clone());
    let x_dtype = mlp.x.dtype();
    let weight_dtypes = [mlp.fc1_weight.dtype(), mlp.fc2_weight.dtype()];
    let bias_dtypes = [
        mlp.fc1_bias.as_ref().map(TensorMetadata::dtype),
        mlp.fc2_bias.as_ref().map(TensorMetadata::dtype),
    ];
    // Untracked too (a recomputed range's first forward): its casts record the amaxes the
    // tracked re-run will, which the max makes harmless.
    let (output, saved) = forward::<B>(mlp, true);
    match prepared {
        OpsKind::Tracked(prep) => {
            let state = State {
                saved,
                activation,
                fc1,
                fc2,
                x_dtype,
                weight_dtypes,
                bias_dtypes,
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
    let inner = Fp8Mlp {
        x: mlp.x.primitive,
        fc1_weight: mlp.fc1_weight.primitive,
        fc1_bias: mlp.fc1_bias.map(|b| b.primitive),
        fc2_weight: mlp.fc2_weight.primitive,
        fc2_bias: mlp.fc2_bias.map(|b| b.primitive),
        activation: mlp.activation,
        fc1: mlp.fc1,
        fc2: mlp.fc2,
    };
    macro_rules! record {
        ($n:literal) => {{
            let parents: [_; $n] = parents.try_into().expect("parents counted");
            let prepared = Fp8MlpOp.prepare::<C>(parents).compute_bound().stateful();
            finish(prepared, inner)
        }};
    }
    match parents.len() {
        3 => record!(3),
        4 => record!(4),
        _ => record!(5),
    }
}
