//! The norm and AdamW ops on burn-flex: the composed norm (what `norm` runs without a kernel) is
//! burn's LayerNorm/RMSNorm bit for bit; the norm node (driven with burn-flex's kernels) gives
//! the composed graph's values and gradients; the composed AdamW is the textbook update.

use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::module::Param;
use burn::nn::{LayerNormConfig, RmsNormConfig};
use burn::tensor::{Tensor, TensorPrimitive};

use super::{B, assert_close, flat, tensor};
use crate::{AdamWStep, NormKind, NormSpec, composed_adamw, composed_norm, norm_node};

fn bits(x: Vec<f32>) -> Vec<u32> {
    x.into_iter().map(f32::to_bits).collect()
}

fn spec(kind: NormKind) -> NormSpec {
    NormSpec {
        kind,
        epsilon: 1e-5,
    }
}

/// x offset per row (so the mean matters), γ and β away from 1 and 0.
fn inputs() -> (Tensor<B, 3>, Tensor<B, 1>, Tensor<B, 1>) {
    (
        (tensor([2, 5, 12], 0.3) * 3.0 + tensor([2, 5, 1], 1.1)).require_grad(),
        (tensor([12], 0.7) + 1.0).require_grad(),
        tensor([12], 1.9).require_grad(),
    )
}

#[test]
fn composed_norm_is_burns_layer_norm_and_rms_norm_bit_for_bit() {
    let device = Default::default();
    let (x, gamma, beta) = inputs();
    let mut layer = LayerNormConfig::new(12)
        .with_epsilon(1e-5)
        .init::<B>(&device);
    layer.gamma = Param::from_tensor(gamma.clone());
    layer.beta = Some(Param::from_tensor(beta.clone()));
    let mut rms = RmsNormConfig::new(12).with_epsilon(1e-5).init::<B>(&device);
    rms.gamma = Param::from_tensor(gamma.clone());
    let weights = tensor([2, 5, 12], 2.3);
    for kind in [NormKind::Layer, NormKind::Rms] {
        let (x1, x2) = (x.clone(), super::fresh(&x).require_grad());
        let old = match kind {
            NormKind::Layer => layer.forward(x1.clone()),
            NormKind::Rms => rms.forward(x1.clone()),
        };
        let beta = (kind == NormKind::Layer).then(|| beta.clone());
        let new = composed_norm(x2.clone(), gamma.clone(), beta, spec(kind));
        let g_old = (old.clone() * weights.clone()).sum().backward();
        let g_new = (new.clone() * weights.clone()).sum().backward();
        assert_eq!(bits(flat(new)), bits(flat(old)), "{kind:?}: output");
        let dx_old = flat(x1.grad(&g_old).expect("dx"));
        let dx_new = flat(x2.grad(&g_new).expect("dx"));
        assert_eq!(bits(dx_new), bits(dx_old), "{kind:?}: dx");
    }
}

/// `dx` of `Σ w ∘ norm(x) + Σ v ∘ x`: x also feeds a residual add after the norm, whose
/// gradient reaches x first.
fn residual_dx(kind: NormKind, fold_first: bool) -> Vec<f32> {
    let (x, gamma, _) = inputs();
    let input = if fold_first {
        // A folded copy is the node's parent: autodiff adds the two gradients of x itself.
        x.clone().reshape([10, 12]).into_primitive().tensor()
    } else {
        // x itself is: the node's kernel adds the residual's gradient while writing dx.
        x.clone().into_primitive().tensor()
    };
    let out = norm_node::<Flex, NoCheckpointing>(
        input,
        gamma.into_primitive().tensor(),
        None,
        spec(kind),
    );
    let out: Tensor<B, 3> = if fold_first {
        Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(out)).reshape([2, 5, 12])
    } else {
        Tensor::from_primitive(TensorPrimitive::Float(out))
    };
    let loss = (out * tensor([2, 5, 12], 2.3)).sum() + (x.clone() * tensor([2, 5, 12], 0.9)).sum();
    flat(x.grad(&loss.backward()).expect("dx"))
}

#[test]
fn the_residual_gradient_added_by_the_norm_kernel_is_autodiffs_sum_bit_for_bit() {
    for kind in [NormKind::Layer, NormKind::Rms] {
        assert_eq!(
            bits(residual_dx(kind, false)),
            bits(residual_dx(kind, true)),
            "{kind:?}"
        );
    }
}

#[test]
fn norm_node_values_and_gradients_equal_the_composed_graph() {
    for kind in [NormKind::Layer, NormKind::Rms] {
        let (x, gamma, beta) = inputs();
        let with_beta = kind == NormKind::Layer;
        let composed = crate::composed_norm(
            x.clone(),
            gamma.clone(),
            with_beta.then(|| beta.clone()),
            spec(kind),
        );
        let weights = tensor([2, 5, 12], 2.3);
        let g_composed = (composed.clone() * weights.clone()).sum().backward();
        let (x2, gamma2, beta2) = (
            super::fresh(&x).require_grad(),
            super::fresh(&gamma).require_grad(),
            super::fresh(&beta).require_grad(),
        );
        let node = norm_node::<Flex, NoCheckpointing>(
            x2.clone().reshape([10, 12]).into_primitive().tensor(),
            gamma2.clone().into_primitive().tensor(),
            with_beta.then(|| beta2.clone().into_primitive().tensor()),
            spec(kind),
        );
        let node: Tensor<B, 3> =
            Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(node)).reshape([2, 5, 12]);
        let g_node = (node.clone() * weights).sum().backward();
        let what = format!("{kind:?}");
        assert_close(&flat(node), &flat(composed), &format!("{what}: output"));
        let mut pairs = vec![(
            flat(x2.grad(&g_node).unwrap()),
            flat(x.grad(&g_composed).unwrap()),
            "dx",
        )];
        pairs.push((
            flat(gamma2.grad(&g_node).unwrap()),
            flat(gamma.grad(&g_composed).unwrap()),
            "dgamma",
        ));
        if with_beta {
            pairs.push((
                flat(beta2.grad(&g_node).unwrap()),
                flat(beta.grad(&g_composed).unwrap()),
                "dbeta",
            ));
        } else {
            assert!(beta2.grad(&g_node).is_none(), "RMSNorm has no β");
        }
        for (got, want, name) in pairs {
            assert_close(&got, &want, &format!("{what}: {name}"));
            assert!(
                got.iter().any(|g| g.abs() > 1e-3),
                "{what}: {name} is all zero"
            );
        }
    }
}

#[test]
fn composed_adamw_is_the_textbook_update() {
    let step = AdamWStep {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        decay: Some(1.0 - 0.1 * 0.01),
        bias_correction1: 1.0 - 0.9f64.powi(2),
        bias_correction2: 1.0 - 0.99f64.powi(2),
        grad_scale: 0.5,
        rounded: None,
        moment_dtypes: crate::F32_MOMENTS,
    };
    let one = |v: &[f32]| -> burn::tensor::ops::FloatTensor<Flex> {
        Tensor::<Flex, 1>::from_floats(v, &Default::default())
            .into_primitive()
            .tensor()
    };
    let back = |t| flat(Tensor::<Flex, 1>::from_primitive(TensorPrimitive::Float(t)));
    let out = composed_adamw::<Flex>(
        one(&[1.0, -2.0]),
        one(&[0.4, -0.2]),
        Some((one(&[0.1, 0.0]), one(&[0.01, 0.04]))),
        step,
        None,
    );
    let mut want = (Vec::new(), Vec::new(), Vec::new());
    for (i, (p, g)) in [(1.0f64, 0.4f64), (-2.0, -0.2)].into_iter().enumerate() {
        let g = g * 0.5;
        let m = 0.9 * [0.1, 0.0][i] + 0.1 * g;
        let v = 0.99 * [0.01, 0.04][i] + 0.01 * g * g;
        let update = (m / step.bias_correction1) / ((v / step.bias_correction2).sqrt() + 1e-8);
        want.0.push((p * (1.0 - 0.001) - 0.1 * update) as f32);
        want.1.push(m as f32);
        want.2.push(v as f32);
    }
    assert_close(&back(out.value), &want.0, "value");
    assert_close(&back(out.exp_avg), &want.1, "m");
    assert_close(&back(out.exp_avg_sq), &want.2, "v");
}
