//! A one-rank layer's routing decisions as device tensors: each token's experts, the routed rows
//! grouped by expert, and the per-expert row counts.
//!
//! Dropless routing is decided on the device (`FusedOps::fused_moe_router`, which also gives
//! the combine weights, then `FusedOps::moe_permutation`), and its `[experts]` counts stay
//! there ([`GroupRows`]): a grouped GEMM that takes device counts runs the layer without the host
//! waiting for the GPU, one that takes host numbers reads them right before it, and the layer's
//! loads are read when the trainer sums them after the step's backward. Capacity dropping and
//! Sinkhorn balancing (while training) compare tokens with each other across the whole
//! microbatch; they stay on the host (`routing.rs`), and their decisions are uploaded into the
//! same form, so everything after the decision is one path.

use burn::tensor::{Int, Tensor, TensorPrimitive};
use ferrotron_ops::{CombineSpec, GroupRows, RouterScore, RouterSpec, combine_rows, moe_router};
use ferrotron_parallel::ParallelOps;
use ferrotron_recipe::{LoadBalancing, ScoreFunction};

use super::dispatch::{Permutation, index_tensor};
use super::routing::Routing;
use crate::config::MoeConfig;

/// Where each token goes.
#[derive(Debug, Clone)]
pub(super) struct Decisions<B: ParallelOps> {
    /// `[tokens, topk]`: each token's experts, best first.
    pub(super) chosen: Tensor<B, 2, Int>,
    /// `[rows]`: the token of each routed row, the rows grouped by expert.
    pub(super) tokens: Tensor<B, 1, Int>,
    /// `[rows]`: the flat (token, slot) index of each routed row.
    pub(super) slots: Tensor<B, 1, Int>,
    /// `[tokens · topk]`: the routed row of each (token, slot); `rows` (one past the last) where
    /// capacity dropped the slot.
    pub(super) rows: Tensor<B, 1, Int>,
    /// Whether capacity dropped any slot.
    pub(super) dropped: bool,
    /// Rows per expert: the grouped GEMM's group sizes, and the experts' loads.
    pub(super) per_expert: GroupRows<B>,
    /// `[tokens · topk]`: the combine weights the device router made with the decisions
    /// (Megatron's `topk_routing_with_score_function`'s); `None` where the host routed.
    pub(super) router_weights: Option<Tensor<B, 1>>,
    /// The router's logits as the host read them, when the host routed.
    pub(super) host_logits: Option<Vec<f32>>,
}

/// Whether `config`'s routing is decided on the device: dropless, and not balanced by Sinkhorn
/// (which balances only while training).
pub(super) fn on_device(config: &MoeConfig, training: bool) -> bool {
    config.capacity.is_none() && !(config.load_balancing == LoadBalancing::Sinkhorn && training)
}

/// The recipe's score function as the fused router ops name it.
pub(super) fn router_score(score_function: ScoreFunction) -> RouterScore {
    match score_function {
        ScoreFunction::Softmax => RouterScore::Softmax,
        ScoreFunction::Sigmoid => RouterScore::Sigmoid,
    }
}

/// How `config` routes (the Sinkhorn activation apart, which the layer makes itself).
pub(super) fn router_spec(config: &MoeConfig) -> RouterSpec {
    RouterSpec {
        topk: config.router_topk,
        score: router_score(config.score_function),
        pre_softmax: config.pre_softmax,
        group_limit: config.group_limit,
        scaling_factor: config.topk_scaling_factor,
    }
}

impl<B: ParallelOps> Decisions<B> {
    /// Routes `logits [tokens, experts]` on the device; `expert_bias` shifts the scores used for
    /// selection only.
    pub(super) fn on_device(
        config: &MoeConfig,
        logits: Tensor<B, 2>,
        expert_bias: Option<Tensor<B, 1>>,
    ) -> Self {
        let [tokens, _] = logits.dims();
        let topk = config.router_topk;
        let (chosen, weights) = moe_router(logits, expert_bias, router_spec(config));
        let permutation = B::moe_permutation(
            chosen.clone().reshape([tokens * topk]).into_primitive(),
            config.num_experts,
        );
        let slots = Tensor::<B, 1, Int>::from_primitive(permutation.order);
        let per_expert = GroupRows::on_device(permutation.counts);
        Decisions {
            chosen,
            tokens: slots.clone().div_scalar(topk as i64),
            slots,
            rows: Tensor::from_primitive(permutation.rows),
            per_expert,
            dropped: false,
            router_weights: Some(weights),
            host_logits: None,
        }
    }

    /// The host router's decisions from the `host_logits` it read, uploaded.
    pub(super) fn from_host(
        routing: &Routing,
        host_logits: Vec<f32>,
        num_experts: usize,
        device: &B::Device,
    ) -> Self {
        let permutation = Permutation::new(routing, num_experts);
        let routed = permutation.slots.len();
        let mut rows = vec![routed; routing.experts.len()];
        for (row, &slot) in permutation.slots.iter().enumerate() {
            rows[slot] = row;
        }
        Decisions {
            chosen: index_tensor::<B>(&routing.experts, device)
                .reshape([routing.num_tokens, routing.topk]),
            tokens: index_tensor::<B>(&permutation.tokens, device),
            slots: index_tensor::<B>(&permutation.slots, device),
            rows: index_tensor::<B>(&rows, device),
            per_expert: GroupRows::on_host(permutation.per_expert),
            dropped: routed < routing.experts.len(),
            router_weights: None,
            host_logits: Some(host_logits),
        }
    }

    /// `tokens [tokens, hidden]` → the routed rows, sorted by expert. Each token is read once
    /// per kept slot, so its gradient gathers those rows and sums them
    /// (`FusedOps::gather_rows`); a dropped slot reads an extra row past the routed ones, cut
    /// off again, whose gradient is zero.
    pub(super) fn dispatch(&self, tokens: Tensor<B, 2>) -> Tensor<B, 2> {
        let [_, topk] = self.chosen.dims();
        if !self.dropped {
            return gather_rows(tokens, self.tokens.clone(), self.rows.clone(), topk);
        }
        let routed = self.tokens.dims()[0];
        let extra = Tensor::<B, 1, Int>::zeros([1], &tokens.device());
        let index = Tensor::cat(vec![self.tokens.clone(), extra], 0);
        gather_rows(tokens, index, self.rows.clone(), topk).slice_dim(0, 0..routed)
    }

    /// The experts' `[rows, hidden]` outputs → `[tokens, hidden]`: each (token, slot) takes its
    /// row (zeros where capacity dropped it), weighted by `weights [tokens · topk]`, summed over
    /// the token's slots (`FusedOps::fused_combine_rows`: one kernel each way on the GPU).
    pub(super) fn combine(&self, expert_out: Tensor<B, 2>, weights: Tensor<B, 1>) -> Tensor<B, 2> {
        let [_, topk] = self.chosen.dims();
        combine_rows(
            expert_out,
            self.rows.clone(),
            self.slots.clone(),
            weights,
            CombineSpec {
                topk,
                dropped: self.dropped,
            },
        )
    }
}

fn gather_rows<B: ParallelOps>(
    x: Tensor<B, 2>,
    index: Tensor<B, 1, Int>,
    back: Tensor<B, 1, Int>,
    group: usize,
) -> Tensor<B, 2> {
    Tensor::from_primitive(TensorPrimitive::Float(B::gather_rows(
        x.into_primitive().tensor(),
        index.into_primitive(),
        back.into_primitive(),
        group,
    )))
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Distribution, TensorData};
    use ferrotron_recipe::Moe;

    use super::*;
    use ferrotron_ops::{BalancingSpec, RouterAuxSpec, moe_router_aux};

    use crate::moe::routing::{aux_loss_counts, route};
    use crate::tests::{Cpu, config, moe_model, moe_section, values};

    const TOKENS: usize = 48;

    fn moe_config(moe: Moe) -> MoeConfig {
        let model = ferrotron_recipe::Model {
            moe: Some(moe),
            ..moe_model()
        };
        config(&model).moe.expect("an MoE model")
    }

    fn ints(x: Tensor<Cpu, 1, Int>) -> Vec<i64> {
        x.into_data().iter::<i64>().collect()
    }

    /// Random logits with ties: every value is a multiple of 1/4 in [-1, 1).
    fn logits(experts: usize) -> Tensor<Cpu, 2> {
        let device = Default::default();
        Tensor::<Cpu, 2>::random([TOKENS, experts], Distribution::Uniform(-4.0, 4.0), &device)
            .floor()
            / 4.0
    }

    /// The device decisions and the host router's, uploaded, for the same logits.
    fn both(moe: Moe, bias: Option<Vec<f32>>) -> (Decisions<Cpu>, Decisions<Cpu>) {
        let config = moe_config(moe);
        let device = Default::default();
        let logits = logits(config.num_experts);
        let host: Vec<f32> = values(logits.clone());
        let routing = route(&config, &host, bias.as_deref(), true);
        let bias = bias.map(|b| {
            let len = b.len();
            Tensor::<Cpu, 1>::from_data(TensorData::new(b, [len]), &device)
        });
        (
            Decisions::on_device(&config, logits, bias),
            Decisions::from_host(&routing, host, config.num_experts, &device),
        )
    }

    fn assert_same(device: Decisions<Cpu>, host: Decisions<Cpu>) {
        assert_eq!(device.per_expert.host(), host.per_expert.host());
        assert_eq!(
            ints(device.chosen.reshape([-1])),
            ints(host.chosen.reshape([-1]))
        );
        assert_eq!(ints(device.tokens), ints(host.tokens));
        assert_eq!(ints(device.slots), ints(host.slots));
        assert_eq!(ints(device.rows), ints(host.rows));
        assert!(!device.dropped && !host.dropped);
    }

    #[test]
    fn device_decisions_are_the_host_routers_for_softmax_after_topk() {
        let (device, host) = both(moe_section(), None);
        assert_eq!(device.per_expert.host().iter().sum::<usize>(), TOKENS * 2);
        assert_same(device, host);
    }

    #[test]
    fn device_decisions_are_the_host_routers_for_pre_softmax() {
        let moe = Moe {
            pre_softmax: true,
            ..moe_section()
        };
        let (device, host) = both(moe, None);
        assert_same(device, host);
    }

    #[test]
    fn device_decisions_are_the_host_routers_with_sigmoid_scores_and_a_bias() {
        let moe = Moe {
            score_function: ScoreFunction::Sigmoid,
            expert_bias: true,
            aux_loss_coeff: 0.0,
            load_balancing: LoadBalancing::None,
            ..moe_section()
        };
        let (device, host) = both(moe, Some(vec![0.0, 0.25, -0.25, 0.5]));
        assert_same(device, host);
    }

    #[test]
    fn device_decisions_are_the_host_routers_with_a_group_limit() {
        let moe = Moe {
            num_experts: 8,
            router_topk: 4,
            num_groups: Some(4),
            group_topk: Some(2),
            ..moe_section()
        };
        let (device, host) = both(moe, None);
        assert_same(device, host);
    }

    #[test]
    fn device_topk_counts_are_the_host_aux_counts_per_sequence_and_whole() {
        let config = moe_config(moe_section());
        let logits = logits(config.num_experts);
        let host: Vec<f32> = values(logits.clone());
        for tokens_per_group in [TOKENS, 16] {
            let spec = RouterAuxSpec {
                balancing: Some(BalancingSpec {
                    score: RouterScore::Softmax,
                    tokens_per_group,
                    count_topk: Some(config.router_topk),
                }),
                log_sum_exp: false,
            };
            let counts = moe_router_aux(logits.clone(), spec).topk_counts;
            assert_eq!(
                values(counts.expect("asked for").reshape([-1])),
                aux_loss_counts(
                    &host,
                    config.num_experts,
                    config.router_topk,
                    tokens_per_group
                )
            );
        }
    }

    #[test]
    fn capacity_and_training_sinkhorn_stay_on_the_host() {
        let dropless = moe_config(moe_section());
        assert!(on_device(&dropless, true));
        let capped = moe_config(Moe {
            capacity_factor: Some(1.0),
            ..moe_section()
        });
        assert!(!on_device(&capped, true));
        let sinkhorn = moe_config(Moe {
            load_balancing: LoadBalancing::Sinkhorn,
            aux_loss_coeff: 0.0,
            router_topk: 1,
            ..moe_section()
        });
        assert!(!on_device(&sinkhorn, true));
        assert!(on_device(&sinkhorn, false));
    }
}
