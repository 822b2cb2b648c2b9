//! One MoE feed-forward layer: router, routed experts, optional shared expert, balancing losses.
//! Kept (token, slot) rows are gathered sorted by expert, run through all experts as grouped
//! matmuls (`grouped.rs`), gathered back into their slots, weighted and summed per token, so
//! compute is proportional to the tokens each expert really receives. Both gathers know which
//! rows read each row, so their gradients are gathers too (`FusedOps::gather_rows`), not the
//! scatter-adds of burn's `select`. A layer cut for a parallel layout (see `parallel.rs`) routes
//! the same way and lets a token dispatcher carry the tokens to the ranks holding their experts.

use burn::module::{Module, Param, ParamId};
use burn::nn::Linear;
use burn::tensor::activation::{sigmoid, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Int, Tensor, TensorData};
use ferrotron_ops::{
    BalancingSpec, Fp8Experts, Fp8Linear, RouterAuxSpec, moe_router_aux, router_weights,
};
use ferrotron_parallel::ParallelOps;
use ferrotron_recipe::LoadBalancing;

use super::decisions::{self, Decisions, router_score, router_spec};
use super::expert::Expert;
use super::grouped::grouped_experts;
use super::loss::{sequence_aux_loss_share, switch_aux_loss_share, z_loss};
use super::parallel::MoeParallel;
use super::routing::{Routing, aux_loss_counts, route};
use crate::LayerLoads;
use crate::config::{ModelConfig, MoeConfig};
use crate::init::{normal_linear, scaled_std};
use crate::mlp::{Mlp, MlpShape};

#[derive(Module, Debug)]
pub struct MoeLayer<B: Backend> {
    /// `[hidden, experts]`, no bias.
    pub(crate) router: Linear<B>,
    /// DeepSeek-V3's selection bias `[experts]`: not trained by gradients (updated by
    /// [`crate::GptModel::update_expert_bias`]) but saved with the model. Always f32, as
    /// Megatron keeps it: in bf16 an update of 1e-3 becomes 2⁻⁹ ≈ 2e-3 from |bias| = 0.25 on
    /// and rounds away from 0.5 on.
    pub(crate) expert_bias: Option<Param<Tensor<B, 1>>>,
    /// Every expert on one rank; this rank's (cut) experts in a parallel layout.
    pub(super) experts: Vec<Expert<B>>,
    pub(super) shared_expert: Option<Mlp<B>>,
    #[module(skip)]
    pub(super) config: MoeConfig,
    /// `None` on one rank.
    #[module(skip)]
    pub(super) parallel: Option<MoeParallel>,
    /// fp8 grouped GEMMs for the routed experts' fc1 and fc2 (`precision.fp8_experts`), on one
    /// rank.
    #[module(skip)]
    pub(super) fp8: Option<ExpertsFp8>,
}

/// The routed experts' fp8 handles: fc1's and fc2's.
#[derive(Debug, Clone)]
pub(crate) struct ExpertsFp8 {
    pub(crate) fc1: Fp8Experts,
    pub(crate) fc2: Fp8Experts,
}

/// What one MoE layer reports besides its output.
#[derive(Debug, Clone)]
pub struct MoeStats<B: Backend> {
    /// Balancing and z-losses of this layer, `[1]`.
    pub aux_loss: Tensor<B, 1>,
    /// Tokens kept per expert (all experts, the whole microbatch), read when asked.
    pub loads: LayerLoads,
}

impl<B: ParallelOps> MoeLayer<B> {
    /// `[batch, seq, hidden]` → same shape, with this layer's losses and loads. In a parallel
    /// layout `x` is this rank's activations (`[batch, seq/tp, hidden]` with sequence
    /// parallelism) and the output is complete.
    pub fn forward(&self, x: Tensor<B, 3>) -> (Tensor<B, 3>, MoeStats<B>) {
        match &self.parallel {
            Some(parallel) => self.forward_parallel(x, parallel),
            None => self.forward_one_rank(x),
        }
    }

    fn forward_one_rank(&self, x: Tensor<B, 3>) -> (Tensor<B, 3>, MoeStats<B>) {
        let [batch, seq, hidden] = x.dims();
        let tokens = x.reshape([batch * seq, hidden]);
        let device = tokens.device();
        let logits = self.router.forward(tokens.clone());
        let training = B::ad_enabled(&device);
        let config = &self.config;
        let decisions = if decisions::on_device(config, training) {
            Decisions::on_device(config, logits.clone(), self.expert_bias())
        } else {
            let host_logits: Vec<f32> = logits.clone().into_data().iter::<f32>().collect();
            let routing = self.route(&host_logits, training);
            Decisions::from_host(&routing, host_logits, config.num_experts, &device)
        };
        let weights = match &decisions.router_weights {
            // Sinkhorn's weights are its own activation's, not the router's
            Some(weights) if config.load_balancing != LoadBalancing::Sinkhorn => weights.clone(),
            _ => self.combine_weights(logits.clone(), decisions.chosen.clone()),
        };

        let sorted = decisions.dispatch(tokens.clone());
        let expert_out = grouped_experts(
            &self.experts,
            sorted,
            &decisions.per_expert,
            self.fp8.as_ref(),
        );
        let output = decisions.combine(expert_out, weights);
        let output = match &self.shared_expert {
            Some(shared) => output + shared.forward(tokens),
            None => output,
        };

        let host_logits = decisions.host_logits.as_deref();
        let aux_loss = self.balancing_loss(logits, host_logits, batch, seq);
        let stats = MoeStats {
            aux_loss,
            loads: LayerLoads::of(&decisions.per_expert),
        };
        (output.reshape([batch, seq, hidden]), stats)
    }

    /// The balancing and z-losses of `logits [batch · seq, experts]`, their terms from
    /// [`moe_router_aux`]; the balancing losses' plain top-k counts from the logits the host
    /// read where it routed, else counted with the terms.
    fn balancing_loss(
        &self,
        logits: Tensor<B, 2>,
        host_logits: Option<&[f32]>,
        batch: usize,
        seq: usize,
    ) -> Tensor<B, 1> {
        let config = &self.config;
        let device = logits.device();
        let mut loss = Tensor::<B, 1>::zeros([1], &device);
        let per_sequence = config.load_balancing == LoadBalancing::SeqAuxLoss;
        let tokens_per_group = if per_sequence { seq } else { batch * seq };
        let balancing = (config.aux_loss_coeff > 0.0
            && matches!(
                config.load_balancing,
                LoadBalancing::AuxLoss | LoadBalancing::SeqAuxLoss
            ))
        .then(|| BalancingSpec {
            score: router_score(config.score_function),
            tokens_per_group,
            count_topk: host_logits.is_none().then_some(config.router_topk),
        });
        let spec = RouterAuxSpec {
            balancing,
            log_sum_exp: config.z_loss_coeff > 0.0,
        };
        if balancing.is_none() && !spec.log_sum_exp {
            return loss;
        }
        let terms = moe_router_aux(logits, spec);
        if let Some(mass) = terms.probability_mass {
            let (experts, topk) = (config.num_experts, config.router_topk);
            let counts = match host_logits {
                Some(host) => {
                    let counts = aux_loss_counts(host, experts, topk, tokens_per_group);
                    let len = counts.len();
                    Tensor::<B, 1>::from_data(TensorData::new(counts, [len]), &device)
                        .reshape([len / experts, experts])
                }
                None => terms
                    .topk_counts
                    .expect("the plain top-k counts, asked for"),
            };
            loss = loss
                + if per_sequence {
                    sequence_aux_loss_share(mass, counts, topk, config.aux_loss_coeff, seq)
                } else {
                    switch_aux_loss_share(
                        mass.reshape([experts]),
                        counts.reshape([experts]),
                        topk,
                        config.aux_loss_coeff,
                        batch * seq,
                    )
                };
        }
        if let Some(log_sum_exp) = terms.log_sum_exp {
            loss = loss + z_loss(log_sum_exp, config.z_loss_coeff);
        }
        loss
    }
}

impl<B: Backend> MoeLayer<B> {
    pub fn new(model: &ModelConfig, moe: &MoeConfig, device: &B::Device) -> Self {
        let std = model.init_method_std;
        let output_std = scaled_std(std, model.num_layers);
        let mlp = |ffn| MlpShape {
            hidden: model.hidden_size,
            ffn,
            activation: model.activation,
            bias: model.add_bias_linear,
            std,
            output_std,
        };
        let router = normal_linear(model.hidden_size, moe.num_experts, std, false, device);
        let expert_bias = moe.expert_bias.then(|| {
            let zeros = Tensor::zeros([moe.num_experts], (device, DType::F32));
            Param::initialized(ParamId::new(), zeros).set_require_grad(false)
        });
        let expert_shape = mlp(moe.expert_ffn_hidden_size);
        let experts = (0..moe.num_experts)
            .map(|_| Expert::new(&expert_shape, device))
            .collect();
        let shared_expert = moe
            .shared_expert_ffn_hidden_size
            .map(|ffn| Mlp::new(&mlp(ffn), device));
        MoeLayer {
            router,
            expert_bias,
            experts,
            shared_expert,
            config: moe.clone(),
            parallel: None,
            fp8: None,
        }
    }

    /// The fp8 slots of the routed experts (relative to the layer), in the order
    /// [`Self::with_fp8`] takes handles: fc1's routed rows, each expert's fc1 weight, then the
    /// same for fc2. Each weight's slot is named by its parameter path (`experts.3.fc1`), the
    /// rows' by the linear's (`experts.fc1`). None for a layer cut over ranks, whose tokens reach
    /// the experts through the token dispatcher.
    pub(crate) fn fp8_linears(&self) -> Vec<String> {
        if self.parallel.is_some() {
            return Vec::new();
        }
        ["fc1", "fc2"]
            .into_iter()
            .flat_map(|linear| {
                std::iter::once(format!("experts.{linear}"))
                    .chain((0..self.experts.len()).map(move |e| format!("experts.{e}.{linear}")))
            })
            .collect()
    }

    /// The same layer with the handles of [`Self::fp8_linears`], in that order.
    pub(crate) fn with_fp8(self, handles: Vec<Fp8Linear>) -> Self {
        if handles.is_empty() {
            return self;
        }
        let experts = self.experts.len();
        let mut handles = handles.into_iter();
        let mut take = || {
            let rows = handles.next().expect("the routed rows' handle");
            let weights = handles.by_ref().take(experts).collect();
            Fp8Experts { rows, weights }
        };
        let (fc1, fc2) = (take(), take());
        MoeLayer {
            fp8: Some(ExpertsFp8 { fc1, fc2 }),
            ..self
        }
    }

    /// The current selection bias, if this layer uses one.
    pub fn expert_bias(&self) -> Option<Tensor<B, 1>> {
        self.expert_bias.as_ref().map(Param::val)
    }

    /// DeepSeek-V3's update: `bias_i += rate · sign(mean_load − load_i)`.
    pub(crate) fn update_expert_bias(self, loads: &[u64]) -> Self {
        let Some(bias) = self.expert_bias else {
            return self;
        };
        let mean = loads.iter().sum::<u64>() as f64 / loads.len() as f64;
        let rate = self.config.expert_bias_update_rate;
        let delta: Vec<f32> = loads
            .iter()
            .map(|&load| {
                let gap = mean - load as f64;
                if gap == 0.0 {
                    0.0
                } else {
                    (rate * gap.signum()) as f32
                }
            })
            .collect();
        let bias = bias.map(|value| {
            let device = value.device();
            // made in f32 (the device's default dtype would round 1e-3), then the bias's dtype
            let delta = Tensor::<B, 1>::from_data(
                TensorData::new(delta, [loads.len()]),
                (&device, DType::F32),
            )
            .cast(value.dtype());
            (value + delta).detach()
        });
        MoeLayer {
            expert_bias: Some(bias),
            ..self
        }
    }

    pub(crate) fn num_experts(&self) -> usize {
        self.config.num_experts
    }

    pub(super) fn route(&self, logits: &[f32], training: bool) -> Routing {
        let bias: Option<Vec<f32>> = self
            .expert_bias
            .as_ref()
            .map(|bias| bias.val().into_data().iter::<f32>().collect());
        route(&self.config, logits, bias.as_deref(), training)
    }

    /// Differentiable `[tokens · topk]` combine weights of the `chosen [tokens, topk]` experts
    /// (Megatron's `topk_routing_with_score_function`, the Sinkhorn activation apart), scaled
    /// by `router_topk_scaling_factor` after normalisation; dropped slots simply never reach an
    /// expert. As Megatron computes them: in f32 whatever the logits' dtype, the result cast to
    /// it.
    pub(super) fn combine_weights(
        &self,
        logits: Tensor<B, 2>,
        chosen: Tensor<B, 2, Int>,
    ) -> Tensor<B, 1> {
        let [tokens, topk] = chosen.dims();
        if self.config.load_balancing == LoadBalancing::Sinkhorn {
            // Megatron's Sinkhorn activation (unscaled): sigmoid for top-1, else softmax over all
            // experts.
            let weights = if topk == 1 {
                sigmoid(logits)
            } else {
                softmax(logits, 1)
            };
            return weights.gather(1, chosen).reshape([tokens * topk]);
        }
        router_weights(logits, chosen, &router_spec(&self.config))
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::Distribution;
    use ferrotron_recipe::{Model, Moe, ScoreFunction, TokenDropPolicy};

    use super::*;
    use crate::tests::{Cpu, config, moe_model, moe_section, scalar, values};

    /// A layer whose router is the identity (hidden 4 = experts 4), so the logits are the input.
    fn identity_router_layer(moe: Moe) -> MoeLayer<Cpu> {
        let model = Model {
            hidden_size: 4,
            num_attention_heads: 2,
            moe: Some(moe),
            ..moe_model()
        };
        let model_config = config(&model);
        let moe_config = model_config.moe.clone().expect("an MoE model");
        let device = Default::default();
        let mut layer = MoeLayer::<Cpu>::new(&model_config, &moe_config, &device);
        layer.router.weight = Param::from_tensor(Tensor::eye(4, &device));
        layer
    }

    fn input(rows: &[[f32; 4]]) -> Tensor<Cpu, 3> {
        let flat: Vec<f32> = rows.iter().flatten().copied().collect();
        Tensor::from_data(
            TensorData::new(flat, [1, rows.len(), 4]),
            &Default::default(),
        )
    }

    fn expert_output(layer: &MoeLayer<Cpu>, expert: usize, row: [f32; 4]) -> Vec<f32> {
        values(layer.experts[expert].forward(input(&[row]).reshape([1, 4])))
    }

    fn assert_close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-6, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn aux_loss_matches_the_hand_computed_value() {
        // Logits [ln3, 0, 0, 0] and [0, ln3, 0, 0]: softmax rows [1/2, 1/6, 1/6, 1/6] and
        // [1/6, 1/2, 1/6, 1/6]; top-1 picks experts 0 and 1.
        // P = [1/3, 1/3, 1/6, 1/6], f = [1/2, 1/2, 0, 0]; E·Σ f·P = 4 · (1/6 + 1/6) = 4/3.
        let layer = identity_router_layer(Moe {
            router_topk: 1,
            aux_loss_coeff: 0.01,
            shared_expert_ffn_hidden_size: None,
            ..moe_section()
        });
        let ln3 = 3.0f32.ln();
        let (_, stats) = layer.forward(input(&[[ln3, 0.0, 0.0, 0.0], [0.0, ln3, 0.0, 0.0]]));
        let aux = scalar(stats.aux_loss);
        assert!((aux - 0.04 / 3.0).abs() < 1e-7, "{aux}");
        assert_eq!(stats.loads.read(), vec![1, 1, 0, 0]);
    }

    #[test]
    fn output_is_the_weighted_sum_of_the_chosen_experts_plus_the_shared_one() {
        let layer = identity_router_layer(moe_section()); // top-2, softmax after top-k, shared
        let device = Default::default();
        let x = Tensor::<Cpu, 3>::random([1, 3, 4], Distribution::Normal(0.0, 1.0), &device);
        let rows: Vec<[f32; 4]> = values(x.clone())
            .chunks_exact(4)
            .map(|c| [c[0], c[1], c[2], c[3]])
            .collect();
        let (output, _) = layer.forward(x.clone());
        let output = values(output);
        let routing = layer.route(&values(x.clone()), false);
        let shared = values(
            layer
                .shared_expert
                .as_ref()
                .expect("shared expert")
                .forward(x.reshape([3, 4])),
        );
        for (token, row) in rows.iter().enumerate() {
            let mut expected = shared[token * 4..(token + 1) * 4].to_vec();
            for slot in 0..2 {
                let expert = routing.experts[token * 2 + slot];
                let weight = routing.weights[token * 2 + slot];
                for (e, o) in expected.iter_mut().zip(expert_output(&layer, expert, *row)) {
                    *e += weight * o;
                }
            }
            assert_close(&output[token * 4..(token + 1) * 4], &expected);
        }
    }

    #[test]
    fn dropped_tokens_get_no_routed_output() {
        // All four tokens prefer expert 0; top-1 with capacity ceil(4·1/4 · 1) = 1 keeps only
        // the most probable one (token 1).
        let layer = identity_router_layer(Moe {
            router_topk: 1,
            pre_softmax: true,
            capacity_factor: Some(1.0),
            token_drop_policy: TokenDropPolicy::Probs,
            shared_expert_ffn_hidden_size: None,
            ..moe_section()
        });
        let (output, stats) = layer.forward(input(&[
            [1.0, 0.0, 0.0, 0.0],
            [3.0, 0.0, 0.0, 0.0],
            [2.0, 0.0, 0.0, 0.0],
            [1.5, 0.0, 0.0, 0.0],
        ]));
        assert_eq!(stats.loads.read(), vec![1, 0, 0, 0]);
        let output = values(output);
        for dropped in [0, 2, 3] {
            assert!(
                output[dropped * 4..(dropped + 1) * 4]
                    .iter()
                    .all(|&v| v == 0.0)
            );
        }
        assert!(output[4..8].iter().any(|&v| v != 0.0));
    }

    #[test]
    fn expert_bias_changes_selection_but_not_the_combine_weight() {
        let mut layer = identity_router_layer(Moe {
            router_topk: 1,
            score_function: ScoreFunction::Sigmoid,
            expert_bias: true,
            load_balancing: LoadBalancing::None,
            shared_expert_ffn_hidden_size: None,
            ..moe_section()
        });
        let row = [2.0, 0.0, 0.0, 0.0];
        let (unbiased, stats) = layer.forward(input(&[row]));
        assert_eq!(stats.loads.read(), vec![1, 0, 0, 0]);
        let sigmoid_2 = 1.0 / (1.0 + (-2.0f32).exp());
        let expected: Vec<f32> = expert_output(&layer, 0, row)
            .iter()
            .map(|v| v * sigmoid_2)
            .collect();
        assert_close(&values(unbiased), &expected);

        let device = Default::default();
        layer.expert_bias = Some(
            Param::initialized(
                ParamId::new(),
                Tensor::from_floats([0.0, 0.0, 5.0, 0.0], &device),
            )
            .set_require_grad(false),
        );
        let (biased, stats) = layer.forward(input(&[row]));
        assert_eq!(stats.loads.read(), vec![0, 0, 1, 0]);
        // Expert 2's logit is 0: the weight is sigmoid(0) = 0.5, the bias does not enter it.
        let expected: Vec<f32> = expert_output(&layer, 2, row)
            .iter()
            .map(|v| v * 0.5)
            .collect();
        assert_close(&values(biased), &expected);
    }

    #[test]
    fn z_loss_adds_to_the_balancing_loss() {
        let row = [[0.0, 0.0, 0.0, 0.0]];
        let plain = identity_router_layer(Moe {
            load_balancing: LoadBalancing::None,
            ..moe_section()
        });
        let with_z = identity_router_layer(Moe {
            load_balancing: LoadBalancing::None,
            z_loss_coeff: Some(0.5),
            ..moe_section()
        });
        assert_eq!(scalar(plain.forward(input(&row)).1.aux_loss), 0.0);
        // logsumexp of four zeros = ln 4; squared, times 0.5.
        let z = scalar(with_z.forward(input(&row)).1.aux_loss);
        assert!((z - 0.5 * 4.0f32.ln().powi(2)).abs() < 1e-6, "{z}");
    }
}
