#!/usr/bin/env python3
"""Megatron-LM's own `num_floating_point_operations` (megatron/training/training.py) on the plans
`recipe plan --format json` resolves, against the plan's `flops_per_iteration`.

The function is taken from a Megatron-LM checkout (MEGATRON_LM, or --training-py) and run as
is, with the arguments Megatron would get for each preset (its dense, MoE and multi-latent
attention paths; the hybrid path is not asked for). A `layer_freq` list or Megatron pattern
string goes through Megatron's own `moe_freq_type` (megatron/training/arguments.py, next to
training.py), as `--moe-layer-freq` would. No Megatron import is needed: only its source.

    python3 tools/megatron_flops_ref.py --recipe-bin target/debug/recipe \\
        --training-py /path/to/Megatron-LM/megatron/training/training.py recipes/llama3.1-8b.yaml …

Prints one row per recipe: Megatron's FLOPs, the plan's, their relative difference; exit 1 when
any differs by more than 1e-12.
"""
import argparse
import ast
import json
import math
import os
import re
import subprocess
import sys
from types import SimpleNamespace


def megatron_functions(path, names, scope):
    """The top-level functions `names` of the Python file at `path`, run in `scope`."""
    tree = ast.parse(open(path).read())
    nodes = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    missing = set(names) - {n.name for n in nodes}
    if missing:
        sys.exit(f"{path} has no {', '.join(sorted(missing))}")
    exec(compile(ast.Module(body=nodes, type_ignores=[]), path, "exec"), scope)
    return [scope[name] for name in names]


def megatron_function(path):
    # The helpers it calls from elsewhere in Megatron, for models without hybrid (Mamba)
    # layers or experimental linear attention, which is what a recipe expresses.
    scope = {
        "math": math,
        "is_hybrid_model": lambda args: False,
        "is_linear_attention_variant": lambda variant: False,
    }
    return megatron_functions(path, ["num_floating_point_operations"], scope)[0]


def megatron_moe_freq_type(training_py):
    """Megatron's `--moe-layer-freq` parser, from arguments.py beside training.py."""
    path = os.path.join(os.path.dirname(training_py), "arguments.py")
    return megatron_functions(path, ["_eval_pattern", "moe_freq_type"], {"re": re})[1]


def layer_freq(moe, moe_freq_type):
    """`model.moe.layer_freq` as Megatron's args hold it: an int or a list of 0/1."""
    freq = moe.get("layer_freq", 1) if moe else 1
    return moe_freq_type(freq) if isinstance(freq, str) else freq


def megatron_args(plan, moe_freq_type):
    m = plan["recipe"]["model"]
    moe = m.get("moe")
    mla = m.get("mla")
    heads, groups = m["num_attention_heads"], m.get("num_query_groups") or m["num_attention_heads"]
    args = SimpleNamespace(
        num_layers=m["num_layers"],
        hidden_size=m["hidden_size"],
        ffn_hidden_size=m["ffn_hidden_size"],
        num_attention_heads=heads,
        num_query_groups=groups,
        group_query_attention=groups != heads,
        kv_channels=m.get("kv_channels") or m["hidden_size"] // heads,
        seq_length=m["seq_length"],
        swiglu=m.get("activation") == "swiglu",
        padded_vocab_size=plan["padded_vocab_size"],
        num_experts=moe["num_experts"] if moe else None,
        moe_router_topk=moe["router_topk"] if moe else 1,
        moe_ffn_hidden_size=(moe.get("ffn_hidden_size") or m["ffn_hidden_size"]) if moe else None,
        moe_shared_expert_intermediate_size=moe.get("shared_expert_ffn_hidden_size") if moe else None,
        moe_layer_freq=layer_freq(moe, moe_freq_type),
        moe_latent_size=None,
        mtp_num_layers=None,
        multi_latent_attention=mla is not None,
        q_lora_rank=mla.get("q_lora_rank") if mla else None,
        kv_lora_rank=mla["kv_lora_rank"] if mla else None,
        qk_head_dim=mla["qk_head_dim"] if mla else None,
        qk_pos_emb_head_dim=mla["qk_pos_emb_head_dim"] if mla else None,
        v_head_dim=mla["v_head_dim"] if mla else None,
        attention_output_gate=False,
        experimental_attention_variant=None,
        linear_attention_freq=None,
        hybrid_layer_pattern=None,
        spec=None,
    )
    return args


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipe-bin", default="target/debug/recipe")
    parser.add_argument("--training-py", default=os.path.join(os.environ.get("MEGATRON_LM", "."), "megatron/training/training.py"))
    parser.add_argument("recipes", nargs="+")
    opts = parser.parse_args()
    flops = megatron_function(opts.training_py)
    moe_freq_type = megatron_moe_freq_type(opts.training_py)
    worst = 0.0
    print("| recipe | Megatron FLOPs/iteration | plan | rel diff |\n|---|---:|---:|---:|")
    for recipe in opts.recipes:
        plan = json.loads(subprocess.run([opts.recipe_bin, "plan", recipe, "--format", "json"],
                                         check=True, capture_output=True, text=True).stdout)
        theirs = flops(megatron_args(plan, moe_freq_type), plan["global_batch_size"])
        ours = plan["flops_per_iteration"]
        diff = abs(theirs - ours) / theirs
        worst = max(worst, diff)
        print(f"| {os.path.basename(recipe)} | {theirs:.6e} | {ours:.6e} | {diff:.1e} |")
    sys.exit(0 if worst <= 1e-12 else 1)


if __name__ == "__main__":
    main()
