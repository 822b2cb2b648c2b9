#!/usr/bin/env bash
# gpu-train.sh — training on the GPU machine: does our CUDA backend train like the CPU, and how
# fast is it? (issue #7, item 4 (b) and (c)).
#
# Built here, run there (the GPU machine has no Rust toolchain):
#
#   cargo build --release -p ferrotron-cli --features burn-cuda     # burn-cuda is optional
#   mkdir -p dist && cp target/release/recipe dist/
#   device run: bash tools/gpu-train.sh        (carry: ["dist"])
#
# (b) recipes/shakespeare-tiny.yaml (an fp32 recipe) for 50 steps from one seed on: cpu, cuda (ours,
#     fp32), cuda with precision.dtype=bf16, burn-cuda (fp32, when the binary has it), for each
#     model family (FAMILIES, default "gpt llama moe": the recipe as shipped, then LLaMA-style
#     and MoE variants of the same size; also qwen3, mistral, and issue 46's mla (multi-latent
#     attention), deepseek (mla + DeepSeek-V3's MoE) and qwen3moe: tools/gpu-families.sh). Every
#     backend starts from the same weights (drawn on the CPU from the seed) and reads the same
#     batches, so the curves differ only by arithmetic. Tolerances, max |loss − cpu loss| / cpu loss
#     over all steps: fp32 backends 1e-2 (reduction order and cuBLASLt's algorithms compound over
#     50 Adam steps), bf16 5e-2 (8 significant bits: each rounding is ~2⁻⁹ relative, and a 4-layer
#     model stacks a few hundred of them per token; Megatron's bf16-vs-fp32 curves differ by ~1 %).
# (c) the gpt-350m preset on one GPU for 30 steps in bf16 (micro batch 4, 2 microbatches, seq
#     2048, the shipped Shakespeare corpus): tokens/s, TFLOP/s and MFU (Megatron's FLOP formula,
#     as `recipe plan` counts it, against the plan's peak: 989 TFLOP/s bf16 on H100/H200) and
#     peak device memory, next to `recipe plan`'s predictions for the same layout.
#
# Env: OUT (results, default /tmp/gpu-train-out), FERROTRON_DIST (binaries, default ./dist),
# PARTS (default "bc"), FAMILIES ("gpt llama moe"), STEPS_B (50), STEPS_C (30), RUN_TIMEOUT (150).
# Output: the tables last on stdout and in $OUT/gpu-train.md; logs in $OUT/train-logs.tar.gz.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/gpu-train-out}
dist=${FERROTRON_DIST:-$root/dist}
recipe_bin=$dist/recipe
parts=${PARTS:-bc}
steps_b=${STEPS_B:-50}
steps_c=${STEPS_C:-30}
run_timeout=${RUN_TIMEOUT:-150}
seed=1234
work=/tmp/ferrotron-gpu-train
logs=$work/logs
rm -rf "$work"
mkdir -p "$OUT" "$logs"

# cuBLASLt and NVRTC live in the toolkit (design.md); NVRTC needs its headers for bf16. cuDNN
# (fused attention) is the wheel in torch's Python environment.
cudnn_lib=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${cudnn_lib:+:$cudnn_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
export FERROTRON_KERNEL_CACHE=$work/kernels
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/nvidia-smi.txt" 2>&1 || true

if [[ ! -x "$recipe_bin" ]]; then
    echo "no recipe binary at $recipe_bin: build it and carry dist/ (see the header)" >&2
    exit 2
fi

# train TAG BACKEND RECIPE STEPS [--set ...]: one run, its metrics in $logs/TAG.jsonl.
train() {
    local tag=$1 backend=$2 recipe=$3 steps=$4
    shift 4
    local start=$SECONDS
    timeout "$run_timeout" "$recipe_bin" run "$recipe" --backend "$backend" --world-size 1 \
        --run-dir "$work/$tag" \
        --set "training.train_iters=$steps" \
        --set training.log_interval=1 \
        --set "training.seed=$seed" \
        --set checkpoint.dir=null \
        --set "logging.jsonl=$logs/$tag.jsonl" "$@" >"$logs/$tag.log" 2>&1
    local rc=$?
    echo "$tag: exit $rc in $((SECONDS - start)) s" >>"$logs/runs.txt"
    return $rc
}

tables=$OUT/gpu-train.md
: >"$tables"

# ---- (b) shakespeare-tiny: loss curves, for every model family (tools/gpu-families.sh) --------
# shellcheck source=tools/gpu-families.sh
source "$root/tools/gpu-families.sh"
if [[ $parts == *b* ]]; then
    tiny=recipes/shakespeare-tiny.yaml
    for family in ${FAMILIES:-gpt llama moe}; do
        sets=()
        case $family in
            llama) sets=("${llama_sets[@]}") ;;
            moe) sets=("${moe_sets[@]}") ;;
            qwen3) sets=("${qwen3_sets[@]}") ;;
            mistral) sets=("${mistral_sets[@]}") ;;
            mla) sets=("${mla_sets[@]}") ;;
            deepseek) sets=("${deepseek_sets[@]}") ;;
            qwen3moe) sets=("${qwen3moe_sets[@]}") ;;
        esac
        train "$family-cpu" cpu "$tiny" "$steps_b" "${sets[@]}"
        train "$family-cuda-fp32" cuda "$tiny" "$steps_b" "${sets[@]}"
        train "$family-cuda-bf16" cuda "$tiny" "$steps_b" --set precision.dtype=bf16 "${sets[@]}"
        if [[ $family == gpt ]] && ! train gpt-burn-cuda-fp32 burn-cuda "$tiny" "$steps_b" &&
            grep -q -- "--features burn-cuda" "$logs/gpt-burn-cuda-fp32.log"; then
            echo "burn-cuda: not built into this binary" >>"$logs/runs.txt"
        fi
        python3 - "$logs" "$steps_b" "$family" >>"$tables" <<'PY'
import json, os, sys
logs, steps, family = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def losses(tag):
    path = os.path.join(logs, f"{tag}.jsonl")
    if not os.path.exists(path):
        return {}
    rows = [json.loads(l) for l in open(path) if l.strip()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r and "step" in r}
tags = [f"{family}-{t}" for t in ["cpu", "cuda-fp32", "cuda-bf16", "burn-cuda-fp32"]]
step_tol = {f"{family}-{t}": v for t, v in {"cuda-fp32": 1e-4, "cuda-bf16": 1e-2, "burn-cuda-fp32": 1e-4}.items()}
def norms_of(tag):
    path = os.path.join(logs, f"{tag}.jsonl")
    rows = [json.loads(l) for l in open(path) if l.strip()] if os.path.exists(path) else []
    return {r["step"]: r["grad_norm"] for r in rows if "grad_norm" in r and "step" in r}
curves = {t: losses(t) for t in tags}
shown = [t for t in tags if curves[t]]
print(f"### (b) shakespeare-tiny ({family}), {steps} steps, seed 1234, same initial weights\n")
print("| step | " + " | ".join(shown) + " |")
print("|---" * (len(shown) + 1) + "|")
for step in range(1, steps + 1):
    if step in (1, 2, 3) or step % 5 == 0:
        cells = [f"{curves[t][step]:.4f}" if step in curves[t] else "—" for t in shown]
        print(f"| {step} | " + " | ".join(cells) + " |")
# Before the first gradient spike (a CPU step whose gradient norm is over 3x the run's median)
# the curves must agree step by step; a spike amplifies rounding differences chaotically (any two
# fp32 backends part there), so after it only the level of the curve is compared: the mean loss
# of the last 10 steps. (10x until 2026-12-06: under Megatron's schedule the LLaMA-style curve has
# spikes of 3.6x and 8.2x at steps 31 and 34, after which its bf16 run parts by 3e-2 and its fp32
# one by 1e-4 at step 39, while both agree to 5e-3 and 2e-7 up to step 30.)
norms = norms_of(f"{family}-cpu")
median = sorted(norms.values())[len(norms) // 2] if norms else 0.0
# The first steps' norms are those of the random initialisation (the mistral family's step 1
# is 3x its median), not a spike of training: the search starts at step 4.
spike = min((s for s, g in norms.items() if s > 3 and g > 3 * median), default=steps + 1)
print(f"\nfirst gradient spike on the cpu run: step {spike if spike <= steps else 'none'} "
      f"(grad norm {norms.get(spike, float('nan')):.1f}, median {median:.2f})\n")
# An MoE's top-k routing is a discontinuous function of the router logits: once rounding flips
# one token's expert, the curves part exponentially without any gradient spike (measured on the
# H200 in fp32: 1e-7 relative for 15 steps, 3e-5 by step 20, 1e-2 by step 37). Its curves are
# compared step by step over the first 20 steps, then by level.
if family in ("moe", "deepseek", "qwen3moe") and spike > 21:
    spike = 21
    print(f"{family}: steps compared one by one up to step 20 (routing flips part the curves later)\n")
print("| backend | steps | max rel diff, steps 1–" + str(spike - 1) + " | tolerance | mean of last 10 vs cpu | tolerance | result |")
print("|---|---|---|---|---|---|---|")
cpu = curves[f"{family}-cpu"]
last10 = lambda c: sum(c[s] for s in range(steps - 9, steps + 1) if s in c) / 10
for tag in tags[1:]:
    curve = curves[tag]
    if not curve and tag.endswith("burn-cuda-fp32") and family != "gpt":
        continue
    if not curve:
        print(f"| {tag} | 0 | — | {step_tol[tag]:.0e} | — | 2e-02 | not run (see its log) |")
        continue
    early = [s for s in curve if s in cpu and s < spike]
    rel = max((abs(curve[s] - cpu[s]) / abs(cpu[s]) for s in early), default=float("nan"))
    level = abs(last10(curve) - last10(cpu)) / abs(last10(cpu)) if len(curve) == steps else float("nan")
    ok = len(curve) == steps and rel <= step_tol[tag] and level <= 2e-2
    print(f"| {tag} | {len(curve)} | {rel:.1e} | {step_tol[tag]:.0e} | {level:.1e} | 2e-02 | {'pass' if ok else 'FAIL'} |")
print()
PY
    done
fi

# ---- (c) gpt-350m on one GPU: speed and memory --------------------------------------------------
if [[ $parts == *c* ]]; then
    big=(--set parallel.data=1 --set parallel.distributed_optimizer=false
        --set training.global_batch_size=8 --set training.micro_batch_size=4
        --set training.train_tokens=null --set training.schedule.warmup_iters=3
        --set training.eval_interval=1000
        --set 'data.blend=[{path: recipes/data/shakespeare.jsonl}]')
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
    case "$gpu" in *H200*) kind=h200 ;; *H100*) kind=h100 ;; *A100*) kind=a100 ;; *B200*) kind=b200 ;; *) kind=h100 ;; esac
    "$recipe_bin" plan recipes/gpt-350m.yaml "${big[@]}" --set "training.train_iters=$steps_c" \
        --nodes 1 --gpus-per-node 1 --gpu "$kind" --format json >"$logs/gpt-350m-plan.json" 2>"$logs/gpt-350m-plan.err"
    "$recipe_bin" plan recipes/gpt-350m.yaml "${big[@]}" --set "training.train_iters=$steps_c" \
        --nodes 1 --gpus-per-node 1 --gpu "$kind" >"$logs/gpt-350m-plan.txt" 2>&1
    train gpt-350m-bf16 cuda recipes/gpt-350m.yaml "$steps_c" "${big[@]}"
    python3 - "$logs" "$steps_c" >>"$tables" <<'PY'
import json, os, re, statistics, sys
logs, steps = sys.argv[1], int(sys.argv[2])
path = os.path.join(logs, "gpt-350m-bf16.jsonl")
rows = [json.loads(l) for l in open(path) if l.strip()] if os.path.exists(path) else []
rows = [r for r in rows if "loss" in r and "step" in r]
log = open(os.path.join(logs, "gpt-350m-bf16.log"), errors="replace").read()
peak = re.search(r"peak device memory ([0-9.]+) GiB", log)
try:
    plan = json.load(open(os.path.join(logs, "gpt-350m-plan.json")))
except Exception:
    plan = {}
print(f"### (c) gpt-350m, {steps} steps in bf16 on one GPU (micro 4 × 2, seq 2048)\n")
if not rows:
    print("no steps recorded: see gpt-350m-bf16.log\n")
    print("```\n" + log[-3000:] + "\n```")
    sys.exit(0)
steady = [r for r in rows if r["step"] > 5] or rows  # the first steps compile kernels
med = lambda k: statistics.median(r[k] for r in steady)
print("| | measured (median of steps 6+) | `recipe plan` predicts |")
print("|---|---|---|")
predicted = plan.get("predicted", {})
pred_step = predicted.get("step_seconds")
pred_tps = predicted.get("tokens_per_second_per_gpu")
pred_mfu = predicted.get("mfu")
pred_mem = plan.get("memory", {}).get("per_gpu_bytes", {}).get("total")
fmt = lambda v, f: f.format(v) if isinstance(v, (int, float)) else "see gpt-350m-plan.txt"
print(f"| step time | {med('step_seconds'):.3f} s | {fmt(pred_step, '{:.3f} s')} |")
print(f"| tokens/s | {med('tokens_per_second'):,.0f} | {fmt(pred_tps, '{:,.0f}')} |")
flops = plan.get("flops_per_iteration")
pred_tflops = flops / pred_step / 1e12 if isinstance(flops, (int, float)) and pred_step else None
print(f"| TFLOP/s per GPU | {med('tflops_per_gpu'):.1f} | {fmt(pred_tflops, '{:.0f}')} |")
print(f"| MFU (vs the plan's peak) | {100 * med('mfu'):.1f} % | {fmt(pred_mfu * 100 if isinstance(pred_mfu, (int, float)) else None, '{:.1f} %')} |")
print(f"| peak device memory | {peak.group(1) + ' GiB' if peak else 'n/a'} | {fmt(pred_mem / 2**30 if isinstance(pred_mem, (int, float)) else None, '{:.2f} GiB')} |")
first, last = rows[0]["loss"], rows[-1]["loss"]
print(f"| loss | {first:.3f} → {last:.3f} over {len(rows)} steps ({'falling' if last < first else 'NOT falling'}) | |")
print()
PY
    grep -E "FLOPs/iteration|predicted step|total " "$logs/gpt-350m-plan.txt" >>"$tables" 2>/dev/null || true
fi

tar czf "$OUT/train-logs.tar.gz" -C "$work" logs 2>/dev/null || true
echo
cat "$logs/runs.txt" 2>/dev/null
echo
cat "$tables"
