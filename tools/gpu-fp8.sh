#!/usr/bin/env bash
# gpu-fp8.sh — the fp8 measurements of issue 17 in one call on the GPU machine (one H200):
#   1. `gpu_check --filter fp8`: the cast-transpose, amax, fp8 GEMM and scale-update kernels
#      against the host arithmetic, the fp8 linear against its CPU reference and bf16, then the
#      casts' speed at the training shapes;
#   2. `gpu-bench.sh` rows bf16 and fp8 hybrid of gpt-1.3b and the LLaMA-style 1B (micro
#      batches 4 and 6) in the same call (the speed-up table; the bar is 1.35×);
#   2b. the same fp8 rows with OP_TIMING=1: per-op GPU time tables (ops/logs/*.ops.md);
#   3. `gpu-fp8-curve.sh`: 300 steps of GPT-2 124M, fp8 against bf16 from the same weights,
#      three seeds;
#   4. `gpu-resume.sh` with fp8: a run killed after its checkpoints and resumed must continue
#      the uninterrupted run's losses bit for bit (the scaling state is in the checkpoint).
# The tables are printed last; logs under $OUT.
#
# Built here, run there:
#   CARGO_TARGET_DIR=/work/target-rel cargo build --release --locked -p ferrotron-cli -p ferrotron-gpu-check --bins
#   mkdir -p .gpu-dist && strip -o .gpu-dist/recipe $CARGO_TARGET_DIR/release/recipe \
#       && strip -o .gpu-dist/gpu_check $CARGO_TARGET_DIR/release/gpu_check
#   device run: bash tools/gpu-fp8.sh        (carry: [".gpu-dist"])
# Env: OUT (/tmp/gpu-fp8-out), FERROTRON_DIST (.gpu-dist), BENCH_STEPS (20), SKIP ("bench
# ops curve resume": parts to leave out).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/gpu-fp8-out}
dist=${FERROTRON_DIST:-$root/.gpu-dist}
export FERROTRON_DIST=$dist
mkdir -p "$OUT"
skip=" ${SKIP:-} "

cudnn_lib=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${cudnn_lib:+:$cudnn_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FERROTRON_KERNEL_CACHE=${FERROTRON_KERNEL_CACHE:-/tmp/ferrotron-kernels}
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>&1 | head -1

echo "=== 1. gpu_check --filter fp8 ($(date +%T))"
timeout 300 "$dist/gpu_check" --filter fp8 >"$OUT/gpu-check-fp8.md" 2>"$OUT/gpu-check-fp8.err"
echo "exit $?"

if [[ $skip != *" bench "* ]]; then
    echo "=== 2. bench bf16 vs fp8 ($(date +%T))"
    OUT=$OUT/bench STEPS=${BENCH_STEPS:-20} ONLY="gpt-1.3b gpt-1.3b-fp8 llama-1b-mb4 llama-1b-mb4-fp8 llama-1b-mb6 llama-1b-mb6-fp8" \
        bash tools/gpu-bench.sh >"$OUT/bench.out" 2>&1
    echo "exit $?"
fi
if [[ $skip != *" ops "* ]]; then
    # Where an fp8 step's time goes: the per-op GPU time table of the fp8 rows (the events
    # around every op slow the run, so its speed is not the bench's).
    echo "=== 2b. fp8 op tables ($(date +%T))"
    OUT=$OUT/ops STEPS=8 OP_TIMING=1 ONLY="gpt-1.3b-fp8 llama-1b-mb6-fp8" \
        bash tools/gpu-bench.sh >"$OUT/ops.out" 2>&1
    echo "exit $?"
fi
if [[ $skip != *" curve "* ]]; then
    echo "=== 3. 124M curve ($(date +%T))"
    OUT=$OUT/curve bash tools/gpu-fp8-curve.sh >"$OUT/curve.out" 2>&1
    echo "exit $?"
fi
if [[ $skip != *" resume "* ]]; then
    echo "=== 4. fp8 resume ($(date +%T))"
    OUT=$OUT/resume FAMILIES=gpt STEPS=12 INTERVAL=4 KILLS=2 EXTRA_SETS="--set precision.fp8=hybrid" \
        bash tools/gpu-resume.sh >"$OUT/resume.out" 2>&1
    echo "exit $?"
fi

echo
echo "## gpu_check --filter fp8"
tail -n 40 "$OUT/gpu-check-fp8.md"
tail -n 3 "$OUT/gpu-check-fp8.err"
for ops in "$OUT"/ops/logs/*.ops.md; do
    if [[ -f $ops ]]; then
        echo
        echo "## $(basename "$ops") (the 12 costliest ops)"
        head -n 14 "$ops"
    fi
done
for part in bench/gpu-bench.md curve/gpu-fp8-curve.md resume/gpu-resume.md; do
    if [[ -f $OUT/$part ]]; then
        echo
        echo "## $part"
        cat "$OUT/$part"
    fi
done
