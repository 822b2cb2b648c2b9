"""Reference inverse frequencies and attention factors of scaled RoPE from transformers' own
functions (`ROPE_INIT_FUNCTIONS`), for ferrotron-model's rope tests.

    /work/pyref/bin/python tools/rope_scaling_reference.py \
        > crates/ferrotron-model/src/rope_scaling_reference.json
"""

import json

from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

CASES = [
    # Llama 3.1's published scaling, head_dim 128, theta 500000.
    dict(head_dim=128, theta=500000.0, rope={"rope_type": "llama3", "factor": 8.0,
         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 8192}),
    # A tiny context, so every band (kept, blended, divided) holds several frequencies.
    dict(head_dim=16, theta=10000.0, rope={"rope_type": "llama3", "factor": 4.0,
         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 64}),
    dict(head_dim=16, theta=10000.0, rope={"rope_type": "linear", "factor": 2.0}),
    # YaRN with the temperature from factor alone (mscale 1, mscale_all_dim 0).
    dict(head_dim=64, theta=10000.0, rope={"rope_type": "yarn", "factor": 40.0,
         "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0,
         "mscale": 1.0, "mscale_all_dim": 0.0}),
    # DeepSeek-V3's: mscale and mscale_all_dim both set (they cancel to 1 when equal).
    dict(head_dim=64, theta=10000.0, rope={"rope_type": "yarn", "factor": 40.0,
         "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0,
         "mscale": 1.0, "mscale_all_dim": 1.0}),
    dict(head_dim=16, theta=10000.0, rope={"rope_type": "yarn", "factor": 4.0,
         "original_max_position_embeddings": 32, "beta_fast": 8.0, "beta_slow": 2.0,
         "mscale": 0.707, "mscale_all_dim": 0.5}),
]


def case(head_dim, theta, rope):
    config = LlamaConfig(
        hidden_size=head_dim * 2,
        num_attention_heads=2,
        head_dim=head_dim,
        max_position_embeddings=1 << 17,
        rope_parameters={"rope_theta": theta, **rope},
    )
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, "cpu")
    scaling = {("type" if k == "rope_type" else k): v for k, v in rope.items()}
    return {
        "head_dim": head_dim,
        "theta": theta,
        "rope_scaling": scaling,
        "inv_freq": [float(f) for f in inv_freq.double()],
        "attention_factor": float(attention_factor),
    }


print(json.dumps([case(**c) for c in CASES], indent=1))
