//! The decoder-only language model, GPT-2 or LLaMA flavoured by configuration. The loss lives
//! here rather than in the trainer so MoE auxiliary losses and the language-model loss are
//! always combined the same way.
//!
//! One type serves the one-rank model and every rank's piece of a parallel one: a pipeline
//! chunk holds a run of layers (plus the embedding on the first stage and the head on the
//! last), each layer holds its tensor-parallel shard, and the forward pass runs the same code
//! with every collective an identity on one rank. A rank's model is cut from the full one-rank
//! model ([`GptModel::shard`]), so one rank and N ranks start from the same numbers.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::nn::{Dropout, DropoutConfig, Embedding, Linear};
use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Int, Tensor, TensorData};
use ferrotron_ops::fp8::scaling::Fp8Settings;
use ferrotron_ops::{
    Fp8State, LinearLossSpec, OutputWeight, cross_entropy, linear_cross_entropy,
    tied_cross_entropy, tied_logits,
};
use ferrotron_parallel::collectives::gather_from_region;
use ferrotron_parallel::{ParallelContext, ParallelOps, ParamRole, ShardSpec};
use ferrotron_recipe::{CrossEntropyFusionImpl, PositionEmbedding};

use crate::block::TransformerBlock;
use crate::init::{normal_embedding, normal_linear};
use crate::norm::Norm;
use crate::parallel::{
    ChunkData, ChunkInput, ChunkOutput, ChunkSpec, Placement, SequencePositions, TensorParallel,
    VocabShard, cut_module, roles_of, vocab_parallel_cross_entropy, vocab_parallel_lookup,
};
use crate::recompute::{
    LayersOut, RecomputePolicy, run_kept, run_mlp_recomputed, run_plain, run_recomputed,
};
use crate::{ExpertLoads, ModelConfig, ModelError};

#[derive(Module, Debug)]
pub struct GptModel<B: Backend> {
    /// `[padded_vocab, hidden]` (rows divided by tp): on the first chunk, and on the last one
    /// when the output layer reuses it.
    embedding: Option<Embedding<B>>,
    /// `[max_positions, hidden]` when positions are learned (first chunk).
    position_embedding: Option<Embedding<B>>,
    embedding_dropout: Dropout,
    /// This chunk's layers.
    layers: Vec<TransformerBlock<B>>,
    /// On the last chunk.
    final_norm: Option<Norm<B>>,
    /// `[hidden, padded_vocab]` (columns divided by tp) on the last chunk; absent when the
    /// output layer reuses the embedding.
    output_layer: Option<Linear<B>>,
    #[module(skip)]
    config: ModelConfig,
    #[module(skip)]
    chunk: ChunkSpec,
    #[module(skip)]
    parallel: ParallelContext,
    /// Which layers the backward pass recomputes.
    #[module(skip)]
    recompute: RecomputePolicy,
    /// Whether a training forward cuts the graph after every layer it does not recompute
    /// (`ferrotron_parallel::recompute`'s kept cuts), so the backward runs layer by layer.
    #[module(skip)]
    cut_layers: bool,
    /// The scaling state of this chunk's fp8 linears (`crate::fp8`), when it has any.
    #[module(skip)]
    fp8: Option<Arc<Fp8State>>,
    /// Whether the last chunk computes its output layer and loss a chunk of rows at a time
    /// (`runtime.cross_entropy_fusion_impl: linear`, one tensor rank).
    #[module(skip)]
    linear_loss: bool,
}

/// The forward pass's results.
#[derive(Debug, Clone)]
pub struct ModelOutput<B: Backend> {
    /// `[batch, seq, padded_vocab]`
    pub logits: Tensor<B, 3>,
    /// Sum of every MoE layer's balancing and z-losses, `[1]`; zero for a dense model.
    pub aux_loss: Tensor<B, 1>,
    /// Tokens per expert of every MoE layer, for auxiliary-loss-free balancing.
    pub expert_loads: ExpertLoads,
}

/// The training objective and its parts.
#[derive(Debug, Clone)]
pub struct LossOutput<B: Backend> {
    /// `lm_loss + aux_loss`, `[1]`: what to differentiate.
    pub loss: Tensor<B, 1>,
    /// Mean token cross-entropy, `[1]`.
    pub lm_loss: Tensor<B, 1>,
    /// `[1]`, zero for a dense model.
    pub aux_loss: Tensor<B, 1>,
    pub expert_loads: ExpertLoads,
}

impl<B: Backend> GptModel<B> {
    pub(crate) fn new(config: &ModelConfig, device: &B::Device) -> Self {
        let std = config.init_method_std;
        let embedding = normal_embedding(config.padded_vocab_size, config.hidden_size, std, device);
        let position_embedding =
            (config.position_embedding == PositionEmbedding::Learned).then(|| {
                normal_embedding(
                    config.max_position_embeddings,
                    config.hidden_size,
                    std,
                    device,
                )
            });
        let layers = (0..config.num_layers)
            .map(|index| TransformerBlock::new(config, index, device))
            .collect();
        let final_norm = Norm::new(
            config.normalization,
            config.hidden_size,
            config.norm_epsilon,
            device,
        );
        let output_layer = (!config.tie_embeddings).then(|| {
            normal_linear(
                config.hidden_size,
                config.padded_vocab_size,
                std,
                false,
                device,
            )
        });
        GptModel {
            embedding: Some(embedding),
            position_embedding,
            embedding_dropout: DropoutConfig::new(config.hidden_dropout).init(),
            layers,
            final_norm: Some(final_norm),
            output_layer,
            config: config.clone(),
            chunk: ChunkSpec::whole(config),
            parallel: ParallelContext::single(),
            recompute: RecomputePolicy::Keep,
            cut_layers: false,
            fp8: None,
            linear_loss: false,
        }
    }

    /// This rank's chunk of the model: the full one-rank model built with the same seed as on
    /// every other rank (`B::seed`, then [`ModelConfig::init`]), then cut by [`Self::shard`].
    pub fn new_parallel(
        config: &ModelConfig,
        ctx: &ParallelContext,
        chunk: &ChunkSpec,
        device: &B::Device,
    ) -> Result<Self, ModelError> {
        Self::shard(&config.init(device), ctx, chunk)
    }

    /// The part of `full` (a one-rank model) that this rank holds for `chunk` under `ctx`:
    /// its layers, each cut to its tensor-parallel shard, the vocabulary-parallel embedding on
    /// the first chunk (and, for a tied output layer, a copy on the last), the head on the last.
    pub fn shard(
        full: &GptModel<B>,
        ctx: &ParallelContext,
        chunk: &ChunkSpec,
    ) -> Result<Self, ModelError> {
        let config = &full.config;
        if full.chunk != ChunkSpec::whole(config) || full.parallel.tp_size() != 1 {
            return Err(ModelError::Layout(
                "a shard is cut from the full one-rank model (ModelConfig::init)".to_owned(),
            ));
        }
        check_layout(config, ctx, chunk)?;
        let tp = TensorParallel::of(ctx);
        let replicated = |_: &str| Placement::replicated(&tp);
        let needs_embedding = chunk.pre_process || (chunk.post_process && config.tie_embeddings);
        let embedding = match (&full.embedding, needs_embedding) {
            (Some(embedding), true) => {
                Some(cut_module(embedding, |_| vocab_rows(&tp, config, chunk))?)
            }
            _ => None,
        };
        let position_embedding = match (&full.position_embedding, chunk.pre_process) {
            (Some(table), true) => Some(cut_module(table, replicated)?),
            _ => None,
        };
        let layers = full.layers[chunk.layers.clone()]
            .iter()
            .map(|layer| layer.shard(ctx, &tp))
            .collect::<Result<Vec<_>, _>>()?;
        let final_norm = match (&full.final_norm, chunk.post_process) {
            (Some(norm), true) => Some(cut_module(norm, replicated)?),
            _ => None,
        };
        let output_layer = match (&full.output_layer, chunk.post_process) {
            (Some(output), true) => Some(cut_module(output, |_| Placement::split(&tp, 1, 1))?),
            _ => None,
        };
        Ok(GptModel {
            embedding,
            position_embedding,
            embedding_dropout: full.embedding_dropout.clone(),
            layers,
            final_norm,
            output_layer,
            config: config.clone(),
            chunk: chunk.clone(),
            parallel: ctx.clone(),
            recompute: full.recompute,
            cut_layers: full.cut_layers,
            // fp8 handles are given to the cut chunk (`with_fp8`): a state is one chunk's
            fp8: None,
            linear_loss: full.linear_loss,
        })
    }

    /// Every local parameter with where it sits in the one-rank model (global name = the
    /// one-rank module path, e.g. `layers.5.attention.qkv.weight`) and how its gradient is
    /// reduced.
    pub fn param_roles(&self) -> Vec<ParamRole> {
        let ctx = &self.parallel;
        let tp = TensorParallel::of(ctx);
        let replicated = |_: &str| Placement::replicated(&tp);
        let mut roles = Vec::new();
        if let Some(embedding) = &self.embedding {
            roles.extend(roles_of(embedding, "embedding", |_| {
                vocab_rows(&tp, &self.config, &self.chunk)
            }));
        }
        if let Some(table) = &self.position_embedding {
            roles.extend(roles_of(table, "position_embedding", replicated));
        }
        for (offset, layer) in self.layers.iter().enumerate() {
            let index = self.chunk.layers.start + offset;
            roles.extend(layer.param_roles(&format!("layers.{index}"), ctx, &tp));
        }
        if let Some(norm) = &self.final_norm {
            roles.extend(roles_of(norm, "final_norm", replicated));
        }
        if let Some(output) = &self.output_layer {
            roles.extend(roles_of(output, "output_layer", |_| {
                Placement::split(&tp, 1, 1)
            }));
        }
        roles
    }

    /// Replace every local parameter by `source(its shard spec)` (a checkpoint loader cutting
    /// this layout's shards from global tensors). Ids and `require_grad` are kept; fails on a
    /// missing tensor or a wrong shape.
    pub fn load_shards(
        self,
        source: impl FnMut(&ShardSpec) -> Option<TensorData>,
    ) -> Result<Self, ModelError> {
        let specs: HashMap<ParamId, ShardSpec> = self
            .param_roles()
            .into_iter()
            .map(|role| (role.id, role.shard))
            .collect();
        let mut loader = ShardLoader {
            specs,
            source,
            problems: Vec::new(),
        };
        let model = self.map(&mut loader);
        if loader.problems.is_empty() {
            Ok(model)
        } else {
            Err(ModelError::Layout(loader.problems.join("; ")))
        }
    }

    /// The same model recomputing `policy`'s layers in the backward pass.
    pub fn with_recompute(self, policy: RecomputePolicy) -> Self {
        GptModel {
            recompute: policy,
            ..self
        }
    }

    /// The same model with its training backward taken layer by layer (or not): every layer
    /// outside a recomputed range becomes a range of its own that keeps its activations, so the
    /// trainer sees each layer's parameter gradients final before the layers in front of it are
    /// differentiated (the data-parallel reduction's overlap). The numbers do not change.
    pub fn with_layer_cuts(self, cut_layers: bool) -> Self {
        GptModel { cut_layers, ..self }
    }

    /// The same model with its output layer and loss run as `fusion` says (Megatron's
    /// `--cross-entropy-fusion-impl`); the numbers agree to rounding.
    pub fn with_cross_entropy_fusion(self, fusion: CrossEntropyFusionImpl) -> Self {
        GptModel {
            linear_loss: fusion == CrossEntropyFusionImpl::Linear,
            ..self
        }
    }

    /// The same model with fp8 GEMMs (`settings`) in the layers `in_fp8` picks by global index,
    /// their routed experts' too with `experts`, sharing one scaling state; the output layer
    /// stays in the model's dtype.
    pub fn with_fp8(
        self,
        settings: Fp8Settings,
        in_fp8: impl Fn(usize) -> bool,
        experts: bool,
    ) -> Self {
        let first = self.chunk.layers.start;
        let (layers, fp8) = crate::fp8::assign(self.layers, first, settings, in_fp8, experts);
        GptModel {
            layers,
            fp8,
            ..self
        }
    }

    /// The scaling state of the chunk's fp8 linears (none without fp8 layers).
    pub fn fp8_state(&self) -> Option<&Arc<Fp8State>> {
        self.fp8.as_ref()
    }

    /// Whether a training forward draws dropout masks (the backward driver then keeps the
    /// generator where a run without recomputation would have it).
    pub fn has_dropout(&self) -> bool {
        self.config.hidden_dropout > 0.0 || self.config.attention_dropout > 0.0
    }

    /// The configuration the model was built from.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The pipeline chunk this model is.
    pub fn chunk(&self) -> &ChunkSpec {
        &self.chunk
    }

    /// The groups this model computes over.
    pub fn parallel_context(&self) -> &ParallelContext {
        &self.parallel
    }

    /// `[batch, seq, hidden]` of the hidden states between chunks on this rank: the sequence
    /// divided by cp, and by tp with sequence parallelism.
    pub fn boundary_shape(&self, batch: usize) -> [usize; 3] {
        let tp = TensorParallel::of(&self.parallel);
        let mut seq = self.config.seq_length / self.parallel.cp_size();
        if tp.sequence_parallel {
            seq /= tp.size();
        }
        [batch, seq, self.config.hidden_size]
    }

    /// The longest sequence the position tables cover (unbounded without position embeddings).
    pub fn max_sequence_length(&self) -> usize {
        match self.config.position_embedding {
            PositionEmbedding::Learned => self.config.max_position_embeddings,
            PositionEmbedding::Rope => self
                .config
                .max_position_embeddings
                .max(self.config.seq_length),
            PositionEmbedding::None => usize::MAX,
        }
    }
    /// Parameters exempt from weight decay: every one-dimensional parameter, i.e. norm weights,
    /// LayerNorm biases, linear biases and the MoE expert-bias buffer (Megatron's rule).
    pub fn no_weight_decay_params(&self) -> HashSet<ParamId> {
        let mut collector = OneDimensionalParams::default();
        self.visit(&mut collector);
        collector.ids
    }

    /// Parameters trained by gradients: `num_params()` less the expert-bias buffers, which
    /// Megatron keeps as buffers, not parameters.
    pub fn num_trainable_params(&self) -> usize {
        let buffers: usize = self
            .layers
            .iter()
            .filter_map(|layer| layer.moe())
            .filter_map(|moe| moe.expert_bias())
            .map(|bias| bias.dims()[0])
            .sum();
        self.num_params() - buffers
    }

    /// The selection bias of every MoE layer that uses one, in layer order.
    pub fn expert_biases(&self) -> Vec<Tensor<B, 1>> {
        self.layers
            .iter()
            .filter_map(|layer| layer.moe())
            .filter_map(|moe| moe.expert_bias())
            .collect()
    }

    /// Apply DeepSeek-V3's auxiliary-loss-free update to every MoE layer with an expert bias:
    /// `bias_i += rate · sign(mean_load − load_i)`. `loads` are the tokens per expert summed
    /// over the step (all microbatches, and all data-parallel ranks once there are several).
    pub fn update_expert_bias(self, loads: &mut ExpertLoads) -> Result<Self, ModelError> {
        let loads = loads.layers();
        let moe_layers: Vec<usize> = self
            .layers
            .iter()
            .filter_map(|layer| layer.moe().map(|moe| moe.num_experts()))
            .collect();
        let shapes_match = loads.len() == moe_layers.len()
            && loads
                .iter()
                .zip(&moe_layers)
                .all(|(given, &experts)| given.len() == experts);
        if !shapes_match {
            return Err(ModelError::ExpertLoadsMismatch {
                given: loads.len(),
                given_experts: loads.first().map_or(0, Vec::len),
                expected: moe_layers.len(),
                expected_experts: moe_layers.first().copied().unwrap_or(0),
            });
        }
        let mut per_layer = loads.iter();
        let layers = self
            .layers
            .into_iter()
            .map(|layer| {
                if layer.moe().is_none() {
                    return layer;
                }
                match per_layer.next() {
                    Some(load) => layer.map_moe(|moe| moe.update_expert_bias(load)),
                    None => layer,
                }
            })
            .collect();
        Ok(GptModel { layers, ..self })
    }

    fn vocab_shard(&self) -> VocabShard {
        let tp = &self.parallel.tp;
        VocabShard::new(self.config.padded_vocab_size, tp.rank(), tp.size())
    }
}

impl<B: ParallelOps> GptModel<B> {
    /// `tokens`: `[batch, seq]` ids below the padded vocabulary; the whole model (one chunk).
    /// Under tensor parallelism the logits are gathered over tp, which training never does.
    ///
    /// # Panics
    /// When `seq` exceeds [`Self::max_sequence_length`] or the model is a pipeline chunk: caller
    /// bugs, since the data pipeline and `generate` both cut sequences to the recipe's length.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> ModelOutput<B> {
        let device = tokens.device();
        let [_, seq] = tokens.dims();
        self.assert_whole();
        let positions = self.positions_or_panic(seq, &device);
        let hidden = self.embed(tokens, &positions);
        let (hidden, aux_loss, expert_loads) = self.run_layers(hidden, &positions, &device);
        let tp = TensorParallel::of(&self.parallel);
        let logits = gather_from_region(self.local_logits(hidden), 2, &tp.comm);
        ModelOutput {
            logits,
            aux_loss,
            expert_loads,
        }
    }

    /// Mean next-token cross-entropy of `labels` (`[batch, seq]`, each below the padded
    /// vocabulary) plus the MoE auxiliary losses. Like Megatron, the padded logits take part in
    /// the softmax; no real label ever points at them.
    ///
    /// # Panics
    /// As [`Self::forward`].
    pub fn loss(&self, tokens: Tensor<B, 2, Int>, labels: Tensor<B, 2, Int>) -> LossOutput<B> {
        self.whole_loss(ChunkInput::tokens(tokens).with_labels(labels, None))
    }

    /// As [`Self::loss`], averaging only over tokens where `loss_mask` (`[batch, seq]`, 0 or 1)
    /// is 1, as Megatron's GPT dataset masks end-of-document tokens.
    pub fn loss_masked(
        &self,
        tokens: Tensor<B, 2, Int>,
        labels: Tensor<B, 2, Int>,
        loss_mask: Tensor<B, 2>,
    ) -> LossOutput<B> {
        self.whole_loss(ChunkInput::tokens(tokens).with_labels(labels, Some(loss_mask)))
    }

    /// Run this chunk: tokens (first chunk) or the previous chunk's hidden states in; hidden
    /// states, or on the last chunk the loss over this rank's tokens (labels required), out.
    /// With context parallelism the inputs are this cp rank's part of the sequence
    /// ([`crate::split_for_context_parallel`]) and the loss is the mean over its tokens.
    pub fn forward_chunk(&self, input: ChunkInput<B>) -> Result<ChunkOutput<B>, ModelError> {
        let tp = TensorParallel::of(&self.parallel);
        let (hidden, positions, device) = match input.data {
            ChunkData::Tokens(tokens) => {
                if !self.chunk.pre_process {
                    return Err(ModelError::Chunk(format!(
                        "chunk with layers {:?} takes hidden states, not tokens",
                        self.chunk.layers
                    )));
                }
                let device = tokens.device();
                let positions = self.positions(tokens.dims()[1], &device)?;
                (self.embed(tokens, &positions), positions, device)
            }
            ChunkData::Hidden(hidden) => {
                if self.chunk.pre_process {
                    return Err(ModelError::Chunk(
                        "the first chunk takes tokens, not hidden states".to_owned(),
                    ));
                }
                let device = hidden.device();
                let [_, rows, _] = hidden.dims();
                let seq = if tp.sequence_parallel {
                    rows * tp.size()
                } else {
                    rows
                };
                let positions = self.positions(seq, &device)?;
                (hidden, positions, device)
            }
        };
        let (hidden, aux_loss, expert_loads) = self.run_layers(hidden, &positions, &device);
        if !self.chunk.post_process {
            return Ok(ChunkOutput::Hidden {
                hidden,
                aux_loss,
                expert_loads,
            });
        }
        let Some(labels) = input.labels else {
            return Err(ModelError::Chunk(
                "the last chunk computes the loss and needs labels".to_owned(),
            ));
        };
        let token_losses = self.token_losses(hidden, labels, &tp);
        let lm_loss = match input.loss_mask {
            Some(loss_mask) => {
                let [batch, seq] = loss_mask.dims();
                let mask = loss_mask.reshape([batch * seq]).cast(FloatDType::F32);
                (token_losses * mask.clone()).sum() / mask.sum().clamp_min(1.0)
            }
            None => token_losses.mean(),
        };
        Ok(ChunkOutput::Loss(combine(
            lm_loss,
            aux_loss.cast(FloatDType::F32),
            expert_loads,
        )))
    }

    /// Per-token losses `[batch·seq]` in f32 whatever the compute dtype (Megatron's fp32
    /// cross-entropy: a bf16 log-sum-exp over the vocabulary rounds the loss to 3 significant
    /// digits) from the last layer's output: the backend's fused kernel over a whole vocabulary
    /// (with the tied output layer in it where the backend has that kernel), else the composed
    /// (vocabulary-parallel) loss over f32 logits.
    fn token_losses(
        &self,
        hidden: Tensor<B, 3>,
        labels: Tensor<B, 2, Int>,
        tp: &TensorParallel,
    ) -> Tensor<B, 1> {
        let [batch, seq] = labels.dims();
        let rows = self.output_rows(hidden);
        let flat_labels = || labels.clone().reshape([batch * seq]);
        if self.linear_loss && tp.size() == 1 {
            let (weight, layout) = match (&self.output_layer, &self.embedding) {
                (Some(output), _) => (output.weight.val(), OutputWeight::Untied),
                (None, Some(embedding)) => (embedding.weight.val(), OutputWeight::Tied),
                (None, None) => unreachable!("a tied post_process chunk holds the embedding"),
            };
            let vocab = self.config.padded_vocab_size as u64;
            let spec = LinearLossSpec {
                weight: layout,
                chunk_rows: usize::try_from(CrossEntropyFusionImpl::linear_chunk_rows(vocab))
                    .unwrap_or(usize::MAX),
            };
            return linear_cross_entropy(rows, weight, flat_labels(), spec);
        }
        if tp.size() == 1
            && let (None, Some(embedding)) = (&self.output_layer, &self.embedding)
            && let Some(losses) =
                tied_cross_entropy(rows.clone(), embedding.weight.val(), flat_labels())
        {
            return losses;
        }
        let logits = self.logits_of(rows);
        if tp.size() == 1
            && let Some(losses) = cross_entropy(logits.clone(), flat_labels())
        {
            return losses;
        }
        let vocab = logits.dims()[1];
        let logits = logits.reshape([batch, seq, vocab]).cast(FloatDType::F32);
        vocab_parallel_cross_entropy(logits, labels, self.vocab_shard(), &tp.comm)
    }

    fn whole_loss(&self, input: ChunkInput<B>) -> LossOutput<B> {
        self.assert_whole();
        match self.forward_chunk(input) {
            Ok(ChunkOutput::Loss(loss)) => loss,
            Ok(ChunkOutput::Hidden { .. }) => unreachable!("the whole model ends in the loss"),
            Err(error) => panic!("{error}"),
        }
    }

    fn assert_whole(&self) {
        assert!(
            self.chunk.pre_process && self.chunk.post_process,
            "forward/loss run the whole model; pipeline chunk {:?} runs through forward_chunk",
            self.chunk
        );
    }

    fn positions_or_panic(&self, seq: usize, device: &B::Device) -> SequencePositions<B> {
        match self.positions(seq, device) {
            Ok(positions) => positions,
            Err(error) => panic!("{error}"),
        }
    }

    /// Positions of this rank's `seq` tokens, refusing sequences beyond the position tables.
    fn positions(
        &self,
        seq: usize,
        device: &B::Device,
    ) -> Result<SequencePositions<B>, ModelError> {
        let cp = &self.parallel.cp;
        let positions = SequencePositions::new(seq, cp.rank(), cp.size(), device)?;
        if positions.extent() > self.max_sequence_length() {
            return Err(ModelError::Chunk(format!(
                "a sequence of {} tokens is longer than the {} positions this model covers",
                positions.extent(),
                self.max_sequence_length()
            )));
        }
        Ok(positions)
    }

    /// Word (vocabulary-parallel) plus position embeddings: `[batch, seq, hidden]`, or this
    /// rank's part of the sequence with sequence parallelism.
    fn embed(&self, tokens: Tensor<B, 2, Int>, positions: &SequencePositions<B>) -> Tensor<B, 3> {
        let tp = TensorParallel::of(&self.parallel);
        let embedding = self
            .embedding
            .as_ref()
            .expect("a pre_process chunk holds the embedding");
        let partial = vocab_parallel_lookup(embedding.weight.val(), tokens, self.vocab_shard());
        let mut hidden = tp.exit(partial);
        if let Some(table) = &self.position_embedding {
            let [_, rows, _] = hidden.dims();
            let start = if tp.sequence_parallel {
                tp.rank() * rows
            } else {
                0
            };
            let rows = positions.rows(table.weight.val(), start..start + rows);
            hidden = hidden + rows.unsqueeze::<3>();
        }
        self.embedding_dropout.forward(hidden)
    }

    /// The chunk's layers, the policy's ranges cut out for recomputation. Under a training
    /// forward with dropout every layer start marks the generator, recomputed or not, so both
    /// draw the same masks (`ferrotron_parallel::recompute`).
    fn run_layers(
        &self,
        hidden: Tensor<B, 3>,
        positions: &SequencePositions<B>,
        device: &B::Device,
    ) -> (Tensor<B, 3>, Tensor<B, 1>, ExpertLoads) {
        let training = B::ad_enabled(device);
        let marks = training && self.has_dropout();
        let ranges = if training {
            self.recompute.ranges(self.layers.len())
        } else {
            Vec::new()
        };
        let mut out = LayersOut {
            hidden,
            aux_loss: Tensor::<B, 1>::zeros([1], device),
            loads: Vec::new(),
        };
        let cut = training && self.cut_layers;
        let offset = self.chunk.layers.start;
        let kept = |range: std::ops::Range<usize>, out| {
            if cut {
                range.fold(out, |out, i| {
                    run_kept(&self.layers[i], offset + i, out, positions, marks)
                })
            } else {
                let first = offset + range.start;
                run_plain(&self.layers[range], first, out, positions, marks, false)
            }
        };
        if training && self.recompute == RecomputePolicy::Mlp {
            for (i, layer) in self.layers.iter().enumerate() {
                out = if layer.moe().is_some() {
                    kept(i..i + 1, out)
                } else {
                    run_mlp_recomputed(layer, offset + i, out, positions, marks, cut)
                };
            }
            return (out.hidden, out.aux_loss, ExpertLoads::pending(out.loads));
        }
        let mut next = 0;
        for range in ranges {
            out = kept(next..range.start, out);
            let mark = if marks { B::rng_mark(device) } else { [0, 0] };
            let first = offset + range.start;
            out = run_recomputed(
                &self.layers[range.clone()],
                first,
                out,
                positions,
                marks,
                mark,
            );
            next = range.end;
        }
        let out = kept(next..self.layers.len(), out);
        (out.hidden, out.aux_loss, ExpertLoads::pending(out.loads))
    }

    /// Final norm and this rank's vocabulary columns of the logits, `[batch, seq, vocab/tp]`
    /// (the whole local sequence: gathered over tp with sequence parallelism).
    fn local_logits(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        let [batch, _, _] = hidden.dims();
        let logits = self.logits_of(self.output_rows(hidden));
        let [rows, vocab] = logits.dims();
        logits.reshape([batch, rows / batch, vocab])
    }

    /// The final norm's output as `[batch·seq, hidden]` rows, entered into the tensor-parallel
    /// region (with sequence parallelism that gathers the whole sequence).
    fn output_rows(&self, hidden: Tensor<B, 3>) -> Tensor<B, 2> {
        let tp = TensorParallel::of(&self.parallel);
        let norm = self
            .final_norm
            .as_ref()
            .expect("a post_process chunk holds the final norm");
        let hidden = tp.enter(norm.forward(hidden));
        let [batch, seq, width] = hidden.dims();
        hidden.reshape([batch * seq, width])
    }

    /// This rank's logit columns of `rows [batch·seq, hidden]`. One [batch·seq, hidden] ×
    /// [hidden, vocab] product rather than a batch of them: the CPU GEMM then packs the
    /// vocabulary-sized weight once instead of once per sequence and splits the whole product
    /// over its threads, and the weight gradient is one product instead of a product per
    /// sequence summed afterwards. Tied, the backend's tied-logits kernel writes the logits and
    /// the embedding's gradient once (ferrotron-ops `op/logits.rs`).
    fn logits_of(&self, rows: Tensor<B, 2>) -> Tensor<B, 2> {
        match (&self.output_layer, &self.embedding) {
            (Some(output), _) => output.forward(rows),
            (None, Some(embedding)) => tied_logits(rows, embedding.weight.val()),
            (None, None) => unreachable!("a tied post_process chunk holds the embedding"),
        }
    }
}

/// The word embedding's rows over tp; a tied embedding outside a one-chunk model is kept in
/// step between the first and last stage.
fn vocab_rows(tp: &TensorParallel, config: &ModelConfig, chunk: &ChunkSpec) -> Placement {
    Placement {
        tied_embedding: config.tie_embeddings && !(chunk.pre_process && chunk.post_process),
        ..Placement::split(tp, 0, 1)
    }
}

/// Refuses layouts that cannot split this model evenly.
fn check_layout(
    config: &ModelConfig,
    ctx: &ParallelContext,
    chunk: &ChunkSpec,
) -> Result<(), ModelError> {
    if chunk.layers.start > chunk.layers.end || chunk.layers.end > config.num_layers {
        return Err(ModelError::Layout(format!(
            "chunk layers {:?} are not a range within the model's {} layers",
            chunk.layers, config.num_layers
        )));
    }
    let (tp, cp) = (ctx.tp_size(), ctx.cp_size());
    if !config.padded_vocab_size.is_multiple_of(tp) {
        return Err(ModelError::Layout(format!(
            "the padded vocabulary ({}) cannot be split over {tp} tensor-parallel ranks",
            config.padded_vocab_size
        )));
    }
    if !config.seq_length.is_multiple_of(2 * cp) && cp > 1 {
        return Err(ModelError::Layout(format!(
            "seq_length {} cannot be cut into {} chunks for {cp} context-parallel ranks",
            config.seq_length,
            2 * cp
        )));
    }
    if ctx.sequence_split() && !(config.seq_length / cp).is_multiple_of(tp) {
        return Err(ModelError::Layout(format!(
            "sequence parallelism splits each rank's {} tokens over {tp} tensor-parallel ranks, which does not divide",
            config.seq_length / cp
        )));
    }
    Ok(())
}

fn combine<B: Backend>(
    lm_loss: Tensor<B, 1>,
    aux_loss: Tensor<B, 1>,
    expert_loads: ExpertLoads,
) -> LossOutput<B> {
    LossOutput {
        loss: lm_loss.clone() + aux_loss.clone(),
        lm_loss,
        aux_loss,
        expert_loads,
    }
}

#[derive(Default)]
struct OneDimensionalParams {
    ids: HashSet<ParamId>,
}

impl<B: Backend> ModuleVisitor<B> for OneDimensionalParams {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if D == 1 {
            self.ids.insert(param.id);
        }
    }
}

struct ShardLoader<F> {
    specs: HashMap<ParamId, ShardSpec>,
    source: F,
    problems: Vec<String>,
}

impl<B: Backend, F: FnMut(&ShardSpec) -> Option<TensorData>> ModuleMapper<B> for ShardLoader<F> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let Some(spec) = self.specs.get(&id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let expected = tensor.dims().to_vec();
        let loaded = match (self.source)(spec) {
            Some(data) if data.shape.to_vec() == expected => {
                let loaded = Tensor::<B, D>::from_data(data, &tensor.device());
                if tensor.is_require_grad() {
                    loaded.require_grad()
                } else {
                    loaded
                }
            }
            Some(data) => {
                self.problems.push(format!(
                    "{}: the source gave shape {:?}, this rank holds {expected:?}",
                    spec.global_name, data.shape
                ));
                tensor
            }
            None => {
                self.problems
                    .push(format!("{}: no tensor in the source", spec.global_name));
                tensor
            }
        };
        Param::from_mapped_value(id, loaded, mapper)
    }
}
