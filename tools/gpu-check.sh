#!/usr/bin/env bash
# gpu-check.sh — the GPU acceptance run of ferrotron-cuda, for the device machine.
#
# Built here, run there: the GPU machine has no Rust toolchain, so build the binaries first and
# carry the folder that holds them (git-ignored, default dist/):
#
#   cargo build --release -p ferrotron-gpu-check        # step (a)
#   cargo build --release -p ferrotron-cli --features burn-cuda     # steps (b) and (c)
#   mkdir -p dist && cp target/release/gpu_check target/release/recipe dist/
#   device run: bash tools/gpu-check.sh            (carry: ["dist"])
#
# Steps, logged under $OUT (the device tool returns that folder; training logs as one tarball):
#   (a) op table: every backend op on random inputs against burn-flex on the CPU, at dtype
#       tolerances, outputs poisoned first (gpu_check; full table in op-table.md).
#   (b) shakespeare-tiny, 50 steps, same seed, on cpu / cuda / burn-cuda; loss curves compared.
#   (c) gpt-350m, 30 steps on one H200: tokens/s, MFU, peak memory next to the plan's numbers.
# Steps (b) and (c) are tools/gpu-train.sh (see its header); the summary table prints last.
#
# Env: OUT (log folder, default /tmp/gpu-check-out), FERROTRON_DIST (binaries, default ./dist),
# GPU_CHECK_ARGS (extra gpu_check arguments, e.g. "--filter matmul").
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/gpu-check-out}
dist=${FERROTRON_DIST:-$root/dist}
mkdir -p "$OUT"
# The device tool returns at most 8 files: training logs are gathered here and tarred at the end.
logs=/tmp/ferrotron-gpu-check/logs
mkdir -p "$logs"
summary=()

# cuBLASLt and NVRTC live in the toolkit; NCCL in the Python wheel (design.md). cudarc's loader
# asks for libnccl.so, which some images only ship as libnccl.so.2: give it a link.
nccl_lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
if [[ -n "$nccl_lib" && -e "$nccl_lib/libnccl.so.2" && ! -e "$nccl_lib/libnccl.so" ]]; then
    links=$(mktemp -d)
    ln -s "$nccl_lib/libnccl.so.2" "$links/libnccl.so"
    nccl_lib="$links:$nccl_lib"
fi
# cuDNN (fused attention) is the wheel in torch's Python environment too.
cudnn_lib=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${cudnn_lib:+:$cudnn_lib}${nccl_lib:+:$nccl_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0

nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true

# ---- (a) op table -----------------------------------------------------------------------------
if [[ -x "$dist/gpu_check" ]]; then
    start=$SECONDS
    # shellcheck disable=SC2086
    # Poison every fresh GPU buffer (NaN / -1 / 0xFF) so unwritten output elements fail their row.
    FERROTRON_CUDA_POISON=1 "$dist/gpu_check" ${GPU_CHECK_ARGS:-} >"$OUT/op-table.md" 2>"$OUT/gpu_check.log"
    rc=$?
    passed=$(grep -o '^[0-9]*/[0-9]* rows pass' "$OUT/op-table.md" || echo "no table")
    summary+=("| (a) op table | $([[ $rc == 0 ]] && echo pass || echo FAIL) | $passed in $((SECONDS - start)) s |")
else
    summary+=("| (a) op table | missing | build gpu_check and copy it to $dist |")
fi

# ---- (b), (c): training, by tools/gpu-train.sh ---------------------------------------------------
if [[ -x "$dist/recipe" ]]; then
    OUT="$OUT/train" FERROTRON_DIST="$dist" bash "$root/tools/gpu-train.sh" >"$OUT/gpu-train.log" 2>&1
    rc=$?
    summary+=("| (b), (c) training | $([[ $rc == 0 ]] && echo pass || echo FAIL) | tables in train/gpu-train.md |")
else
    summary+=("| (b), (c) training | missing | build recipe and copy it to $dist |")
fi

tar czf "$OUT/train-logs.tar.gz" -C "$logs" . 2>/dev/null || true

# ---- tables last ------------------------------------------------------------------------------
echo
if [[ -s "$OUT/op-table.md" ]]; then
    grep -v '| yes |' "$OUT/op-table.md" | head -60
    echo "(rows that pass are omitted above; the full table is op-table.md)"
fi
tail -n 3 "$OUT/gpu_check.log" 2>/dev/null
echo
echo "| step | result | detail |"
echo "|---|---|---|"
printf '%s\n' "${summary[@]}"
