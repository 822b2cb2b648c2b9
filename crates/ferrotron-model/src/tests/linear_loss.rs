//! `runtime.cross_entropy_fusion_impl: linear` on the whole model: the tied (GPT-2) and the
//! untied (LLaMA) output layer give the native path's loss and every parameter's gradient.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use ferrotron_recipe::CrossEntropyFusionImpl;

use super::*;

/// The loss and every parameter's gradient (in visiting order) of one forward and backward.
fn loss_and_gradients(model: &Model, fusion: CrossEntropyFusionImpl) -> (f32, Vec<Vec<f32>>) {
    let gpt = build::<CpuAutodiff>(model, 3).with_cross_entropy_fusion(fusion);
    let (inputs, labels) = fixed_batch();
    let loss = gpt.loss(inputs, labels).loss;
    let value = scalar(loss.clone());
    let grads = loss.backward();
    struct Read<'a> {
        grads: &'a <CpuAutodiff as AutodiffBackend>::Gradients,
        out: Vec<Vec<f32>>,
    }
    impl ModuleVisitor<CpuAutodiff> for Read<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<CpuAutodiff, D>>) {
            let grad = param
                .val()
                .grad(self.grads)
                .expect("every parameter has a gradient");
            self.out
                .push(grad.into_data().to_vec::<f32>().expect("f32"));
        }
    }
    let mut read = Read {
        grads: &grads,
        out: Vec::new(),
    };
    gpt.visit(&mut read);
    (value, read.out)
}

#[test]
fn the_linear_loss_fusion_gives_the_native_loss_and_gradients() {
    for (name, model) in [
        ("gpt2 (tied)", gpt2_model()),
        ("llama (untied)", llama_model()),
    ] {
        let (native, native_grads) = loss_and_gradients(&model, CrossEntropyFusionImpl::Native);
        let (linear, linear_grads) = loss_and_gradients(&model, CrossEntropyFusionImpl::Linear);
        assert!(
            (native - linear).abs() <= 1e-6 * native.abs(),
            "{name}: loss {native} vs {linear}"
        );
        assert_eq!(native_grads.len(), linear_grads.len());
        for (index, (a, b)) in native_grads.iter().zip(&linear_grads).enumerate() {
            let scale = a.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
            let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(
                worst <= 1e-5 * scale,
                "{name}: parameter {index} differs by {worst} (scale {scale})"
            );
        }
    }
}
