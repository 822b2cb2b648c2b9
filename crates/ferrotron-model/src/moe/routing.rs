//! Routing decisions (which experts, which tokens survive capacity) made on the host from the
//! router's logits: what capacity dropping, Sinkhorn balancing and the expert-parallel
//! dispatchers route with (a one-rank dropless layer decides on the device, `decisions.rs`,
//! with the same selection). The decisions are discrete and carry no gradient, so plain Rust
//! here is exact, testable by hand, and breaks ties deterministically (the lower expert index,
//! then the earlier token, wins). The differentiable combine weights are recomputed on the
//! device from these indices.

use ferrotron_ops::select_topk;
use ferrotron_recipe::{LoadBalancing, ScoreFunction, TokenDropPolicy};

use super::sinkhorn::sinkhorn;
use crate::config::MoeConfig;

/// Routing of `num_tokens` tokens to `topk` experts each.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    pub num_tokens: usize,
    pub topk: usize,
    /// `[num_tokens · topk]`: the expert of each (token, slot), best first.
    pub experts: Vec<usize>,
    /// `[num_tokens · topk]`: the combine weight of each (token, slot) before dropping.
    pub weights: Vec<f32>,
    /// `[num_tokens · topk]`: false where capacity dropped the (token, slot).
    pub kept: Vec<bool>,
    /// Tokens each expert may take; `None` when dropless.
    pub capacity: Option<usize>,
}

impl Routing {
    /// Kept tokens per expert: the load that aux-loss-free balancing equalises.
    pub fn loads(&self, num_experts: usize) -> Vec<u64> {
        let mut loads = vec![0; num_experts];
        for (&expert, &kept) in self.experts.iter().zip(&self.kept) {
            if kept {
                loads[expert] += 1;
            }
        }
        loads
    }

    /// Kept (token, slot) pairs of one expert, in token order: `(tokens, flat slot indices)`.
    pub fn assignments(&self, expert: usize) -> (Vec<usize>, Vec<usize>) {
        let mut tokens = Vec::new();
        let mut slots = Vec::new();
        for (slot, (&chosen, &kept)) in self.experts.iter().zip(&self.kept).enumerate() {
            if kept && chosen == expert {
                tokens.push(slot / self.topk);
                slots.push(slot);
            }
        }
        (tokens, slots)
    }
}

/// Route `logits` (`[num_tokens, num_experts]`, row-major). `expert_bias` shifts the scores
/// used for selection only. `training` matters only to Sinkhorn balancing, which balances while
/// training and routes by plain top-k otherwise (as Megatron does).
pub fn route(
    config: &MoeConfig,
    logits: &[f32],
    expert_bias: Option<&[f32]>,
    training: bool,
) -> Routing {
    let num_experts = config.num_experts;
    let topk = config.router_topk;
    let num_tokens = logits.len() / num_experts;
    let sinkhorn_scores = (config.load_balancing == LoadBalancing::Sinkhorn && training)
        .then(|| sinkhorn(logits, num_experts));
    let mut experts = Vec::with_capacity(num_tokens * topk);
    let mut weights = Vec::with_capacity(num_tokens * topk);
    for (token, row) in logits.chunks_exact(num_experts).enumerate() {
        let chosen = match &sinkhorn_scores {
            Some(balanced) => {
                let balanced: Vec<f32> = balanced[token * num_experts..(token + 1) * num_experts]
                    .iter()
                    .map(|&v| v as f32)
                    .collect();
                select_topk(&balanced, topk, None)
            }
            None => {
                let scores = selection_scores(config, row, expert_bias);
                select_topk(&scores, topk, config.group_limit)
            }
        };
        weights.extend(combine_weights(config, row, &chosen));
        experts.extend(chosen);
    }
    let mut routing = Routing {
        num_tokens,
        topk,
        experts,
        weights,
        kept: vec![true; num_tokens * topk],
        capacity: None,
    };
    if let Some(capacity) = config.capacity {
        let limit = expert_capacity(num_tokens * topk, num_experts, capacity.factor);
        drop_over_capacity(&mut routing, num_experts, limit, capacity.drop_policy);
        routing.capacity = Some(limit);
    }
    routing
}

/// Megatron's `get_capacity(num_tokens · topk, experts, factor)`: ceil(slots / experts · factor).
pub fn expert_capacity(slots: usize, num_experts: usize, factor: f64) -> usize {
    ((slots as f64 / num_experts as f64) * factor).ceil() as usize
}

/// Tokens per expert under plain top-k of the logits, the `f_i` of the balancing losses
/// (Megatron counts them without bias, groups or capacity). `[num_experts]`, or per sequence
/// `[sequences · num_experts]` when `tokens_per_sequence` splits the rows.
pub(crate) fn aux_loss_counts(
    logits: &[f32],
    num_experts: usize,
    topk: usize,
    tokens_per_sequence: usize,
) -> Vec<f32> {
    let rows_per_group = tokens_per_sequence.max(1);
    let mut counts = Vec::new();
    for sequence in logits.chunks(rows_per_group * num_experts) {
        let mut sequence_counts = vec![0.0f32; num_experts];
        for row in sequence.chunks_exact(num_experts) {
            for expert in select_topk(row, topk, None) {
                sequence_counts[expert] += 1.0;
            }
        }
        counts.extend(sequence_counts);
    }
    counts
}

fn selection_scores(config: &MoeConfig, row: &[f32], expert_bias: Option<&[f32]>) -> Vec<f32> {
    let mut scores = match config.score_function {
        ScoreFunction::Softmax if config.pre_softmax => softmax(row),
        ScoreFunction::Softmax => row.to_vec(),
        ScoreFunction::Sigmoid => row.iter().map(|&x| sigmoid(x)).collect(),
    };
    if let Some(bias) = expert_bias {
        for (score, &b) in scores.iter_mut().zip(bias) {
            *score += b;
        }
    }
    scores
}

/// Megatron's `topk_routing_with_score_function` weights of the `chosen` experts, or its
/// Sinkhorn activation (which is not scaled).
fn combine_weights(config: &MoeConfig, row: &[f32], chosen: &[usize]) -> Vec<f32> {
    if config.load_balancing == LoadBalancing::Sinkhorn {
        // Megatron's Sinkhorn activation: sigmoid for top-1, else softmax over all experts.
        return if config.router_topk == 1 {
            chosen.iter().map(|&e| sigmoid(row[e])).collect()
        } else {
            let probs = softmax(row);
            chosen.iter().map(|&e| probs[e]).collect()
        };
    }
    let weights: Vec<f32> = match config.score_function {
        ScoreFunction::Softmax if config.pre_softmax => {
            let probs = softmax(row);
            chosen.iter().map(|&e| probs[e]).collect()
        }
        ScoreFunction::Softmax => {
            let picked: Vec<f32> = chosen.iter().map(|&e| row[e]).collect();
            softmax(&picked)
        }
        ScoreFunction::Sigmoid => {
            let picked: Vec<f32> = chosen.iter().map(|&e| sigmoid(row[e])).collect();
            if chosen.len() > 1 {
                let total: f32 = picked.iter().sum::<f32>() + 1e-20;
                picked.iter().map(|p| p / total).collect()
            } else {
                picked
            }
        }
    };
    // Megatron's `probs *= scaling_factor`, in the probabilities' f32.
    let factor = config.topk_scaling_factor as f32;
    weights.into_iter().map(|w| w * factor).collect()
}

fn drop_over_capacity(
    routing: &mut Routing,
    num_experts: usize,
    capacity: usize,
    policy: TokenDropPolicy,
) {
    for expert in 0..num_experts {
        let (_, mut slots) = routing.assignments(expert);
        if slots.len() <= capacity {
            continue;
        }
        if policy == TokenDropPolicy::Probs {
            // Highest combine weight first; the earlier token wins a tie.
            slots.sort_by(|&a, &b| {
                routing.weights[b]
                    .total_cmp(&routing.weights[a])
                    .then(a.cmp(&b))
            });
        }
        for &slot in &slots[capacity..] {
            routing.kept[slot] = false;
        }
    }
}

fn softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = row.iter().map(|&x| (x - max).exp()).collect();
    let total: f32 = exps.iter().sum();
    exps.iter().map(|e| e / total).collect()
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Capacity;

    fn config(topk: usize) -> MoeConfig {
        MoeConfig {
            num_experts: 4,
            router_topk: topk,
            load_balancing: LoadBalancing::AuxLoss,
            aux_loss_coeff: 0.01,
            z_loss_coeff: 0.0,
            score_function: ScoreFunction::Softmax,
            pre_softmax: false,
            expert_bias: false,
            expert_bias_update_rate: 0.001,
            group_limit: None,
            capacity: None,
            layer_pattern: vec![true],
            topk_scaling_factor: 1.0,
            expert_ffn_hidden_size: 8,
            shared_expert_ffn_hidden_size: None,
            token_dispatcher: ferrotron_recipe::TokenDispatcher::Alltoall,
        }
    }

    #[test]
    fn softmax_after_topk_normalises_over_the_chosen_experts() {
        let routing = route(&config(2), &[0.0, 2.0, 1.0, 2.0f32.ln() + 1.0], None, true);
        assert_eq!(routing.experts, vec![1, 3]);
        // softmax([2, ln2 + 1]) over the two chosen: e^2 and e^(ln2+1) = 2e → e² / (e² + 2e).
        let e = std::f32::consts::E;
        let expected = e * e / (e * e + 2.0 * e);
        assert!((routing.weights[0] - expected).abs() < 1e-6);
        assert!((routing.weights[0] + routing.weights[1] - 1.0).abs() < 1e-6);
    }

    #[test]
    fn pre_softmax_weights_are_probabilities_over_all_experts() {
        let mut cfg = config(1);
        cfg.pre_softmax = true;
        let routing = route(&cfg, &[0.0, 0.0, 0.0, 0.0], None, true);
        assert_eq!(routing.experts, vec![0]);
        assert!((routing.weights[0] - 0.25).abs() < 1e-6);
    }

    #[test]
    fn expert_bias_changes_selection_but_not_the_weights_formula() {
        let mut cfg = config(1);
        cfg.score_function = ScoreFunction::Sigmoid;
        cfg.expert_bias = true;
        let logits = [2.0, 0.0, 0.0, 0.0];
        let plain = route(&cfg, &logits, None, true);
        assert_eq!(plain.experts, vec![0]);
        let biased = route(&cfg, &logits, Some(&[0.0, 0.0, 1.0, 0.0]), true);
        assert_eq!(biased.experts, vec![2]);
        // The weight is sigmoid of the chosen expert's logit, without the bias.
        assert!((biased.weights[0] - 0.5).abs() < 1e-6);
    }

    #[test]
    fn capacity_drops_the_lowest_weight_tokens_under_probs_policy() {
        let mut cfg = config(1);
        cfg.capacity = Some(Capacity {
            factor: 1.0,
            drop_policy: TokenDropPolicy::Probs,
            pad_to_capacity: false,
        });
        cfg.pre_softmax = true;
        // Four tokens all prefer expert 0; capacity = ceil(4·1/4 · 1.0) = 1.
        let logits = [
            1.0, 0.0, 0.0, 0.0, //
            3.0, 0.0, 0.0, 0.0, //
            2.0, 0.0, 0.0, 0.0, //
            1.5, 0.0, 0.0, 0.0,
        ];
        let routing = route(&cfg, &logits, None, true);
        assert_eq!(routing.capacity, Some(1));
        assert_eq!(routing.kept, vec![false, true, false, false]);
        assert_eq!(routing.loads(4), vec![1, 0, 0, 0]);
    }

    #[test]
    fn capacity_keeps_the_earliest_tokens_under_position_policy() {
        let mut cfg = config(1);
        cfg.capacity = Some(Capacity {
            factor: 2.0,
            drop_policy: TokenDropPolicy::Position,
            pad_to_capacity: false,
        });
        let logits = [
            1.0, 0.0, 0.0, 0.0, //
            3.0, 0.0, 0.0, 0.0, //
            2.0, 0.0, 0.0, 0.0, //
            0.0, 1.0, 0.0, 0.0,
        ];
        let routing = route(&cfg, &logits, None, true);
        // capacity = ceil(4/4 · 2) = 2: tokens 0 and 1 stay, token 2 is dropped.
        assert_eq!(routing.capacity, Some(2));
        assert_eq!(routing.kept, vec![true, true, false, true]);
        assert_eq!(routing.assignments(0), (vec![0, 1], vec![0, 1]));
        assert_eq!(routing.assignments(1), (vec![3], vec![3]));
    }

    #[test]
    fn aux_counts_are_per_sequence_when_asked() {
        let logits = [
            1.0, 0.0, 0.0, 0.0, //
            0.0, 1.0, 0.0, 0.0, //
            0.0, 1.0, 0.0, 0.0, //
            0.0, 1.0, 0.0, 0.0,
        ];
        assert_eq!(aux_loss_counts(&logits, 4, 1, 4), vec![1.0, 3.0, 0.0, 0.0]);
        assert_eq!(
            aux_loss_counts(&logits, 4, 1, 2),
            vec![1.0, 1.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0]
        );
    }

    #[test]
    fn sinkhorn_spreads_tokens_that_all_prefer_one_expert() {
        let mut cfg = config(1);
        cfg.load_balancing = LoadBalancing::Sinkhorn;
        cfg.aux_loss_coeff = 0.0;
        let logits = [
            3.0, 2.0, 1.0, 0.0, //
            3.0, 0.0, 2.0, 1.0, //
            3.0, 1.0, 0.0, 2.0, //
            3.0, 0.5, 1.0, 0.0,
        ];
        let training = route(&cfg, &logits, None, true);
        let inference = route(&cfg, &logits, None, false);
        assert_eq!(inference.loads(4), vec![4, 0, 0, 0]);
        let loads = training.loads(4);
        assert!(loads.iter().all(|&l| l <= 2), "{loads:?}");
        // Top-1 Sinkhorn weights are sigmoid of the chosen logit.
        let expert = training.experts[0];
        let expected = 1.0 / (1.0 + (-logits[expert]).exp());
        assert!((training.weights[0] - expected).abs() < 1e-6);
    }
}
