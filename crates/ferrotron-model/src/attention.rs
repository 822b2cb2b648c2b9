//! Causal self-attention with grouped queries. The fused QKV projection keeps Megatron's layout
//! (per key/value group: its query heads, then its key, then its value), so tensor parallelism
//! is a contiguous split of the QKV columns over groups (each rank gets whole groups with their
//! query heads) and a row split of the output projection.
//!
//! With context parallelism a rank holds two chunks of the sequence: keys and values are
//! all-gathered over cp (the backward reduce-scatters their gradients) and the causal mask
//! compares global positions.
//!
//! Without context parallelism the scores go through `FusedOps::fused_attention` (causal,
//! dropout included, grouped K/V not repeated): its composed default is exactly the arithmetic
//! this layer had before (burn's `attention` op, or matmul–softmax–dropout–matmul while dropout
//! is live), and the CUDA backend replaces it with cuDNN's fused flash attention. The
//! context-parallel path (gathered K/V, global-position mask) stays composed. Without it the
//! attention takes the packed projection whole (`FusedOps::fused_qkv_attention`), rotary
//! embeddings applied to its query and key slots in place (`FusedOps::fused_rope_qkv`), so
//! kernels write the projection's gradient in one piece.
//!
//! Variants of today's dense families, each Megatron's switch: a bias on the QKV projection
//! alone (`--add-qkv-bias`, Qwen2.5; split by query group like the weight); QK-norm
//! (`--qk-layernorm`, Qwen3: the query heads and the key head of the packed projection
//! normalised over `head_dim` before RoPE, through `FusedOps::fused_qk_norm`, one `[head_dim]`
//! weight each shared by every head, so replicated over tp with a gradient summed over tp, as
//! Megatron all-reduces `q_layernorm`/`k_layernorm`); a causal sliding window
//! (`--window-size`, Mistral: `AttentionSpec::window`, and on the context-parallel path a mask
//! by global position).

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::module::attention;
use burn::tensor::{Bool, Tensor, TensorPrimitive};
use ferrotron_ops::{
    AttentionSpec, Fp8Linear, Fp8Residual, Fp8Rope, FusedOps, QkNormParams, repeat_groups,
    split_qkv,
};
use ferrotron_parallel::collectives::gather_from_sequence_region;
use ferrotron_parallel::{Comm, ParallelOps, solo};
use ferrotron_recipe::PositionEmbedding;

use crate::block::Sublayer;
use crate::init::{normal_linear, scaled_std};
use crate::norm::Norm;
use crate::parallel::{Placement, SequencePositions, TensorParallel, cut_module};
use crate::rope::RotaryEmbedding;
use crate::{ModelConfig, ModelError};

#[derive(Module, Debug)]
pub struct SelfAttention<B: Backend> {
    /// `[hidden, (heads + 2·groups)·head_dim]` (columns divided by tp on a tp rank).
    qkv: Linear<B>,
    /// `[heads·head_dim, hidden]` (rows divided by tp).
    proj: Linear<B>,
    rope: Option<RotaryEmbedding<B>>,
    /// QK-norm's query and key norms over `[head_dim]` (Megatron's `q_layernorm`,
    /// `k_layernorm`), where the model has them.
    q_norm: Option<Norm<B>>,
    k_norm: Option<Norm<B>>,
    dropout: Dropout,
    /// The sliding window's left size (Megatron's `--window-size (left, 0)`).
    #[module(skip)]
    window: Option<usize>,
    /// Heads and groups on this rank.
    num_heads: usize,
    num_groups: usize,
    head_dim: usize,
    #[module(skip)]
    tp: TensorParallel,
    #[module(skip)]
    cp: Comm,
    /// fp8 GEMMs for `qkv` and `proj` (`crate::fp8`), where the plan puts this layer in fp8.
    #[module(skip)]
    fp8: Option<(Fp8Linear, Fp8Linear)>,
}

impl<B: Backend> SelfAttention<B> {
    pub fn new(config: &ModelConfig, device: &B::Device) -> Self {
        let heads = config.num_attention_heads;
        let groups = config.num_query_groups;
        let head_dim = config.kv_channels;
        let std = config.init_method_std;
        let bias = config.add_bias_linear;
        let qk_norm = || {
            config
                .qk_layernorm
                .then(|| Norm::new(config.normalization, head_dim, config.norm_epsilon, device))
        };
        let rope = (config.position_embedding == PositionEmbedding::Rope).then(|| {
            // Keep in step with `GptModel::max_sequence_length`.
            let positions = config.max_position_embeddings.max(config.seq_length);
            RotaryEmbedding::new(
                head_dim,
                positions,
                config.rotary_base,
                config.rope_scaling.as_ref(),
                device,
            )
        });
        SelfAttention {
            qkv: normal_linear(
                config.hidden_size,
                (heads + 2 * groups) * head_dim,
                std,
                config.add_qkv_bias,
                device,
            ),
            proj: normal_linear(
                heads * head_dim,
                config.hidden_size,
                scaled_std(std, config.num_layers),
                bias,
                device,
            ),
            rope,
            q_norm: qk_norm(),
            k_norm: qk_norm(),
            dropout: DropoutConfig::new(config.attention_dropout).init(),
            window: config.window_size.map(|(left, _)| left),
            num_heads: heads,
            num_groups: groups,
            head_dim,
            tp: TensorParallel::single(),
            cp: solo(),
            fp8: None,
        }
    }

    /// The same layer with fp8 GEMMs for its QKV and output projections.
    pub(crate) fn with_fp8(self, qkv: Fp8Linear, proj: Fp8Linear) -> Self {
        SelfAttention {
            fp8: Some((qkv, proj)),
            ..self
        }
    }

    /// This rank's part of a full one-rank attention layer: `groups / tp` query groups with
    /// their heads, computing over `tp` and `cp`.
    pub fn shard(&self, tp: &TensorParallel, cp: &Comm) -> Result<Self, ModelError> {
        let size = tp.size();
        if !self.num_groups.is_multiple_of(size) {
            return Err(ModelError::Layout(format!(
                "{} query groups cannot be split over {size} tensor-parallel ranks (Megatron splits attention by query group)",
                self.num_groups
            )));
        }
        let placed = cut_module(self, |name| Self::placement(name, tp))?;
        Ok(SelfAttention {
            num_heads: self.num_heads / size,
            num_groups: self.num_groups / size,
            tp: tp.clone(),
            cp: cp.clone(),
            ..placed
        })
    }

    /// How parameter `name` (`qkv.weight`, `proj.bias`, ...) is split over `tp`.
    pub fn placement(name: &str, tp: &TensorParallel) -> Placement {
        match name {
            "qkv.weight" => Placement::split(tp, 1, 1),
            "qkv.bias" | "proj.weight" => Placement::split(tp, 0, 1),
            // Every rank normalises its own heads with the same weights: a partial sum over tp
            // with or without sequence parallelism.
            _ if name.starts_with("q_norm.") || name.starts_with("k_norm.") => Placement {
                tp_partial: tp.size() > 1,
                ..Placement::replicated(tp)
            },
            _ => Placement::replicated(tp),
        }
    }
}

impl<B: ParallelOps + FusedOps> SelfAttention<B> {
    /// `[batch, seq, hidden]` → `[batch, seq, hidden]` (`seq` is this rank's part with sequence
    /// parallelism); a token sees the tokens at or before its global position only.
    pub fn forward(&self, x: Tensor<B, 3>, positions: &SequencePositions<B>) -> Tensor<B, 3> {
        let x = self.tp.enter(x);
        let qkv = crate::fp8::linear(&self.qkv, x, self.fp8.as_ref().map(|f| &f.0));
        let context = self.attend(qkv, positions, false);
        self.project(context)
    }

    /// [`Self::forward`] of `norm(x)`: in fp8 on one tensor-parallel rank, the norm runs
    /// inside the QKV projection's node (`Norm::fp8_input`), and so does RoPE where attention
    /// takes the packed projection (ferrotron-ops `fp8/rope.rs`); the output projection's node then
    /// takes in the block's `residual` add where one is given.
    pub(crate) fn forward_normed(
        &self,
        x: Tensor<B, 3>,
        norm: &Norm<B>,
        positions: &SequencePositions<B>,
        residual: Option<Fp8Residual<B>>,
    ) -> Sublayer<B> {
        let fused = match &self.fp8 {
            Some((fp8, proj)) if self.tp.size() == 1 => norm.fp8_input(&x).map(|n| (fp8, proj, n)),
            _ => None,
        };
        let Some((fp8, proj, input_norm)) = fused else {
            return Sublayer::Output(self.forward(norm.forward(x), positions));
        };
        let [_, seq, _] = x.dims();
        let rope = match &self.rope {
            // QK-norm comes between the projection and RoPE, so RoPE stays out of the node.
            Some(rope) if self.packed(positions) && self.q_norm.is_none() => {
                let (cos, sin) = rope.packed_tables(positions, seq);
                Some(Fp8Rope {
                    cos: cos.into_primitive().tensor(),
                    sin: sin.into_primitive().tensor(),
                    groups: self.num_groups,
                    slots: self.num_heads / self.num_groups + 2,
                    head_dim: self.head_dim,
                })
            }
            _ => None,
        };
        let rotated = rope.is_some();
        let qkv = crate::fp8::fused_linear(&self.qkv, x, Some(input_norm), (rope, None), fp8);
        let context = self.attend(qkv, positions, rotated);
        match residual {
            Some(residual) => Sublayer::WithResidual(crate::fp8::fused_linear(
                &self.proj,
                context,
                None,
                (None, Some(residual)),
                proj,
            )),
            None => Sublayer::Output(self.project(context)),
        }
    }

    /// Whether attention runs straight from the packed projection (one context-parallel rank,
    /// no masks by global position).
    fn packed(&self, positions: &SequencePositions<B>) -> bool {
        self.cp.size() == 1 && positions.future().is_none()
    }

    /// Attention from the packed projection `qkv [batch, seq, groups·(per_group + 2)·head_dim]`
    /// (its query and key slots already `rotated` by RoPE, or not): the context
    /// `[batch, seq, heads·head_dim]`.
    fn attend(
        &self,
        qkv: Tensor<B, 3>,
        positions: &SequencePositions<B>,
        rotated: bool,
    ) -> Tensor<B, 3> {
        let [batch, seq, _] = qkv.dims();
        let (heads, groups, head_dim) = (self.num_heads, self.num_groups, self.head_dim);
        let per_group = heads / groups;
        let qkv = self.qk_norm(qkv.reshape([batch, seq, groups, per_group + 2, head_dim]));
        let spec = AttentionSpec {
            causal: true,
            scale: None,
            dropout: self.dropout.prob,
            window: self.window,
        };
        if self.packed(positions) {
            // Straight from the packed projection, rotated in place where the model has RoPE:
            // a kernel hands back one packed gradient instead of three slices' zero-padded ones
            // (see ferrotron-ops `op/qkv.rs`, `op/rope.rs`).
            let qkv = match &self.rope {
                Some(rope) if !rotated => rope.apply_packed(qkv, positions),
                _ => qkv,
            };
            let context: Tensor<B, 4> = Tensor::from_primitive(TensorPrimitive::Float(
                B::fused_qkv_attention(qkv.into_primitive().tensor(), spec),
            ));
            return context.reshape([batch, seq, heads * head_dim]);
        }
        let (query, key, value) = split_qkv(qkv);

        let (query, key) = match &self.rope {
            Some(rope) => (rope.apply(query, positions), rope.apply(key, positions)),
            None => (query, key),
        };
        let (key, value) = if self.cp.size() > 1 {
            (
                gather_from_sequence_region(key, 2, &self.cp),
                gather_from_sequence_region(value, 2, &self.cp),
            )
        } else {
            (key, value)
        };
        let context = match positions.hidden_keys(self.window) {
            // One sequence chunk per rank: causal attention through the fused op (the composed
            // default is the arithmetic this layer always had; a GPU backend runs one kernel
            // on the unrepeated grouped K/V).
            None => Tensor::from_primitive(TensorPrimitive::Float(B::fused_attention(
                query.into_primitive().tensor(),
                key.into_primitive().tensor(),
                value.into_primitive().tensor(),
                spec,
            ))),
            // Context parallel: keys from every chunk, masked by global position (composed).
            Some(hidden) => {
                let key = repeat_groups(key, per_group);
                let value = repeat_groups(value, per_group);
                if self.dropout.prob > 0.0 && B::ad_enabled(&query.device()) {
                    self.attention_with_dropout(query, key, value, hidden)
                } else {
                    let [_, _, keys, _] = key.dims();
                    let mask = hidden.unsqueeze::<4>().expand([batch, heads, seq, keys]);
                    attention(query, key, value, Some(mask), None, Default::default())
                }
            }
        };
        context
            .swap_dims(1, 2)
            .reshape([batch, seq, heads * head_dim])
    }

    /// QK-norm of the packed projection `[batch, seq, groups, slots, head_dim]` where the model
    /// has it (the value slot untouched), else the projection as it is.
    fn qk_norm(&self, qkv: Tensor<B, 5>) -> Tensor<B, 5> {
        let (Some(q_norm), Some(k_norm)) = (&self.q_norm, &self.k_norm) else {
            return qkv;
        };
        let (q_weight, q_bias, spec) = q_norm.primitives();
        let (k_weight, k_bias, _) = k_norm.primitives();
        let params = QkNormParams {
            weight: [q_weight, k_weight],
            bias: q_bias.zip(k_bias).map(|(q, k)| [q, k]),
        };
        Tensor::from_primitive(TensorPrimitive::Float(B::fused_qk_norm(
            qkv.into_primitive().tensor(),
            params,
            spec,
        )))
    }

    /// The output projection of the `[batch, seq, heads·head_dim]` context.
    fn project(&self, context: Tensor<B, 3>) -> Tensor<B, 3> {
        crate::fp8::row_parallel(
            &self.tp,
            &self.proj,
            context,
            self.fp8.as_ref().map(|f| &f.1),
        )
    }

    /// Attention over gathered keys with a global-position mask (true: hidden) and live
    /// dropout.
    fn attention_with_dropout(
        &self,
        query: Tensor<B, 4>,
        key: Tensor<B, 4>,
        value: Tensor<B, 4>,
        hidden: Tensor<B, 2, Bool>,
    ) -> Tensor<B, 4> {
        let [batch, heads, seq, _] = query.dims();
        let [_, _, keys, _] = key.dims();
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let scores = query.matmul(key.swap_dims(2, 3)) * scale;
        let hidden = hidden.unsqueeze::<4>().expand([batch, heads, seq, keys]);
        let probabilities = softmax(scores.mask_fill(hidden, f32::NEG_INFINITY), 3);
        self.dropout.forward(probabilities).matmul(value)
    }
}

#[cfg(test)]
mod tests {
    use burn::module::Param;
    use burn::tensor::Distribution;

    use super::*;
    use crate::tests::{Cpu, config, llama_model, values};

    /// Grouped-query attention must equal multi-head attention whose heads in a group share
    /// identical key/value projections.
    #[test]
    fn grouped_query_attention_equals_mha_with_shared_kv_heads() {
        let device = Default::default();
        let gqa_config = config(&llama_model()); // 4 heads, 2 groups, head_dim 4
        let mut mha_model = llama_model();
        mha_model.num_query_groups = None;
        let mha_config = config(&mha_model);
        let gqa = SelfAttention::<Cpu>::new(&gqa_config, &device);
        let mut mha = SelfAttention::<Cpu>::new(&mha_config, &device);

        let d = 4;
        let weight = gqa.qkv.weight.val(); // [16, 2 groups · (2 q + k + v) · 4]
        let column = |group: usize, slot: usize| {
            let start = (group * 4 + slot) * d;
            weight.clone().slice_dim(1, start..start + d)
        };
        let mut pieces = Vec::new();
        for head in 0..4 {
            let group = head / 2;
            pieces.push(column(group, head % 2)); // its query
            pieces.push(column(group, 2)); // the group's key
            pieces.push(column(group, 3)); // the group's value
        }
        mha.qkv.weight = Param::from_tensor(Tensor::cat(pieces, 1));
        mha.proj.weight = Param::from_tensor(gqa.proj.weight.val());

        let x = Tensor::<Cpu, 3>::random([2, 6, 16], Distribution::Normal(0.0, 1.0), &device);
        let positions = SequencePositions::new(6, 0, 1, &device).expect("one cp rank");
        let a = values(gqa.forward(x.clone(), &positions));
        let b = values(mha.forward(x, &positions));
        for (u, v) in a.iter().zip(&b) {
            assert!((u - v).abs() < 1e-5, "{u} vs {v}");
        }
    }

    /// QK-norm makes attention blind to the scale of the query and key projections (the value
    /// slot is left alone): scaling their columns changes nothing with it and much without it.
    #[test]
    fn qk_norm_normalises_query_and_key_heads_but_not_values() {
        let device = Default::default();
        // Inputs large enough that the scores, not only their softmax's uniform start, matter.
        let x = Tensor::<Cpu, 3>::random([2, 6, 16], Distribution::Normal(0.0, 10.0), &device);
        let positions = SequencePositions::new(6, 0, 1, &device).expect("one cp rank");
        for qk_layernorm in [true, false] {
            let mut model = llama_model(); // 4 heads in 2 groups of (2 q, k, v) slots of 4
            model.qk_layernorm = qk_layernorm;
            model.norm_epsilon = 1e-12;
            let attention = SelfAttention::<Cpu>::new(&config(&model), &device);
            let mut scaled = attention.clone();
            let slots = Tensor::<Cpu, 1>::from_floats([3.0, 3.0, 3.0, 1.0], &device)
                .reshape([1, 1, 4, 1])
                .expand([1, 2, 4, 4])
                .reshape([1, 32]);
            scaled.qkv.weight = Param::from_tensor(attention.qkv.weight.val() * slots);
            let a = values(attention.forward(x.clone(), &positions));
            let b = values(scaled.forward(x.clone(), &positions));
            let largest = a
                .iter()
                .zip(&b)
                .map(|(u, v)| (u - v).abs())
                .fold(0.0, f32::max);
            let size = a.iter().map(|u| u.abs()).fold(0.0, f32::max);
            if qk_layernorm {
                assert!(largest < 1e-5 * size, "{largest} of {size}");
            } else {
                assert!(largest > 1e-2 * size, "{largest} of {size}");
            }
        }
    }

    #[test]
    fn multi_query_attention_works() {
        let mut model = llama_model();
        model.num_query_groups = Some(1);
        let attention = SelfAttention::<Cpu>::new(&config(&model), &Default::default());
        let x = Tensor::<Cpu, 3>::ones([1, 5, 16], &Default::default());
        let positions = SequencePositions::new(5, 0, 1, &Default::default()).expect("one cp rank");
        assert_eq!(attention.forward(x, &positions).dims(), [1, 5, 16]);
    }
}
