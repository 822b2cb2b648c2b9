//! The tensor mapping: every transformers tensor as a selection from one of our global tensors.
//!
//! Our layouts are Megatron's: burn `Linear` weights are `[in, out]`, QKV is one fused
//! projection ordered per key/value group (its query heads, then its key, then its value), and
//! SwiGLU's fc1 is `[gate | up]`. transformers' `nn.Linear` weights are `[out, in]`, GPT-2's
//! `Conv1D` weights `[in, out]` with `c_attn` ordered `[q | k | v]`. So each HF tensor is: some
//! rows (the real vocabulary of an embedding), some column ranges (a head, a half of fc1), then
//! maybe a transpose. One index walk ([`Selection::for_each`]) serves both directions, so import
//! is the exact inverse of export by construction.
//!
//! No row permutation of q/k is needed for rotary embeddings: our RoPE rotates halves (channel
//! `i` with `i + head_dim/2`, see `ferrotron-model`'s `rope.rs`), which is transformers'
//! `rotate_half` convention. The permutation in Meta→HF converters undoes Meta's interleaved
//! pairs, which we never had.
//!
//! Experts are stored one by one (Mixtral's `block_sparse_moe.experts.{e}.w1/w3/w2`, Qwen3-MoE's
//! and DeepSeek-V3's `mlp.experts.{e}.gate_proj/up_proj/down_proj`), each a selection of our
//! `feed_forward.Moe.experts.{e}` fc1/fc2 like a dense MLP's; DeepSeek-V3's shared experts are
//! our one shared MLP of their summed width. Multi-latent attention's projections copy
//! transposed, their rotary channels reordered only for files that store them as halves.

use std::ops::Range;

use ferrotron_recipe::{Model, Normalization};

use crate::family::Family;

/// The sizes that decide every tensor's name and shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Dims {
    pub family: Family,
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub groups: usize,
    pub head_dim: usize,
    /// The dense layers' FFN size.
    pub ffn: usize,
    /// Each routed expert's FFN size.
    pub expert_ffn: usize,
    pub experts: usize,
    /// Which layers have an MoE feed-forward (the others are dense).
    pub moe_layers: Vec<bool>,
    /// The shared experts' FFN size, all of them together (Megatron's one shared MLP).
    pub shared_ffn: Option<usize>,
    /// DeepSeek-V3's expert selection bias.
    pub expert_bias: bool,
    /// Multi-latent attention's sizes.
    pub mla: Option<MlaDims>,
    /// The real vocabulary: the HF rows.
    pub vocab: usize,
    /// Our embedding rows (the real vocabulary padded for tensor parallelism).
    pub padded_vocab: usize,
    /// Learned position rows (GPT-2).
    pub positions: usize,
    /// Whether our model has linear biases.
    pub bias: bool,
    /// Whether the fused query/key/value projection has a bias (`bias`, or Qwen2's alone).
    pub qkv_bias: bool,
    /// Per-head RMSNorms on queries and keys (Qwen3's `q_norm` / `k_norm`).
    pub qk_norm: bool,
    pub tied: bool,
}

/// Multi-latent attention's sizes (Megatron's names, see `ferrotron_recipe::Mla`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaDims {
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    /// Per head, the query/key channels without rotary embedding (`qk_nope_head_dim`).
    pub qk_head_dim: usize,
    /// Per head, the rotary channels (`qk_rope_head_dim`).
    pub qk_pos_emb_head_dim: usize,
    pub v_head_dim: usize,
    /// transformers' `rope_interleave`: the rotary channels are stored as interleaved pairs,
    /// which Megatron's MLA de-interleaves itself, so they copy straight. Without it they are
    /// stored as halves and are permuted into pairs on the way in (and written with it).
    pub rope_interleave: bool,
}

impl MlaDims {
    fn q_head_dim(&self) -> usize {
        self.qk_head_dim + self.qk_pos_emb_head_dim
    }
}

impl Dims {
    pub fn of(model: &Model, vocab: usize, padded_vocab: usize) -> Dims {
        let family = Family::of(model);
        let moe = model.moe.as_ref();
        let mla = model.mla.map(|m| MlaDims {
            q_lora_rank: m.q_lora_rank.map(|r| r as usize),
            kv_lora_rank: m.kv_lora_rank as usize,
            qk_head_dim: m.qk_head_dim as usize,
            qk_pos_emb_head_dim: m.qk_pos_emb_head_dim as usize,
            v_head_dim: m.v_head_dim as usize,
            rope_interleave: true,
        });
        Dims {
            family,
            layers: model.num_layers as usize,
            hidden: model.hidden_size as usize,
            heads: model.num_attention_heads as usize,
            groups: model.num_query_groups() as usize,
            head_dim: model.kv_channels() as usize,
            ffn: model.ffn_hidden_size() as usize,
            expert_ffn: moe.map_or(0, |m| m.expert_ffn_hidden_size(model) as usize),
            experts: moe.map_or(0, |m| m.num_experts as usize),
            moe_layers: model.moe_layers(),
            shared_ffn: moe.and_then(|m| m.shared_expert_ffn_hidden_size.map(|s| s as usize)),
            expert_bias: moe.is_some_and(|m| m.expert_bias),
            mla,
            vocab,
            padded_vocab,
            positions: model.max_position_embeddings() as usize,
            bias: model.add_bias_linear,
            qkv_bias: model.qkv_bias(),
            qk_norm: model.qk_layernorm,
            tied: model.tie_embeddings,
        }
    }
}

/// Which elements of one of our tensors make a transformers tensor, and how they are laid out.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    /// Keep the first this many rows of dim 0 (the real vocabulary of an embedding).
    pub rows: Option<usize>,
    /// Take these ranges of the last dim, in order.
    pub columns: Option<Vec<Range<usize>>>,
    /// Transpose the (2-D) result.
    pub transpose: bool,
}

impl Selection {
    const WHOLE: Selection = Selection {
        rows: None,
        columns: None,
        transpose: false,
    };

    fn transposed() -> Selection {
        Selection {
            transpose: true,
            ..Selection::WHOLE
        }
    }

    fn columns(columns: impl IntoIterator<Item = Range<usize>>, transpose: bool) -> Selection {
        Selection {
            rows: None,
            columns: Some(columns.into_iter().collect()),
            transpose,
        }
    }

    /// The transformers tensor's shape, taken from ours of shape `ours`.
    pub fn shape(&self, ours: &[usize]) -> Vec<usize> {
        let (rows, cols) = self.extent(ours);
        match (ours.len(), self.transpose) {
            (1, _) => vec![cols.len()],
            (_, false) => vec![rows, cols.len()],
            (_, true) => vec![cols.len(), rows],
        }
    }

    /// Call `visit(hf_index, our_index)` for every element of the transformers tensor, in its
    /// row-major order (`ours` is our tensor's shape, 1-D or 2-D).
    pub fn for_each(&self, ours: &[usize], mut visit: impl FnMut(usize, usize)) {
        let width = *ours.last().unwrap_or(&1);
        let (rows, cols) = self.extent(ours);
        if self.transpose {
            for (j, &col) in cols.iter().enumerate() {
                for row in 0..rows {
                    visit(j * rows + row, row * width + col);
                }
            }
        } else {
            for row in 0..rows {
                for (j, &col) in cols.iter().enumerate() {
                    visit(row * cols.len() + j, row * width + col);
                }
            }
        }
    }

    fn extent(&self, ours: &[usize]) -> (usize, Vec<usize>) {
        let width = *ours.last().unwrap_or(&1);
        let rows = if ours.len() == 1 { 1 } else { ours[0] };
        let rows = self.rows.map_or(rows, |r| r.min(rows));
        let cols = match &self.columns {
            Some(ranges) => ranges.iter().flat_map(Clone::clone).collect(),
            None => (0..width).collect(),
        };
        (rows, cols)
    }
}

/// Where a transformers tensor's values come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A selection of our global tensor `name` of shape `shape`.
    Ours {
        name: String,
        shape: Vec<usize>,
        selection: Selection,
    },
    /// Zeros: a bias transformers' class always has and our model was built without.
    Zeros,
}

/// One transformers tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Piece {
    pub hf: String,
    pub shape: Vec<usize>,
    pub source: Source,
}

/// Every transformers tensor of the model `dims` describes, in the class's module order.
pub fn pieces(dims: &Dims) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut push = |hf: String, name: String, shape: Vec<usize>, selection: Selection| {
        out.push(Piece {
            hf,
            shape: selection.shape(&shape),
            source: Source::Ours {
                name,
                shape,
                selection,
            },
        });
    };
    let (h, v, vp) = (dims.hidden, dims.vocab, dims.padded_vocab);
    let vocab_rows = Selection {
        rows: Some(v),
        ..Selection::WHOLE
    };
    let gpt2 = dims.family == Family::Gpt2;
    let (root, norm) = if gpt2 {
        ("transformer", Normalization::Layernorm)
    } else {
        ("model", Normalization::Rmsnorm)
    };
    let embed = if gpt2 { "wte" } else { "embed_tokens" };
    push(
        format!("{root}.{embed}.weight"),
        "embedding.weight".into(),
        vec![vp, h],
        vocab_rows,
    );
    if gpt2 {
        push(
            "transformer.wpe.weight".into(),
            "position_embedding.weight".into(),
            vec![dims.positions, h],
            Selection::WHOLE,
        );
    }
    for layer in 0..dims.layers {
        let ours = format!("layers.{layer}");
        let hf = if gpt2 {
            format!("transformer.h.{layer}")
        } else {
            format!("model.layers.{layer}")
        };
        let (input_norm, post_norm) = if gpt2 {
            ("ln_1", "ln_2")
        } else {
            ("input_layernorm", "post_attention_layernorm")
        };
        norms(
            &mut push,
            &format!("{hf}.{input_norm}"),
            &format!("{ours}.input_norm"),
            h,
            norm,
        );
        match &dims.mla {
            Some(mla) => latent_attention(
                &mut push,
                dims,
                mla,
                &format!("{hf}.self_attn"),
                &format!("{ours}.{}", mla::LAYER),
            ),
            None => attention(&mut push, dims, &hf, &format!("{ours}.attention")),
        }
        norms(
            &mut push,
            &format!("{hf}.{post_norm}"),
            &format!("{ours}.pre_mlp_norm"),
            h,
            norm,
        );
        match dims.family {
            Family::Gpt2 => {
                let mlp = format!("{ours}.feed_forward.Dense");
                linear(
                    &mut push,
                    dims.bias,
                    &format!("{hf}.mlp.c_fc"),
                    &format!("{mlp}.fc1"),
                    [h, dims.ffn],
                    Selection::WHOLE,
                );
                linear(
                    &mut push,
                    dims.bias,
                    &format!("{hf}.mlp.c_proj"),
                    &format!("{mlp}.fc2"),
                    [dims.ffn, h],
                    Selection::WHOLE,
                );
            }
            _ if !dims.moe_layers[layer] => {
                let mlp = format!("{ours}.feed_forward.Dense");
                swiglu(
                    &mut push,
                    dims,
                    dims.ffn,
                    &format!("{hf}.mlp"),
                    &mlp,
                    ["gate_proj", "up_proj", "down_proj"],
                );
            }
            family => {
                // Mixtral names its sparse block and its experts' projections its own way
                let (block, projections) = match family {
                    Family::Mixtral => ("block_sparse_moe", ["w1", "w3", "w2"]),
                    _ => ("mlp", ["gate_proj", "up_proj", "down_proj"]),
                };
                let moe = format!("{ours}.feed_forward.Moe");
                let block = format!("{hf}.{block}");
                router(&mut push, dims, &format!("{block}.gate"), &moe);
                for expert in 0..dims.experts {
                    swiglu(
                        &mut push,
                        dims,
                        dims.expert_ffn,
                        &format!("{block}.experts.{expert}"),
                        &format!("{moe}.experts.{expert}"),
                        projections,
                    );
                }
                // a shared expert makes a model DeepSeek-V3 (`family.rs`), never Mixtral
                if let Some(shared) = dims.shared_ffn {
                    swiglu(
                        &mut push,
                        dims,
                        shared,
                        &format!("{block}.shared_experts"),
                        &format!("{moe}.shared_expert"),
                        ["gate_proj", "up_proj", "down_proj"],
                    );
                }
            }
        }
    }
    norms(
        &mut push,
        &format!("{root}.{}", if gpt2 { "ln_f" } else { "norm" }),
        "final_norm",
        h,
        norm,
    );
    if !dims.tied {
        push(
            "lm_head.weight".into(),
            "output_layer.weight".into(),
            vec![h, vp],
            Selection::columns(std::iter::once(0..v), true),
        );
    }
    if gpt2 && !dims.bias {
        with_zero_biases(&mut out, dims);
    }
    out
}

/// Our per-head query and key norms' weights, under a layer's `attention` (`ferrotron-model`).
const QUERY_NORM: &str = "q_norm.Rms.gamma";
const KEY_NORM: &str = "k_norm.Rms.gamma";
/// An MoE layer's selection bias, under its `feed_forward.Moe`.
const EXPERT_BIAS: &str = "expert_bias";

type Push<'a> = dyn FnMut(String, String, Vec<usize>, Selection) + 'a;

fn norms(push: &mut Push<'_>, hf: &str, ours: &str, hidden: usize, norm: Normalization) {
    match norm {
        Normalization::Layernorm => {
            push(
                format!("{hf}.weight"),
                format!("{ours}.Layer.gamma"),
                vec![hidden],
                Selection::WHOLE,
            );
            push(
                format!("{hf}.bias"),
                format!("{ours}.Layer.beta"),
                vec![hidden],
                Selection::WHOLE,
            );
        }
        Normalization::Rmsnorm => {
            push(
                format!("{hf}.weight"),
                format!("{ours}.Rms.gamma"),
                vec![hidden],
                Selection::WHOLE,
            );
        }
    }
}

/// A linear layer: its weight under `selection`, its bias (when it has one) under the same
/// columns.
fn linear(
    push: &mut Push<'_>,
    bias: bool,
    hf: &str,
    ours: &str,
    shape: [usize; 2],
    selection: Selection,
) {
    if bias {
        let bias = Selection {
            transpose: false,
            ..selection.clone()
        };
        push(
            format!("{hf}.bias"),
            format!("{ours}.bias"),
            vec![shape[1]],
            bias,
        );
    }
    push(
        format!("{hf}.weight"),
        format!("{ours}.weight"),
        shape.to_vec(),
        selection,
    );
}

fn attention(push: &mut Push<'_>, dims: &Dims, hf: &str, ours: &str) {
    let (heads, groups, d, h) = (dims.heads, dims.groups, dims.head_dim, dims.hidden);
    let per_group = heads / groups;
    let slot = |group: usize, slot: usize| {
        let start = (group * (per_group + 2) + slot) * d;
        start..start + d
    };
    let query: Vec<_> = (0..heads)
        .map(|q| slot(q / per_group, q % per_group))
        .collect();
    let key: Vec<_> = (0..groups).map(|g| slot(g, per_group)).collect();
    let value: Vec<_> = (0..groups).map(|g| slot(g, per_group + 1)).collect();
    let qkv = [h, (heads + 2 * groups) * d];
    let qkv_name = format!("{ours}.qkv");
    let proj_name = format!("{ours}.proj");
    if dims.family == Family::Gpt2 {
        let fused = [query, key, value].concat();
        linear(
            push,
            dims.qkv_bias,
            &format!("{hf}.attn.c_attn"),
            &qkv_name,
            qkv,
            Selection::columns(fused, false),
        );
        linear(
            push,
            dims.bias,
            &format!("{hf}.attn.c_proj"),
            &proj_name,
            [heads * d, h],
            Selection::WHOLE,
        );
    } else {
        for (name, columns) in [("q_proj", query), ("k_proj", key), ("v_proj", value)] {
            linear(
                push,
                dims.qkv_bias,
                &format!("{hf}.self_attn.{name}"),
                &qkv_name,
                qkv,
                Selection::columns(columns, true),
            );
        }
        linear(
            push,
            dims.bias,
            &format!("{hf}.self_attn.o_proj"),
            &proj_name,
            [heads * d, h],
            Selection::transposed(),
        );
        if dims.qk_norm {
            for (hf_norm, our_norm) in [("q_norm", QUERY_NORM), ("k_norm", KEY_NORM)] {
                push(
                    format!("{hf}.self_attn.{hf_norm}.weight"),
                    format!("{ours}.{our_norm}"),
                    vec![d],
                    Selection::WHOLE,
                );
            }
        }
    }
}

/// Multi-latent attention's parameters (`ferrotron-model`'s `mla.rs`, Megatron's names).
mod mla {
    /// A layer's multi-latent attention.
    pub(super) const LAYER: &str = "latent_attention";
    pub(super) const Q_DOWN: &str = "linear_q_down_proj";
    pub(super) const Q_UP: &str = "linear_q_up_proj";
    pub(super) const Q: &str = "linear_q_proj";
    pub(super) const Q_NORM: &str = "q_layernorm.Rms.gamma";
    pub(super) const KV_DOWN: &str = "linear_kv_down_proj";
    pub(super) const KV_UP: &str = "linear_kv_up_proj";
    pub(super) const KV_NORM: &str = "kv_layernorm.Rms.gamma";
    pub(super) const OUT: &str = "linear_proj";
}

/// DeepSeek-V3's attention: every projection is one of ours transposed, per head in the same
/// channel order (query `[nope | rope]`, key/value up-projection `[k_nope | v]`, key/value
/// down-projection `[latent | k_rope]`); only the rotary channels of files without
/// `rope_interleave` are reordered.
fn latent_attention(push: &mut Push<'_>, dims: &Dims, mla: &MlaDims, hf: &str, ours: &str) {
    let (h, heads) = (dims.hidden, dims.heads);
    let (q_head, rope) = (mla.q_head_dim(), mla.qk_pos_emb_head_dim);
    let query: Vec<Range<usize>> = (0..heads)
        .flat_map(|head| {
            let start = head * q_head;
            std::iter::once(start..start + mla.qk_head_dim).chain(rotary_columns(
                start + mla.qk_head_dim,
                rope,
                mla.rope_interleave,
            ))
        })
        .collect();
    let ours_of = |name: &str| format!("{ours}.{name}");
    match mla.q_lora_rank {
        Some(rank) => {
            push(
                format!("{hf}.q_a_proj.weight"),
                ours_of(&format!("{}.weight", mla::Q_DOWN)),
                vec![h, rank],
                Selection::transposed(),
            );
            push(
                format!("{hf}.q_a_layernorm.weight"),
                ours_of(mla::Q_NORM),
                vec![rank],
                Selection::WHOLE,
            );
            push(
                format!("{hf}.q_b_proj.weight"),
                ours_of(&format!("{}.weight", mla::Q_UP)),
                vec![rank, heads * q_head],
                Selection::columns(query, true),
            );
        }
        None => push(
            format!("{hf}.q_proj.weight"),
            ours_of(&format!("{}.weight", mla::Q)),
            vec![h, heads * q_head],
            Selection::columns(query, true),
        ),
    }
    let latent = mla.kv_lora_rank;
    let down = std::iter::once(0..latent).chain(rotary_columns(latent, rope, mla.rope_interleave));
    push(
        format!("{hf}.kv_a_proj_with_mqa.weight"),
        ours_of(&format!("{}.weight", mla::KV_DOWN)),
        vec![h, latent + rope],
        Selection::columns(down, true),
    );
    push(
        format!("{hf}.kv_a_layernorm.weight"),
        ours_of(mla::KV_NORM),
        vec![latent],
        Selection::WHOLE,
    );
    push(
        format!("{hf}.kv_b_proj.weight"),
        ours_of(&format!("{}.weight", mla::KV_UP)),
        vec![latent, heads * (mla.qk_head_dim + mla.v_head_dim)],
        Selection::transposed(),
    );
    push(
        format!("{hf}.o_proj.weight"),
        ours_of(&format!("{}.weight", mla::OUT)),
        vec![heads * mla.v_head_dim, h],
        Selection::transposed(),
    );
}

/// Our `rope` rotary channels from `start` in the order transformers stores them: the same with
/// `rope_interleave` (Megatron's MLA de-interleaves pairs itself, as transformers'
/// `apply_rotary_pos_emb_interleave` does); without, transformers rotates halves directly, so
/// its channel `j` of the first half is our `2j` and of the second half our `2j + 1`.
fn rotary_columns(start: usize, rope: usize, interleave: bool) -> Vec<Range<usize>> {
    if interleave {
        return std::iter::once(start..start + rope).collect();
    }
    let half = rope / 2;
    (0..rope)
        .map(|j| {
            let ours = if j < half { 2 * j } else { 2 * (j - half) + 1 };
            start + ours..start + ours + 1
        })
        .collect()
}

/// The router `[hidden, experts]` as transformers' `gate.weight` `[experts, hidden]`, and
/// DeepSeek-V3's selection bias beside it.
fn router(push: &mut Push<'_>, dims: &Dims, hf: &str, ours: &str) {
    push(
        format!("{hf}.weight"),
        format!("{ours}.router.weight"),
        vec![dims.hidden, dims.experts],
        Selection::transposed(),
    );
    if dims.expert_bias {
        push(
            format!("{hf}.e_score_correction_bias"),
            format!("{ours}.{EXPERT_BIAS}"),
            vec![dims.experts],
            Selection::WHOLE,
        );
    }
}

/// Megatron's fused SwiGLU fc1 `[gate | up]` (of `f` channels each) and fc2 as transformers'
/// gate, up and down.
fn swiglu(
    push: &mut Push<'_>,
    dims: &Dims,
    f: usize,
    hf: &str,
    ours: &str,
    [gate, up, down]: [&str; 3],
) {
    let h = dims.hidden;
    let fc1 = format!("{ours}.fc1");
    linear(
        push,
        dims.bias,
        &format!("{hf}.{gate}"),
        &fc1,
        [h, 2 * f],
        Selection::columns(std::iter::once(0..f), true),
    );
    linear(
        push,
        dims.bias,
        &format!("{hf}.{up}"),
        &fc1,
        [h, 2 * f],
        Selection::columns(std::iter::once(f..2 * f), true),
    );
    linear(
        push,
        dims.bias,
        &format!("{hf}.{down}"),
        &format!("{ours}.fc2"),
        [f, h],
        Selection::transposed(),
    );
}

/// GPT-2 always has biases: a model without them exports zeros, which compute the same.
fn with_zero_biases(out: &mut Vec<Piece>, dims: &Dims) {
    let biased = Dims {
        bias: true,
        qkv_bias: true,
        ..dims.clone()
    };
    *out = pieces(&biased)
        .into_iter()
        .map(|piece| match out.iter().find(|p| p.hf == piece.hf) {
            Some(ours) => ours.clone(),
            None => Piece {
                source: Source::Zeros,
                ..piece
            },
        })
        .collect();
}
