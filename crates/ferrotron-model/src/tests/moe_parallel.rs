//! Expert parallelism on thread ranks against one rank. In the EP layouts every rank holds other
//! tokens (EP ranks are data-parallel ranks of the dense part), so each rank's output, aux loss,
//! loads, input and router gradients must equal one rank processing that rank's tokens alone,
//! and each local expert's gradient (its etp piece, cut by its `ShardSpec`) must equal the sum
//! over ranks of the one-rank gradients: every rank's tokens reach the expert's owner.
//!
//! Tolerance: `1e-6 + 1e-5·|expected|` on values of order 0.1–1 (weights drawn with std 0.3).
//! The ranks compute the same float operations on the same numbers except for summation order
//! (expert outputs summed per rank, then across ranks; etp partial sums added in an exchange;
//! router gradients over fewer rows), which moves results by a few ulps: the largest difference
//! seen is about 1e-6 relative. Routing decisions are discrete and compared exactly (loads).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor, TensorData};
use ferrotron_dist::{CallLogs, Communicator, World};
use ferrotron_parallel::{Comm, ParallelContext, ParamRole};
use ferrotron_recipe::TokenDispatcher;

use super::*;
use crate::moe::MoeLayer;

type Grads = <CpuAutodiff as burn::tensor::backend::AutodiffBackend>::Gradients;

const BATCH: usize = 2;
const SEQ: usize = 4;
const SEED: u64 = 11;

/// Rank threads build their full layer from one seed, one at a time: the RNG is process-global.
static INIT: Mutex<()> = Mutex::new(());

/// The world communicator a test's groups are made from: a thread rank's, recorded or not.
trait WorldComm: Communicator + Sync + std::fmt::Debug + 'static {}

impl<C: Communicator + Sync + std::fmt::Debug + 'static> WorldComm for C {}

#[derive(Debug, Clone, Copy)]
struct Layout {
    ep: usize,
    etp: usize,
    dispatcher: TokenDispatcher,
}

impl Layout {
    fn world(&self) -> usize {
        self.ep * self.etp
    }

    /// Megatron's expert grid `etp-ep`: etp ranks are neighbours.
    fn context<W: WorldComm>(&self, world: &W) -> ParallelContext {
        let me = world.global_rank() as usize;
        let (etp_index, ep_index) = (me % self.etp, me / self.etp);
        let etp_members: Vec<u32> = (0..self.etp)
            .map(|i| (ep_index * self.etp + i) as u32)
            .collect();
        let ep_members: Vec<u32> = (0..self.ep)
            .map(|i| (i * self.etp + etp_index) as u32)
            .collect();
        let group = |name: &str, members: &[u32]| -> Comm {
            Arc::new(world.new_group(name, members).expect("thread groups form"))
        };
        ParallelContext {
            ep: group("ep", &ep_members),
            etp: group("etp", &etp_members),
            ..ParallelContext::single()
        }
    }
}

fn full_layer(model: &Model) -> MoeLayer<CpuAutodiff> {
    let config = config(model);
    let moe = config.moe.clone().expect("an MoE model");
    let device = Default::default();
    let _guard = INIT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    CpuAutodiff::seed(&device, SEED);
    MoeLayer::new(&config, &moe, &device).map(&mut NonZeroBiases)
}

/// Biases start at zero; give them values so a bias counted twice (or not at all) shows.
struct NonZeroBiases;

impl ModuleMapper<CpuAutodiff> for NonZeroBiases {
    fn map_float<const D: usize>(
        &mut self,
        param: Param<Tensor<CpuAutodiff, D>>,
    ) -> Param<Tensor<CpuAutodiff, D>> {
        if D != 1 {
            return param;
        }
        param.map(|value| {
            let trained = value.is_require_grad();
            let noise = value.random_like(Distribution::Normal(0.0, 0.1));
            let shifted = Tensor::from_data(
                (value.clone().detach() + noise).into_data(),
                &value.device(),
            );
            if trained {
                shifted.require_grad()
            } else {
                shifted
            }
        })
    }
}

/// Rank `rank`'s tokens and the weights of its loss `Σ output · probe`.
fn rank_data(hidden: usize, rank: usize) -> (Vec<f32>, Vec<f32>) {
    let n = BATCH * SEQ * hidden;
    let stream = 2 * rank as u64;
    (noise(n, stream + 1, 1.5), noise(n, stream + 2, 1.0))
}

/// `n` deterministic values in `[-scale, scale)` (a 64-bit LCG), different for each `stream`.
fn noise(n: usize, stream: u64, scale: f32) -> Vec<f32> {
    let mut state = stream.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let unit = (state >> 40) as f32 / (1u64 << 24) as f32;
            (2.0 * unit - 1.0) * scale
        })
        .collect()
}

/// What one rank (or the one-rank reference for one rank's tokens) produced.
#[derive(Debug, Clone)]
struct Outcome {
    output: Vec<f32>,
    aux: f32,
    loads: Vec<u64>,
    input_grad: Vec<f32>,
    /// Gradient of every parameter by global name (the local shard on a rank).
    grads: HashMap<String, Vec<f32>>,
}

fn run_layer(
    layer: &MoeLayer<CpuAutodiff>,
    roles: &[ParamRole],
    hidden: usize,
    rank: usize,
) -> Outcome {
    let device = Default::default();
    let (x, probe) = rank_data(hidden, rank);
    let x = Tensor::<CpuAutodiff, 3>::from_data(TensorData::new(x, [BATCH, SEQ, hidden]), &device)
        .require_grad();
    let probe =
        Tensor::<CpuAutodiff, 3>::from_data(TensorData::new(probe, [BATCH, SEQ, hidden]), &device);
    let (output, stats) = layer.forward(x.clone());
    let loss = (output.clone() * probe).sum() + stats.aux_loss.clone();
    let gradients = loss.backward();
    let input_grad = x.grad(&gradients).map(values).unwrap_or_default();
    let by_id = GradCollector::collect(layer, &gradients);
    let grads = roles
        .iter()
        .filter_map(|role| {
            by_id
                .get(&role.id)
                .map(|grad| (role.shard.global_name.clone(), grad.clone()))
        })
        .collect();
    Outcome {
        output: values(output),
        aux: scalar(stats.aux_loss),
        loads: stats.loads.read(),
        input_grad,
        grads,
    }
}

struct GradCollector<'a> {
    gradients: &'a Grads,
    grads: HashMap<ParamId, Vec<f32>>,
}

impl GradCollector<'_> {
    fn collect(layer: &MoeLayer<CpuAutodiff>, gradients: &Grads) -> HashMap<ParamId, Vec<f32>> {
        let mut collector = GradCollector {
            gradients,
            grads: HashMap::new(),
        };
        layer.visit(&mut collector);
        collector.grads
    }
}

impl ModuleVisitor<CpuAutodiff> for GradCollector<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<CpuAutodiff, D>>) {
        if let Some(grad) = param.val().grad(self.gradients) {
            self.grads.insert(param.id, values(grad));
        }
    }
}

/// The layer on `layout`'s thread ranks, each with its own tokens.
fn parallel_outcomes(model: &Model, layout: Layout) -> (Vec<Outcome>, Vec<Vec<ParamRole>>) {
    let hidden = model.hidden_size as usize;
    let logs = CallLogs::new(layout.world());
    let results = World::new(layout.world() as u32)
        .run(|rank| {
            let ctx = layout.context(&rank.recorded_world(&logs));
            let local = full_layer(model).shard_with(&ctx, layout.dispatcher)?;
            let roles = local.param_roles("moe", &ctx);
            let outcome = run_layer(&local, &roles, hidden, rank.rank() as usize);
            Ok::<_, crate::ModelError>((outcome, roles))
        })
        .expect("every rank runs");
    assert_one_call_order(&logs);
    results.into_iter().unzip()
}

/// One rank processing each rank's tokens separately.
fn reference_outcomes(model: &Model, ranks: usize) -> Vec<Outcome> {
    let hidden = model.hidden_size as usize;
    let layer = full_layer(model);
    let roles = layer.param_roles("moe", &ParallelContext::single());
    (0..ranks)
        .map(|rank| run_layer(&layer, &roles, hidden, rank))
        .collect()
}

fn assert_close(what: &str, actual: &[f32], expected: &[f32]) {
    assert_eq!(actual.len(), expected.len(), "{what}: lengths differ");
    for (index, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (a - e).abs() <= 1e-6 + 1e-5 * e.abs(),
            "{what}[{index}]: {a} vs {e}"
        );
    }
}

/// Every check of the module docs, for `model` on `layout`.
fn assert_matches_one_rank(model: &Model, layout: Layout) -> Vec<Outcome> {
    let (outcomes, roles) = parallel_outcomes(model, layout);
    let reference = reference_outcomes(model, layout.world());
    let mut expert_pieces = 0;
    for (rank, (outcome, roles)) in outcomes.iter().zip(&roles).enumerate() {
        let expected = &reference[rank];
        assert_close(
            &format!("rank {rank} output"),
            &outcome.output,
            &expected.output,
        );
        assert_close(
            &format!("rank {rank} aux loss"),
            &[outcome.aux],
            &[expected.aux],
        );
        assert_eq!(outcome.loads, expected.loads, "rank {rank} loads");
        assert_close(
            &format!("rank {rank} input grad"),
            &outcome.input_grad,
            &expected.input_grad,
        );
        for role in roles {
            let name = &role.shard.global_name;
            let global_len: usize = role.shard.global_shape.iter().product();
            // A parameter no token reached has no gradient: zero.
            let grad_of = |outcome: &Outcome| {
                outcome
                    .grads
                    .get(name)
                    .cloned()
                    .unwrap_or_else(|| vec![0.0; global_len])
            };
            let whole: Vec<f32> = if role.expert {
                expert_pieces += 1;
                let mut sum = vec![0.0f32; global_len];
                for other in &reference {
                    for (s, g) in sum.iter_mut().zip(grad_of(other)) {
                        *s += g;
                    }
                }
                sum
            } else {
                grad_of(expected)
            };
            let global = TensorData::new(whole, role.shard.global_shape.clone());
            let piece: Vec<f32> = role
                .shard
                .slice_of(&global)
                .expect("the spec cuts its global tensor")
                .iter::<f32>()
                .collect();
            let local = outcome
                .grads
                .get(name)
                .cloned()
                .unwrap_or_else(|| vec![0.0; piece.len()]);
            assert_close(&format!("rank {rank} grad of {name}"), &local, &piece);
        }
    }
    assert!(expert_pieces > 0, "no expert gradient was compared");
    outcomes
}

/// Weights large enough (std 0.3) that outputs and gradients are O(0.1–1), so the tolerance
/// means something.
fn moe_with(moe: Moe) -> Model {
    Model {
        moe: Some(moe),
        init_method_std: 0.3,
        ..moe_model()
    }
}

fn layout(ep: usize, etp: usize, dispatcher: TokenDispatcher) -> Layout {
    Layout {
        ep,
        etp,
        dispatcher,
    }
}

/// SwiGLU experts, a shared expert, Switch balancing and a z-loss.
fn swiglu_moe() -> Model {
    moe_with(Moe {
        z_loss_coeff: Some(1e-3),
        ..moe_section()
    })
}

/// GELU experts with biases (fc2's bias must be added once across etp pieces).
fn gelu_moe_with_biases() -> Model {
    Model {
        activation: Activation::Gelu,
        add_bias_linear: true,
        ..moe_with(Moe {
            shared_expert_ffn_hidden_size: None,
            ..moe_section()
        })
    }
}

#[test]
fn ep2_all_to_all_matches_one_rank() {
    assert_matches_one_rank(&swiglu_moe(), layout(2, 1, TokenDispatcher::Alltoall));
}

#[test]
fn ep2_all_gather_matches_one_rank() {
    assert_matches_one_rank(&swiglu_moe(), layout(2, 1, TokenDispatcher::Allgather));
}

#[test]
fn ep2_etp2_all_to_all_matches_one_rank() {
    assert_matches_one_rank(&swiglu_moe(), layout(2, 2, TokenDispatcher::Alltoall));
    assert_matches_one_rank(
        &gelu_moe_with_biases(),
        layout(2, 2, TokenDispatcher::Alltoall),
    );
}

#[test]
fn ep2_etp2_all_gather_matches_one_rank() {
    assert_matches_one_rank(
        &gelu_moe_with_biases(),
        layout(2, 2, TokenDispatcher::Allgather),
    );
}

#[test]
fn ep4_matches_one_rank_with_sequence_balancing() {
    let model = moe_with(Moe {
        load_balancing: LoadBalancing::SeqAuxLoss,
        ..moe_section()
    });
    assert_matches_one_rank(&model, layout(4, 1, TokenDispatcher::Alltoall));
}

#[test]
fn ep2_capacity_drops_exactly_the_tokens_one_rank_drops() {
    for policy in [TokenDropPolicy::Probs, TokenDropPolicy::Position] {
        let model = moe_with(Moe {
            capacity_factor: Some(0.5),
            token_drop_policy: policy,
            ..moe_section()
        });
        let outcomes = assert_matches_one_rank(&model, layout(2, 1, TokenDispatcher::Alltoall));
        for outcome in &outcomes {
            // capacity = ceil(8·2 / 4 · 0.5) = 2 of 16 slots per expert: most are dropped.
            let kept: u64 = outcome.loads.iter().sum();
            assert!(
                kept < (BATCH * SEQ * 2) as u64,
                "{policy:?}: {:?}",
                outcome.loads
            );
            assert!(
                outcome.loads.iter().all(|&load| load <= 2),
                "{:?}",
                outcome.loads
            );
        }
    }
}

#[test]
fn a_rank_whose_experts_get_no_tokens_still_joins_every_exchange() {
    // A selection bias sends every token to experts 0 and 1 (both on ep rank 0): ep rank 1
    // receives no rows and returns none, yet every exchange and its backward line up.
    let model = moe_with(Moe {
        score_function: ScoreFunction::Sigmoid,
        expert_bias: true,
        load_balancing: LoadBalancing::None,
        ..moe_section()
    });
    let logs = CallLogs::new(2);
    let outcomes = World::new(2)
        .run(|rank| {
            let ctx = layout(2, 1, TokenDispatcher::Alltoall).context(&rank.recorded_world(&logs));
            let mut local = full_layer(&model).shard(&ctx)?;
            let device = Default::default();
            local.expert_bias = Some(
                Param::initialized(
                    ParamId::new(),
                    Tensor::from_floats([10.0, 10.0, 0.0, 0.0], &device),
                )
                .set_require_grad(false),
            );
            Ok::<_, crate::ModelError>(run_layer(&local, &[], 16, rank.rank() as usize))
        })
        .expect("every rank runs");
    assert_one_call_order(&logs);
    for outcome in &outcomes {
        // Each of the 8 tokens picks experts 0 and 1.
        assert_eq!(outcome.loads, vec![8, 8, 0, 0]);
        assert!(outcome.output.iter().all(|v| v.is_finite()));
        assert!(outcome.input_grad.iter().any(|&v| v != 0.0));
    }
}

// ---------------------------------------------------------------------------------------------
// One microbatch split over tensor- (with or without sequence parallelism) and context-parallel
// ranks, which are also the expert-parallel ranks. Routing, capacity and balancing losses are
// functions of the whole microbatch, so they must equal one rank's on the whole microbatch.
//
// Each rank's loss is `cp · Σ local output · probe + aux`, the form the runtime's cp averaging
// expects (aux already carries the cp factor in its gradient). One-rank gradients are then
// recovered the way the runtime reduces them: tp_partial parameters summed over tp, dense
// parameters averaged over cp, expert parameters divided by dp_cp (= cp here; edp = 1).

const SPLIT_SEQ: usize = 8;

#[derive(Debug, Clone, Copy)]
struct SplitLayout {
    tp: usize,
    sequence_parallel: bool,
    cp: usize,
    ep: usize,
    etp: usize,
    dispatcher: TokenDispatcher,
}

impl SplitLayout {
    fn world(&self) -> usize {
        self.tp * self.cp
    }

    fn coordinates(&self, rank: usize) -> (usize, usize) {
        (rank % self.tp, rank / self.tp)
    }

    fn context<W: WorldComm>(&self, world: &W) -> ParallelContext {
        let me = world.global_rank() as usize;
        let (tp_index, cp_index) = self.coordinates(me);
        let (etp_index, ep_index) = (me % self.etp, me / self.etp);
        let members = |count: usize, rank_of: &dyn Fn(usize) -> usize| -> Vec<u32> {
            (0..count).map(|i| rank_of(i) as u32).collect()
        };
        let group = |name: &str, members: Vec<u32>| -> Comm {
            Arc::new(world.new_group(name, &members).expect("thread groups form"))
        };
        ParallelContext {
            tp: group("tp", members(self.tp, &|t| t + self.tp * cp_index)),
            cp: group("cp", members(self.cp, &|c| tp_index + self.tp * c)),
            etp: group("etp", members(self.etp, &|e| e + self.etp * ep_index)),
            ep: group("ep", members(self.ep, &|e| etp_index + self.etp * e)),
            sequence_parallel: self.sequence_parallel,
            ..ParallelContext::single()
        }
    }

    /// Global sequence positions rank `rank` holds, in local order.
    fn positions(&self, rank: usize) -> Vec<usize> {
        let (tp_index, cp_index) = self.coordinates(rank);
        let cp_positions = crate::context_parallel_positions(SPLIT_SEQ, cp_index, self.cp)
            .expect("the test sequence splits");
        if self.sequence_parallel {
            let chunk = cp_positions.len() / self.tp;
            cp_positions[tp_index * chunk..(tp_index + 1) * chunk].to_vec()
        } else {
            cp_positions
        }
    }
}

/// `[BATCH, SPLIT_SEQ, hidden]` values at `positions` along the sequence, scaled.
fn at_positions(full: &[f32], hidden: usize, positions: &[usize], scale: f32) -> Vec<f32> {
    (0..BATCH)
        .flat_map(|b| {
            positions.iter().flat_map(move |&p| {
                let start = (b * SPLIT_SEQ + p) * hidden;
                full[start..start + hidden].iter().map(move |v| v * scale)
            })
        })
        .collect()
}

fn run_split(
    layer: &MoeLayer<CpuAutodiff>,
    roles: &[ParamRole],
    x: Vec<f32>,
    probe: Vec<f32>,
    shape: [usize; 3],
) -> Outcome {
    let device = Default::default();
    let x = Tensor::<CpuAutodiff, 3>::from_data(TensorData::new(x, shape), &device).require_grad();
    let probe = Tensor::<CpuAutodiff, 3>::from_data(TensorData::new(probe, shape), &device);
    let (output, stats) = layer.forward(x.clone());
    let loss = (output.clone() * probe).sum() + stats.aux_loss.clone();
    let gradients = loss.backward();
    let by_id = GradCollector::collect(layer, &gradients);
    Outcome {
        output: values(output),
        aux: scalar(stats.aux_loss),
        loads: stats.loads.read(),
        input_grad: x.grad(&gradients).map(values).unwrap_or_default(),
        grads: roles
            .iter()
            .filter_map(|role| {
                by_id
                    .get(&role.id)
                    .map(|grad| (role.shard.global_name.clone(), grad.clone()))
            })
            .collect(),
    }
}

fn microbatch(hidden: usize) -> (Vec<f32>, Vec<f32>) {
    let n = BATCH * SPLIT_SEQ * hidden;
    (noise(n, 101, 1.5), noise(n, 202, 1.0))
}

fn assert_split_matches_one_rank(model: &Model, layout: SplitLayout) {
    let hidden = model.hidden_size as usize;
    let (x, probe) = microbatch(hidden);
    let cp = layout.cp as f32;
    let logs = CallLogs::new(layout.world());
    let results = World::new(layout.world() as u32)
        .run(|rank| {
            let ctx = layout.context(&rank.recorded_world(&logs));
            let local = full_layer(model).shard_with(&ctx, layout.dispatcher)?;
            let roles = local.param_roles("moe", &ctx);
            let positions = layout.positions(rank.rank() as usize);
            let outcome = run_split(
                &local,
                &roles,
                at_positions(&x, hidden, &positions, 1.0),
                at_positions(&probe, hidden, &positions, cp),
                [BATCH, positions.len(), hidden],
            );
            Ok::<_, crate::ModelError>((outcome, roles))
        })
        .expect("every rank runs");
    assert_one_call_order(&logs);
    let layer = full_layer(model);
    let reference_roles = layer.param_roles("moe", &ParallelContext::single());
    let reference = run_split(
        &layer,
        &reference_roles,
        x.clone(),
        probe.clone(),
        [BATCH, SPLIT_SEQ, hidden],
    );
    assert!(
        reference.loads.iter().sum::<u64>() > 0,
        "the microbatch routes some tokens"
    );

    let local_grad = |rank: usize, role: &ParamRole| -> Vec<f32> {
        let len = role
            .shard
            .local_shape()
            .expect("valid spec")
            .iter()
            .product();
        results[rank]
            .0
            .grads
            .get(&role.shard.global_name)
            .cloned()
            .unwrap_or_else(|| vec![0.0; len])
    };
    for (rank, (outcome, roles)) in results.iter().enumerate() {
        let positions = layout.positions(rank);
        let (tp_index, _) = layout.coordinates(rank);
        assert_close(
            &format!("rank {rank} output"),
            &outcome.output,
            &at_positions(&reference.output, hidden, &positions, 1.0),
        );
        assert_close(
            &format!("rank {rank} aux"),
            &[outcome.aux],
            &[reference.aux],
        );
        assert_eq!(outcome.loads, reference.loads, "rank {rank} loads");
        assert_close(
            &format!("rank {rank} input grad"),
            &outcome.input_grad,
            &at_positions(&reference.input_grad, hidden, &positions, cp),
        );
        for (index, role) in roles.iter().enumerate() {
            let name = &role.shard.global_name;
            // The ranks of cp index `c` whose grads the runtime sums into this one.
            let peers_over_tp = |c: usize| -> Vec<usize> {
                if role.tp_partial {
                    (0..layout.tp).map(|t| t + layout.tp * c).collect()
                } else {
                    vec![tp_index + layout.tp * c]
                }
            };
            let mut reduced = vec![0.0f32; local_grad(rank, role).len()];
            let contributors: Vec<usize> = if role.expert {
                vec![rank]
            } else {
                (0..layout.cp).flat_map(peers_over_tp).collect()
            };
            for peer in contributors {
                let peer_role = &results[peer].1[index];
                assert_eq!(peer_role.shard.global_name, *name, "ranks list roles alike");
                for (r, g) in reduced.iter_mut().zip(local_grad(peer, peer_role)) {
                    *r += g / cp;
                }
            }
            let global_len: usize = role.shard.global_shape.iter().product();
            let whole = reference
                .grads
                .get(name)
                .cloned()
                .unwrap_or_else(|| vec![0.0; global_len]);
            let piece: Vec<f32> = role
                .shard
                .slice_of(&TensorData::new(whole, role.shard.global_shape.clone()))
                .expect("the spec cuts its global tensor")
                .iter::<f32>()
                .collect();
            assert_close(&format!("rank {rank} grad of {name}"), &reduced, &piece);
        }
    }
}

fn dropping_moe(policy: TokenDropPolicy, balancing: LoadBalancing) -> Model {
    moe_with(Moe {
        capacity_factor: Some(0.5),
        token_drop_policy: policy,
        load_balancing: balancing,
        z_loss_coeff: Some(1e-3),
        ..moe_section()
    })
}

fn split(tp: usize, sequence_parallel: bool, cp: usize, ep: usize, etp: usize) -> SplitLayout {
    SplitLayout {
        tp,
        sequence_parallel,
        cp,
        ep,
        etp,
        dispatcher: TokenDispatcher::Alltoall,
    }
}

#[test]
fn tp2_sequence_parallel_ep2_routes_the_whole_microbatch() {
    let model = dropping_moe(TokenDropPolicy::Position, LoadBalancing::SeqAuxLoss);
    assert_split_matches_one_rank(&model, split(2, true, 1, 2, 1));
}

#[test]
fn tp2_without_sequence_parallel_splits_tokens_inside_the_layer() {
    let model = dropping_moe(TokenDropPolicy::Probs, LoadBalancing::AuxLoss);
    let layout = SplitLayout {
        dispatcher: TokenDispatcher::Allgather,
        ..split(2, false, 1, 2, 1)
    };
    assert_split_matches_one_rank(&model, layout);
}

#[test]
fn cp2_ep2_routes_in_one_rank_token_order() {
    let model = dropping_moe(TokenDropPolicy::Position, LoadBalancing::SeqAuxLoss);
    assert_split_matches_one_rank(&model, split(1, false, 2, 2, 1));
}

#[test]
fn tp2_sp_cp2_ep2_etp2_matches_one_rank() {
    assert_split_matches_one_rank(&gelu_moe_with_biases(), split(2, true, 2, 2, 2));
}

#[test]
fn roles_name_global_experts_and_cut_swiglu_halves_over_etp() {
    let model = swiglu_moe();
    let layout = layout(2, 2, TokenDispatcher::Alltoall);
    let roles = World::new(4)
        .run(|rank| {
            let ctx = layout.context(rank.world());
            let local = full_layer(&model).shard(&ctx)?;
            Ok::<_, crate::ModelError>(local.param_roles("moe", &ctx))
        })
        .expect("every rank runs");
    // Rank 3: etp index 1, ep index 1 → experts 2 and 3, second piece of each.
    let names: Vec<&str> = roles[3]
        .iter()
        .map(|role| role.shard.global_name.as_str())
        .collect();
    assert!(names.contains(&"moe.router.weight"), "{names:?}");
    assert!(names.contains(&"moe.experts.2.fc1.weight"), "{names:?}");
    assert!(names.contains(&"moe.experts.3.fc2.weight"), "{names:?}");
    assert!(!names.iter().any(|name| name.starts_with("moe.experts.0")));
    let fc1 = roles[3]
        .iter()
        .find(|role| role.shard.global_name == "moe.experts.3.fc1.weight")
        .expect("expert 3's fc1");
    assert!(fc1.expert && !fc1.tp_partial);
    // [hidden 16, 2 · ffn 8]: SwiGLU's gate and linear halves each cut in two.
    assert_eq!(fc1.shard.global_shape, vec![16, 16]);
    assert_eq!(
        fc1.shard.splits,
        vec![ferrotron_parallel::Split::fused(1, 2, 1, 2)]
    );
    let router = roles[3]
        .iter()
        .find(|role| role.shard.global_name == "moe.router.weight")
        .expect("the router");
    assert!(!router.expert && router.shard.splits.is_empty());
}

#[test]
fn layouts_that_cannot_split_the_experts_are_refused() {
    let model = swiglu_moe();
    let errors = World::new(3)
        .run(|rank| {
            let ctx = layout(3, 1, TokenDispatcher::Alltoall).context(rank.world());
            Ok::<_, crate::ModelError>(full_layer(&model).shard(&ctx).err())
        })
        .expect("every rank runs");
    let message = errors[0]
        .as_ref()
        .expect("4 experts over 3 ranks")
        .to_string();
    assert!(
        message.contains("4 experts cannot be split over 3"),
        "{message}"
    );

    let errors = World::new(3)
        .run(|rank| {
            let ctx = layout(1, 3, TokenDispatcher::Alltoall).context(rank.world());
            Ok::<_, crate::ModelError>(full_layer(&model).shard(&ctx).err())
        })
        .expect("every rank runs");
    let message = errors[0].as_ref().expect("ffn 8 over 3 ranks").to_string();
    assert!(message.contains("8 hidden units"), "{message}");
}

#[test]
fn a_layer_cut_for_one_rank_matches_the_full_layer() {
    assert_matches_one_rank(&swiglu_moe(), layout(1, 1, TokenDispatcher::Alltoall));
    assert_matches_one_rank(&swiglu_moe(), layout(1, 1, TokenDispatcher::Allgather));
}

// ---------------------------------------------------------------------------------------------
// The whole model (dense layers replicated, MoE layers expert-parallel) on ep2 × etp2: each rank
// trains on its own batch, as data-parallel ranks of the dense part.

fn model_batch(rank: usize) -> (Vec<u32>, Vec<u32>) {
    let stream: Vec<u32> = noise(BATCH * (SEQ_MODEL + 1), 7 + rank as u64, 1.0)
        .into_iter()
        .map(|v| ((v + 1.0) * 49.9) as u32)
        .collect();
    let rows: Vec<&[u32]> = stream.chunks(SEQ_MODEL + 1).collect();
    (
        rows.iter()
            .flat_map(|row| row[..SEQ_MODEL].to_vec())
            .collect(),
        rows.iter().flat_map(|row| row[1..].to_vec()).collect(),
    )
}

const SEQ_MODEL: usize = 8;

fn token_tensor(ids: &[u32]) -> Tensor<CpuAutodiff, 2, burn::tensor::Int> {
    let rows: Vec<&[u32]> = ids.chunks(SEQ_MODEL).collect();
    tokens(&rows)
}

/// `(loss, grads by global name)` of `model` on rank `rank`'s batch.
fn model_step(
    model: &crate::GptModel<CpuAutodiff>,
    rank: usize,
) -> (f32, HashMap<String, Vec<f32>>) {
    let (inputs, labels) = model_batch(rank);
    let output = model.loss(token_tensor(&inputs), token_tensor(&labels));
    let loss = scalar(output.loss.clone());
    let gradients = output.loss.backward();
    let mut collector = GradCollector {
        gradients: &gradients,
        grads: HashMap::new(),
    };
    model.visit(&mut collector);
    let grads = model
        .param_roles()
        .into_iter()
        .filter_map(|role| {
            collector
                .grads
                .get(&role.id)
                .map(|grad| (role.shard.global_name.clone(), grad.clone()))
        })
        .collect();
    (loss, grads)
}

#[test]
fn whole_model_on_ep2_etp2_matches_one_rank_per_rank_batch() {
    let mut model = Model {
        seq_length: SEQ_MODEL as u32,
        ..swiglu_moe()
    };
    if let Some(moe) = &mut model.moe {
        moe.layer_freq = ferrotron_recipe::LayerFreq::Every(1);
    }
    let full = || {
        let _guard = INIT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        build::<CpuAutodiff>(&model, SEED)
    };
    let layout = layout(2, 2, TokenDispatcher::Alltoall);
    let logs = CallLogs::new(4);
    let results = World::new(4)
        .run(|rank| {
            let ctx = layout.context(&rank.recorded_world(&logs));
            let config = config(&model);
            let local = crate::GptModel::shard(&full(), &ctx, &crate::ChunkSpec::whole(&config))?;
            let (loss, grads) = model_step(&local, rank.rank() as usize);
            Ok::<_, crate::ModelError>((loss, grads, local.param_roles()))
        })
        .expect("every rank runs");
    assert_one_call_order(&logs);
    let one_rank = full();
    let reference: Vec<(f32, HashMap<String, Vec<f32>>)> =
        (0..4).map(|rank| model_step(&one_rank, rank)).collect();
    let mut compared_experts = 0;
    for (rank, (loss, grads, roles)) in results.iter().enumerate() {
        assert_close(&format!("rank {rank} loss"), &[*loss], &[reference[rank].0]);
        for role in roles {
            let name = &role.shard.global_name;
            let global_len: usize = role.shard.global_shape.iter().product();
            let grad_of = |grads: &HashMap<String, Vec<f32>>| {
                grads
                    .get(name)
                    .cloned()
                    .unwrap_or_else(|| vec![0.0; global_len])
            };
            let whole = if role.expert {
                compared_experts += 1;
                reference
                    .iter()
                    .fold(vec![0.0f32; global_len], |mut sum, (_, grads)| {
                        for (s, g) in sum.iter_mut().zip(grad_of(grads)) {
                            *s += g;
                        }
                        sum
                    })
            } else {
                grad_of(&reference[rank].1)
            };
            let piece: Vec<f32> = role
                .shard
                .slice_of(&TensorData::new(whole, role.shard.global_shape.clone()))
                .expect("the spec cuts its global tensor")
                .iter::<f32>()
                .collect();
            let local = grads
                .get(name)
                .cloned()
                .unwrap_or_else(|| vec![0.0; piece.len()]);
            assert_close(&format!("rank {rank} grad of {name}"), &local, &piece);
        }
    }
    assert!(compared_experts > 0);
}
