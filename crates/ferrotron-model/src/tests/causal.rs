use burn::module::AutodiffModule;

use super::*;

/// Changing the token at position `changed` must leave every earlier position's logits alone.
fn assert_causal(model: &Model) {
    let gpt = build::<Cpu>(model, 3);
    let base: &[u32] = &[5, 9, 2, 7, 1, 3, 8, 4];
    let mut edited = base.to_vec();
    let changed = 5;
    edited[changed] = 60;
    let a = values(gpt.forward(tokens(&[base])).logits);
    let b = values(gpt.forward(tokens(&[&edited])).logits);
    let vocab = PADDED_VOCAB as usize;
    for position in 0..changed {
        let range = position * vocab..(position + 1) * vocab;
        assert_eq!(
            a[range.clone()],
            b[range],
            "position {position} saw the future"
        );
    }
    let later = changed * vocab..(changed + 1) * vocab;
    assert_ne!(
        a[later.clone()],
        b[later],
        "the edited position itself must change"
    );
}

#[test]
fn gpt2_attention_is_causal() {
    assert_causal(&gpt2_model());
}

#[test]
fn llama_attention_is_causal() {
    assert_causal(&llama_model());
}

#[test]
fn dropless_moe_is_causal() {
    assert_causal(&moe_model());
}

#[test]
fn attention_dropout_path_is_causal_too() {
    // The decomposed path (used when attention dropout is live) must mask the future exactly as
    // the fused op does: with p close to 0 on an autodiff backend it runs and stays causal.
    let mut model = llama_model();
    model.attention_dropout = 1e-9;
    let gpt = build::<CpuAutodiff>(&model, 3);
    let base: &[u32] = &[5, 9, 2, 7, 1, 3];
    let edited: &[u32] = &[5, 9, 2, 7, 1, 60];
    let a = values(gpt.forward(tokens(&[base])).logits);
    let b = values(gpt.forward(tokens(&[edited])).logits);
    let head = 5 * PADDED_VOCAB as usize;
    assert_eq!(a[..head], b[..head]);
}

#[test]
fn dropout_is_active_only_on_an_autodiff_backend() {
    let mut model = gpt2_model();
    model.hidden_dropout = 0.5;
    model.attention_dropout = 0.5;
    let input: &[u32] = &[1, 2, 3, 4];
    let train = build::<CpuAutodiff>(&model, 4);
    let first = values(train.forward(tokens(&[input])).logits);
    let second = values(train.forward(tokens(&[input])).logits);
    assert_ne!(
        first, second,
        "training forward passes should drop different units"
    );

    let eval = train.valid();
    let first = values(eval.forward(tokens(&[input])).logits);
    let second = values(eval.forward(tokens(&[input])).logits);
    assert_eq!(first, second, "inference must be deterministic");
}

#[test]
fn fused_and_decomposed_attention_agree() {
    // Same seed, same weights: the inner backend takes burn's attention op, the autodiff one with
    // a (practically) zero dropout takes the matmul-softmax-matmul path.
    let mut model = llama_model();
    model.attention_dropout = 1e-9;
    let input: &[u32] = &[4, 8, 15, 16, 23, 42];
    let fused = values(build::<Cpu>(&model, 9).forward(tokens(&[input])).logits);
    let decomposed = values(
        build::<CpuAutodiff>(&model, 9)
            .forward(tokens(&[input]))
            .logits,
    );
    for (a, b) in fused.iter().zip(&decomposed) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
}
