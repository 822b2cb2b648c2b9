//! Router balancing losses, as Megatron-Core computes them, from the terms the router's logits
//! give (`ferrotron_ops::moe_router_aux`: the probabilities' mass, the counts, the log-sum-exps).
//! They are differentiable in the router probabilities only; the token counts `f_i` come from
//! the (discrete) routing.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// Switch/GShard balancing, `coeff · E · Σ_i f_i · P_i` with `f_i = count_i / (k·T)` the share
/// of routed slots and `P_i = Σ_t p_ti / T` the mean probability of expert i, or the part of it
/// owed to some of a microbatch's tokens (the loss is linear in the probabilities):
/// `probability_mass` `[E]` is `Σ p_ti` over those tokens, `counts` `[E]` and `total_tokens`
/// describe the whole microbatch. The shares of all its tokens add up to the loss.
pub(crate) fn switch_aux_loss_share<B: Backend>(
    probability_mass: Tensor<B, 1>,
    counts: Tensor<B, 1>,
    topk: usize,
    coeff: f64,
    total_tokens: usize,
) -> Tensor<B, 1> {
    let [experts] = counts.dims();
    let tokens = total_tokens as f64;
    let scale = coeff * experts as f64 / (topk as f64 * tokens * tokens);
    (probability_mass * counts).sum() * scale
}

/// Sequence-level balancing (DeepSeek-V2/V3), the Switch loss computed within each sequence and
/// averaged over sequences, or the part of it owed to some tokens: `probability_mass` `[S, E]` is
/// `Σ p_ti` over those tokens of each sequence; `counts` `[S, E]` (per-sequence slot counts) and
/// `seq_len` describe whole sequences.
pub(crate) fn sequence_aux_loss_share<B: Backend>(
    probability_mass: Tensor<B, 2>,
    counts: Tensor<B, 2>,
    topk: usize,
    coeff: f64,
    seq_len: usize,
) -> Tensor<B, 1> {
    let [_, experts] = counts.dims();
    let length = seq_len as f64;
    let load = counts / (length * topk as f64 / experts as f64);
    (load * (probability_mass / length)).sum_dim(1).mean() * coeff
}

/// ST-MoE router z-loss: `coeff · mean_t (logsumexp_i logits_ti)²` from the log-sum-exps `[T]`.
pub(crate) fn z_loss<B: Backend>(log_sum_exp: Tensor<B, 1>, coeff: f64) -> Tensor<B, 1> {
    log_sum_exp.square().mean() * coeff
}

/// The part of [`z_loss`] over `total_tokens` tokens owed to the rows of `log_sum_exp`.
pub(crate) fn z_loss_share<B: Backend>(
    log_sum_exp: Tensor<B, 1>,
    coeff: f64,
    total_tokens: usize,
) -> Tensor<B, 1> {
    log_sum_exp.square().sum() * (coeff / total_tokens as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::TensorData;
    use ferrotron_ops::{RouterAuxSpec, moe_router_aux};

    type B = Flex;

    fn tensor2(values: &[f32], shape: [usize; 2]) -> Tensor<B, 2> {
        Tensor::from_data(TensorData::new(values.to_vec(), shape), &Default::default())
    }

    fn scalar(t: Tensor<B, 1>) -> f32 {
        t.into_data().iter::<f32>().next().unwrap_or(f32::NAN)
    }

    /// `Σ_t p_ti`, `[E]`.
    fn mass(probs: Tensor<B, 2>) -> Tensor<B, 1> {
        let experts = probs.dims()[1];
        probs.sum_dim(0).reshape([experts])
    }

    #[test]
    fn switch_loss_matches_the_hand_computed_value() {
        // 2 tokens, 2 experts, top-1. P = mean probs = [(0.75+0.25)/2, (0.25+0.75)/2] = [0.5, 0.5];
        // counts = [2, 0] (both tokens picked expert 0 in this made-up routing), f = [1, 0].
        // loss = coeff · E · Σ f_i P_i = 0.1 · 2 · (1·0.5) = 0.1.
        let probs = tensor2(&[0.75, 0.25, 0.25, 0.75], [2, 2]);
        let counts = Tensor::<B, 1>::from_data([2.0f32, 0.0], &Default::default());
        let loss = scalar(switch_aux_loss_share(mass(probs), counts, 1, 0.1, 2));
        assert!((loss - 0.1).abs() < 1e-6, "{loss}");
    }

    #[test]
    fn switch_loss_is_one_times_coeff_when_perfectly_balanced() {
        // Uniform probabilities and uniform counts give E · Σ (1/E)(1/E) = 1.
        let probs = tensor2(&[0.25; 16], [4, 4]);
        let counts = Tensor::<B, 1>::from_data([2.0f32, 2.0, 2.0, 2.0], &Default::default());
        let loss = scalar(switch_aux_loss_share(mass(probs), counts, 2, 0.01, 4));
        assert!((loss - 0.01).abs() < 1e-7, "{loss}");
    }

    #[test]
    fn sequence_loss_averages_per_sequence_losses() {
        // Sequence 0: both tokens prob [1, 0], counts [2, 0] → E · f·P = 2 · (1·1) = 2.
        // Sequence 1: uniform probs [0.5, 0.5], counts [1, 1] → 2 · (0.5·0.5 + 0.5·0.5) = 1.
        // Mean = 1.5, times coeff 0.1 = 0.15.
        let per_sequence_mass = tensor2(&[2.0, 0.0, 1.0, 1.0], [2, 2]);
        let counts = tensor2(&[2.0, 0.0, 1.0, 1.0], [2, 2]);
        let loss = scalar(sequence_aux_loss_share(
            per_sequence_mass,
            counts,
            1,
            0.1,
            2,
        ));
        assert!((loss - 0.15).abs() < 1e-6, "{loss}");
    }

    #[test]
    fn z_loss_is_the_mean_squared_log_sum_exp() {
        // Row [0, 0]: lse = ln 2. Row [ln 3, 0]: lse = ln 4. Mean of squares times coeff.
        let logits = tensor2(&[0.0, 0.0, 3.0f32.ln(), 0.0], [2, 2]);
        let spec = RouterAuxSpec {
            balancing: None,
            log_sum_exp: true,
        };
        let lse = moe_router_aux(logits, spec).log_sum_exp.expect("asked for");
        let expected = 0.5 * (2.0f32.ln().powi(2) + 4.0f32.ln().powi(2)) * 0.001;
        let loss = scalar(z_loss(lse.clone(), 0.001));
        assert!((loss - expected).abs() < 1e-8, "{loss} vs {expected}");
        let halves = scalar(z_loss_share(lse.clone().slice(0..1), 0.001, 2))
            + scalar(z_loss_share(lse.slice(1..2), 0.001, 2));
        assert!((halves - expected).abs() < 1e-8, "{halves} vs {expected}");
    }
}
