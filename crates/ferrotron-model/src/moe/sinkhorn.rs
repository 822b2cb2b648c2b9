//! Sinkhorn balancing (BASE layers, as Megatron-Core implements it): while training, tokens pick
//! experts from the router logits rescaled so that every expert receives the same total mass,
//! which balances load without an auxiliary loss. Runs on the host with the other routing
//! decisions; it carries no gradient.

/// Megatron's stopping tolerance on the mean change of the column scaling.
const TOLERANCE: f64 = 1e-4;
/// Megatron loops until the tolerance is met; a bound keeps degenerate inputs from spinning.
const MAX_ITERATIONS: usize = 1000;
const EPSILON: f64 = 1e-8;

/// Doubly-normalise `exp(logits)` (`[tokens, experts]`, row-major): rows and columns scaled so
/// that each expert column carries equal mass. Each row is shifted by its maximum first; a
/// per-row factor is absorbed by the row scaling, so the result is unchanged but cannot overflow.
pub(super) fn sinkhorn(logits: &[f32], num_experts: usize) -> Vec<f64> {
    let tokens = logits.len() / num_experts;
    let mut cost: Vec<f64> = Vec::with_capacity(logits.len());
    for row in logits.chunks_exact(num_experts) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        cost.extend(row.iter().map(|&x| f64::from(x - max).exp()));
    }
    let mut row_scale = vec![1.0; tokens];
    let mut column_scale = vec![1.0; num_experts];
    for _ in 0..MAX_ITERATIONS {
        for (t, scale) in row_scale.iter_mut().enumerate() {
            let row = &cost[t * num_experts..(t + 1) * num_experts];
            let mass: f64 = row.iter().zip(&column_scale).map(|(c, d)| c * d).sum();
            *scale = 1.0 / (tokens as f64 * (mass + EPSILON));
        }
        let mut next = vec![0.0; num_experts];
        for (t, row) in cost.chunks_exact(num_experts).enumerate() {
            for (mass, c) in next.iter_mut().zip(row) {
                *mass += row_scale[t] * c;
            }
        }
        for mass in &mut next {
            *mass = 1.0 / (num_experts as f64 * (*mass + EPSILON));
        }
        let change = next
            .iter()
            .zip(&column_scale)
            .map(|(a, b)| (a - b).abs())
            .sum::<f64>()
            / num_experts as f64;
        column_scale = next;
        if change <= TOLERANCE {
            break;
        }
    }
    cost.chunks_exact(num_experts)
        .enumerate()
        .flat_map(|(t, row)| {
            let row_factor = row_scale[t];
            row.iter()
                .zip(&column_scale)
                .map(move |(c, d)| c * d * row_factor)
                .collect::<Vec<_>>()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_end_up_with_equal_mass() {
        let logits = [
            3.0, 2.0, 1.0, 0.0, //
            3.0, 0.0, 2.0, 1.0, //
            3.0, 1.0, 0.0, 2.0, //
            2.5, 0.5, 1.0, 0.0,
        ];
        let balanced = sinkhorn(&logits, 4);
        for expert in 0..4 {
            let column: f64 = (0..4).map(|t| balanced[t * 4 + expert]).sum();
            assert!((column - 0.25).abs() < 1e-3, "expert {expert}: {column}");
        }
    }
}
