//! Equivalence of the split model with the one-rank model, on thread ranks.
//!
//! Every layout must compute the one-rank arithmetic, split up: the loss of each rank equals the
//! one-rank loss, and every local gradient, after the reductions its `ParamRole` asks the runtime
//! for (tp-partial sums over tp, the average over cp that the data-parallel reduction performs),
//! equals its `ShardSpec` slice of the one-rank gradient. Float sums happen in a different order
//! (split matmuls, all-reduces), so values agree to float tolerance, not bit for bit.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use ferrotron_dist::{CallLogs, Communicator, Recording, ThreadComm, World};
use ferrotron_parallel::{ParallelContext, ParamRole, ReduceOp, ShardSpec, with_process_rng};

use super::*;
use crate::{ChunkInput, ChunkOutput, ChunkSpec, ModelError, split_for_context_parallel};

type Train = CpuAutodiff;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

const SEED: u64 = 17;
const BATCH: usize = 2;
const SEQ: usize = 16;

/// Absolute and relative tolerance for f32 results computed in a different summation order.
/// Measured: the largest gradient difference over every layout below is 9e-8 (on values up to
/// 0.44), so these leave a margin of about 10×; a wrong reduction or mask is off by 1e-3 or more.
const ATOL: f32 = 1e-6;
const RTOL: f32 = 1e-4;

pub(super) fn small(model: Model) -> Model {
    Model {
        hidden_size: 32,
        ffn_hidden_size: Some(64),
        seq_length: SEQ as u32,
        ..model
    }
}

/// Learned positions, LayerNorm, GELU, biases, tied embeddings, 4 heads.
fn gpt2_small() -> Model {
    small(gpt2_model())
}

/// RoPE, RMSNorm, SwiGLU, 4 heads in 2 query groups, untied, no biases.
pub(super) fn llama_small() -> Model {
    small(llama_model())
}

fn init(model: &Model) -> GptModel<Train> {
    // Flex's RNG is process-global: ranks build their full models one at a time after seeding,
    // under the lock the dropout marks of other ranks' forwards take too.
    with_process_rng(|| build::<Train>(model, SEED)).map(&mut Shifted)
}

/// Norm weights start at one and biases at zero, where a bias added on every tp rank, a norm
/// weight of the wrong head or a bias of the wrong shard would not show: every 1-D parameter is
/// shifted by a fixed pattern (no RNG, so every rank's full model gets the same values).
struct Shifted;

impl<B: Backend> ModuleMapper<B> for Shifted {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if D != 1 {
            return param;
        }
        param.map(|value| {
            let trained = value.is_require_grad();
            let shape = value.shape();
            let pattern: Vec<f32> = (0..shape.num_elements())
                .map(|i| 0.2 * (0.7 * i as f32 + 0.3).sin())
                .collect();
            let pattern =
                Tensor::<B, D>::from_data(TensorData::new(pattern, shape), &value.device());
            let device = value.device();
            let shifted = Tensor::from_data((value.detach() + pattern).into_data(), &device);
            if trained {
                shifted.require_grad()
            } else {
                shifted
            }
        })
    }
}

/// A fixed batch: `[BATCH, SEQ]` tokens and their next-token labels, all below the vocabulary.
fn batch() -> (Tensor<Train, 2, Int>, Tensor<Train, 2, Int>) {
    let mut state = 12345u64;
    let stream: Vec<u32> = (0..BATCH * (SEQ + 1))
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % 100) as u32
        })
        .collect();
    let rows: Vec<&[u32]> = stream.chunks(SEQ + 1).collect();
    let inputs: Vec<&[u32]> = rows.iter().map(|row| &row[..SEQ]).collect();
    let targets: Vec<&[u32]> = rows.iter().map(|row| &row[1..]).collect();
    (tokens(&inputs), tokens(&targets))
}

/// Every parameter's gradient, by id.
fn gradients<B: AutodiffBackend, M: Module<B>>(
    module: &M,
    grads: &B::Gradients,
) -> HashMap<ParamId, Vec<f32>> {
    struct Collect<'a, B: AutodiffBackend> {
        grads: &'a B::Gradients,
        found: HashMap<ParamId, Vec<f32>>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(grad) = param.val().grad(self.grads) {
                self.found.insert(param.id, values(grad));
            }
        }
    }
    let mut collect = Collect {
        grads,
        found: HashMap::new(),
    };
    module.visit(&mut collect);
    collect.found
}

/// Every parameter's value, by id.
fn parameters<B: Backend, M: Module<B>>(module: &M) -> HashMap<ParamId, Vec<f32>> {
    struct Collect {
        found: HashMap<ParamId, Vec<f32>>,
    }
    impl<B: Backend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.found.insert(param.id, values(param.val()));
        }
    }
    let mut collect = Collect {
        found: HashMap::new(),
    };
    module.visit(&mut collect);
    collect.found
}

/// One-rank loss, gradients and values by global name.
struct Reference {
    loss: f32,
    grads: HashMap<String, Vec<f32>>,
    values: HashMap<String, Vec<f32>>,
}

fn reference(model: &Model) -> Reference {
    let full = init(model);
    let (inputs, targets) = batch();
    let loss = full.loss(inputs, targets).loss;
    let value = scalar(loss.clone());
    let grads = gradients(&full, &loss.backward());
    let values = parameters(&full);
    let mut by_name = HashMap::new();
    let mut values_by_name = HashMap::new();
    for role in full.param_roles() {
        assert!(!role.shard.is_split(), "one rank holds whole tensors");
        by_name.insert(role.shard.global_name.clone(), grads[&role.id].clone());
        values_by_name.insert(role.shard.global_name, values[&role.id].clone());
    }
    Reference {
        loss: value,
        grads: by_name,
        values: values_by_name,
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    pub(super) tp: usize,
    pub(super) cp: usize,
    pub(super) sequence_parallel: bool,
}

/// Megatron's rank order (tp fastest, then cp): this rank's tp and cp groups over `world`.
fn context<W>(world: &W, layout: Layout) -> Result<ParallelContext, BoxError>
where
    W: Communicator + Sync + std::fmt::Debug + 'static,
{
    let global = world.global_rank() as usize;
    let (tp_rank, cp_rank) = (global % layout.tp, global / layout.tp);
    let tp_members: Vec<u32> = (0..layout.tp)
        .map(|i| (cp_rank * layout.tp + i) as u32)
        .collect();
    let cp_members: Vec<u32> = (0..layout.cp)
        .map(|j| (j * layout.tp + tp_rank) as u32)
        .collect();
    let everyone: Vec<u32> = (0..(layout.tp * layout.cp) as u32).collect();
    let tp = Arc::new(world.new_group("tp", &tp_members)?);
    let cp = Arc::new(world.new_group("cp", &cp_members)?);
    Ok(ParallelContext {
        // Megatron's expert groups with ep = etp = 1: every rank holds the same experts and
        // routes its own part of the microbatch, so all are expert-data-parallel peers.
        edp: Arc::new(world.new_group("edp", &everyone)?),
        tp,
        cp: cp.clone(),
        dp_cp: cp,
        sequence_parallel: layout.sequence_parallel,
        ..ParallelContext::single()
    })
}

/// What one rank reports: its loss (averaged over cp) and, per local parameter, its shard spec,
/// its reduced gradient and its value. Each cp rank's loss is the mean over its tokens, so the
/// one-rank gradient is the sum over ranks holding other tokens divided by cp: over tp for
/// tp-partial parameters, over cp (dp_cp) for dense ones, over edp for experts.
struct RankResult {
    loss: f32,
    shards: Vec<(ShardSpec, Vec<f32>, Vec<f32>)>,
}

/// `count` pipeline chunks of equal length over the model's layers, first to last.
fn pipeline_chunks(config: &ModelConfig, count: usize) -> Vec<ChunkSpec> {
    let layers = config.num_layers;
    (0..count)
        .map(|i| ChunkSpec {
            layers: i * layers / count..(i + 1) * layers / count,
            pre_process: i == 0,
            post_process: i + 1 == count,
        })
        .collect()
}

/// One rank of `layout`, running `stages` pipeline chunks back to back on its thread.
fn run_rank(
    model: &Model,
    layout: Layout,
    stages: usize,
    world: &Recording<ThreadComm>,
) -> Result<RankResult, BoxError> {
    let ctx = context(world, layout)?;
    let config = config(model);
    let device = Default::default();
    let full = with_process_rng(|| {
        <Train as Backend>::seed(&device, SEED);
        config.init::<Train>(&device)
    })
    .map(&mut Shifted);
    let chunks = pipeline_chunks(&config, stages)
        .iter()
        .map(|chunk| GptModel::shard(&full, &ctx, chunk))
        .collect::<Result<Vec<_>, _>>()?;
    let (inputs, targets) = batch();
    let (inputs, targets) =
        split_for_context_parallel(inputs, targets, ctx.cp_rank(), ctx.cp_size())?;
    let mut input = ChunkInput::tokens(inputs);
    let mut loss = None;
    for chunk in &chunks {
        if chunk.chunk().post_process {
            input = input.with_labels(targets.clone(), None);
        }
        match chunk.forward_chunk(input.clone())? {
            ChunkOutput::Hidden { hidden, .. } => {
                assert_eq!(hidden.dims(), chunk.boundary_shape(BATCH));
                input = ChunkInput::hidden(hidden);
            }
            ChunkOutput::Loss(output) => loss = Some(output.loss),
        }
    }
    let loss = loss.ok_or("the last chunk computes the loss")?;
    let mut loss_value = [scalar(loss.clone())];
    ctx.cp.all_reduce_f32(&mut loss_value, ReduceOp::Sum)?;
    let grads = loss.backward();
    // The tied embedding's copies (first and last stage) are summed, as the embedding group does.
    let mut local: Vec<(ParamRole, Vec<f32>, Vec<f32>)> = Vec::new();
    for chunk in &chunks {
        let chunk_grads = gradients(chunk, &grads);
        let values = parameters(chunk);
        for role in chunk.param_roles() {
            let grad = chunk_grads[&role.id].clone();
            let value = values[&role.id].clone();
            match local
                .iter_mut()
                .find(|(seen, _, _)| seen.shard.global_name == role.shard.global_name)
            {
                Some((seen, sum, seen_value)) => {
                    assert!(seen.tied_embedding && role.tied_embedding, "{role:?}");
                    assert_eq!(seen_value, &value, "tied copies start equal");
                    sum.iter_mut().zip(&grad).for_each(|(s, g)| *s += g);
                }
                None => local.push((role, grad, value)),
            }
        }
    }
    let cp = ctx.cp_size() as f32;
    let mut shards = Vec::new();
    for (role, mut grad, value) in local {
        if role.tp_partial {
            ctx.tp.all_reduce_f32(&mut grad, ReduceOp::Sum)?;
        }
        if role.expert {
            ctx.edp.all_reduce_f32(&mut grad, ReduceOp::Sum)?;
        } else {
            ctx.dp_cp.all_reduce_f32(&mut grad, ReduceOp::Sum)?;
        }
        grad.iter_mut().for_each(|g| *g /= cp);
        shards.push((role.shard, grad, value));
    }
    Ok(RankResult {
        loss: loss_value[0] / cp,
        shards,
    })
}

fn assert_close(what: &str, actual: &[f32], expected: &[f32]) {
    assert_eq!(actual.len(), expected.len(), "{what}: lengths differ");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (a - e).abs() <= ATOL + RTOL * e.abs(),
            "{what}[{i}]: {a} vs one rank {e}"
        );
    }
}

/// Runs `layout` on `tp·cp` thread ranks and compares with the one-rank model.
pub(super) fn assert_equivalent(model: &Model, layout: Layout) {
    assert_equivalent_in_stages(model, layout, 1);
}

/// As [`assert_equivalent`], each rank running the model as `stages` pipeline chunks.
pub(super) fn assert_equivalent_in_stages(model: &Model, layout: Layout, stages: usize) {
    let expected = reference(model);
    let logs = CallLogs::new(layout.tp * layout.cp);
    let ranks = World::new((layout.tp * layout.cp) as u32)
        .run(|rank| run_rank(model, layout, stages, &rank.recorded_world(&logs)))
        .expect("every rank runs");
    assert_one_call_order(&logs);
    let mut covered = HashSet::new();
    for (rank, result) in ranks.iter().enumerate() {
        assert!(
            (result.loss - expected.loss).abs() <= ATOL + RTOL * expected.loss.abs(),
            "rank {rank} loss {} vs one rank {}",
            result.loss,
            expected.loss
        );
        for (spec, grad, value) in &result.shards {
            let name = &spec.global_name;
            let full_grad = &expected.grads[name];
            let full_value = &expected.values[name];
            let want_value = spec.slice_of_f32(full_value).expect("spec fits");
            assert_eq!(
                value, &want_value,
                "rank {rank} {name}: value is not its slice"
            );
            let want_grad = spec.slice_of_f32(full_grad).expect("spec fits");
            assert_close(&format!("rank {rank} grad {name}"), grad, &want_grad);
            covered.insert(name.clone());
        }
    }
    let all: HashSet<String> = expected.grads.keys().cloned().collect();
    assert_eq!(covered, all, "the shards cover every one-rank parameter");
}

pub(super) const TP2: Layout = Layout {
    tp: 2,
    cp: 1,
    sequence_parallel: false,
};
pub(super) const TP2_SP: Layout = Layout {
    sequence_parallel: true,
    ..TP2
};
pub(super) const CP2: Layout = Layout {
    tp: 1,
    cp: 2,
    sequence_parallel: false,
};
pub(super) const TP2_CP2_SP: Layout = Layout {
    tp: 2,
    cp: 2,
    sequence_parallel: true,
};

#[test]
fn tp2_matches_one_rank_gpt2() {
    assert_equivalent(&gpt2_small(), TP2);
}

#[test]
fn tp2_matches_one_rank_llama() {
    assert_equivalent(&llama_small(), TP2);
}

#[test]
fn tp2_with_sequence_parallelism_matches_one_rank_gpt2() {
    assert_equivalent(&gpt2_small(), TP2_SP);
}

#[test]
fn tp2_with_sequence_parallelism_matches_one_rank_llama() {
    assert_equivalent(&llama_small(), TP2_SP);
}

/// An MoE model (dropless, shared expert, aux loss): experts are not split (ep 1), the dense
/// parts and the shared expert are, and each rank routes its own tokens.
#[test]
fn tp2_and_cp2_match_one_rank_moe() {
    for layout in [TP2, TP2_SP, CP2, TP2_CP2_SP] {
        assert_equivalent(&small(moe_model()), layout);
    }
}

#[test]
fn cp2_matches_one_rank_gpt2() {
    assert_equivalent(&gpt2_small(), CP2);
}

#[test]
fn cp2_matches_one_rank_llama() {
    assert_equivalent(&llama_small(), CP2);
    // The decomposed attention path (live attention dropout, here too small to ever drop)
    // masks by global positions as well.
    let mut model = llama_small();
    model.attention_dropout = 1e-9;
    assert_equivalent(&model, CP2);
}

/// Inference on the plain backend (burn's fused attention op with an explicit mask): each cp
/// rank's logits are the one-rank logits at its tokens' positions.
#[test]
fn cp2_inference_logits_are_the_one_rank_logits_at_global_positions() {
    assert_cp2_inference_matches(&llama_small());
}

/// Each cp2 rank's logits (plain backend) are `model`'s one-rank logits at its positions.
pub(super) fn assert_cp2_inference_matches(model: &Model) {
    let config = config(model);
    let (inputs, _) = batch();
    let inputs = Tensor::<Cpu, 2, Int>::from_data(inputs.into_data(), &Default::default());
    let full = with_process_rng(|| build::<Cpu>(model, SEED));
    let expected = full.forward(inputs.clone()).logits;
    let vocab = config.padded_vocab_size;
    let logs = CallLogs::new(2);
    let ranks = World::new(2)
        .run(|rank| -> Result<(Vec<f32>, Vec<f32>), BoxError> {
            let ctx = context(&rank.recorded_world(&logs), CP2)?;
            let gpt = GptModel::shard(&full, &ctx, &ChunkSpec::whole(&config))?;
            let local = crate::context_parallel_slice(inputs.clone(), ctx.cp_rank(), 2)?;
            let positions = crate::context_parallel_positions(SEQ, ctx.cp_rank(), 2)?;
            let ids: Vec<i64> = positions.iter().map(|&p| p as i64).collect();
            let at = Tensor::<Cpu, 1, Int>::from_data(
                TensorData::new(ids, [positions.len()]),
                &Default::default(),
            );
            let want = values(expected.clone().select(1, at));
            Ok((values(gpt.forward(local).logits), want))
        })
        .expect("every rank runs");
    assert_one_call_order(&logs);
    for (rank, (logits, want)) in ranks.iter().enumerate() {
        assert_eq!(logits.len(), BATCH * SEQ / 2 * vocab);
        assert_close(&format!("rank {rank} logits"), logits, want);
    }
}

#[test]
fn tp2_cp2_with_sequence_parallelism_matches_one_rank() {
    assert_equivalent(&llama_small(), TP2_CP2_SP);
    assert_equivalent(&gpt2_small(), TP2_CP2_SP);
}

#[test]
fn tp2_cp2_without_sequence_parallelism_matches_one_rank() {
    assert_equivalent(
        &gpt2_small(),
        Layout {
            sequence_parallel: false,
            ..TP2_CP2_SP
        },
    );
}

/// Two pipeline chunks run back to back reproduce the one-rank loss, and their gradients (the
/// tied embedding's two copies summed, as the embedding group does) the one-rank gradients.
#[test]
fn pp2_chunks_reproduce_the_one_rank_loss_and_gradients() {
    let mut model = gpt2_small();
    model.num_layers = 4;
    let expected = reference(&model);
    let full = init(&model);
    let ctx = ParallelContext::single();
    let first = ChunkSpec {
        layers: 0..2,
        pre_process: true,
        post_process: false,
    };
    let last = ChunkSpec {
        layers: 2..4,
        pre_process: false,
        post_process: true,
    };
    let chunks = [
        GptModel::shard(&full, &ctx, &first).expect("first chunk"),
        GptModel::shard(&full, &ctx, &last).expect("last chunk"),
    ];
    let (inputs, targets) = batch();
    let ChunkOutput::Hidden { hidden, .. } = chunks[0]
        .forward_chunk(ChunkInput::tokens(inputs))
        .expect("first chunk runs")
    else {
        panic!("the first chunk hands on hidden states");
    };
    assert_eq!(hidden.dims(), chunks[0].boundary_shape(BATCH));
    let ChunkOutput::Loss(loss) = chunks[1]
        .forward_chunk(ChunkInput::hidden(hidden).with_labels(targets, None))
        .expect("last chunk runs")
    else {
        panic!("the last chunk computes the loss");
    };
    let value = scalar(loss.loss.clone());
    assert!((value - expected.loss).abs() <= ATOL + RTOL * expected.loss);
    let grads = loss.loss.backward();
    let mut summed: HashMap<String, Vec<f32>> = HashMap::new();
    let mut tied = 0;
    for chunk in &chunks {
        let local = gradients(chunk, &grads);
        for role in chunk.param_roles() {
            tied += usize::from(role.tied_embedding);
            let grad = &local[&role.id];
            let entry = summed
                .entry(role.shard.global_name)
                .or_insert_with(|| vec![0.0; grad.len()]);
            entry.iter_mut().zip(grad).for_each(|(sum, g)| *sum += g);
        }
    }
    assert_eq!(tied, 2, "both stages hold the tied embedding");
    assert_eq!(summed.len(), expected.grads.len());
    for (name, grad) in &summed {
        assert_close(name, grad, &expected.grads[name]);
    }
}

/// tp2·cp2 with sequence parallelism and two pipeline chunks per rank: the vocabulary-parallel
/// tied embedding lives on both stages, hidden states cross the boundary as `[b, s/cp/tp, h]`.
#[test]
fn pp2_chunks_under_tp2_cp2_with_sequence_parallelism_match_one_rank() {
    let mut gpt2 = gpt2_small();
    gpt2.num_layers = 4;
    assert_equivalent_in_stages(&gpt2, TP2_CP2_SP, 2);
    let mut llama = llama_small();
    llama.num_layers = 4;
    assert_equivalent_in_stages(&llama, TP2_CP2_SP, 2);
}

#[test]
fn chunks_refuse_the_wrong_input() {
    let model = gpt2_small();
    let full = init(&model);
    let ctx = ParallelContext::single();
    let last = ChunkSpec {
        layers: 1..2,
        pre_process: false,
        post_process: true,
    };
    let chunk = GptModel::shard(&full, &ctx, &last).expect("last chunk");
    let (inputs, _) = batch();
    let error = chunk
        .forward_chunk(ChunkInput::tokens(inputs))
        .expect_err("tokens into a middle chunk");
    assert!(matches!(error, ModelError::Chunk(_)), "{error}");
    let hidden = Tensor::<Train, 3>::zeros(chunk.boundary_shape(BATCH), &Default::default());
    let error = chunk
        .forward_chunk(ChunkInput::hidden(hidden))
        .expect_err("no labels");
    assert!(error.to_string().contains("labels"), "{error}");
}

#[test]
fn one_rank_roles_name_every_parameter_by_its_module_path() {
    for model in [gpt2_small(), llama_small(), moe_model()] {
        let gpt = build::<Cpu>(&model, 1);
        let mut names = Vec::new();
        struct Paths<'a> {
            path: Vec<String>,
            names: &'a mut Vec<(String, ParamId)>,
        }
        impl<B: Backend> ModuleVisitor<B> for Paths<'_> {
            fn enter_module(&mut self, name: &str, _: &str) {
                self.path.push(name.to_owned());
            }
            fn exit_module(&mut self, _: &str, _: &str) {
                self.path.pop();
            }
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                self.names.push((self.path.join("."), param.id));
            }
        }
        gpt.visit(&mut Paths {
            path: Vec::new(),
            names: &mut names,
        });
        let mut roles: Vec<(String, ParamId)> = gpt
            .param_roles()
            .into_iter()
            .map(|role| (role.shard.global_name, role.id))
            .collect();
        names.sort_by(|a, b| a.0.cmp(&b.0));
        roles.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(roles, names);
    }
}

#[test]
fn load_shards_reads_the_same_shards_shard_cuts() {
    let model = llama_small();
    let full = init(&model);
    let values = reference(&model).values;
    let ctx = ParallelContext::single();
    let chunk = ChunkSpec {
        layers: 1..2,
        pre_process: false,
        post_process: true,
    };
    let cut = GptModel::shard(&full, &ctx, &chunk).expect("chunk");
    let zeroed = cut.clone().map(&mut Zero);
    let loaded = zeroed
        .load_shards(|spec| {
            let local = spec.slice_of_f32(values.get(&spec.global_name)?).ok()?;
            Some(TensorData::new(local, spec.local_shape().ok()?))
        })
        .expect("every shard is in the source");
    assert_eq!(parameters(&loaded), parameters(&cut));
    let missing = cut.load_shards(|_| None).expect_err("an empty source");
    assert!(missing.to_string().contains("no tensor"), "{missing}");
}

struct Zero;
impl<B: Backend> burn::module::ModuleMapper<B> for Zero {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        param.map(|tensor| tensor.zeros_like())
    }
}

#[test]
fn layouts_that_do_not_divide_the_model_are_refused() {
    let model = llama_small(); // 2 query groups
    let config = config(&model);
    let result = World::new(4).run(|rank| -> Result<String, BoxError> {
        let world = rank.world();
        let tp = Arc::new(world.new_group("tp", &[0, 1, 2, 3])?);
        let ctx = ParallelContext {
            tp,
            ..ParallelContext::single()
        };
        let error =
            GptModel::<Cpu>::shard(&build::<Cpu>(&model, 1), &ctx, &ChunkSpec::whole(&config))
                .expect_err("4 ranks cannot split 2 query groups");
        Ok(error.to_string())
    });
    let messages = result.expect("every rank returns its error");
    assert!(messages[0].contains("2 query groups"), "{}", messages[0]);
}

#[test]
fn boundary_shape_divides_the_sequence_by_cp_and_by_tp_with_sequence_parallelism() {
    let model = gpt2_small();
    let config = config(&model);
    let shapes = World::new(4)
        .run(|rank| -> Result<[usize; 3], BoxError> {
            let ctx = context(rank.world(), TP2_CP2_SP)?;
            let gpt = with_process_rng(|| {
                GptModel::<Cpu>::new_parallel(
                    &config,
                    &ctx,
                    &ChunkSpec::whole(&config),
                    &Default::default(),
                )
            })?;
            Ok(gpt.boundary_shape(3))
        })
        .expect("every rank builds");
    assert!(shapes.iter().all(|&shape| shape == [3, SEQ / 4, 32]));
}
