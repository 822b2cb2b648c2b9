#!/usr/bin/env python3
"""Megatron-LM's own `num_floating_point_operations` (megatron/training/training.py) on the plans
`recipe plan --format json` resolves, against the plan's `flops_per_iteration`.

The function is taken from a Megatron-LM checkout (MEGATRON_LM, or --training-py) and run as
is, with the arguments Megatron would get for each preset (its dense and MoE paths; the hybrid
path is not asked for). No Megatron import is needed: only its source.

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
import subprocess
import sys
from types import SimpleNamespace


def megatron_function(path):
    source = open(path).read()
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "num_floating_point_operations":
            module = ast.Module(body=[node], type_ignores=[])
            # The helpers it calls from elsewhere in Megatron, for models without hybrid (Mamba)
            # layers or experimental linear attention, which is what a recipe expresses.
            scope = {
                "math": math,
                "is_hybrid_model": lambda args: False,
                "is_linear_attention_variant": lambda variant: False,
            }
            exec(compile(module, path, "exec"), scope)
            return scope["num_floating_point_operations"]
    sys.exit(f"{path} has no num_floating_point_operations")


def megatron_args(plan):
    m = plan["recipe"]["model"]
    moe = m.get("moe")
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
        moe_ffn_hidden_size=(moe.get("expert_ffn_hidden_size") or m["ffn_hidden_size"]) if moe else None,
        moe_shared_expert_intermediate_size=moe.get("shared_expert_ffn_hidden_size") if moe else None,
        moe_layer_freq=moe.get("layer_freq", 1) if moe else 1,
        moe_latent_size=None,
        mtp_num_layers=None,
        multi_latent_attention=False,
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
    worst = 0.0
    print("| recipe | Megatron FLOPs/iteration | plan | rel diff |\n|---|---:|---:|---:|")
    for recipe in opts.recipes:
        plan = json.loads(subprocess.run([opts.recipe_bin, "plan", recipe, "--format", "json"],
                                         check=True, capture_output=True, text=True).stdout)
        theirs = flops(megatron_args(plan), plan["global_batch_size"])
        ours = plan["flops_per_iteration"]
        diff = abs(theirs - ours) / theirs
        worst = max(worst, diff)
        print(f"| {os.path.basename(recipe)} | {theirs:.6e} | {ours:.6e} | {diff:.1e} |")
    sys.exit(0 if worst <= 1e-12 else 1)


if __name__ == "__main__":
    main()
