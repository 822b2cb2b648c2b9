//! Sampling for `recipe sample`. Each step re-runs the model on the (cropped) context instead of
//! keeping a key/value cache: sampling is a demonstration path, and one code path for training
//! and sampling leaves nothing to drift apart. Randomness comes from a seeded host RNG, so the
//! same seed gives the same text on any backend whose logits agree.

use burn::module::Module;
use burn::tensor::{Int, Tensor, TensorData};
use ferrotron_parallel::ParallelOps;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::GptModel;

/// Extend `prompt` by up to `max_new_tokens` tokens and return only the new ones.
///
/// `temperature <= 0` decodes greedily. `top_k` keeps only the k most likely tokens. The context
/// fed to the model is the last `max_seq` tokens (at least 1, at most
/// [`GptModel::max_sequence_length`]). Ids at or above the real vocabulary (Megatron's padding) are never emitted. An empty
/// prompt yields no tokens.
pub fn generate<B: ParallelOps>(
    model: &GptModel<B>,
    prompt: &[u32],
    max_new_tokens: usize,
    temperature: f32,
    top_k: Option<usize>,
    seed: u64,
    max_seq: usize,
) -> Vec<u32> {
    if prompt.is_empty() {
        return Vec::new();
    }
    let config = model.config();
    let window = max_seq.clamp(1, model.max_sequence_length());
    let device = model.devices().into_iter().next().unwrap_or_default();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut sequence: Vec<u32> = prompt.to_vec();
    let mut generated = Vec::with_capacity(max_new_tokens);
    for _ in 0..max_new_tokens {
        let context = &sequence[sequence.len().saturating_sub(window)..];
        let ids: Vec<i64> = context.iter().map(|&t| i64::from(t)).collect();
        let tokens =
            Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, context.len()]), &device);
        let logits = model.forward(tokens).logits;
        let [_, seq, vocab] = logits.dims();
        let last: Vec<f32> = logits
            .slice_dim(1, seq - 1..seq)
            .reshape([vocab])
            .into_data()
            .iter::<f32>()
            .take(config.vocab_size)
            .collect();
        let next = pick(&last, temperature, top_k, &mut rng);
        sequence.push(next);
        generated.push(next);
    }
    generated
}

fn pick(logits: &[f32], temperature: f32, top_k: Option<usize>, rng: &mut StdRng) -> u32 {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if temperature <= 0.0 {
        return order.first().map_or(0, |&i| i as u32);
    }
    let keep = top_k.unwrap_or(order.len()).clamp(1, order.len().max(1));
    order.truncate(keep);
    let best = logits[order[0]];
    let weights: Vec<f64> = order
        .iter()
        .map(|&i| f64::from((logits[i] - best) / temperature).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let mut draw = rng.random::<f64>() * total;
    for (&id, weight) in order.iter().zip(&weights) {
        if draw < *weight {
            return id as u32;
        }
        draw -= weight;
    }
    order[order.len() - 1] as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_argmax() {
        let mut rng = StdRng::seed_from_u64(0);
        assert_eq!(pick(&[0.1, 3.0, 2.0], 0.0, None, &mut rng), 1);
    }

    #[test]
    fn top_one_is_greedy_at_any_temperature() {
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..20 {
            assert_eq!(pick(&[0.1, 3.0, 2.9], 5.0, Some(1), &mut rng), 1);
        }
    }

    #[test]
    fn top_k_never_samples_outside_the_k_best() {
        let mut rng = StdRng::seed_from_u64(3);
        let logits = [0.0, 1.0, 0.5, 0.9, 0.2];
        for _ in 0..200 {
            let id = pick(&logits, 10.0, Some(2), &mut rng);
            assert!(id == 1 || id == 3, "sampled {id}");
        }
    }
}
