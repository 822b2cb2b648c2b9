#!/usr/bin/env python3
"""Refit the planner's Hopper rates (crates/ferrotron-plan/src/hardware.rs) to measured steps.

Each row is planned with the current binary (`RECIPE_BIN`, default target/debug/recipe) on an
H200, and its step is split into what the fit keeps (GEMMs at the per-op-timed rate, the
optimizer pass), the core-attention FLOPs, the element-wise bytes (hidden-wide passes and
FFN-wide passes, SwiGLU's 8/5 as wide) and the causal scores dropout draws for. A weighted
least squares (relative error) then solves for the attention efficiency and the element-wise
bytes a second, with the dropout cost a score fixed (`--dropout`). Prints the fit and every
row's predicted/measured. Needs numpy.
"""
import argparse, json, os, subprocess
import numpy as np

RECIPE = os.environ.get("RECIPE_BIN", "target/debug/recipe")
COMMON = ("checkpoint.dir=null parallel.data=1 parallel.distributed_optimizer=false "
          "training.train_tokens=null training.train_iters=30 training.eval_interval=100000 "
          "model.vocab_size=50257").split()
LLAMA = ("model.num_layers=16 model.hidden_size=2048 model.ffn_hidden_size=8192 "
         "model.num_attention_heads=32 model.num_query_groups=8 model.seq_length=4096 "
         "recompute.granularity=none recompute.method=null recompute.num_layers=null").split()
NODROP = ["model.attention_dropout=0.0", "model.hidden_dropout=0.0"]
FULL = ["recompute.granularity=full", "recompute.method=uniform", "recompute.num_layers=1"]


def long(seq):
    return LLAMA + FULL + [f"model.seq_length={seq}", f"model.max_position_embeddings={seq}"]


# name, preset, micro batch, overrides, measured step (s; None: from the MFU below)
ROWS = [
    # one H200, 2026-12-04/05 (crates/ferrotron-plan/tests/bench_rows.rs, MEASURED_STEP)
    ("gpt-1.3b", "gpt-1.3b", 12, [], 0.388),
    ("gpt-350m", "gpt-350m", 16, [], 0.184),
    ("gpt-350m-mb24", "gpt-350m", 24, [], 0.278),
    ("gpt-350m-mb32", "gpt-350m", 32, [], 0.364),
    ("llama-1b", "llama3-8b", 2, LLAMA, 0.122),
    ("llama-1b-mb4", "llama3-8b", 4, LLAMA, 0.234),
    ("llama-1b-mb6", "llama3-8b", 6, LLAMA, 0.336),
    # one H100, 2026-12-06 (issue 48's table; MEASURED_H100_STEP)
    ("h100 gpt-1.3b", "gpt-1.3b", 12, [], 24576 / 63353),
    ("h100 gpt-1.3b-nodrop", "gpt-1.3b", 12, NODROP, 24576 / 67699),
    ("h100 gpt-350m", "gpt-350m", 16, [], 32768 / 172692),
    ("h100 gpt-350m-nodrop", "gpt-350m", 16, NODROP, 32768 / 199527),
    ("h100 llama-1b-mb6", "llama3-8b", 6, LLAMA, 24576 / 72002),
    ("h100 llama-1b-32k-full", "llama3-8b", 1, long(32768), None),
    ("h100 llama-1b-128k-full", "llama3-8b", 1, long(131072), 12.7),
]
MFU_32K = 0.363
PEAK, HBM = 989e12, 4.8e12


def plan(preset, mb, sets):
    args = [RECIPE, "plan", f"recipes/{preset}.yaml", "--gpu", "h200", "--gpus-per-node", "1",
            "--nodes", "1", "--format", "json"]
    for s in COMMON + sets + [f"training.global_batch_size={mb}", f"training.micro_batch_size={mb}"]:
        args += ["--set", s]
    return json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)


def term(p, start):
    return sum(t["value"] for t in p["predicted"]["terms"] if start in t["name"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dropout", type=float, default=1.8e-12, help="seconds a causal score")
    args = ap.parse_args()
    rows = []
    for name, preset, mb, sets, measured in ROWS:
        p = plan(preset, mb, sets)
        m = p["recipe"]["model"]
        h, s, layers, heads = m["hidden_size"], m["seq_length"], m["num_layers"], m["num_attention_heads"]
        f = m.get("ffn_hidden_size") or 4 * h
        swiglu = m.get("activation") == "swiglu"
        recomputed = 4 / 3 if p["recipe"]["recompute"]["granularity"] == "full" else 1.0
        scores = layers * mb * heads * s * s / 2 * recomputed if m.get("attention_dropout", 0) > 0 else 0
        # core attention as `flops.rs` counts it: 3 (fwd+bwd) · 2 (FMA) · 2 (QKᵀ, PV) · q · s/2
        attention = 6 * h * s * layers * mb * s * recomputed
        elementwise = layers * mb * s * (72 * h + 12 * f * (1.6 if swiglu else 1.0))
        if measured is None:
            measured = p["flops_per_iteration"] / (MFU_32K * PEAK)
        fixed = term(p, "GEMM compute") + term(p, "optimizer step")
        rows.append((name, measured, fixed, attention / PEAK, elementwise / HBM, scores))
    a = np.array([[r[3], r[4]] for r in rows])
    y = np.array([r[1] - r[2] - args.dropout * r[5] for r in rows])
    w = 1 / np.array([r[1] for r in rows])
    x, *_ = np.linalg.lstsq(a * w[:, None], y * w, rcond=None)
    print(f"attention efficiency {1 / x[0]:.3f}, element-wise {HBM / x[1] / 1e12:.2f} TB/s "
          f"({1 / x[1]:.3f} of 4.8 TB/s), dropout {args.dropout:.2e} s a score")
    print("| row | measured s | fitted s | fitted/measured |\n|---|---:|---:|---:|")
    for r, row in zip(rows, a):
        fitted = r[2] + args.dropout * r[5] + row @ x
        print(f"| {r[0]} | {r[1]:.4f} | {fitted:.4f} | {fitted / r[1]:.3f} |")


if __name__ == "__main__":
    main()
