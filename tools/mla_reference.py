"""Reference outputs of multi-latent attention from transformers' own `DeepseekV3Attention`
(eager, f32, causal) and from Megatron-Core's own `MLASelfAttention` on the same weights, for
ferrotron-model's MLA tests: the weights (transformers' layout, `[out, in]`; Megatron's is the
same), the input, both softmax scales and both outputs of two small layers, one with a query
latent and YaRN scaling (mscale_all_dim ≠ 0, so the softmax scale carries mscale²), one with a
full-rank query projection and plain RoPE.

Megatron runs on the CPU here with three stand-ins that change no arithmetic of the layer:
a one-process gloo group, `torch.cuda.current_device` answering "cpu" (MLA builds its YaRN
tables on the current device), and, for the core attention, torch's `scaled_dot_product_attention`
(MLA's core attention is Transformer Engine's fused one, which is not on this machine, and
Megatron's local `DotProductAttention` takes no separate key/value head dims).

    /work/pyref/bin/python tools/mla_reference.py \
        > crates/ferrotron-model/src/mla/reference.json
"""

import json
import os

import torch
from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer import multi_latent_attention
from megatron.core.transformer.spec_utils import build_module
from megatron.core.transformer.transformer_config import MLATransformerConfig
from transformers import DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3Attention,
    DeepseekV3RotaryEmbedding,
)

CASES = [
    dict(q_lora_rank=12, rope={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
         "original_max_position_embeddings": 4, "beta_fast": 8.0, "beta_slow": 2.0,
         "mscale": 1.0, "mscale_all_dim": 0.8}),
    dict(q_lora_rank=None, rope={"rope_type": "default", "rope_theta": 100.0}),
]
BATCH, SEQ, HIDDEN = 2, 7, 16


class CoreAttention(torch.nn.Module):
    """softmax(scale · q·kᵀ, causal) · v on Megatron's `[s, b, heads, d]` tensors."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type, softmax_scale=None,
                 k_channels=None, v_channels=None, cp_comm_type=None, pg_collection=None):
        super().__init__()
        self.scale = softmax_scale

    def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None):
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.scale)
        return out.permute(2, 0, 1, 3).reshape(query.shape[0], query.shape[1], -1)


MEGATRON_NAMES = {
    "q_a_proj.weight": "linear_q_down_proj.weight",
    "q_a_layernorm.weight": "q_layernorm.weight",
    "q_b_proj.weight": "linear_q_up_proj.weight",
    "q_proj.weight": "linear_q_proj.weight",
    "kv_a_proj_with_mqa.weight": "linear_kv_down_proj.weight",
    "kv_a_layernorm.weight": "kv_layernorm.weight",
    "kv_b_proj.weight": "linear_kv_up_proj.weight",
    "o_proj.weight": "linear_proj.weight",
}


def megatron(q_lora_rank, rope, weights, x):
    """Megatron-Core's `MLASelfAttention` (local spec, RMSNorm latent norms) on `weights`:
    its softmax scale and its output for `x [b, s, h]`."""
    multi_latent_attention.HAVE_TE = False
    if rope["rope_type"] == "yarn":
        scaling = dict(rope_type="yarn", rotary_scaling_factor=rope["factor"],
                       original_max_position_embeddings=rope["original_max_position_embeddings"],
                       beta_fast=rope["beta_fast"], beta_slow=rope["beta_slow"],
                       mscale=rope["mscale"], mscale_all_dim=rope["mscale_all_dim"])
    else:
        scaling = dict(rope_type="rope", mscale_all_dim=0.0)
    config = MLATransformerConfig(
        num_layers=1, hidden_size=HIDDEN, num_attention_heads=3, q_lora_rank=q_lora_rank,
        kv_lora_rank=8, qk_head_dim=6, qk_pos_emb_head_dim=4, v_head_dim=5,
        rotary_base=rope["rope_theta"], qk_layernorm=True, normalization="RMSNorm",
        layernorm_epsilon=1e-6, add_bias_linear=False, attention_dropout=0.0,
        hidden_dropout=0.0, params_dtype=torch.float32, use_cpu_initialization=True, **scaling)
    spec = get_gpt_layer_local_spec(
        multi_latent_attention=True, qk_layernorm=True, normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = CoreAttention
    attention = build_module(spec.submodules.self_attention, config=config, layer_number=1)
    params = dict(attention.named_parameters())
    with torch.no_grad():
        for name, weight in weights.items():
            params[MEGATRON_NAMES[name]].copy_(weight)
        out, _ = attention(x.transpose(0, 1).contiguous(), attention_mask=None)
    return attention.softmax_scale, out.transpose(0, 1)


def case(q_lora_rank, rope):
    torch.manual_seed(0)
    config = DeepseekV3Config(
        hidden_size=HIDDEN,
        num_attention_heads=3,
        num_key_value_heads=3,
        q_lora_rank=q_lora_rank,
        kv_lora_rank=8,
        qk_nope_head_dim=6,
        qk_rope_head_dim=4,
        v_head_dim=5,
        max_position_embeddings=16,
        rms_norm_eps=1e-6,
        attention_bias=False,
        attention_dropout=0.0,
        rope_interleave=True,
        rope_parameters=rope,
    )
    config._attn_implementation = "eager"
    attention = DeepseekV3Attention(config, layer_idx=0).eval()
    with torch.no_grad():
        for name, param in attention.named_parameters():
            if name.endswith("layernorm.weight"):
                param.copy_(1.0 + 0.3 * torch.randn_like(param))
            else:
                param.copy_(0.3 * torch.randn_like(param))
    x = torch.randn(BATCH, SEQ, HIDDEN)
    positions = torch.arange(SEQ).unsqueeze(0).expand(BATCH, SEQ)
    cos, sin = DeepseekV3RotaryEmbedding(config)(x, positions)
    mask = torch.full((SEQ, SEQ), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        out, _ = attention(x, (cos, sin), mask)
    weights = {name: p.detach() for name, p in attention.named_parameters()}
    megatron_scale, megatron_out = megatron(q_lora_rank, rope, weights, x)
    scaling = {("type" if k == "rope_type" else k): v for k, v in rope.items()
               if k not in ("rope_theta",)}
    return {
        "q_lora_rank": q_lora_rank,
        "kv_lora_rank": 8,
        "qk_head_dim": 6,
        "qk_pos_emb_head_dim": 4,
        "v_head_dim": 5,
        "heads": 3,
        "hidden": HIDDEN,
        "rotary_base": rope["rope_theta"],
        "rope_scaling": None if rope["rope_type"] == "default" else scaling,
        "softmax_scale": attention.scaling,
        "shape": [BATCH, SEQ, HIDDEN],
        "weights": {name: {"shape": list(p.shape), "values": p.flatten().tolist()}
                    for name, p in attention.named_parameters()},
        "input": x.flatten().tolist(),
        "output": out.flatten().tolist(),
        "megatron_softmax_scale": megatron_scale,
        "megatron_output": megatron_out.flatten().tolist(),
    }


os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
torch.cuda.current_device = lambda: "cpu"
torch.distributed.init_process_group("gloo", rank=0, world_size=1)
parallel_state.initialize_model_parallel(1, 1)
print(json.dumps([case(**c) for c in CASES]))
