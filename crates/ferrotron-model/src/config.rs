//! The model's resolved configuration. The recipe leaves derivable fields as `Option`s and
//! Megatron derives them from others; resolving them once here means every layer reads a plain
//! number and every inconsistent combination is refused in one place, before any allocation.

use burn::tensor::backend::Backend;
use ferrotron_recipe::{
    Activation, LoadBalancing, Mla, Model, Moe, Normalization, PositionEmbedding, RopeScalingType,
    ScoreFunction, TokenDispatcher, TokenDropPolicy,
};

use crate::{GptModel, ModelError};
pub use ferrotron_ops::GroupLimit;
pub use ferrotron_recipe::RopeScaling;

/// Every number and switch the model needs, with Megatron's derived defaults filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub num_layers: usize,
    pub hidden_size: usize,
    pub ffn_hidden_size: usize,
    pub num_attention_heads: usize,
    pub num_query_groups: usize,
    pub kv_channels: usize,
    /// Embedding and output-layer rows (Megatron pads the vocabulary).
    pub padded_vocab_size: usize,
    /// The tokenizer's real vocabulary; sampling never emits an id at or above it.
    pub vocab_size: usize,
    pub seq_length: usize,
    pub max_position_embeddings: usize,
    pub position_embedding: PositionEmbedding,
    pub rotary_base: f64,
    pub normalization: Normalization,
    pub norm_epsilon: f64,
    pub activation: Activation,
    pub tie_embeddings: bool,
    pub add_bias_linear: bool,
    /// Rotary frequency scaling, every key of its type set (`None`: unscaled).
    pub rope_scaling: Option<RopeScaling>,
    /// A bias on the query/key/value projection (true whenever `add_bias_linear` is).
    pub add_qkv_bias: bool,
    /// Megatron's `--qk-layernorm`: a per-head norm over `kv_channels` on queries and keys
    /// before the rotary embedding.
    pub qk_layernorm: bool,
    /// `(left, right)` as Megatron's `--window-size`: query `i` sees keys `i - left ..= i`
    /// (`right` is always 0, causal). `None`: full causal attention.
    pub window_size: Option<(usize, usize)>,
    pub hidden_dropout: f64,
    pub attention_dropout: f64,
    pub init_method_std: f64,
    pub moe: Option<MoeConfig>,
    /// Multi-latent attention (Megatron's `--multi-latent-attention`); `None`: grouped-query
    /// attention over `num_query_groups` and `kv_channels`.
    pub mla: Option<MlaConfig>,
}

/// Multi-latent attention's sizes, resolved (see [`ferrotron_recipe::Mla`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaConfig {
    /// `None`: a full-rank query projection.
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_head_dim: usize,
    pub qk_pos_emb_head_dim: usize,
    pub v_head_dim: usize,
}

impl MlaConfig {
    /// A query's (and a key's) channels per head: the plain part and the rotary part.
    pub fn q_head_dim(&self) -> usize {
        self.qk_head_dim + self.qk_pos_emb_head_dim
    }

    fn resolve(mla: &Mla, model: &Model) -> Result<Self, ModelError> {
        if let Some(rank) = mla.q_lora_rank {
            positive("mla.q_lora_rank", rank)?;
        }
        positive("mla.kv_lora_rank", mla.kv_lora_rank)?;
        positive("mla.qk_head_dim", mla.qk_head_dim)?;
        positive("mla.qk_pos_emb_head_dim", mla.qk_pos_emb_head_dim)?;
        positive("mla.v_head_dim", mla.v_head_dim)?;
        if model.position_embedding != PositionEmbedding::Rope {
            return Err(ModelError::Incompatible(
                "multi-latent attention rotates a decoupled part of queries and keys; it needs \
                 model.position_embedding: rope"
                    .to_owned(),
            ));
        }
        if !mla.qk_pos_emb_head_dim.is_multiple_of(2) {
            return Err(ModelError::Incompatible(format!(
                "rotary position embeddings rotate pairs of channels, so model.mla.qk_pos_emb_head_dim must be even (got {})",
                mla.qk_pos_emb_head_dim
            )));
        }
        if model.num_query_groups() != model.num_attention_heads {
            return Err(ModelError::Incompatible(format!(
                "multi-latent attention has no query groups (Megatron refuses \
                 --group-query-attention with it): leave model.num_query_groups unset (got {})",
                model.num_query_groups()
            )));
        }
        if model.add_qkv_bias {
            return Err(ModelError::Incompatible(
                "model.add_qkv_bias applies to the fused QKV projection, which multi-latent \
                 attention does not have"
                    .to_owned(),
            ));
        }
        if model.window_size.is_some() {
            return Err(ModelError::Incompatible(
                "multi-latent attention has no sliding window: remove model.window_size".to_owned(),
            ));
        }
        Ok(MlaConfig {
            q_lora_rank: mla.q_lora_rank.map(to_usize),
            kv_lora_rank: to_usize(mla.kv_lora_rank),
            qk_head_dim: to_usize(mla.qk_head_dim),
            qk_pos_emb_head_dim: to_usize(mla.qk_pos_emb_head_dim),
            v_head_dim: to_usize(mla.v_head_dim),
        })
    }
}

/// Mixture-of-Experts settings, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub router_topk: usize,
    pub load_balancing: LoadBalancing,
    pub aux_loss_coeff: f64,
    /// 0 disables the router z-loss.
    pub z_loss_coeff: f64,
    pub score_function: ScoreFunction,
    pub pre_softmax: bool,
    pub expert_bias: bool,
    pub expert_bias_update_rate: f64,
    pub group_limit: Option<GroupLimit>,
    /// `None` is dropless.
    pub capacity: Option<Capacity>,
    /// Megatron's `moe_layer_pattern`: whether each layer (`num_layers` of them) is an MoE
    /// layer, from the recipe's `layer_freq` in any of its forms.
    pub layer_pattern: Vec<bool>,
    /// Megatron's `--moe-router-topk-scaling-factor` (1 when the recipe leaves it out): the
    /// routed combine weights are multiplied by it after their normalisation.
    pub topk_scaling_factor: f64,
    pub expert_ffn_hidden_size: usize,
    pub shared_expert_ffn_hidden_size: Option<usize>,
    /// How tokens reach experts on other expert-parallel ranks (one rank: no difference).
    pub token_dispatcher: TokenDispatcher,
}

/// A per-expert token limit and which tokens lose when it is exceeded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Capacity {
    pub factor: f64,
    pub drop_policy: TokenDropPolicy,
    /// Megatron pads each expert's buffer to capacity; the padding carries zero weight, so it
    /// changes buffer shapes but not results.
    pub pad_to_capacity: bool,
}

impl ModelConfig {
    /// Resolve a recipe's model section for an embedding of `padded_vocab_size` rows. The real
    /// vocabulary is `model.vocab_size`, or every row when the recipe leaves it to the tokenizer;
    /// use [`Self::from_model_with_vocab`] when the tokenizer's size is known.
    pub fn from_model(model: &Model, padded_vocab_size: u32) -> Result<Self, ModelError> {
        let vocab_size = model.vocab_size.unwrap_or(padded_vocab_size);
        Self::resolve(model, vocab_size, padded_vocab_size)
    }

    /// As [`Self::from_model`] with the real (tokenizer) vocabulary given, so sampling never
    /// emits a padding id.
    pub fn from_model_with_vocab(
        model: &Model,
        vocab_size: u32,
        padded_vocab_size: u32,
    ) -> Result<Self, ModelError> {
        Self::resolve(model, vocab_size, padded_vocab_size)
    }

    /// Whether layer `index` (0-based) is an MoE layer.
    pub fn is_moe_layer(&self, index: usize) -> bool {
        self.moe
            .as_ref()
            .is_some_and(|moe| moe.layer_pattern.get(index).copied().unwrap_or(false))
    }

    /// Build the model with Megatron's initialisation; deterministic given `B::seed`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> GptModel<B> {
        GptModel::new(self, device)
    }

    fn resolve(model: &Model, vocab_size: u32, padded_vocab_size: u32) -> Result<Self, ModelError> {
        positive("num_layers", model.num_layers)?;
        positive("hidden_size", model.hidden_size)?;
        positive("num_attention_heads", model.num_attention_heads)?;
        positive("seq_length", model.seq_length)?;
        positive("ffn_hidden_size", model.ffn_hidden_size())?;
        positive("num_query_groups", model.num_query_groups())?;
        positive("kv_channels", model.kv_channels())?;
        positive("vocab_size", vocab_size)?;
        divisible(
            "num_attention_heads",
            model.num_attention_heads,
            "num_query_groups",
            model.num_query_groups(),
        )?;
        if padded_vocab_size < vocab_size {
            return Err(ModelError::VocabularyTooLarge {
                vocab: vocab_size,
                padded: padded_vocab_size,
            });
        }
        let max_positions = model.max_position_embeddings();
        if model.position_embedding == PositionEmbedding::Learned
            && model.seq_length > max_positions
        {
            return Err(ModelError::SequenceTooLong {
                seq_length: model.seq_length,
                max_positions,
            });
        }
        probability("hidden_dropout", model.hidden_dropout)?;
        probability("attention_dropout", model.attention_dropout)?;
        if !(model.init_method_std.is_finite() && model.init_method_std >= 0.0) {
            return Err(ModelError::OutOfRange {
                field: "init_method_std",
                value: model.init_method_std,
                expected: "a finite value >= 0",
            });
        }
        if !(model.norm_epsilon.is_finite() && model.norm_epsilon > 0.0) {
            return Err(ModelError::OutOfRange {
                field: "norm_epsilon",
                value: model.norm_epsilon,
                expected: "a finite value > 0",
            });
        }
        if model.position_embedding == PositionEmbedding::Rope {
            // Multi-latent attention rotates its own `qk_pos_emb_head_dim` channels instead.
            if model.mla.is_none() && !model.kv_channels().is_multiple_of(2) {
                return Err(ModelError::Incompatible(format!(
                    "rotary position embeddings rotate pairs of channels, so model.kv_channels must be even (got {})",
                    model.kv_channels()
                )));
            }
            if !(model.rotary_base.is_finite() && model.rotary_base > 0.0) {
                return Err(ModelError::OutOfRange {
                    field: "rotary_base",
                    value: model.rotary_base,
                    expected: "a finite value > 0",
                });
            }
        }
        let rope_scaling = resolve_rope_scaling(model)?;
        let window_size = resolve_window_size(model)?;
        let moe = model
            .moe
            .as_ref()
            .map(|moe| MoeConfig::resolve(moe, model))
            .transpose()?;
        let mla = model
            .mla
            .as_ref()
            .map(|mla| MlaConfig::resolve(mla, model))
            .transpose()?;
        Ok(ModelConfig {
            num_layers: to_usize(model.num_layers),
            hidden_size: to_usize(model.hidden_size),
            ffn_hidden_size: to_usize(model.ffn_hidden_size()),
            num_attention_heads: to_usize(model.num_attention_heads),
            num_query_groups: to_usize(model.num_query_groups()),
            kv_channels: to_usize(model.kv_channels()),
            padded_vocab_size: to_usize(padded_vocab_size),
            vocab_size: to_usize(vocab_size),
            seq_length: to_usize(model.seq_length),
            max_position_embeddings: to_usize(max_positions),
            position_embedding: model.position_embedding,
            rotary_base: model.rotary_base,
            normalization: model.normalization,
            norm_epsilon: model.norm_epsilon,
            activation: model.activation,
            tie_embeddings: model.tie_embeddings,
            add_bias_linear: model.add_bias_linear,
            rope_scaling,
            add_qkv_bias: model.qkv_bias(),
            qk_layernorm: model.qk_layernorm,
            window_size,
            hidden_dropout: model.hidden_dropout,
            attention_dropout: model.attention_dropout,
            init_method_std: model.init_method_std,
            moe,
            mla,
        })
    }
}

/// The recipe's rotary scaling with every default filled, or a refusal of what the tables
/// cannot be built from (the recipe rules say the same with a location; this guards the
/// configurations built without them).
fn resolve_rope_scaling(model: &Model) -> Result<Option<RopeScaling>, ModelError> {
    let Some(scaling) = model.rope_scaling else {
        return Ok(None);
    };
    if model.position_embedding != PositionEmbedding::Rope {
        return Err(ModelError::Incompatible(
            "model.rope_scaling scales rotary embeddings; it needs model.position_embedding: rope"
                .to_owned(),
        ));
    }
    if let Some(key) = scaling.foreign_keys().first() {
        return Err(ModelError::Incompatible(format!(
            "model.rope_scaling.{key} does not apply to type {}",
            scaling.scaling_type.name()
        )));
    }
    let scaling = scaling.with_defaults();
    if !(scaling.factor.is_finite() && scaling.factor > 0.0) {
        return Err(ModelError::OutOfRange {
            field: "rope_scaling.factor",
            value: scaling.factor,
            expected: "a finite value > 0",
        });
    }
    positive(
        "rope_scaling.original_max_position_embeddings",
        scaling.original_max_position_embeddings(),
    )?;
    match scaling.scaling_type {
        RopeScalingType::Llama3 => {
            let (low, high) = (scaling.low_freq_factor(), scaling.high_freq_factor());
            if !(low.is_finite() && high.is_finite() && low > 0.0 && low < high) {
                return Err(ModelError::Incompatible(format!(
                    "model.rope_scaling needs 0 < low_freq_factor < high_freq_factor (got {low} and {high})"
                )));
            }
        }
        RopeScalingType::Linear => {}
        RopeScalingType::Yarn => {
            let (fast, slow) = (scaling.beta_fast(), scaling.beta_slow());
            if !(fast.is_finite() && slow.is_finite() && slow > 0.0 && slow < fast) {
                return Err(ModelError::Incompatible(format!(
                    "model.rope_scaling needs 0 < beta_slow < beta_fast (got {slow} and {fast})"
                )));
            }
            for (field, value) in [
                ("rope_scaling.mscale", scaling.mscale()),
                ("rope_scaling.mscale_all_dim", scaling.mscale_all_dim()),
            ] {
                non_negative(field, value)?;
            }
        }
    }
    Ok(Some(scaling))
}

/// The recipe's attention window, refused unless causal (`right` 0) and at least one key back.
fn resolve_window_size(model: &Model) -> Result<Option<(usize, usize)>, ModelError> {
    let Some([left, right]) = model.window_size else {
        return Ok(None);
    };
    if right != 0 {
        return Err(ModelError::Incompatible(format!(
            "model.window_size [{left}, {right}]: only causal windows are supported (right 0)"
        )));
    }
    positive("window_size[0]", left)?;
    Ok(Some((to_usize(left), 0)))
}

impl MoeConfig {
    fn resolve(moe: &Moe, model: &Model) -> Result<Self, ModelError> {
        positive("moe.num_experts", moe.num_experts)?;
        positive("moe.router_topk", moe.router_topk)?;
        let layer_pattern = moe
            .layer_freq
            .pattern(model.num_layers)
            .map_err(|e| ModelError::Incompatible(format!("model.moe.layer_freq: {e}")))?;
        let topk_scaling_factor = moe.topk_scaling_factor();
        if !(topk_scaling_factor.is_finite() && topk_scaling_factor > 0.0) {
            return Err(ModelError::OutOfRange {
                field: "moe.router_topk_scaling_factor",
                value: topk_scaling_factor,
                expected: "a finite value > 0 (leave it out for 1)",
            });
        }
        positive("moe.ffn_hidden_size", moe.expert_ffn_hidden_size(model))?;
        if moe.router_topk > moe.num_experts {
            return Err(ModelError::Incompatible(format!(
                "model.moe.router_topk ({}) cannot exceed model.moe.num_experts ({})",
                moe.router_topk, moe.num_experts
            )));
        }
        if moe.load_balancing == LoadBalancing::Sinkhorn {
            sinkhorn_compatible(moe)?;
        }
        if moe.expert_bias && moe.score_function != ScoreFunction::Sigmoid {
            return Err(ModelError::Incompatible(
                "model.moe.expert_bias needs model.moe.score_function: sigmoid (DeepSeek-V3 routing)"
                    .to_owned(),
            ));
        }
        non_negative("moe.aux_loss_coeff", moe.aux_loss_coeff)?;
        let z_loss_coeff = moe.z_loss_coeff.unwrap_or(0.0);
        non_negative("moe.z_loss_coeff", z_loss_coeff)?;
        non_negative("moe.expert_bias_update_rate", moe.expert_bias_update_rate)?;
        let group_limit = match (moe.num_groups, moe.group_topk) {
            (None, None) => None,
            (Some(num_groups), Some(group_topk)) => {
                Some(resolve_group_limit(moe, num_groups, group_topk)?)
            }
            _ => {
                return Err(ModelError::Incompatible(
                    "group-limited routing needs both model.moe.num_groups and model.moe.group_topk"
                        .to_owned(),
                ));
            }
        };
        let capacity = match moe.capacity_factor {
            Some(factor) => {
                if !(factor.is_finite() && factor > 0.0) {
                    return Err(ModelError::OutOfRange {
                        field: "moe.capacity_factor",
                        value: factor,
                        expected: "a finite value > 0 (leave it out for dropless routing)",
                    });
                }
                Some(Capacity {
                    factor,
                    drop_policy: moe.token_drop_policy,
                    pad_to_capacity: moe.pad_to_capacity,
                })
            }
            None if moe.pad_to_capacity => {
                return Err(ModelError::Incompatible(
                    "model.moe.pad_to_capacity needs model.moe.capacity_factor".to_owned(),
                ));
            }
            None => None,
        };
        Ok(MoeConfig {
            num_experts: to_usize(moe.num_experts),
            router_topk: to_usize(moe.router_topk),
            load_balancing: moe.load_balancing,
            aux_loss_coeff: moe.aux_loss_coeff,
            z_loss_coeff,
            score_function: moe.score_function,
            pre_softmax: moe.pre_softmax,
            expert_bias: moe.expert_bias,
            expert_bias_update_rate: moe.expert_bias_update_rate,
            group_limit,
            capacity,
            layer_pattern,
            topk_scaling_factor,
            expert_ffn_hidden_size: to_usize(moe.expert_ffn_hidden_size(model)),
            shared_expert_ffn_hidden_size: moe.shared_expert_ffn_hidden_size.map(to_usize),
            token_dispatcher: moe.token_dispatcher,
        })
    }
}

fn resolve_group_limit(
    moe: &Moe,
    num_groups: u32,
    group_topk: u32,
) -> Result<GroupLimit, ModelError> {
    positive("moe.num_groups", num_groups)?;
    positive("moe.group_topk", group_topk)?;
    divisible(
        "moe.num_experts",
        moe.num_experts,
        "moe.num_groups",
        num_groups,
    )?;
    divisible(
        "moe.router_topk",
        moe.router_topk,
        "moe.group_topk",
        group_topk,
    )?;
    if group_topk > num_groups {
        return Err(ModelError::Incompatible(format!(
            "model.moe.group_topk ({group_topk}) cannot exceed model.moe.num_groups ({num_groups})"
        )));
    }
    let experts_in_selected_groups = group_topk * (moe.num_experts / num_groups);
    if experts_in_selected_groups < moe.router_topk {
        return Err(ModelError::Incompatible(format!(
            "model.moe.group_topk ({group_topk}) groups of {} experts hold fewer than router_topk ({}) experts",
            moe.num_experts / num_groups,
            moe.router_topk
        )));
    }
    Ok(GroupLimit {
        num_groups: to_usize(num_groups),
        group_topk: to_usize(group_topk),
    })
}

/// Megatron's Sinkhorn router balances by routing alone: it refuses an auxiliary loss and
/// ignores capacity, expert bias and groups, which here are refused rather than ignored.
fn sinkhorn_compatible(moe: &Moe) -> Result<(), ModelError> {
    let conflicts = [
        (moe.aux_loss_coeff > 0.0, "aux_loss_coeff: 0"),
        (moe.capacity_factor.is_some(), "no capacity_factor"),
        (moe.expert_bias, "expert_bias: false"),
        (
            moe.num_groups.is_some() || moe.group_topk.is_some(),
            "no num_groups/group_topk",
        ),
    ];
    let needed: Vec<&str> = conflicts
        .iter()
        .filter(|(conflict, _)| *conflict)
        .map(|(_, fix)| *fix)
        .collect();
    if needed.is_empty() {
        Ok(())
    } else {
        Err(ModelError::Incompatible(format!(
            "model.moe.load_balancing: sinkhorn balances by routing alone; it needs {}",
            needed.join(", ")
        )))
    }
}

fn to_usize(value: u32) -> usize {
    // u32 always fits in usize on the 32- and 64-bit targets burn supports.
    value as usize
}

fn positive(field: &'static str, value: u32) -> Result<(), ModelError> {
    if value == 0 {
        Err(ModelError::ZeroSize { field })
    } else {
        Ok(())
    }
}

fn divisible(
    numerator_field: &'static str,
    numerator: u32,
    denominator_field: &'static str,
    denominator: u32,
) -> Result<(), ModelError> {
    if numerator.is_multiple_of(denominator) {
        Ok(())
    } else {
        Err(ModelError::NotDivisible {
            numerator_field,
            numerator,
            denominator_field,
            denominator,
        })
    }
}

fn probability(field: &'static str, value: f64) -> Result<(), ModelError> {
    if (0.0..1.0).contains(&value) {
        Ok(())
    } else {
        Err(ModelError::OutOfRange {
            field,
            value,
            expected: "0 <= p < 1",
        })
    }
}

fn non_negative(field: &'static str, value: f64) -> Result<(), ModelError> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(ModelError::OutOfRange {
            field,
            value,
            expected: "a finite value >= 0",
        })
    }
}
