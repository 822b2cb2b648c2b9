//! Multi-latent attention (DeepSeek-V2/V3; Megatron's `--multi-latent-attention`,
//! `MLASelfAttention`): queries and keys/values come out of low-rank latents, so a layer's
//! projections (and, at inference, its cache) are far smaller than grouped-query attention's.
//! This is its own layer rather than a switch of `SelfAttention` because nothing of the fused,
//! per-group QKV projection carries over: five projections instead of one, a rotary part
//! decoupled from the rest of each head, and a value head dim other than the query/key one.
//!
//! Megatron's arithmetic, parameter names and layouts (checked against Megatron-Core's
//! `multi_latent_attention.py` and transformers' `DeepseekV3Attention`, see the tests):
//! - query: `linear_q_down_proj [hidden → q_lora_rank]`, `q_layernorm` (with `qk_layernorm`),
//!   `linear_q_up_proj [q_lora_rank → heads·q_head_dim]`; without `q_lora_rank` one
//!   `linear_q_proj [hidden → heads·q_head_dim]`. Each head is `[q_nope | q_rope]`
//!   (`qk_head_dim` + `qk_pos_emb_head_dim` channels).
//! - key/value: `linear_kv_down_proj [hidden → kv_lora_rank + qk_pos_emb_head_dim]`, split into
//!   the latent (normed by `kv_layernorm` with `qk_layernorm`) and `k_pos_emb`, one rotary key
//!   part shared by every head; `linear_kv_up_proj [kv_lora_rank → heads·(qk_head_dim +
//!   v_head_dim)]`, each head `[k_nope | v]`.
//! - RoPE on `q_rope` and `k_pos_emb` the MLA way: the channels are stored interleaved, so they
//!   are de-interleaved first (`cat(t[0::2], t[1::2])`, Megatron's `_apply_rotary_pos_emb_bshd`
//!   with `multi_latent_attention`) and then rotated half by half; YaRN's cos/sin factor is in
//!   the tables (`rope.rs`).
//! - attention of `[q_nope | q_rope]` against `[k_nope | k_rope]` with the values' own head dim,
//!   softmax scale `mscale² / sqrt(q_head_dim)` (`mscale` YaRN's of `mscale_all_dim`), then
//!   `linear_proj [heads·v_head_dim → hidden]`. Megatron's init: normal(0, std) for every
//!   projection, `std / sqrt(2·layers)` for `linear_proj`; no bias but `linear_proj`'s
//!   (`add_bias_linear`).
//!
//! Tensor parallelism as Megatron splits it: the up projections are column-parallel by head,
//! `linear_proj` row-parallel; the down projections and latent norms are replicated and run on
//! this rank's tokens, and their outputs (the latents and `k_pos_emb`, much narrower than the
//! hidden states) enter the tensor-parallel region: all-gathered along the sequence with
//! sequence parallelism (so the replicated weights see part of the sequence: their gradients
//! are partial sums over tp), otherwise copied in (the backward all-reduces the latents'
//! gradients, so every rank's replicated gradient is already whole). Context parallelism
//! gathers keys and values over cp and masks by global position, as `SelfAttention` does.
//!
//! Attention itself goes through `FusedOps::fused_attention` with `query/key [b, heads, s,
//! q_head_dim]`, `value [b, heads, s, v_head_dim]` and the scale in the spec (a GPU backend's
//! fused kernel must take `d_v ≠ d_qk`); under cp it is composed with the global-position mask.

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, Tensor, TensorPrimitive};
use ferrotron_ops::{AttentionSpec, Fp8Linear, FusedOps};
use ferrotron_parallel::collectives::gather_from_sequence_region;
use ferrotron_parallel::{Comm, ParallelOps, solo};
use ferrotron_recipe::RopeScalingType;

use crate::init::{normal_linear, scaled_std};
use crate::norm::Norm;
use crate::parallel::{Placement, SequencePositions, TensorParallel, cut_module};
use crate::rope::RotaryEmbedding;
use crate::{MlaConfig, ModelConfig, ModelError};

/// The layer's linears by parameter path, in the order fp8 handles are given to them.
const LINEARS: [&str; 6] = [
    "linear_q_proj",
    "linear_q_down_proj",
    "linear_q_up_proj",
    "linear_kv_down_proj",
    "linear_kv_up_proj",
    "linear_proj",
];

#[derive(Module, Debug)]
pub struct MultiLatentAttention<B: Backend> {
    /// `[hidden, heads·q_head_dim]` without `q_lora_rank` (columns divided by tp).
    linear_q_proj: Option<Linear<B>>,
    /// `[hidden, q_lora_rank]` with `q_lora_rank` (replicated).
    linear_q_down_proj: Option<Linear<B>>,
    /// `[q_lora_rank]` with `q_lora_rank` and `qk_layernorm` (replicated).
    q_layernorm: Option<Norm<B>>,
    /// `[q_lora_rank, heads·q_head_dim]` with `q_lora_rank` (columns divided by tp).
    linear_q_up_proj: Option<Linear<B>>,
    /// `[hidden, kv_lora_rank + qk_pos_emb_head_dim]` (replicated).
    linear_kv_down_proj: Linear<B>,
    /// `[kv_lora_rank]` with `qk_layernorm` (replicated).
    kv_layernorm: Option<Norm<B>>,
    /// `[kv_lora_rank, heads·(qk_head_dim + v_head_dim)]` (columns divided by tp).
    linear_kv_up_proj: Linear<B>,
    /// `[heads·v_head_dim, hidden]` (rows divided by tp).
    linear_proj: Linear<B>,
    /// Tables over `qk_pos_emb_head_dim` channels.
    rope: RotaryEmbedding<B>,
    dropout: Dropout,
    /// Heads on this rank.
    num_heads: usize,
    #[module(skip)]
    dims: MlaConfig,
    /// `mscale² / sqrt(q_head_dim)`.
    #[module(skip)]
    softmax_scale: f64,
    #[module(skip)]
    tp: TensorParallel,
    #[module(skip)]
    cp: Comm,
    /// fp8 GEMMs (`crate::fp8`) by linear, where the plan puts this layer in fp8.
    #[module(skip)]
    fp8: Vec<(&'static str, Fp8Linear)>,
}

impl<B: Backend> MultiLatentAttention<B> {
    pub fn new(config: &ModelConfig, mla: &MlaConfig, device: &B::Device) -> Self {
        let heads = config.num_attention_heads;
        let hidden = config.hidden_size;
        let std = config.init_method_std;
        let linear = |d_in, d_out| normal_linear(d_in, d_out, std, false, device);
        let norm = |dim| {
            config
                .qk_layernorm
                .then(|| Norm::new(config.normalization, dim, config.norm_epsilon, device))
        };
        let q_out = heads * mla.q_head_dim();
        // Construction order is Megatron's (q, then kv, then the output), so the seeded draws
        // are too.
        let (linear_q_proj, linear_q_down_proj, q_layernorm, linear_q_up_proj) =
            match mla.q_lora_rank {
                None => (Some(linear(hidden, q_out)), None, None, None),
                Some(rank) => (
                    None,
                    Some(linear(hidden, rank)),
                    norm(rank),
                    Some(linear(rank, q_out)),
                ),
            };
        let linear_kv_down_proj = linear(hidden, mla.kv_lora_rank + mla.qk_pos_emb_head_dim);
        let kv_layernorm = norm(mla.kv_lora_rank);
        let linear_kv_up_proj =
            linear(mla.kv_lora_rank, heads * (mla.qk_head_dim + mla.v_head_dim));
        let linear_proj = normal_linear(
            heads * mla.v_head_dim,
            hidden,
            scaled_std(std, config.num_layers),
            config.add_bias_linear,
            device,
        );
        // Keep in step with `GptModel::max_sequence_length`.
        let positions = config.max_position_embeddings.max(config.seq_length);
        let rope = RotaryEmbedding::new(
            mla.qk_pos_emb_head_dim,
            positions,
            config.rotary_base,
            config.rope_scaling.as_ref(),
            device,
        );
        MultiLatentAttention {
            linear_q_proj,
            linear_q_down_proj,
            q_layernorm,
            linear_q_up_proj,
            linear_kv_down_proj,
            kv_layernorm,
            linear_kv_up_proj,
            linear_proj,
            rope,
            dropout: DropoutConfig::new(config.attention_dropout).init(),
            num_heads: heads,
            dims: *mla,
            softmax_scale: softmax_scale(config, mla),
            tp: TensorParallel::single(),
            cp: solo(),
            fp8: Vec::new(),
        }
    }

    /// Paths of the linears this layer has, in the order [`Self::with_fp8`] takes handles.
    pub(crate) fn linear_names(&self) -> Vec<&'static str> {
        LINEARS
            .into_iter()
            .filter(|name| self.linear(name).is_some())
            .collect()
    }

    /// The same layer with fp8 GEMMs, one handle per [`Self::linear_names`] entry.
    pub(crate) fn with_fp8(self, handles: Vec<Fp8Linear>) -> Self {
        let fp8 = self.linear_names().into_iter().zip(handles).collect();
        MultiLatentAttention { fp8, ..self }
    }

    fn linear(&self, name: &str) -> Option<&Linear<B>> {
        match name {
            "linear_q_proj" => self.linear_q_proj.as_ref(),
            "linear_q_down_proj" => self.linear_q_down_proj.as_ref(),
            "linear_q_up_proj" => self.linear_q_up_proj.as_ref(),
            "linear_kv_down_proj" => Some(&self.linear_kv_down_proj),
            "linear_kv_up_proj" => Some(&self.linear_kv_up_proj),
            "linear_proj" => Some(&self.linear_proj),
            _ => None,
        }
    }

    fn fp8_of(&self, name: &str) -> Option<&Fp8Linear> {
        self.fp8
            .iter()
            .find(|(linear, _)| *linear == name)
            .map(|(_, handle)| handle)
    }

    /// This rank's part of a full one-rank layer: `heads / tp` heads, computing over `tp` and
    /// `cp`.
    pub fn shard(&self, tp: &TensorParallel, cp: &Comm) -> Result<Self, ModelError> {
        let size = tp.size();
        if !self.num_heads.is_multiple_of(size) {
            return Err(ModelError::Layout(format!(
                "{} attention heads cannot be split over {size} tensor-parallel ranks (Megatron splits multi-latent attention by head)",
                self.num_heads
            )));
        }
        let placed = cut_module(self, |name| Self::placement(name, tp))?;
        Ok(MultiLatentAttention {
            num_heads: self.num_heads / size,
            tp: tp.clone(),
            cp: cp.clone(),
            ..placed
        })
    }

    /// How parameter `name` (`linear_q_up_proj.weight`, `kv_layernorm.Rms.gamma`, ...) is split
    /// over `tp`: the up projections by head (columns), `linear_proj` by rows; the down
    /// projections and latent norms replicated, run on this rank's tokens (a partial gradient
    /// with sequence parallelism, as every replicated weight).
    pub fn placement(name: &str, tp: &TensorParallel) -> Placement {
        match name {
            "linear_q_proj.weight" | "linear_q_up_proj.weight" | "linear_kv_up_proj.weight" => {
                Placement::split(tp, 1, 1)
            }
            "linear_proj.weight" => Placement::split(tp, 0, 1),
            _ => Placement::replicated(tp),
        }
    }
}

/// Megatron's `MLASelfAttention.softmax_scale`: `mscale² / sqrt(q_head_dim)`, `mscale` YaRN's
/// `0.1·mscale_all_dim·ln(factor) + 1` (1 for a factor ≤ 1 and without YaRN).
fn softmax_scale(config: &ModelConfig, mla: &MlaConfig) -> f64 {
    let mscale = match &config.rope_scaling {
        Some(scaling) if scaling.scaling_type == RopeScalingType::Yarn && scaling.factor > 1.0 => {
            0.1 * scaling.mscale_all_dim() * scaling.factor.ln() + 1.0
        }
        _ => 1.0,
    };
    mscale * mscale / (mla.q_head_dim() as f64).sqrt()
}

/// `cat(t[.., 0::2], t[.., 1::2])` along the last dim: Megatron's MLA de-interleave of the
/// rotary channels before rotate-half RoPE.
fn deinterleave<B: Backend>(t: Tensor<B, 4>) -> Tensor<B, 4> {
    let [a, b, c, d] = t.dims();
    t.reshape([a, b, c, d / 2, 2])
        .swap_dims(3, 4)
        .reshape([a, b, c, d])
}

impl<B: ParallelOps + FusedOps> MultiLatentAttention<B> {
    /// `[batch, seq, hidden]` → `[batch, seq, hidden]` (`seq` is this rank's part with sequence
    /// parallelism); a token sees the tokens at or before its global position only.
    pub fn forward(&self, x: Tensor<B, 3>, positions: &SequencePositions<B>) -> Tensor<B, 3> {
        let (query, key, value) = self.query_key_value(x, positions);
        let [batch, heads, seq, _] = query.dims();
        let (key, value) = if self.cp.size() > 1 {
            (
                gather_from_sequence_region(key, 2, &self.cp),
                gather_from_sequence_region(value, 2, &self.cp),
            )
        } else {
            (key, value)
        };
        let context = match positions.hidden_keys(None) {
            None => Tensor::from_primitive(TensorPrimitive::Float(B::fused_attention(
                query.into_primitive().tensor(),
                key.into_primitive().tensor(),
                value.into_primitive().tensor(),
                AttentionSpec {
                    causal: true,
                    scale: Some(self.softmax_scale),
                    dropout: self.dropout.prob,
                    window: None,
                },
            ))),
            Some(hidden) => self.masked_attention(query, key, value, hidden),
        };
        let context = context
            .swap_dims(1, 2)
            .reshape([batch, seq, heads * self.dims.v_head_dim]);
        crate::fp8::row_parallel(
            &self.tp,
            &self.linear_proj,
            context,
            self.fp8_of("linear_proj"),
        )
    }

    /// `linear(x)`, in fp8 where `name` has a handle.
    fn project<const D: usize>(&self, name: &'static str, x: Tensor<B, D>) -> Tensor<B, D> {
        let layer = self.linear(name).expect("a linear this layer has");
        crate::fp8::linear(layer, x, self.fp8_of(name))
    }

    /// Query and key `[batch, heads, seq, q_head_dim]` (rotated) and value `[batch, heads, seq,
    /// v_head_dim]` of this rank's heads for the whole local sequence (gathered over tp with
    /// sequence parallelism).
    fn query_key_value(
        &self,
        x: Tensor<B, 3>,
        positions: &SequencePositions<B>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) {
        let MlaConfig {
            kv_lora_rank,
            qk_head_dim,
            qk_pos_emb_head_dim: rope_dim,
            v_head_dim,
            ..
        } = self.dims;
        let heads = self.num_heads;
        let normed = |norm: &Option<Norm<B>>, t: Tensor<B, 3>| match norm {
            Some(norm) => norm.forward(t),
            None => t,
        };
        // Down projections and norms on this rank's tokens, then the narrow results enter the
        // tensor-parallel region in one collective.
        let kv_combined = self.project("linear_kv_down_proj", x.clone());
        let kv_latent = normed(
            &self.kv_layernorm,
            kv_combined.clone().slice_dim(2, 0..kv_lora_rank),
        );
        let k_pos_emb = kv_combined.slice_dim(2, kv_lora_rank..kv_lora_rank + rope_dim);
        let (q, kv_latent, k_pos_emb) = match self.dims.q_lora_rank {
            Some(q_lora_rank) => {
                let q_latent = normed(&self.q_layernorm, self.project("linear_q_down_proj", x));
                let entered = self
                    .tp
                    .enter(Tensor::cat(vec![q_latent, kv_latent, k_pos_emb], 2));
                let kv_start = q_lora_rank;
                let rope_start = kv_start + kv_lora_rank;
                let q_latent = entered.clone().slice_dim(2, 0..kv_start);
                (
                    self.project("linear_q_up_proj", q_latent),
                    entered.clone().slice_dim(2, kv_start..rope_start),
                    entered.slice_dim(2, rope_start..rope_start + rope_dim),
                )
            }
            None => {
                let entered = self.tp.enter(Tensor::cat(vec![kv_latent, k_pos_emb], 2));
                (
                    self.project("linear_q_proj", self.tp.enter(x)),
                    entered.clone().slice_dim(2, 0..kv_lora_rank),
                    entered.slice_dim(2, kv_lora_rank..kv_lora_rank + rope_dim),
                )
            }
        };
        let [batch, seq, _] = q.dims();
        let q_head_dim = qk_head_dim + rope_dim;
        let q = q.reshape([batch, seq, heads, q_head_dim]).swap_dims(1, 2);
        let q_nope = q.clone().slice_dim(3, 0..qk_head_dim);
        let q_rope = self.rope.apply(
            deinterleave(q.slice_dim(3, qk_head_dim..q_head_dim)),
            positions,
        );
        let k_rope = self
            .rope
            .apply(
                deinterleave(k_pos_emb.reshape([batch, 1, seq, rope_dim])),
                positions,
            )
            .expand([batch, heads, seq, rope_dim]);
        let kv = self
            .project("linear_kv_up_proj", kv_latent)
            .reshape([batch, seq, heads, qk_head_dim + v_head_dim])
            .swap_dims(1, 2);
        let k_nope = kv.clone().slice_dim(3, 0..qk_head_dim);
        let value = kv.slice_dim(3, qk_head_dim..qk_head_dim + v_head_dim);
        (
            Tensor::cat(vec![q_nope, q_rope], 3),
            Tensor::cat(vec![k_nope, k_rope], 3),
            value,
        )
    }

    /// Attention over keys gathered from every cp rank with the global-position mask (true:
    /// hidden), composed: burn's attention op, or matmul–softmax–dropout–matmul while dropout
    /// is live.
    fn masked_attention(
        &self,
        query: Tensor<B, 4>,
        key: Tensor<B, 4>,
        value: Tensor<B, 4>,
        hidden: Tensor<B, 2, Bool>,
    ) -> Tensor<B, 4> {
        let [batch, heads, seq, _] = query.dims();
        let keys = key.dims()[2];
        let hidden = hidden.unsqueeze::<4>().expand([batch, heads, seq, keys]);
        if self.dropout.prob > 0.0 && B::ad_enabled(&query.device()) {
            let scores = query.matmul(key.swap_dims(2, 3)) * self.softmax_scale;
            let probabilities = softmax(scores.mask_fill(hidden, f32::NEG_INFINITY), 3);
            self.dropout.forward(probabilities).matmul(value)
        } else {
            let options = AttentionModuleOptions {
                scale: Some(self.softmax_scale),
                ..Default::default()
            };
            attention(query, key, value, Some(hidden), None, options)
        }
    }
}

#[cfg(test)]
mod tests;
