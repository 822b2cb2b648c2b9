use super::*;
use crate::generate;

#[test]
fn generation_is_deterministic_for_a_seed() {
    let gpt = build::<Cpu>(&llama_model(), 8);
    let prompt = [3, 1, 4];
    let a = generate(&gpt, &prompt, 10, 1.0, None, 42, 8);
    let b = generate(&gpt, &prompt, 10, 1.0, None, 42, 8);
    assert_eq!(a.len(), 10);
    assert_eq!(a, b);
    let others: Vec<Vec<u32>> = (0..4)
        .map(|seed| generate(&gpt, &prompt, 10, 1.0, None, seed, 8))
        .collect();
    assert!(others.iter().any(|o| *o != a), "seeds should matter");
}

#[test]
fn top_one_sampling_equals_greedy_decoding() {
    let gpt = build::<Cpu>(&gpt2_model(), 8);
    let prompt = [7, 7, 2];
    let greedy = generate(&gpt, &prompt, 12, 0.0, None, 0, 8);
    let top_one = generate(&gpt, &prompt, 12, 2.0, Some(1), 99, 8);
    assert_eq!(greedy, top_one);
}

#[test]
fn sampling_never_emits_padding_ids() {
    // Real vocabulary 100 of 128 padded rows.
    let gpt = build::<Cpu>(&gpt2_model(), 8);
    let sampled = generate(&gpt, &[1], 40, 5.0, None, 1, 8);
    assert!(sampled.iter().all(|&t| t < 100), "{sampled:?}");
}
