//! The typed recipe. Section and key names follow Megatron-Core's vocabulary so its users can
//! translate flags one to one (`--num-query-groups` is `model.num_query_groups`).
//!
//! Fields that Megatron derives from others (ffn size, kv channels, max positions, vocabulary)
//! are `Option`s here: `None` means "derive it", and [`Recipe::with_derived_defaults`] fills them
//! so `recipe show` prints the values that will actually be used.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Degree;
use crate::layer_freq::LayerFreq;

/// The recipe format version this build reads and writes.
pub const FORMAT_VERSION: u32 = 2;

/// A complete training recipe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    /// Recipe format version; this build reads version 2.
    #[schemars(range(min = 2, max = 2))]
    pub version: u32,
    /// Run name, used in metrics labels and run directories.
    #[schemars(length(min = 1))]
    pub name: String,
    /// A base recipe to deep-merge under this one (a path relative to this file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extends: Option<String>,
    /// A fragment meant only to be extended (`recipes/base/*.yaml`): validated for what it
    /// sets, required keys may be missing, never run; recipes that extend it are not abstract.
    #[serde(
        default,
        rename = "abstract",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub is_abstract: bool,
    pub model: Model,
    #[serde(default)]
    pub parallel: Parallel,
    #[serde(default)]
    pub precision: Precision,
    pub training: Training,
    #[serde(default)]
    pub recompute: Recompute,
    #[serde(default)]
    pub data: Data,
    #[serde(default)]
    pub checkpoint: Checkpoint,
    #[serde(default)]
    pub logging: Logging,
    /// The machines the run targets; needed by `recipe plan` and the layout rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<Cluster>,
    #[serde(default)]
    pub runtime: Runtime,
}

// ---------------------------------------------------------------------------------------------
// model

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Model {
    #[schemars(range(min = 1, max = crate::bounds::MAX_LAYERS))]
    pub num_layers: u32,
    #[schemars(range(min = 1, max = crate::bounds::MAX_HIDDEN))]
    pub hidden_size: u32,
    /// Default: 4 × hidden_size for GELU; for SwiGLU Megatron users usually set it explicitly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::bounds::MAX_FFN_HIDDEN))]
    pub ffn_hidden_size: Option<u32>,
    #[schemars(range(min = 1, max = crate::bounds::MAX_HEADS))]
    pub num_attention_heads: u32,
    /// Grouped-query attention groups (key/value heads). Default: num_attention_heads (MHA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::bounds::MAX_HEADS))]
    pub num_query_groups: Option<u32>,
    /// Per-head dimension. Default: hidden_size / num_attention_heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::bounds::MAX_KV_CHANNELS))]
    pub kv_channels: Option<u32>,
    /// Vocabulary size before padding. Default: the tokenizer's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::bounds::MAX_VOCAB))]
    pub vocab_size: Option<u32>,
    /// Pad the vocabulary to a multiple of this times the tensor-parallel degree (Megatron: 128).
    #[serde(default = "defaults::make_vocab_size_divisible_by")]
    #[schemars(range(min = 1, max = crate::bounds::MAX_VOCAB_MULTIPLE))]
    pub make_vocab_size_divisible_by: u32,
    #[schemars(range(min = 1, max = crate::bounds::MAX_SEQ_LENGTH))]
    pub seq_length: u32,
    /// Default: seq_length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::bounds::MAX_SEQ_LENGTH))]
    pub max_position_embeddings: Option<u32>,
    #[serde(default)]
    pub position_embedding: PositionEmbedding,
    /// RoPE theta.
    #[serde(default = "defaults::rotary_base")]
    #[schemars(range(min = 1.0))]
    pub rotary_base: f64,
    #[serde(default)]
    pub normalization: Normalization,
    #[serde(default = "defaults::norm_epsilon")]
    #[schemars(range(min = 0.0))]
    pub norm_epsilon: f64,
    #[serde(default)]
    pub activation: Activation,
    /// Share the input embedding with the output layer.
    #[serde(default = "defaults::yes")]
    pub tie_embeddings: bool,
    /// Biases in linear layers (GPT-2: true, LLaMA: false).
    #[serde(default = "defaults::yes")]
    pub add_bias_linear: bool,
    #[serde(default = "defaults::dropout")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub hidden_dropout: f64,
    #[serde(default = "defaults::dropout")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub attention_dropout: f64,
    #[serde(default = "defaults::init_method_std")]
    #[schemars(range(min = 0.0))]
    pub init_method_std: f64,
    /// Mixture-of-Experts layers; absent for a dense model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<Moe>,
    /// Rotary frequency scaling for a context longer than the one trained first (Llama 3.1's
    /// `llama3`, `linear`, `yarn`); absent: unscaled rotary embeddings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeScaling>,
    /// Megatron's `--add-qkv-bias`: a bias on the query/key/value projection only, every other
    /// linear layer without (Qwen2.5). `add_bias_linear: true` implies it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub add_qkv_bias: bool,
    /// Megatron's `--qk-layernorm`: normalize each query and each key head over its head
    /// dimension (with the model's `normalization`) before the rotary embedding (Qwen3, OLMo2).
    /// One weight of `kv_channels` for queries and one for keys, shared by every head.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub qk_layernorm: bool,
    /// Megatron's `--window-size` `[left, right]`: query `i` sees keys `i - left ..= i + right`
    /// (TransformerEngine's and flash-attention's convention); only causal windows
    /// (`right: 0`) are supported. Hugging Face's `sliding_window: W` (Mistral) lets a query see
    /// `W` keys, itself included, so it is `[W - 1, 0]`. Absent: full causal attention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_size: Option<[u32; 2]>,
    /// Megatron's `--multi-latent-attention` (DeepSeek-V2/V3): queries and keys/values through
    /// low-rank latents, a rotary part of every query head and one rotary key part shared by
    /// every head. With it, `qk_layernorm` puts the norms on the query and key/value latents,
    /// as Megatron's MLA layer spec does; `num_query_groups` and `kv_channels` do not apply.
    /// Absent: standard (grouped-query) attention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mla: Option<Mla>,
}

/// Multi-latent attention's sizes, Megatron's names and defaults (`--q-lora-rank`,
/// `--kv-lora-rank`, `--qk-head-dim`, `--qk-pos-emb-head-dim`, `--v-head-dim`). DeepSeek-V3:
/// 1536, 512, 128, 64, 128.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Mla {
    /// The query latent's size; absent: a full-rank query projection (DeepSeek-V2-Lite).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::bounds::MAX_HIDDEN))]
    pub q_lora_rank: Option<u32>,
    /// The key/value latent's size (the part of a token cached at inference).
    #[serde(default = "defaults::kv_lora_rank")]
    #[schemars(range(min = 1, max = crate::bounds::MAX_HIDDEN))]
    pub kv_lora_rank: u32,
    /// Per head, the query and key channels without rotary embedding.
    #[serde(default = "defaults::qk_head_dim")]
    #[schemars(range(min = 1, max = crate::bounds::MAX_KV_CHANNELS))]
    pub qk_head_dim: u32,
    /// Per head, the rotary query channels; the key's rotary part, of the same size, is one
    /// shared by every head.
    #[serde(default = "defaults::qk_pos_emb_head_dim")]
    #[schemars(range(min = 1, max = crate::bounds::MAX_KV_CHANNELS))]
    pub qk_pos_emb_head_dim: u32,
    /// Per head, the value channels.
    #[serde(default = "defaults::v_head_dim")]
    #[schemars(range(min = 1, max = crate::bounds::MAX_KV_CHANNELS))]
    pub v_head_dim: u32,
}

impl Mla {
    /// A query's (and a key's) channels per head: the plain part and the rotary part.
    pub fn q_head_dim(&self) -> u32 {
        self.qk_head_dim + self.qk_pos_emb_head_dim
    }
}

/// How rotary frequencies are scaled, with the parameters of Hugging Face's `rope_scaling`
/// (whose names Megatron-Core's rotary embeddings take too). Which keys apply depends on
/// `type`; the semantic rules refuse a key of another type, and an unset key of this type
/// takes the default its method returns.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RopeScaling {
    #[serde(rename = "type")]
    pub scaling_type: RopeScalingType,
    /// How many times longer the context is (Megatron's `--rope-scaling-factor`).
    #[schemars(range(min = 0.0))]
    pub factor: f64,
    /// `llama3`: wavelengths longer than original context / low_freq_factor are divided by
    /// `factor`. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub low_freq_factor: Option<f64>,
    /// `llama3`: wavelengths shorter than original context / high_freq_factor are kept.
    /// Default 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub high_freq_factor: Option<f64>,
    /// `llama3` and `yarn`: the context the model was first trained at. Default 8192 (`llama3`,
    /// Llama 3.1's) or 4096 (`yarn`, Megatron-Core's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub original_max_position_embeddings: Option<u32>,
    /// `yarn`: rotations per original context above which a frequency is kept. Default 32.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta_fast: Option<f64>,
    /// `yarn`: rotations per original context below which a frequency is interpolated.
    /// Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta_slow: Option<f64>,
    /// `yarn`: the attention temperature's scale. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mscale: Option<f64>,
    /// `yarn`: the temperature scale divided out (DeepSeek-V3 sets it equal to `mscale`).
    /// Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mscale_all_dim: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RopeScalingType {
    /// Llama 3.1: long wavelengths divided by `factor`, short ones kept, a smooth blend between.
    Llama3,
    /// Positions divided by `factor` (position interpolation).
    Linear,
    /// YaRN: NTK-by-parts interpolation and an attention temperature on cos/sin.
    Yarn,
}

impl RopeScalingType {
    /// The keys of [`RopeScaling`] besides `type` and `factor` this type reads.
    pub fn keys(self) -> &'static [&'static str] {
        match self {
            RopeScalingType::Llama3 => &[
                "low_freq_factor",
                "high_freq_factor",
                "original_max_position_embeddings",
            ],
            RopeScalingType::Linear => &[],
            RopeScalingType::Yarn => &[
                "original_max_position_embeddings",
                "beta_fast",
                "beta_slow",
                "mscale",
                "mscale_all_dim",
            ],
        }
    }

    /// The name as written in a recipe.
    pub fn name(self) -> &'static str {
        match self {
            RopeScalingType::Llama3 => "llama3",
            RopeScalingType::Linear => "linear",
            RopeScalingType::Yarn => "yarn",
        }
    }
}

impl RopeScaling {
    pub fn low_freq_factor(&self) -> f64 {
        self.low_freq_factor.unwrap_or(1.0)
    }

    pub fn high_freq_factor(&self) -> f64 {
        self.high_freq_factor.unwrap_or(4.0)
    }

    pub fn original_max_position_embeddings(&self) -> u32 {
        self.original_max_position_embeddings
            .unwrap_or(match self.scaling_type {
                RopeScalingType::Yarn => 4096,
                _ => 8192,
            })
    }

    pub fn beta_fast(&self) -> f64 {
        self.beta_fast.unwrap_or(32.0)
    }

    pub fn beta_slow(&self) -> f64 {
        self.beta_slow.unwrap_or(1.0)
    }

    pub fn mscale(&self) -> f64 {
        self.mscale.unwrap_or(1.0)
    }

    pub fn mscale_all_dim(&self) -> f64 {
        self.mscale_all_dim.unwrap_or(0.0)
    }

    /// The keys set here that `type` does not read (each one a mistake the rules refuse).
    pub fn foreign_keys(&self) -> Vec<&'static str> {
        let set = [
            ("low_freq_factor", self.low_freq_factor.is_some()),
            ("high_freq_factor", self.high_freq_factor.is_some()),
            (
                "original_max_position_embeddings",
                self.original_max_position_embeddings.is_some(),
            ),
            ("beta_fast", self.beta_fast.is_some()),
            ("beta_slow", self.beta_slow.is_some()),
            ("mscale", self.mscale.is_some()),
            ("mscale_all_dim", self.mscale_all_dim.is_some()),
        ];
        let own = self.scaling_type.keys();
        set.into_iter()
            .filter(|(key, is_set)| *is_set && !own.contains(key))
            .map(|(key, _)| key)
            .collect()
    }

    /// A copy with every key of its type set to the value used (what `recipe show` prints).
    pub fn with_defaults(&self) -> RopeScaling {
        let own = self.scaling_type.keys();
        let pick = |key: &str, value: f64| own.contains(&key).then_some(value);
        RopeScaling {
            scaling_type: self.scaling_type,
            factor: self.factor,
            low_freq_factor: pick("low_freq_factor", self.low_freq_factor()),
            high_freq_factor: pick("high_freq_factor", self.high_freq_factor()),
            original_max_position_embeddings: own
                .contains(&"original_max_position_embeddings")
                .then_some(self.original_max_position_embeddings()),
            beta_fast: pick("beta_fast", self.beta_fast()),
            beta_slow: pick("beta_slow", self.beta_slow()),
            mscale: pick("mscale", self.mscale()),
            mscale_all_dim: pick("mscale_all_dim", self.mscale_all_dim()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PositionEmbedding {
    #[default]
    Learned,
    Rope,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Normalization {
    #[default]
    Layernorm,
    Rmsnorm,
}

/// The MLP's activation. `gelu` is the exact (erf) GELU; `gelu_tanh` its tanh approximation,
/// which GPT-2 trained with (Hugging Face's `gelu_new`), Megatron's fused bias-GELU computes
/// and cuBLASLt's GELU epilogue implements, so on a GPU it runs inside the MLP's GEMMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    #[default]
    Gelu,
    GeluTanh,
    Swiglu,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Moe {
    #[schemars(range(min = 1, max = crate::bounds::MAX_EXPERTS))]
    pub num_experts: u32,
    #[serde(default = "defaults::router_topk")]
    #[schemars(range(min = 1, max = crate::bounds::MAX_EXPERTS))]
    pub router_topk: u32,
    #[serde(default)]
    pub load_balancing: LoadBalancing,
    #[serde(default = "defaults::aux_loss_coeff")]
    #[schemars(range(min = 0.0))]
    pub aux_loss_coeff: f64,
    /// Router z-loss coefficient (ST-MoE); absent disables it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub z_loss_coeff: Option<f64>,
    #[serde(default)]
    pub score_function: ScoreFunction,
    /// Softmax before top-k (Mixtral computes it after).
    #[serde(default)]
    pub pre_softmax: bool,
    /// Auxiliary-loss-free balancing with a per-expert bias (DeepSeek-V3); needs sigmoid scores.
    #[serde(default)]
    pub expert_bias: bool,
    #[serde(default = "defaults::expert_bias_update_rate")]
    #[schemars(range(min = 0.0))]
    pub expert_bias_update_rate: f64,
    /// Group-limited routing: number of expert groups (DeepSeek).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub num_groups: Option<u32>,
    /// Group-limited routing: groups selected per token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub group_topk: Option<u32>,
    /// Expert capacity factor; absent means dropless.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub capacity_factor: Option<f64>,
    #[serde(default)]
    pub token_drop_policy: TokenDropPolicy,
    /// Pad every expert's tokens up to its capacity (needs capacity_factor).
    #[serde(default)]
    pub pad_to_capacity: bool,
    #[serde(default)]
    pub token_dispatcher: TokenDispatcher,
    /// Megatron's `--moe-layer-freq`: an integer N makes every N-th layer from layer 0 an MoE
    /// layer (1: all layers); a list gives one 0/1 per layer (1 = MoE), e.g. DeepSeek-V3's
    /// three dense first layers `[0, 0, 0, 1, …]`, also as Megatron's string
    /// `"([0]*3+[1]*58)"`.
    #[serde(default)]
    pub layer_freq: LayerFreq,
    /// Per-expert FFN size. Default: model.ffn_hidden_size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::bounds::MAX_FFN_HIDDEN))]
    pub ffn_hidden_size: Option<u32>,
    /// FFN size of the shared expert(s); absent for none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::bounds::MAX_FFN_HIDDEN))]
    pub shared_expert_ffn_hidden_size: Option<u32>,
    /// Megatron's `--moe-router-topk-scaling-factor`: the routed experts' combine weights are
    /// multiplied by it after normalisation (DeepSeek-V3's `routed_scaling_factor`, 2.5).
    /// Absent: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub router_topk_scaling_factor: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LoadBalancing {
    #[default]
    AuxLoss,
    SeqAuxLoss,
    Sinkhorn,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ScoreFunction {
    #[default]
    Softmax,
    Sigmoid,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TokenDropPolicy {
    /// Drop the tokens with the lowest router probability.
    #[default]
    Probs,
    /// Drop the tokens that arrive last.
    Position,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TokenDispatcher {
    Allgather,
    #[default]
    Alltoall,
    Flex,
}

// ---------------------------------------------------------------------------------------------
// parallel

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Parallel {
    #[serde(default)]
    pub tensor: Degree,
    #[serde(default)]
    pub pipeline: Degree,
    /// Virtual pipeline stages (model chunks) per pipeline rank; 1 disables interleaving.
    #[serde(default)]
    pub virtual_pipeline: Degree,
    #[serde(default)]
    pub context: Degree,
    #[serde(default)]
    pub expert: Degree,
    /// Expert tensor parallelism. Default: the tensor degree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_tensor: Option<Degree>,
    /// Data-parallel degree. Default `auto`: world / (tensor × pipeline × context).
    #[serde(default = "defaults::auto")]
    pub data: Degree,
    #[serde(default)]
    pub sequence_parallel: bool,
    /// ZeRO-1: shard optimizer states over data-parallel ranks.
    #[serde(default)]
    pub distributed_optimizer: bool,
    /// Megatron's `--num-distributed-optimizer-instances`: shard the optimizer within this many
    /// groups of data × context ranks (each holds a full copy), not across all of them.
    #[serde(default = "defaults::one")]
    #[schemars(range(min = 1))]
    pub distributed_optimizer_instances: u32,
    /// Count the input embedding as a layer when splitting layers over pipeline stages.
    #[serde(default)]
    pub account_for_embedding_in_pipeline_split: bool,
    /// Count the loss/output layer as a layer when splitting layers over pipeline stages.
    #[serde(default)]
    pub account_for_loss_in_pipeline_split: bool,
    /// Layers on the first pipeline stage when it should differ (uneven split).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub num_layers_in_first_pipeline_stage: Option<u32>,
    /// Layers on the last pipeline stage when it should differ (uneven split).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub num_layers_in_last_pipeline_stage: Option<u32>,
    /// Overlap the data-parallel gradient reduce with the backward pass.
    #[serde(default = "defaults::yes")]
    pub overlap_grad_reduce: bool,
    /// Parameter elements per data-parallel gradient bucket (Megatron's `--ddp-bucket-size`);
    /// a bucket is reduced as soon as the backward has produced all of its gradients. Default
    /// 40,000,000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub ddp_bucket_size: Option<u64>,
    /// Overlap the distributed optimizer's parameter all-gather with the forward pass.
    #[serde(default = "defaults::yes")]
    pub overlap_param_gather: bool,
    /// Megatron's `--distributed-timeout-minutes`: how long a rank of a process world (srun,
    /// torchrun, `--nproc-per-node`) waits for the others in a collective or while a group
    /// forms, in every group, before the run fails naming the ranks that did not arrive.
    /// Fractions allowed (0.5 is 30 s). Default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.01, max = 10080.0))]
    pub distributed_timeout_minutes: Option<f64>,
}

/// [`Parallel::distributed_timeout_minutes`] when unset, as in Megatron.
pub const DEFAULT_DISTRIBUTED_TIMEOUT_MINUTES: f64 = 10.0;

impl Parallel {
    /// `distributed_timeout_minutes` as a duration (the default when unset; a value the schema
    /// refuses, should one get here, also reads as the default).
    pub fn distributed_timeout(&self) -> Duration {
        let default = Duration::from_secs_f64(DEFAULT_DISTRIBUTED_TIMEOUT_MINUTES * 60.0);
        self.distributed_timeout_minutes
            .filter(|minutes| (0.01..=10080.0).contains(minutes))
            .and_then(|minutes| Duration::try_from_secs_f64(minutes * 60.0).ok())
            .unwrap_or(default)
    }
}

impl Default for Parallel {
    fn default() -> Self {
        Parallel {
            tensor: Degree::ONE,
            pipeline: Degree::ONE,
            virtual_pipeline: Degree::ONE,
            context: Degree::ONE,
            expert: Degree::ONE,
            expert_tensor: None,
            data: Degree::AUTO,
            sequence_parallel: false,
            distributed_optimizer: false,
            distributed_optimizer_instances: 1,
            account_for_embedding_in_pipeline_split: false,
            account_for_loss_in_pipeline_split: false,
            num_layers_in_first_pipeline_stage: None,
            num_layers_in_last_pipeline_stage: None,
            overlap_grad_reduce: true,
            ddp_bucket_size: None,
            overlap_param_gather: true,
            distributed_timeout_minutes: None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// precision

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Precision {
    #[serde(default)]
    pub dtype: Dtype,
    #[serde(default)]
    pub fp8: Fp8,
    #[serde(default)]
    pub fp8_recipe: Fp8Recipe,
    /// Megatron's `--fp8-margin`: delayed scaling aims at `fp8_max / 2^margin` instead of the
    /// format's maximum, leaving headroom for an amax that grows between updates.
    #[serde(default)]
    #[schemars(range(max = 32))]
    pub fp8_margin: u32,
    /// Megatron's `--fp8-amax-history-len`: optimizer steps of amax the delayed scale is
    /// computed from.
    #[serde(default = "defaults::one")]
    #[schemars(range(min = 1, max = 1024))]
    pub fp8_amax_history_len: u32,
    /// Megatron's `--fp8-amax-compute-algo`: the amax a delayed scale uses, the newest in the
    /// history or the largest of it.
    #[serde(default)]
    pub fp8_amax_compute_algo: Fp8AmaxComputeAlgo,
    /// Megatron's `--first-last-layers-bf16`: keep the GEMMs of the first and last transformer
    /// layers in bf16 (the output layer always is).
    #[serde(default)]
    pub first_last_layers_bf16: bool,
    /// Megatron's `--num-layers-at-start-in-bf16`, with `first_last_layers_bf16`.
    #[serde(default = "defaults::one")]
    pub num_layers_at_start_in_bf16: u32,
    /// Megatron's `--num-layers-at-end-in-bf16`, with `first_last_layers_bf16`.
    #[serde(default = "defaults::one")]
    pub num_layers_at_end_in_bf16: u32,
    /// The routed MoE experts' fc1 and fc2 in fp8 too, on one rank (as Transformer Engine's
    /// `GroupedLinear` runs them under fp8): the routed rows cast once, each expert's weight
    /// with its own scale, Hopper's grouped GEMM with device counts. Off until its GPU checks
    /// have run; the experts stay in the model's dtype otherwise, and in parallel layouts.
    /// Written out only when on, so recipes without it keep their plan hash.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fp8_experts: bool,
    /// Static loss scale for fp16; absent means dynamic loss scaling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub loss_scale: Option<f64>,
}

/// `runtime.grouped_gemm_kernel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GroupedGemmKernel {
    #[default]
    Auto,
    CpAsync,
    Tma,
    TmaCluster,
    TmaPingpong,
}

impl GroupedGemmKernel {
    fn is_auto(&self) -> bool {
        *self == GroupedGemmKernel::Auto
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    #[default]
    Bf16,
    Fp16,
    Fp32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Fp8 {
    #[default]
    None,
    Hybrid,
    E4m3,
}

impl Default for Precision {
    fn default() -> Self {
        Precision {
            dtype: Dtype::default(),
            fp8: Fp8::default(),
            fp8_recipe: Fp8Recipe::default(),
            fp8_margin: 0,
            fp8_amax_history_len: 1,
            fp8_amax_compute_algo: Fp8AmaxComputeAlgo::default(),
            first_last_layers_bf16: false,
            num_layers_at_start_in_bf16: 1,
            num_layers_at_end_in_bf16: 1,
            fp8_experts: false,
            loss_scale: None,
        }
    }
}

impl Precision {
    /// Whether transformer layer `index` (of `num_layers`) runs its GEMMs in fp8.
    pub fn fp8_layer(&self, index: u32, num_layers: u32) -> bool {
        if self.fp8 == Fp8::None {
            return false;
        }
        !self.first_last_layers_bf16
            || (index >= self.num_layers_at_start_in_bf16
                && index + self.num_layers_at_end_in_bf16 < num_layers)
    }
}

/// Which amax of the history a delayed scale is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Fp8AmaxComputeAlgo {
    #[default]
    MostRecent,
    Max,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Fp8Recipe {
    #[default]
    Delayed,
    Tensorwise,
    Mxfp8,
    Blockwise,
}

// ---------------------------------------------------------------------------------------------
// training

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Training {
    /// Sequences per microbatch per data-parallel rank; `auto` lets the planner choose.
    pub micro_batch_size: Degree,
    /// Sequences per optimizer step across all data-parallel ranks.
    #[schemars(range(min = 1, max = crate::bounds::MAX_BATCH))]
    pub global_batch_size: u32,
    /// Optimizer steps. Exactly one of train_iters and train_tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub train_iters: Option<u64>,
    /// Token budget; iterations = train_tokens / (global_batch_size × seq_length).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub train_tokens: Option<u64>,
    #[serde(default = "defaults::seed")]
    pub seed: u64,
    /// Global gradient-norm clip; 0 disables clipping.
    #[serde(default = "defaults::clip_grad")]
    #[schemars(range(min = 0.0))]
    pub clip_grad: f64,
    /// Evaluate every this many iterations; 0 disables evaluation.
    #[serde(default = "defaults::eval_interval")]
    pub eval_interval: u64,
    /// Global batches of validation data per evaluation.
    #[serde(default = "defaults::eval_iters")]
    pub eval_iters: u64,
    /// Which validation batches each evaluation reads: `advance` (Megatron's) moves on through
    /// the validation split, `fixed` reads the same first `eval_iters` global batches every time.
    // Left out of the serialized recipe while it has its default, so the recipe hashes of runs
    // and sweep members written before it existed stay what they were.
    #[serde(default, skip_serializing_if = "EvalBatches::is_advance")]
    pub eval_batches: EvalBatches,
    #[serde(default = "defaults::log_interval")]
    #[schemars(range(min = 1))]
    pub log_interval: u64,
    #[serde(default)]
    pub optimizer: Optimizer,
    #[serde(default)]
    pub schedule: Schedule,
}

/// Which validation batches an evaluation reads (`training.eval_batches`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EvalBatches {
    /// Megatron's: evaluation k (k = 0, 1, …) reads the `eval_iters` global batches from
    /// validation sample k · eval_iters · global_batch_size, so each evaluation sees new data
    /// (the split holds enough samples for every evaluation of the run).
    #[default]
    Advance,
    /// The first `eval_iters` global batches of the validation split at every evaluation, so
    /// successive losses are of the same samples.
    Fixed,
}

impl EvalBatches {
    fn is_advance(&self) -> bool {
        *self == EvalBatches::Advance
    }
}

/// AdamW with decoupled weight decay (no decay on norms and biases).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Optimizer {
    #[serde(default = "defaults::lr")]
    #[schemars(range(min = 0.0))]
    pub lr: f64,
    #[serde(default)]
    #[schemars(range(min = 0.0))]
    pub min_lr: f64,
    #[serde(default = "defaults::beta1")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub beta1: f64,
    #[serde(default = "defaults::beta2")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub beta2: f64,
    #[serde(default = "defaults::eps")]
    #[schemars(range(min = 0.0))]
    pub eps: f64,
    #[serde(default = "defaults::weight_decay")]
    #[schemars(range(min = 0.0))]
    pub weight_decay: f64,
    /// Megatron's `--use-precision-aware-optimizer`: the optimizer may keep its states in lower
    /// precision (`exp_avg_dtype`, `exp_avg_sq_dtype`). As in Megatron it needs the distributed
    /// optimizer (`parallel.distributed_optimizer`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub use_precision_aware_optimizer: bool,
    /// Megatron's `--main-grads-dtype`: the dtype the gradients are summed in over a step's
    /// microbatches (and data-parallel replicas) before the update. `bf16`
    /// halves the buffer (2 bytes a parameter instead of 4) at the cost of rounding every sum,
    /// as Megatron does when it turns `accumulate_allreduce_grads_in_fp32` off for it. Anything
    /// but `fp32` needs `use_precision_aware_optimizer`.
    #[serde(default, skip_serializing_if = "StateDtype::is_fp32")]
    pub main_grads_dtype: StateDtype,
    /// Megatron's `--exp-avg-dtype`: how AdamW's first moment is stored; the update computes
    /// in fp32 whatever it is. Anything but `fp32` needs `use_precision_aware_optimizer`.
    #[serde(default, skip_serializing_if = "StateDtype::is_fp32")]
    pub exp_avg_dtype: StateDtype,
    /// Megatron's `--exp-avg-sq-dtype`: how AdamW's second moment is stored.
    #[serde(default, skip_serializing_if = "StateDtype::is_fp32")]
    pub exp_avg_sq_dtype: StateDtype,
    /// Megatron's `--optimizer-cpu-offload`: the offloaded part's fp32 masters and moments live
    /// in host memory and its AdamW runs on the CPU cores; gradients go to the host and the
    /// updated weights come back every step. As in Megatron it needs
    /// `use_precision_aware_optimizer`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optimizer_cpu_offload: bool,
    /// Megatron's `--optimizer-offload-fraction`: parameters are offloaded in order while the
    /// offloaded element count is below this fraction of the total (Megatron's
    /// `HybridDeviceOptimizer`), so 1.0 offloads every parameter.
    #[serde(
        default = "defaults::optimizer_offload_fraction",
        skip_serializing_if = "defaults::is_whole_fraction"
    )]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub optimizer_offload_fraction: f64,
}

/// How an optimizer state is stored (Megatron's `--exp-avg-dtype` choices that Ferrotron
/// trains with: fp16 and fp8 states need per-tensor scaling, which it does not have).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StateDtype {
    #[default]
    Fp32,
    Bf16,
}

impl StateDtype {
    pub fn is_fp32(&self) -> bool {
        *self == StateDtype::Fp32
    }

    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            StateDtype::Fp32 => 4,
            StateDtype::Bf16 => 2,
        }
    }
}

impl Default for Optimizer {
    fn default() -> Self {
        Optimizer {
            lr: defaults::lr(),
            min_lr: 0.0,
            beta1: defaults::beta1(),
            beta2: defaults::beta2(),
            eps: defaults::eps(),
            weight_decay: defaults::weight_decay(),
            use_precision_aware_optimizer: false,
            main_grads_dtype: StateDtype::Fp32,
            exp_avg_dtype: StateDtype::Fp32,
            exp_avg_sq_dtype: StateDtype::Fp32,
            optimizer_cpu_offload: false,
            optimizer_offload_fraction: defaults::optimizer_offload_fraction(),
        }
    }
}

/// The learning-rate schedule, with Megatron-LM's meaning (`OptimizerParamScheduler`): iteration
/// `k` (1-based) runs at the rate of position `k − 1`, so the first step runs at `warmup_init`
/// and warmup reaches `lr` at iteration `warmup_iters + 1`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Schedule {
    #[serde(default)]
    pub decay: Decay,
    /// Megatron's `--lr-warmup-iters`: iterations of linear warmup from `warmup_init` to `lr`.
    #[serde(default)]
    pub warmup_iters: u64,
    /// Megatron's `--lr-warmup-init`: the rate warmup starts from (the first iteration's rate).
    #[serde(default)]
    #[schemars(range(min = 0.0))]
    pub warmup_init: f64,
    /// Megatron's `--lr-decay-iters`: the iteration where decay ends and `min_lr` begins, counted
    /// from the start of training (warmup included). Default: the training iterations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub decay_iters: Option<u64>,
    /// WSD (Megatron's `--lr-wsd-decay-iters`): length of the final decay phase, which ends at
    /// `decay_iters`; the rest after warmup is stable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub wsd_decay_iters: Option<u64>,
    /// WSD (Megatron's `--lr-wsd-decay-style`): the shape of the final decay phase. Default:
    /// `exponential`, as Megatron's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wsd_decay_style: Option<WsdDecayStyle>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Decay {
    Constant,
    Linear,
    #[default]
    Cosine,
    Wsd,
}

/// The final phase of a WSD schedule, as Megatron's `--lr-wsd-decay-style` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WsdDecayStyle {
    #[default]
    Exponential,
    Linear,
    Cosine,
    MinusSqrt,
}

// ---------------------------------------------------------------------------------------------
// recompute

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Recompute {
    #[serde(default)]
    pub granularity: RecomputeGranularity,
    /// Only with `full`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<RecomputeMethod>,
    /// With `full`: layers per chunk (uniform) or per stage (block) to recompute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::bounds::MAX_LAYERS))]
    pub num_layers: Option<u32>,
    /// Megatron's `--recompute-modules`, only with `selective`: which parts of a layer the
    /// backward recomputes. Absent: Megatron's default, `[core_attn]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub modules: Vec<RecomputeModule>,
}

impl Recompute {
    /// Whether every dense layer's MLP block is recomputed (`selective` with `mlp`).
    pub fn recomputes_mlp(&self) -> bool {
        self.granularity == RecomputeGranularity::Selective
            && self.modules.contains(&RecomputeModule::Mlp)
    }
}

/// A part of a layer that selective recomputation re-runs (Megatron's `--recompute-modules`
/// names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RecomputeModule {
    /// The attention core: scores, softmax, dropout. A fused (flash) attention kernel keeps
    /// only its softmax statistics and recomputes the rest in its backward anyway.
    CoreAttn,
    /// Each dense layer's MLP block: its norm, both projections, the activation, the dropout
    /// and the residual add, re-run from the block's input. It holds most of a layer's
    /// activations and few of its FLOPs at long sequence lengths, where attention dominates.
    Mlp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RecomputeGranularity {
    #[default]
    None,
    Selective,
    Full,
    /// The planner picks none, selective, full (uniform, one layer per checkpoint) or Megatron's
    /// block method with the fewest recomputed layers that fit: the fastest that fits in memory.
    Auto,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RecomputeMethod {
    Uniform,
    Block,
}

// ---------------------------------------------------------------------------------------------
// data

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Data {
    #[serde(default)]
    pub tokenizer: Tokenizer,
    /// Datasets and their sampling weights: Megatron `.bin/.idx` prefixes or raw `.jsonl` files.
    #[serde(default)]
    pub blend: Vec<BlendEntry>,
    /// Validation data of its own (Megatron's `--valid-data-path`): all of these datasets'
    /// documents are validation data, and `split` then only cuts the train and test shares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_blend: Option<Vec<BlendEntry>>,
    /// Test data of its own (Megatron's `--test-data-path`), evaluated once at the end of training.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_blend: Option<Vec<BlendEntry>>,
    /// Train/validation/test proportions, Megatron style ("969,30,1").
    #[serde(default = "defaults::split")]
    pub split: String,
    /// Where index caches and preprocessed JSONL go. Default: `.ferrotron/cache` beside the recipe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_dir: Option<String>,
    /// JSON key holding the text when a blend entry is raw JSONL.
    #[serde(default = "defaults::json_key")]
    pub json_key: String,
}

impl Default for Data {
    fn default() -> Self {
        Data {
            tokenizer: Tokenizer::default(),
            blend: Vec::new(),
            valid_blend: None,
            test_blend: None,
            split: defaults::split(),
            cache_dir: None,
            json_key: defaults::json_key(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Tokenizer {
    #[serde(rename = "type", default)]
    pub kind: TokenizerKind,
    /// GPT-2 BPE `vocab.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab_file: Option<String>,
    /// GPT-2 BPE `merges.txt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_file: Option<String>,
    /// Hugging Face `tokenizer.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub enum TokenizerKind {
    #[default]
    #[serde(rename = "gpt2-bpe")]
    Gpt2Bpe,
    #[serde(rename = "hf")]
    Hf,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BlendEntry {
    pub path: String,
    #[serde(default = "defaults::weight")]
    #[schemars(range(min = 0.0))]
    pub weight: f64,
}

// ---------------------------------------------------------------------------------------------
// checkpoint, logging, cluster, runtime

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// Directory for checkpoints; absent disables saving.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
    /// Save every this many iterations (and always at the end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub interval: Option<u64>,
    /// Keep only the newest K checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub keep_last: Option<u32>,
    /// `auto` (newest committed checkpoint in dir), `never`, or a checkpoint path.
    #[serde(default = "defaults::resume")]
    pub resume: String,
    /// Check every tensor file against the blake3 checksum in the checkpoint's manifest before
    /// resuming (with `resume: auto`, a damaged checkpoint falls back to the newest older one
    /// that verifies). `false` skips the read for huge checkpoints on trusted storage.
    // Left out of the serialized recipe while it has its default, so the recipe hashes of runs
    // and sweep members written before it existed stay what they were.
    #[serde(default = "defaults::yes", skip_serializing_if = "defaults::is_yes")]
    pub verify: bool,
    /// Weights to start from when `dir` holds no checkpoint yet (needs `dir` and `resume: auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<InitFrom>,
    /// Megatron's `--async-save`: a save stops training only to copy this rank's shards to host
    /// memory; a thread writes, hashes and commits them while training goes on (at most one
    /// save in flight; the last step's and a stop's save are waited for). The files are the
    /// synchronous save's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub async_save: bool,
}

/// Where a fresh run's weights come from instead of the random initialisation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InitFrom {
    /// A Hugging Face model folder (`config.json` and `model.safetensors`) of a
    /// `GPT2LMHeadModel`, `LlamaForCausalLM` or `MixtralForCausalLM`.
    pub hf: String,
}

impl Default for Checkpoint {
    fn default() -> Self {
        Checkpoint {
            dir: None,
            interval: None,
            keep_last: None,
            resume: defaults::resume(),
            init_from: None,
            verify: true,
            async_save: false,
        }
    }
}

/// How `checkpoint.resume` is interpreted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumePolicy {
    Auto,
    Never,
    Path(String),
}

impl Checkpoint {
    pub fn resume_policy(&self) -> ResumePolicy {
        match self.resume.as_str() {
            "auto" => ResumePolicy::Auto,
            "never" => ResumePolicy::Never,
            path => ResumePolicy::Path(path.to_owned()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Logging {
    /// Append one JSON object per logged step to this file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jsonl: Option<String>,
    /// Write TensorBoard event files of the same scalars into this directory (a new file per run
    /// start; `tensorboard --logdir DIR`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensorboard: Option<String>,
    /// Serve Prometheus `/metrics`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<Prometheus>,
    #[serde(default)]
    pub format: LogFormat,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Prometheus {
    /// 0 picks a free port and prints it.
    pub port: u16,
    #[serde(default = "defaults::address")]
    pub address: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Human,
    Json,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Cluster {
    #[serde(default = "defaults::one")]
    #[schemars(range(min = 1, max = crate::bounds::MAX_NODES))]
    pub nodes: u32,
    #[serde(default = "defaults::gpus_per_node")]
    #[schemars(range(min = 1, max = crate::bounds::MAX_GPUS_PER_NODE))]
    pub gpus_per_node: u32,
    #[serde(default)]
    pub gpu: GpuKind,
}

impl Cluster {
    /// Ranks in the cluster; saturates rather than wraps (the planner refuses clusters past
    /// the bounds before using it).
    pub fn world_size(&self) -> u32 {
        self.nodes.saturating_mul(self.gpus_per_node)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum GpuKind {
    A100,
    #[default]
    H100,
    H200,
    B200,
    /// CPU thread ranks (tests and small runs).
    Cpu,
}

/// How the run executes. Besides the backend and its threads, the CUDA backend's own paths,
/// each on by default (the measured, GPU-tested choice); turning one off takes burn's
/// composition instead, to compare. Several change a run's numbers, so they are the recipe's,
/// recorded with it in the run manifest; each is left out of the serialized recipe while on, so
/// the hashes of recipes written before they existed stay put. The environment variables that
/// only help debugging (`FERROTRON_OP_TIMING`, …) are listed in `ferrotron_cuda::switches`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Runtime {
    #[serde(default)]
    pub backend: Backend,
    /// CPU worker threads per rank; absent uses all cores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub threads: Option<u32>,
    /// cuDNN's fused flash attention (off: burn's attention, composed).
    #[serde(default = "defaults::yes", skip_serializing_if = "defaults::is_yes")]
    pub fused_attention: bool,
    /// The norm, cross-entropy, AdamW, RoPE, QK-norm, SwiGLU and MoE routing kernels.
    #[serde(default = "defaults::yes", skip_serializing_if = "defaults::is_yes")]
    pub fused_kernels: bool,
    /// The vectorised loop of contiguous element-wise maps.
    #[serde(default = "defaults::yes", skip_serializing_if = "defaults::is_yes")]
    pub vector_maps: bool,
    /// One grouped GEMM for all experts (off: a GEMM per expert).
    #[serde(default = "defaults::yes", skip_serializing_if = "defaults::is_yes")]
    pub grouped_gemm: bool,
    /// The grouped GEMM reads the routing's per-expert row counts on the device (Ferrotron's
    /// own kernel for bf16 and f16, expert widths a multiple of 128: warpgroup MMA on Hopper,
    /// `mma.sync` on other sm_80+ GPUs), so a MoE layer never waits for the host, wherever the
    /// mean expert is too small for one GEMM per expert (`grouped_gemm_per_expert`, which reads
    /// the counts and runs 1.5–1.7× the kernel's rate where it applies). On an H100 the kernel
    /// beats cuBLAS's grouped call at Qwen3-30B-A3B's experts by 1.12–1.21× per GEMM, and that
    /// model trained at 89,629 tokens/s over a global batch where the grouped call gave 81,262
    /// (2026-12-07). With `grouped_gemm_per_expert: false` it takes every shape. Off: cuBLAS's
    /// grouped-batched GEMM, which takes the counts as host numbers.
    #[serde(default = "defaults::yes", skip_serializing_if = "defaults::is_yes")]
    pub grouped_gemm_device_counts: bool,
    /// The experts' GEMMs (forward and both gradients) as one cuBLASLt GEMM per expert
    /// (planned once per bucket of 1,024 row counts) where each expert's output covers the GPU's
    /// multiprocessors with 128 × 128 tiles, instead of cuBLAS's grouped call, which runs the
    /// forward at 0.43 of its gradients' rate on an H100: with the forward per expert, the small
    /// MoE row trained 1.13× as fast and Mixtral's forward ran 2.4× (2026-12-07). Off: the
    /// grouped call always.
    #[serde(default = "defaults::yes", skip_serializing_if = "defaults::is_yes")]
    pub grouped_gemm_per_expert: bool,
    /// Time cuBLASLt's candidate algorithms per GEMM shape and keep the fastest (off: the
    /// heuristic's first).
    #[serde(default = "defaults::yes", skip_serializing_if = "defaults::is_yes")]
    pub gemm_tune: bool,
    /// Time cuDNN's candidate plans per attention graph and keep the fastest (off: the first).
    #[serde(default = "defaults::yes", skip_serializing_if = "defaults::is_yes")]
    pub attention_tune: bool,
    /// The one-pass norm backward (off: the input gradient and the γ/β reduction apart).
    #[serde(default = "defaults::yes", skip_serializing_if = "defaults::is_yes")]
    pub norm_one_pass: bool,
    /// Uploads through pinned staging buffers (off: pageable copies).
    #[serde(default = "defaults::yes", skip_serializing_if = "defaults::is_yes")]
    pub pinned_uploads: bool,
    /// Megatron's `bias_gelu_fusion` for a GELU MLP on the GPU: fc1's bias is added inside the
    /// GELU kernel and its gradient summed in the pass that writes GELU's input gradient,
    /// instead of a second read of that gradient (`[tokens, ffn]`) by the linear's backward.
    /// The exact (erf) GELU is kept, where Megatron's fused kernel uses the tanh form. Opt-in
    /// until measured on a GPU; the CPU always runs the linear's bias.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bias_gelu_fusion: bool,
    /// Which device-count grouped GEMM a Hopper GPU runs: `auto` the measured best, which is
    /// `tma`, the warp-specialised persistent kernel fed by the Tensor Memory Accelerator (up
    /// to 252 experts on a rank; past that `cp_async`); `cp_async` the warpgroup kernel fed by
    /// cp.async, the default before the TMA kernel was measured; `tma_cluster` the TMA kernel
    /// in two-block clusters sharing the row tile by multicast (1.6–2.2× slower wherever its
    /// column tiles pair up, cause unknown); `tma_pingpong` the TMA kernel on CUTLASS's ping-pong
    /// schedule (128 × 128 tiles, the two consumer warpgroups on alternate tiles; not yet run on
    /// a GPU). For timing one against another; other GPUs take `auto`.
    #[serde(default, skip_serializing_if = "GroupedGemmKernel::is_auto")]
    pub grouped_gemm_kernel: GroupedGemmKernel,
    /// Megatron's `use_cpu_initialization`, on by default here: the initial weights are drawn
    /// on the CPU (burn-flex's generator) and copied to the device, so every backend and
    /// layout starts from the CPU run's weights. Off: the device draws them with its own
    /// generator (Philox on ferrotron-cuda) from the same seed, the same for every layout on
    /// that backend, without one CPU core drawing every weight first (an 8B model's run spent
    /// 186 s before its first step, the draw not timed apart).
    #[serde(default = "defaults::yes", skip_serializing_if = "defaults::is_yes")]
    pub use_cpu_initialization: bool,
    /// Megatron's `--cross-entropy-fusion-impl`: how the output layer and the loss run.
    #[serde(default, skip_serializing_if = "CrossEntropyFusionImpl::is_native")]
    pub cross_entropy_fusion_impl: CrossEntropyFusionImpl,
}

/// How the output layer's logits reach the loss (Megatron's `--cross-entropy-fusion-impl`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CrossEntropyFusionImpl {
    /// The logits of a whole microbatch written by the output layer and kept for the backward;
    /// the fused cross-entropy kernel computes the loss from them.
    #[default]
    Native,
    /// The output layer and the loss as one op over chunks of rows, each chunk's logits
    /// recomputed in the backward: at most one chunk's logits and their gradient are alive
    /// (long sequences, large vocabularies), for a third more of the output layer's FLOPs.
    /// Needs `parallel.tensor: 1`.
    Linear,
}

impl CrossEntropyFusionImpl {
    /// Rows of logits one chunk of [`CrossEntropyFusionImpl::Linear`] holds: 2²⁸ logits (512 MiB
    /// in bf16, as much again for their gradient) over a `vocab`-wide output layer, so the
    /// chunk's GEMMs stay large while its memory stays below one layer's activations.
    pub fn linear_chunk_rows(vocab: u64) -> u64 {
        ((1u64 << 28) / vocab.max(1)).max(1)
    }

    fn is_native(&self) -> bool {
        *self == Self::Native
    }
}

impl Default for Runtime {
    fn default() -> Self {
        Runtime {
            backend: Backend::default(),
            threads: None,
            fused_attention: true,
            fused_kernels: true,
            vector_maps: true,
            grouped_gemm: true,
            grouped_gemm_device_counts: true,
            grouped_gemm_per_expert: true,
            gemm_tune: true,
            attention_tune: true,
            norm_one_pass: true,
            pinned_uploads: true,
            bias_gelu_fusion: false,
            grouped_gemm_kernel: GroupedGemmKernel::Auto,
            use_cpu_initialization: true,
            cross_entropy_fusion_impl: CrossEntropyFusionImpl::Native,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub enum Backend {
    #[default]
    #[serde(rename = "cpu")]
    Cpu,
    #[serde(rename = "cuda")]
    Cuda,
    #[serde(rename = "burn-cuda")]
    BurnCuda,
}

// ---------------------------------------------------------------------------------------------
// derived values

impl Model {
    /// The FFN size that will be used (4h when unset).
    pub fn ffn_hidden_size(&self) -> u32 {
        self.ffn_hidden_size.unwrap_or(4 * self.hidden_size)
    }

    pub fn num_query_groups(&self) -> u32 {
        self.num_query_groups.unwrap_or(self.num_attention_heads)
    }

    pub fn kv_channels(&self) -> u32 {
        self.kv_channels
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    pub fn max_position_embeddings(&self) -> u32 {
        self.max_position_embeddings.unwrap_or(self.seq_length)
    }

    /// Vocabulary padded as Megatron does: up to a multiple of divisible_by × tp.
    pub fn padded_vocab_size(&self, vocab: u32, tensor_parallel: u32) -> u32 {
        // In u64: within the bounds the result fits u32, but a product past them must not wrap
        // to a small vocabulary that looks valid.
        let multiple =
            u64::from(self.make_vocab_size_divisible_by) * u64::from(tensor_parallel.max(1));
        let padded = u64::from(vocab).div_ceil(multiple) * multiple;
        u32::try_from(padded).unwrap_or(u32::MAX)
    }

    /// Whether the query/key/value projection has a bias (`add_qkv_bias`, or every linear
    /// layer's through `add_bias_linear`).
    pub fn qkv_bias(&self) -> bool {
        self.add_qkv_bias || self.add_bias_linear
    }

    /// Whether each layer is an MoE layer (all false for a dense model; a `layer_freq` the
    /// semantic rules refuse, a list of the wrong length or a malformed expression, makes no
    /// layer MoE).
    pub fn moe_layers(&self) -> Vec<bool> {
        self.moe
            .as_ref()
            .and_then(|moe| moe.layer_freq.pattern(self.num_layers).ok())
            .unwrap_or_else(|| vec![false; self.num_layers as usize])
    }

    /// How many layers are MoE layers.
    pub fn num_moe_layers(&self) -> u32 {
        self.moe_layers().iter().filter(|&&moe| moe).count() as u32
    }
}

impl Moe {
    pub fn expert_ffn_hidden_size(&self, model: &Model) -> u32 {
        self.ffn_hidden_size
            .unwrap_or_else(|| model.ffn_hidden_size())
    }

    /// The routed combine weights' factor (`router_topk_scaling_factor`, 1 when absent).
    pub fn topk_scaling_factor(&self) -> f64 {
        self.router_topk_scaling_factor.unwrap_or(1.0)
    }
}

impl Training {
    /// Training iterations, from train_iters or derived from the token budget.
    pub fn iterations(&self, seq_length: u32) -> Option<u64> {
        self.train_iters.or_else(|| {
            self.train_tokens
                .map(|t| t / (u64::from(self.global_batch_size) * u64::from(seq_length)).max(1))
        })
    }
}

impl Recipe {
    /// A copy with every derivable `None` filled (what `recipe show` prints).
    /// `vocab_size` stays as written when it depends on a tokenizer file.
    pub fn with_derived_defaults(&self) -> Recipe {
        let mut r = self.clone();
        let m = &mut r.model;
        m.ffn_hidden_size = Some(self.model.ffn_hidden_size());
        m.num_query_groups = Some(self.model.num_query_groups());
        m.kv_channels = Some(self.model.kv_channels());
        m.max_position_embeddings = Some(self.model.max_position_embeddings());
        if let Some(scaling) = m.rope_scaling.as_mut() {
            *scaling = scaling.with_defaults();
        }
        if let Some(moe) = m.moe.as_mut() {
            moe.ffn_hidden_size = Some(moe.expert_ffn_hidden_size(&self.model));
        }
        if r.parallel.expert_tensor.is_none() {
            r.parallel.expert_tensor = Some(r.parallel.tensor);
        }
        r
    }
}

mod defaults {
    use crate::Degree;

    /// Megatron's `--optimizer-offload-fraction` default: everything.
    pub(super) fn optimizer_offload_fraction() -> f64 {
        1.0
    }

    pub(super) fn is_whole_fraction(value: &f64) -> bool {
        *value == 1.0
    }

    pub(super) fn is_yes(value: &bool) -> bool {
        *value
    }

    pub(super) fn yes() -> bool {
        true
    }
    pub(super) fn one() -> u32 {
        1
    }
    pub(super) fn auto() -> Degree {
        Degree::AUTO
    }
    pub(super) fn make_vocab_size_divisible_by() -> u32 {
        128
    }
    /// Megatron's MLA defaults (`--kv-lora-rank` 32, `--qk-head-dim` 128,
    /// `--qk-pos-emb-head-dim` 64, `--v-head-dim` 128).
    pub(super) fn kv_lora_rank() -> u32 {
        32
    }

    pub(super) fn qk_head_dim() -> u32 {
        128
    }

    pub(super) fn qk_pos_emb_head_dim() -> u32 {
        64
    }

    pub(super) fn v_head_dim() -> u32 {
        128
    }

    pub(super) fn rotary_base() -> f64 {
        10000.0
    }
    pub(super) fn norm_epsilon() -> f64 {
        1e-5
    }
    pub(super) fn dropout() -> f64 {
        0.1
    }
    pub(super) fn init_method_std() -> f64 {
        0.02
    }
    pub(super) fn router_topk() -> u32 {
        2
    }
    pub(super) fn aux_loss_coeff() -> f64 {
        1e-2
    }
    pub(super) fn expert_bias_update_rate() -> f64 {
        1e-3
    }
    pub(super) fn seed() -> u64 {
        1234
    }
    pub(super) fn clip_grad() -> f64 {
        1.0
    }
    pub(super) fn eval_interval() -> u64 {
        1000
    }
    pub(super) fn eval_iters() -> u64 {
        10
    }
    pub(super) fn log_interval() -> u64 {
        10
    }
    pub(super) fn lr() -> f64 {
        3e-4
    }
    pub(super) fn beta1() -> f64 {
        0.9
    }
    pub(super) fn beta2() -> f64 {
        0.95
    }
    pub(super) fn eps() -> f64 {
        1e-8
    }
    pub(super) fn weight_decay() -> f64 {
        0.1
    }
    pub(super) fn split() -> String {
        "969,30,1".to_owned()
    }
    pub(super) fn json_key() -> String {
        "text".to_owned()
    }
    pub(super) fn weight() -> f64 {
        1.0
    }
    pub(super) fn resume() -> String {
        "auto".to_owned()
    }
    pub(super) fn address() -> String {
        "127.0.0.1".to_owned()
    }
    pub(super) fn gpus_per_node() -> u32 {
        8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_distributed_timeout_is_ten_minutes_unless_set_and_keeps_old_hashes() {
        let recipe = crate::rules::fixture::recipe();
        assert_eq!(
            recipe.parallel.distributed_timeout(),
            Duration::from_secs(600)
        );
        let json = serde_json::to_value(&recipe).expect("serializes");
        assert!(
            json["parallel"]
                .get("distributed_timeout_minutes")
                .is_none(),
            "recipes written before the key keep their hash: {json}"
        );
        let mut half = recipe.clone();
        half.parallel.distributed_timeout_minutes = Some(0.5);
        assert_eq!(half.parallel.distributed_timeout(), Duration::from_secs(30));
        assert_ne!(half.content_hash(), recipe.content_hash());
    }

    /// `precision.fp8_experts` and `runtime.grouped_gemm_kernel` are written only when set, so
    /// recipes without them hash as before; set, they parse and change the hash.
    #[test]
    fn the_fp8_experts_and_grouped_kernel_keys_keep_old_hashes() {
        let recipe = crate::rules::fixture::recipe();
        let json = serde_json::to_value(&recipe).expect("serializes");
        assert!(json["precision"].get("fp8_experts").is_none(), "{json}");
        assert!(
            json["runtime"].get("grouped_gemm_kernel").is_none(),
            "{json}"
        );
        let mut set = json.clone();
        set["precision"]["fp8_experts"] = serde_json::json!(true);
        set["runtime"]["grouped_gemm_kernel"] = serde_json::json!("tma_cluster");
        let set: Recipe = serde_json::from_value(set).expect("parses");
        assert!(set.precision.fp8_experts);
        assert_eq!(
            set.runtime.grouped_gemm_kernel,
            GroupedGemmKernel::TmaCluster
        );
        assert_ne!(set.content_hash(), recipe.content_hash());
        let mut cp_async = json.clone();
        cp_async["runtime"]["grouped_gemm_kernel"] = serde_json::json!("cp_async");
        let cp_async: Recipe = serde_json::from_value(cp_async).expect("parses");
        assert_eq!(
            cp_async.runtime.grouped_gemm_kernel,
            GroupedGemmKernel::CpAsync
        );
        let mut unknown = json;
        unknown["runtime"]["grouped_gemm_kernel"] = serde_json::json!("cutlass");
        assert!(serde_json::from_value::<Recipe>(unknown).is_err());
    }

    /// A recipe's MoE section written before the list form of `layer_freq` and
    /// `router_topk_scaling_factor` serializes, and so hashes, exactly as it did; the new
    /// forms change the hash.
    #[test]
    fn the_moe_keys_keep_old_hashes() {
        let mut recipe = crate::rules::fixture::recipe();
        recipe.model.moe = Some(
            serde_json::from_value(serde_json::json!({"num_experts": 8, "layer_freq": 2}))
                .expect("moe"),
        );
        let json = serde_json::to_value(&recipe).expect("serializes");
        let moe = &json["model"]["moe"];
        assert_eq!(moe["layer_freq"], serde_json::json!(2), "{moe}");
        assert!(moe.get("router_topk_scaling_factor").is_none(), "{moe}");
        // The JSON as the u32 field wrote it, every key of the section: the same hash.
        let before = serde_json::json!({
            "num_experts": 8, "router_topk": 2, "load_balancing": "aux_loss",
            "aux_loss_coeff": 0.01, "score_function": "softmax", "pre_softmax": false,
            "expert_bias": false, "expert_bias_update_rate": 0.001, "token_drop_policy": "probs",
            "pad_to_capacity": false, "token_dispatcher": "alltoall", "layer_freq": 2
        });
        let mut old = json.clone();
        old["model"]["moe"] = before;
        assert_eq!(crate::canonical_hash(&old), recipe.content_hash());

        let mut listed = recipe.clone();
        listed.model.moe.as_mut().expect("moe").layer_freq = LayerFreq::Pattern(vec![1, 0]);
        assert_eq!(listed.model.moe_layers(), recipe.model.moe_layers());
        assert_ne!(listed.content_hash(), recipe.content_hash());
        let mut scaled = recipe.clone();
        scaled
            .model
            .moe
            .as_mut()
            .expect("moe")
            .router_topk_scaling_factor = Some(2.5);
        assert_ne!(scaled.content_hash(), recipe.content_hash());
    }

    /// The dense families' keys are left out of a recipe that does not use them (recipes
    /// written before them keep their hash), and `recipe show` prints each scaling type's
    /// defaults.
    #[test]
    fn the_dense_family_keys_keep_old_hashes_and_show_their_defaults() {
        let recipe = crate::rules::fixture::recipe();
        let json = serde_json::to_value(&recipe).expect("serializes");
        for key in [
            "rope_scaling",
            "add_qkv_bias",
            "qk_layernorm",
            "window_size",
        ] {
            assert!(json["model"].get(key).is_none(), "{key}: {json}");
        }
        let mut qwen = recipe.clone();
        qwen.model.qk_layernorm = true;
        assert_ne!(qwen.content_hash(), recipe.content_hash());
        let mut llama = recipe.clone();
        llama.model.rope_scaling = Some(
            serde_json::from_value(serde_json::json!({"type": "llama3", "factor": 8.0}))
                .expect("llama3"),
        );
        let shown = llama
            .with_derived_defaults()
            .model
            .rope_scaling
            .expect("kept");
        assert_eq!(
            (
                shown.low_freq_factor,
                shown.high_freq_factor,
                shown.original_max_position_embeddings,
                shown.beta_fast
            ),
            (Some(1.0), Some(4.0), Some(8192), None)
        );
    }
}
