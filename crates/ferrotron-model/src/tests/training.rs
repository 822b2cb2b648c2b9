use burn::optim::{AdamWConfig, GradientsParams, Optimizer};

use super::*;

/// Train on one fixed batch and return the language-model loss before and after.
fn overfit(model: &Model, steps: usize) -> (f32, f32) {
    let mut gpt = build::<CpuAutodiff>(model, 0);
    let mut optimizer = AdamWConfig::new()
        .with_weight_decay(0.0)
        .init::<CpuAutodiff, GptModel<CpuAutodiff>>();
    let (inputs, labels) = fixed_batch();
    let mut first = f32::NAN;
    let mut last = f32::NAN;
    for step in 0..steps {
        let output = gpt.loss(inputs.clone(), labels.clone());
        last = scalar(output.lm_loss.clone());
        if step == 0 {
            first = last;
        }
        let gradients = GradientsParams::from_grads(output.loss.backward(), &gpt);
        gpt = optimizer.step(1e-2, gpt, gradients);
    }
    (first, last)
}

#[test]
fn gpt2_overfits_a_fixed_batch() {
    let (first, last) = overfit(&gpt2_model(), 40);
    // Starts near ln(128) ≈ 4.85 (uniform over the padded vocabulary).
    assert!((first - 128f32.ln()).abs() < 0.2, "initial loss {first}");
    assert!(last < 0.25 * first, "loss {first} → {last}");
}

#[test]
fn llama_overfits_a_fixed_batch() {
    let (first, last) = overfit(&llama_model(), 40);
    assert!(last < 0.25 * first, "loss {first} → {last}");
}

#[test]
fn moe_overfits_a_fixed_batch() {
    let mut model = moe_model();
    model.moe = Some(Moe {
        z_loss_coeff: Some(1e-3),
        ..moe_section()
    });
    let (first, last) = overfit(&model, 40);
    assert!(last < 0.25 * first, "loss {first} → {last}");
}

#[test]
fn cross_entropy_matches_log_softmax() {
    use burn::tensor::activation::log_softmax;

    let gpt = build::<Cpu>(&gpt2_model(), 5);
    let inputs = tokens::<Cpu>(&[&[1, 2, 3, 4], &[9, 8, 7, 6]]);
    let labels = tokens::<Cpu>(&[&[2, 3, 4, 5], &[8, 7, 6, 99]]);
    let logits = gpt.forward(inputs.clone()).logits.reshape([8, 128]);
    let reference = -values(
        log_softmax(logits, 1)
            .gather(1, labels.clone().reshape([8, 1]))
            .mean(),
    )[0];
    let loss = scalar(gpt.loss(inputs.clone(), labels.clone()).lm_loss);
    assert!((loss - reference).abs() < 1e-5, "{loss} vs {reference}");

    // Masking out the second row leaves the first row's mean.
    let mask = Tensor::<Cpu, 2>::from_data(
        TensorData::new(vec![1.0f32, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0], [2, 4]),
        &Default::default(),
    );
    let masked = scalar(
        gpt.loss_masked(inputs.clone(), labels.clone(), mask)
            .lm_loss,
    );
    let first_row = scalar(
        gpt.loss(inputs.slice_dim(0, 0..1), labels.slice_dim(0, 0..1))
            .lm_loss,
    );
    assert!((masked - first_row).abs() < 1e-5, "{masked} vs {first_row}");
}
