//! An MoE layer cut for a parallel layout, as Megatron-Core lays it out: experts split over
//! `ep` (global expert `ep_rank · E_local + i`), each expert cut over `etp`, the router replicated,
//! the shared expert tensor-parallel like a dense MLP. Each rank cuts its part out of the full
//! one-rank layer, and the forward pass is arranged so that the arithmetic equals one rank's:
//! routing of the whole microbatch (see `microbatch.rs`), expert outputs carried by a token
//! dispatcher (`dispatch.rs`), balancing losses split into per-token shares.

use burn::module::Param;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use ferrotron_ops::{RouterAuxSpec, balancing_probabilities, moe_router_aux};
use ferrotron_parallel::collectives::{all_reduce_detached, gather_from_region, scatter_to_region};
use ferrotron_parallel::{ParallelContext, ParallelOps, ParamRole, ReduceOp, ShardSpec};
use ferrotron_recipe::{LoadBalancing, TokenDispatcher};

use super::decisions::router_score;
use super::dispatch::{self, ExpertGroups, index_tensor};
use super::expert::Piece;
use super::layer::{MoeLayer, MoeStats};
use super::loss::{sequence_aux_loss_share, switch_aux_loss_share, z_loss_share};
use super::microbatch::{
    TokenPlacement, gather_logits, microbatch_groups, rows_of, splits_rows_over_tp,
};
use super::routing::aux_loss_counts;
use crate::LayerLoads;
use crate::error::ModelError;
use crate::parallel::{Placement, TensorParallel, cut_module, roles_of};

/// What a cut layer needs to know about its rank.
#[derive(Debug, Clone)]
pub(super) struct MoeParallel {
    ctx: ParallelContext,
    groups: ExpertGroups,
    dispatcher: TokenDispatcher,
}

impl<B: Backend> MoeLayer<B> {
    /// This rank's part of `self`, the full one-rank layer (built from the same seed on every
    /// rank), dispatching with the recipe's `moe.token_dispatcher`.
    pub fn shard(&self, ctx: &ParallelContext) -> Result<MoeLayer<B>, ModelError> {
        self.shard_with(ctx, self.config.token_dispatcher)
    }

    /// [`Self::shard`] with an explicit token dispatcher (`flex` dispatches like `alltoall`).
    pub fn shard_with(
        &self,
        ctx: &ParallelContext,
        dispatcher: TokenDispatcher,
    ) -> Result<MoeLayer<B>, ModelError> {
        if self.parallel.is_some() {
            return Err(ModelError::Layout(
                "an MoE layer can only be cut from the full one-rank layer".to_owned(),
            ));
        }
        let num_experts = self.config.num_experts;
        let ep = ctx.ep.size();
        if !num_experts.is_multiple_of(ep) {
            return Err(ModelError::Layout(format!(
                "{num_experts} experts cannot be split over {ep} expert-parallel ranks"
            )));
        }
        let local = num_experts / ep;
        let first = ctx.ep.rank() * local;
        let piece = Piece {
            index: ctx.etp.rank(),
            count: ctx.etp.size(),
        };
        let experts = self.experts[first..first + local]
            .iter()
            .map(|expert| expert.shard(piece))
            .collect::<Result<Vec<_>, _>>()?;
        let shared_expert = self
            .shared_expert
            .as_ref()
            .map(|shared| shared.shard(&TensorParallel::of(ctx)))
            .transpose()?;
        Ok(MoeLayer {
            router: cut_module(&self.router, |_| Placement::default())?,
            expert_bias: self
                .expert_bias
                .as_ref()
                .map(|bias| cut_module(bias, |_| Placement::default()))
                .transpose()?,
            experts,
            shared_expert,
            config: self.config.clone(),
            fp8: None,
            parallel: Some(MoeParallel {
                ctx: ctx.clone(),
                groups: ExpertGroups {
                    ep: ctx.ep.clone(),
                    etp: ctx.etp.clone(),
                    num_experts,
                },
                dispatcher,
            }),
        })
    }

    /// Every local parameter's role, named by its one-rank module path under `prefix` (e.g.
    /// `layers.4.feed_forward.Moe`): `router.weight`, `expert_bias`, `experts.{global}.fc1.weight`,
    /// …, `shared_expert.fc1.weight`, …. Experts are `expert` (reduced over edp); the router sees
    /// only this rank's share of the tokens whenever tp > 1, so its gradient is `tp_partial`.
    pub fn param_roles(&self, prefix: &str, ctx: &ParallelContext) -> Vec<ParamRole> {
        let tp = ctx.tp.size() > 1;
        let replicated = || Placement {
            tp_partial: tp,
            tp_duplicate: tp,
            ..Placement::default()
        };
        let mut roles = roles_of(&self.router, &format!("{prefix}.router"), |_| replicated());
        if let Some(bias) = &self.expert_bias {
            roles.push(expert_bias_role(bias, prefix, tp));
        }
        let first = self
            .parallel
            .as_ref()
            .map_or(0, |parallel| parallel.groups.ep.rank() * self.experts.len());
        for (index, expert) in self.experts.iter().enumerate() {
            roles.extend(expert.param_roles(&format!("{prefix}.experts.{}", first + index)));
        }
        if let Some(shared) = &self.shared_expert {
            let tensor_parallel = shared.tensor_parallel().clone();
            roles.extend(roles_of(
                shared,
                &format!("{prefix}.shared_expert"),
                |name| shared.placement(name, &tensor_parallel),
            ));
        }
        roles
    }
}

fn expert_bias_role<B: Backend>(bias: &Param<Tensor<B, 1>>, prefix: &str, tp: bool) -> ParamRole {
    let shard = ShardSpec::full(format!("{prefix}.expert_bias"), bias.dims().to_vec());
    ParamRole {
        tp_partial: tp,
        tp_duplicate: tp,
        no_weight_decay: true,
        ..ParamRole::new(bias.id, shard)
    }
}

impl<B: ParallelOps> MoeLayer<B> {
    pub(super) fn forward_parallel(
        &self,
        x: Tensor<B, 3>,
        parallel: &MoeParallel,
    ) -> (Tensor<B, 3>, MoeStats<B>) {
        let ctx = &parallel.ctx;
        let [batch, seq, hidden] = x.dims();
        let tokens = x.clone().reshape([batch * seq, hidden]);
        let split_over_tp = splits_rows_over_tp(ctx);
        if split_over_tp {
            assert!(
                (batch * seq).is_multiple_of(ctx.tp.size()),
                "MoE without sequence parallelism splits its {} tokens over {} tensor-parallel ranks; they must divide evenly",
                batch * seq,
                ctx.tp.size()
            );
        }
        let own_tokens = if split_over_tp {
            scatter_to_region(tokens, 0, &ctx.tp)
        } else {
            tokens
        };
        let logits = self.router.forward(own_tokens.clone());
        let host_logits: Vec<f32> = logits.clone().into_data().iter::<f32>().collect();
        let training = B::ad_enabled(&own_tokens.device());

        let placement = TokenPlacement::of_rank(ctx, batch, seq);
        let groups = microbatch_groups(ctx);
        let num_experts = self.config.num_experts;
        let microbatch_logits = if groups.is_empty() {
            host_logits
        } else {
            gather_logits(&groups, &placement, &host_logits, num_experts)
        };
        let microbatch = self.route(&microbatch_logits, training);
        let routing = if groups.is_empty() {
            microbatch.clone()
        } else {
            rows_of(&microbatch, &placement.ids)
        };
        let chosen = index_tensor::<B>(&routing.experts, &logits.device())
            .reshape([routing.num_tokens, routing.topk]);
        let weights = self.combine_weights(logits.clone(), chosen);

        let routed = match parallel.dispatcher {
            TokenDispatcher::Allgather => dispatch::all_gather(
                own_tokens,
                weights,
                &routing,
                &self.experts,
                &parallel.groups,
            ),
            TokenDispatcher::Alltoall | TokenDispatcher::Flex => dispatch::all_to_all(
                own_tokens,
                weights,
                &routing,
                &self.experts,
                &parallel.groups,
            ),
        };
        let routed = if split_over_tp {
            gather_from_region(routed, 0, &ctx.tp)
        } else {
            routed
        };
        let mut output = routed.reshape([batch, seq, hidden]);
        if let Some(shared) = &self.shared_expert {
            output = output + shared.forward(x);
        }
        let aux_loss = self.balancing_loss_share(logits, &microbatch_logits, &placement, ctx);
        let stats = MoeStats {
            aux_loss,
            loads: LayerLoads::ready(microbatch.loads(num_experts)),
        };
        (output, stats)
    }

    /// The microbatch's balancing and z-losses as the one-rank layer computes them, with the
    /// gradient of this rank's tokens' share. The losses are linear in per-token terms, so the
    /// shares of the tp ranks add up to the whole; dense gradients are averaged over cp, so the
    /// share is scaled by cp. The value is replaced (without gradient) by the microbatch's total.
    fn balancing_loss_share(
        &self,
        logits: Tensor<B, 2>,
        microbatch_logits: &[f32],
        placement: &TokenPlacement,
        ctx: &ParallelContext,
    ) -> Tensor<B, 1> {
        let config = &self.config;
        let device = logits.device();
        let experts = config.num_experts;
        let total = placement.total_tokens();
        let mut share = Tensor::<B, 1>::zeros([1], &device);
        let needs_counts = config.aux_loss_coeff > 0.0
            && matches!(
                config.load_balancing,
                LoadBalancing::AuxLoss | LoadBalancing::SeqAuxLoss
            );
        if needs_counts {
            let score = router_score(config.score_function);
            let probabilities = balancing_probabilities(logits.clone(), score);
            share = share
                + if config.load_balancing == LoadBalancing::SeqAuxLoss {
                    let sequences = placement.sequences;
                    let counts = aux_loss_counts(
                        microbatch_logits,
                        experts,
                        config.router_topk,
                        placement.seq_len,
                    );
                    let counts = Tensor::<B, 2>::from_data(
                        TensorData::new(counts, [sequences, experts]),
                        &device,
                    );
                    let membership = sequence_membership::<B>(placement, &device);
                    sequence_aux_loss_share(
                        membership.matmul(probabilities),
                        counts,
                        config.router_topk,
                        config.aux_loss_coeff,
                        placement.seq_len,
                    )
                } else {
                    let counts =
                        aux_loss_counts(microbatch_logits, experts, config.router_topk, total);
                    let counts =
                        Tensor::<B, 1>::from_data(TensorData::new(counts, [experts]), &device);
                    switch_aux_loss_share(
                        probabilities.sum_dim(0).reshape([experts]),
                        counts,
                        config.router_topk,
                        config.aux_loss_coeff,
                        total,
                    )
                };
        }
        if config.z_loss_coeff > 0.0 {
            let spec = RouterAuxSpec {
                balancing: None,
                log_sum_exp: true,
            };
            let log_sum_exp = moe_router_aux(logits, spec).log_sum_exp;
            let log_sum_exp = log_sum_exp.expect("the log-sum-exps, asked for");
            share = share + z_loss_share(log_sum_exp, config.z_loss_coeff, total);
        }
        let groups = microbatch_groups(ctx);
        if groups.is_empty() {
            return share;
        }
        let mut whole = share.clone().detach();
        for comm in &groups {
            whole = all_reduce_detached(whole, ReduceOp::Sum, comm);
        }
        let scaled = share.mul_scalar(ctx.cp.size() as f64);
        let correction = whole - scaled.clone().detach();
        scaled + correction
    }
}

/// `[sequences, rows]`: 1 where routed row r belongs to sequence s.
fn sequence_membership<B: Backend>(placement: &TokenPlacement, device: &B::Device) -> Tensor<B, 2> {
    let rows = placement.ids.len();
    let mut membership = vec![0.0f32; placement.sequences * rows];
    for (row, &id) in placement.ids.iter().enumerate() {
        membership[(id / placement.seq_len) * rows + row] = 1.0;
    }
    Tensor::from_data(
        TensorData::new(membership, [placement.sequences, rows]),
        device,
    )
}
