//! The fused fp8 MLP node against the unfused layers on burn-flex's reference primitives: two
//! fp8 linear nodes around the 16-bit activation give the same output, gradients and scaling
//! state, step after step, for GELU and SwiGLU with and without biases. The reference casts
//! materialise the activation as the unfused graph does, so a difference is the node's
//! bookkeeping: a transpose, a role, a scale or a bias gradient taken from the wrong tensor.
//! Bit for bit but for SwiGLU's fc1 bias gradient, whose `dh` the unfused graph computes with
//! burn's composed backward and the reference in one f32 expression (an f32 rounding apart;
//! the fp8 casts of the two agree), hence a tolerance of 1e-6 of each part's largest value.

use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::tensor::{Tensor, TensorPrimitive};

use super::{B, flat, tensor};
use crate::fp8::scaling::{AmaxAlgo, Fp8Format, Fp8Scaling, Fp8Settings};
use crate::{
    Fp8Activation, Fp8InputNorm, Fp8Linear, Fp8Mlp, Fp8Residual, Fp8Rope, Fp8State, FusedOps,
    NormKind, NormSpec, dropout_add_node, end_local_fp8_step, gelu, norm_node,
};
use burn::backend::Flex;

const ROWS: usize = 8;
const IN: usize = 16;
const FFN: usize = 24;
const OUT: usize = 16;

fn settings() -> Fp8Settings {
    Fp8Settings {
        forward: Fp8Format::E4m3,
        backward: Fp8Format::E5m2,
        scaling: Fp8Scaling::Delayed {
            history: 2,
            algo: AmaxAlgo::MostRecent,
        },
        margin: 0,
    }
}

fn handles() -> (Fp8Linear, Fp8Linear) {
    let state = Fp8State::new(settings(), vec!["mlp.fc1".into(), "mlp.fc2".into()]);
    (Fp8Linear::new(&state, 0), Fp8Linear::new(&state, 1))
}

struct Params {
    w1: Tensor<B, 2>,
    b1: Option<Tensor<B, 1>>,
    w2: Tensor<B, 2>,
    b2: Option<Tensor<B, 1>>,
}

fn params(act: Fp8Activation, bias: bool) -> Params {
    let width = if act == Fp8Activation::Swiglu {
        2 * FFN
    } else {
        FFN
    };
    Params {
        w1: (tensor([IN, width], 0.3) * 0.4).require_grad(),
        b1: bias.then(|| (tensor([width], 0.5) * 0.1).require_grad()),
        w2: (tensor([FFN, OUT], 0.7) * 0.3).require_grad(),
        b2: bias.then(|| (tensor([OUT], 0.2) * 0.1).require_grad()),
    }
}

/// Ends the optimizer step and returns the layers' scaling state after the update.
fn end_step(fp8: &(Fp8Linear, Fp8Linear)) -> Vec<f32> {
    end_local_fp8_step::<Flex>(fp8.0.state());
    fp8.0
        .state()
        .rows::<Flex>()
        .into_iter()
        .flat_map(|(_, row)| row)
        .collect()
}

/// Every part of two steps' numbers equal to the bit.
fn assert_same_bits(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: parts");
    for (i, (a, b)) in a.iter().zip(b).enumerate() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(a), bits(b), "{what}: part {i} differs");
    }
}

/// The GELU MLP of `p` over `x`, with an input norm and a residual add where given.
fn gelu_mlp<const D: usize>(
    p: &Params,
    x: &Tensor<B, D>,
    norm: Option<Fp8InputNorm<B>>,
    residual: Option<Fp8Residual<B>>,
    fp8: &(Fp8Linear, Fp8Linear),
) -> Fp8Mlp<B> {
    Fp8Mlp {
        x: primitive(x),
        norm,
        fc1_weight: primitive(&p.w1),
        fc1_bias: p.b1.as_ref().map(primitive),
        fc2_weight: primitive(&p.w2),
        fc2_bias: p.b2.as_ref().map(primitive),
        activation: Fp8Activation::Gelu,
        fc1: fp8.0.clone(),
        fc2: fp8.1.clone(),
        residual,
    }
}

fn primitive<const D: usize>(t: &Tensor<B, D>) -> burn::tensor::ops::FloatTensor<B> {
    t.clone().into_primitive().tensor()
}

fn linear(
    x: Tensor<B, 2>,
    w: &Tensor<B, 2>,
    b: &Option<Tensor<B, 1>>,
    fp8: &Fp8Linear,
) -> Tensor<B, 2> {
    Tensor::from_primitive(TensorPrimitive::Float(B::fp8_linear(
        primitive(&x),
        primitive(w),
        b.as_ref().map(primitive),
        fp8,
    )))
}

/// The numbers of one step: output, then the gradients of x, w1, b1, w2, b2, then the state.
fn step(
    fused: bool,
    act: Fp8Activation,
    p: &Params,
    fp8: &(Fp8Linear, Fp8Linear),
    seed: f32,
) -> Vec<Vec<f32>> {
    let x = (tensor([ROWS, IN], seed) * 2.0).require_grad();
    let y = if fused {
        Tensor::from_primitive(TensorPrimitive::Float(B::fp8_mlp(Fp8Mlp {
            x: primitive(&x),
            norm: None,
            fc1_weight: primitive(&p.w1),
            fc1_bias: p.b1.as_ref().map(primitive),
            fc2_weight: primitive(&p.w2),
            fc2_bias: p.b2.as_ref().map(primitive),
            activation: act,
            fc1: fp8.0.clone(),
            fc2: fp8.1.clone(),
            residual: None,
        })))
    } else {
        let h = linear(x.clone(), &p.w1, &p.b1, &fp8.0);
        let a = match act {
            Fp8Activation::Gelu => gelu(h),
            Fp8Activation::Swiglu => Tensor::from_primitive(TensorPrimitive::Float(
                B::fused_swiglu(h.into_primitive().tensor()),
            )),
        };
        linear(a, &p.w2, &p.b2, &fp8.1)
    };
    let g = tensor([ROWS, OUT], seed + 0.4) * 1e-3;
    let grads = (y.clone() * g).sum().backward();
    let mut out = vec![
        flat(y),
        flat(x.grad(&grads).expect("dx")),
        flat(p.w1.grad(&grads).expect("dw1")),
    ];
    out.extend(p.b1.as_ref().map(|b| flat(b.grad(&grads).expect("db1"))));
    out.push(flat(p.w2.grad(&grads).expect("dw2")));
    out.extend(p.b2.as_ref().map(|b| flat(b.grad(&grads).expect("db2"))));
    out.push(end_step(fp8));
    out
}

#[test]
fn the_fused_mlp_node_gives_the_unfused_layers_numbers() {
    for act in [Fp8Activation::Gelu, Fp8Activation::Swiglu] {
        for bias in [true, false] {
            let p = params(act, bias);
            let (fused, unfused) = (handles(), handles());
            for s in 0..3 {
                let seed = 0.1 + s as f32;
                let a = step(true, act, &p, &fused, seed);
                let b = step(false, act, &p, &unfused, seed);
                assert_eq!(a.len(), b.len());
                for (i, (a, b)) in a.iter().zip(&b).enumerate() {
                    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                    assert!(
                        worst <= 1e-6 * scale,
                        "{act:?}, bias {bias}, step {s}: part {i} differs by {worst:e} (of {scale:e})"
                    );
                }
            }
        }
    }
}

/// The numbers of one step of a pre-norm block's fp8 half, `norm(x)` into the MLP (or into
/// one linear), with `x` also read by a residual: the node with its input norm (`fused`)
/// against the norm node then the fp8 node (both on burn-flex's norm kernels). Output, the gradients of x, γ, β, w1, then the
/// scaling state.
fn normed_step(
    fused: bool,
    kind: NormKind,
    mlp: bool,
    fp8: &(Fp8Linear, Fp8Linear),
) -> Vec<Vec<f32>> {
    let p = params(Fp8Activation::Gelu, true);
    let x = (tensor([2, ROWS / 2, IN], 0.3) * 2.0 + 0.5).require_grad();
    let gamma = (tensor([IN], 0.9) * 0.2 + 1.0).require_grad();
    let beta = (tensor([IN], 1.7) * 0.1).require_grad();
    let beta = (kind == NormKind::Layer).then_some(beta);
    let spec = NormSpec {
        kind,
        epsilon: 1e-5,
    };
    let input_norm = || Fp8InputNorm {
        gamma: primitive(&gamma),
        beta: beta.as_ref().map(primitive),
        spec,
    };
    let input = if fused {
        x.clone()
    } else {
        Tensor::from_primitive(TensorPrimitive::Float(norm_node::<Flex, NoCheckpointing>(
            primitive(&x),
            primitive(&gamma),
            beta.as_ref().map(primitive),
            spec,
        )))
    };
    let norm = fused.then(input_norm);
    let y: Tensor<B, 3> = if mlp {
        Tensor::from_primitive(TensorPrimitive::Float(B::fp8_mlp(gelu_mlp(
            &p, &input, norm, None, fp8,
        ))))
    } else {
        let (w, b) = (primitive(&p.w1), p.b1.as_ref().map(primitive));
        Tensor::from_primitive(TensorPrimitive::Float(match norm {
            Some(norm) => {
                B::fp8_fused_linear(primitive(&input), Some(norm), w, b, None, None, &fp8.0)
            }
            None => B::fp8_linear(primitive(&input), w, b, &fp8.0),
        }))
    };
    let [_, _, width] = y.dims();
    let g = tensor([2, ROWS / 2, width], 0.8) * 1e-3;
    let residual = tensor([2, ROWS / 2, IN], 1.1) * 1e-3;
    let grads = ((y.clone() * g).sum() + (x.clone() * residual).sum()).backward();
    let mut out = vec![
        flat(y),
        flat(x.grad(&grads).expect("dx")),
        flat(gamma.grad(&grads).expect("dgamma")),
        flat(p.w1.grad(&grads).expect("dw1")),
    ];
    out.extend(beta.map(|b| flat(b.grad(&grads).expect("dbeta"))));
    out.push(end_step(fp8));
    out
}

#[test]
fn an_input_norm_inside_the_fp8_nodes_gives_the_norm_node_then_the_fp8_nodes_numbers() {
    for kind in [NormKind::Layer, NormKind::Rms] {
        for mlp in [true, false] {
            let (fused, unfused) = (handles(), handles());
            for step in 0..2 {
                assert_same_bits(
                    &normed_step(true, kind, mlp, &fused),
                    &normed_step(false, kind, mlp, &unfused),
                    &format!("{kind:?}, mlp {mlp}, step {step}"),
                );
            }
        }
    }
}

/// One step of an fp8 QKV projection whose output is rotated by RoPE: the rotation inside the
/// node (`fused`: its backward casts the rotated-back gradient straight from the incoming one)
/// against the fp8 node then the RoPE op. Output, the gradients of x, w, b, then the state.
fn rope_step(fused: bool, fp8: &(Fp8Linear, Fp8Linear)) -> Vec<Vec<f32>> {
    const SEQ: usize = 4;
    let (groups, slots, head_dim) = (1, 3, 8);
    let cols = groups * slots * head_dim;
    let x = (tensor([2, SEQ, IN], 0.4) * 2.0).require_grad();
    let w = (tensor([IN, cols], 0.6) * 0.3).require_grad();
    let b = (tensor([cols], 0.8) * 0.1).require_grad();
    let (cos, sin) = (tensor([SEQ, head_dim], 1.3), tensor([SEQ, head_dim], 1.9));
    let y: Tensor<B, 3> = if fused {
        let rope = Fp8Rope {
            cos: primitive(&cos),
            sin: primitive(&sin),
            groups,
            slots,
            head_dim,
        };
        Tensor::from_primitive(TensorPrimitive::Float(B::fp8_fused_linear(
            primitive(&x),
            None,
            primitive(&w),
            Some(primitive(&b)),
            Some(rope),
            None,
            &fp8.0,
        )))
    } else {
        let y: Tensor<B, 3> = Tensor::from_primitive(TensorPrimitive::Float(B::fp8_linear(
            primitive(&x),
            primitive(&w),
            Some(primitive(&b)),
            &fp8.0,
        )));
        let packed = y.reshape([2, SEQ, groups, slots, head_dim]);
        let rotated: Tensor<B, 5> = Tensor::from_primitive(TensorPrimitive::Float(
            B::fused_rope_qkv(primitive(&packed), primitive(&cos), primitive(&sin)),
        ));
        rotated.reshape([2, SEQ, cols])
    };
    let g = tensor([2, SEQ, cols], 0.7) * 1e-3;
    let grads = (y.clone() * g).sum().backward();
    vec![
        flat(y),
        flat(x.grad(&grads).expect("dx")),
        flat(w.grad(&grads).expect("dw")),
        flat(b.grad(&grads).expect("db")),
        end_step(fp8),
    ]
}

#[test]
fn rope_inside_the_fp8_projection_gives_the_projection_then_rope_numbers() {
    let (fused, unfused) = (handles(), handles());
    for step in 0..2 {
        let a = rope_step(true, &fused);
        let b = rope_step(false, &unfused);
        for (i, (a, b)) in a.iter().zip(&b).enumerate() {
            let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(
                worst <= 1e-6 * scale,
                "step {step}: part {i} differs by {worst:e} (of {scale:e})"
            );
        }
    }
}

/// One step of a block's fp8 half ending in `residual + dropout(y)`: the add inside the fp8
/// node (`fused`: its backward casts the dropped gradient straight from the output's) against
/// the fp8 node then the dropout-add node, both on the reference kernels, which draw the same
/// Bernoulli mask from the same seed. Output, the gradients of x, the residual, w1, then the
/// state.
fn residual_step(fused: bool, mlp: bool, fp8: &(Fp8Linear, Fp8Linear)) -> Vec<Vec<f32>> {
    const PROB: f64 = 0.25;
    let p = params(Fp8Activation::Gelu, true);
    let x = (tensor([ROWS, IN], 0.3) * 2.0).require_grad();
    let residual = (tensor([ROWS, OUT], 0.9)).require_grad();
    <Flex as burn::tensor::backend::Backend>::seed(&Default::default(), 11);
    let fused_residual = || {
        fused.then(|| Fp8Residual {
            residual: primitive(&residual),
            prob: PROB,
        })
    };
    let y: Tensor<B, 2> = if mlp {
        Tensor::from_primitive(TensorPrimitive::Float(B::fp8_mlp(gelu_mlp(
            &p,
            &x,
            None,
            fused_residual(),
            fp8,
        ))))
    } else {
        let w = (tensor([IN, OUT], 0.6) * 0.3).require_grad();
        Tensor::from_primitive(TensorPrimitive::Float(B::fp8_fused_linear(
            primitive(&x),
            None,
            primitive(&w),
            None,
            None,
            fused_residual(),
            &fp8.0,
        )))
    };
    let y = if fused {
        y
    } else {
        Tensor::from_primitive(TensorPrimitive::Float(dropout_add_node::<
            Flex,
            NoCheckpointing,
        >(
            primitive(&y),
            primitive(&residual),
            PROB,
        )))
    };
    let g = tensor([ROWS, OUT], 0.5) * 1e-3;
    let grads = (y.clone() * g).sum().backward();
    let mut out = vec![
        flat(y),
        flat(x.grad(&grads).expect("dx")),
        flat(residual.grad(&grads).expect("dresidual")),
    ];
    if mlp {
        out.push(flat(p.w1.grad(&grads).expect("dw1")));
    }
    out.push(end_step(fp8));
    out
}

#[test]
fn a_residual_add_inside_the_fp8_nodes_gives_the_dropout_add_nodes_numbers() {
    for mlp in [true, false] {
        let (fused, unfused) = (handles(), handles());
        for step in 0..2 {
            assert_same_bits(
                &residual_step(true, mlp, &fused),
                &residual_step(false, mlp, &unfused),
                &format!("mlp {mlp}, step {step}"),
            );
        }
    }
}

/// A pre-norm block's MLP half, `h + dropout(mlp(norm(h)))`: the MLP node taking both its norm
/// and its residual add in, both reading `h` (the node hands `h` the residual's gradient and its
/// norm's backward adds it back), against the norm node, the MLP node and the dropout-add node.
/// Output, `h`'s gradient, w1's, then the state.
fn block_mlp_step(fused: bool, fp8: &(Fp8Linear, Fp8Linear)) -> Vec<Vec<f32>> {
    const PROB: f64 = 0.25;
    let p = params(Fp8Activation::Gelu, true);
    let h = (tensor([2, ROWS / 2, IN], 0.3) * 2.0 + 0.5).require_grad();
    let gamma = (tensor([IN], 0.9) * 0.2 + 1.0).require_grad();
    let spec = NormSpec {
        kind: NormKind::Rms,
        epsilon: 1e-5,
    };
    <Flex as burn::tensor::backend::Backend>::seed(&Default::default(), 5);
    let mlp = |x: &Tensor<B, 3>, norm, residual| gelu_mlp(&p, x, norm, residual, fp8);
    let y: Tensor<B, 3> = if fused {
        let norm = Fp8InputNorm {
            gamma: primitive(&gamma),
            beta: None,
            spec,
        };
        let residual = Fp8Residual {
            residual: primitive(&h),
            prob: PROB,
        };
        Tensor::from_primitive(TensorPrimitive::Float(B::fp8_mlp(mlp(
            &h,
            Some(norm),
            Some(residual),
        ))))
    } else {
        let normed: Tensor<B, 3> =
            Tensor::from_primitive(TensorPrimitive::Float(norm_node::<Flex, NoCheckpointing>(
                primitive(&h),
                primitive(&gamma),
                None,
                spec,
            )));
        let out: Tensor<B, 3> =
            Tensor::from_primitive(TensorPrimitive::Float(B::fp8_mlp(mlp(&normed, None, None))));
        Tensor::from_primitive(TensorPrimitive::Float(dropout_add_node::<
            Flex,
            NoCheckpointing,
        >(
            primitive(&out),
            primitive(&h),
            PROB,
        )))
    };
    let g = tensor([2, ROWS / 2, OUT], 0.5) * 1e-3;
    let grads = (y.clone() * g).sum().backward();
    vec![
        flat(y),
        flat(h.grad(&grads).expect("dh")),
        flat(gamma.grad(&grads).expect("dgamma")),
        flat(p.w1.grad(&grads).expect("dw1")),
        end_step(fp8),
    ]
}

#[test]
fn a_block_mlp_half_with_norm_and_residual_in_one_node_gives_the_three_nodes_numbers() {
    let (fused, unfused) = (handles(), handles());
    for step in 0..2 {
        assert_same_bits(
            &block_mlp_step(true, &fused),
            &block_mlp_step(false, &unfused),
            &format!("step {step}"),
        );
    }
}
