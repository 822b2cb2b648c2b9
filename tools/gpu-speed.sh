#!/usr/bin/env bash
# gpu-speed.sh — the GPU-speed run (issue 13) for the device machine, in one call:
#   (1) gpu_check --filter fused: cuDNN fused attention (bf16/f16, d 64/128, MHA/GQA, causal,
#       dropout) and the linear overrides against their composed versions, then attention
#       fwd/bwd TFLOP/s; cuDNN's own error log goes to $OUT/cudnn.log when a plan fails;
#   (2) PyTorch's SDPA at the same shapes (reference rates);
#   (3) the whole op table (nothing regressed: kernel names, spec-keyed kernel cache, linear);
#   (4) tools/gpu-train.sh part c (gpt-350m bf16, STEPS_C steps) with FERROTRON_OP_TIMING: the
#       per-op GPU time table lands in $OUT/op-timing-350m.md; PARTS adds b (parity curves);
#   (5) optionally gpt-1.3b (GPT13=1), micro batch MB13 (2).
#
# Built here, run there (the GPU machine has no Rust toolchain): copy gpu_check and recipe into
# a git-ignored folder of the checkout the device tool ships and carry it:
#   cargo build --release -p ferrotron-gpu-check && cargo build --release -p ferrotron-cli
#   cp target/release/{gpu_check,recipe} <checkout>/.gpu-dist/
#   device run: FERROTRON_DIST=.gpu-dist bash .gpu-dist/gpu-speed.sh      (carry: [".gpu-dist"])
#
# Env: OUT, FERROTRON_DIST (default ./dist), STEPS_C (8), PARTS (c), SKIP (letters of steps to skip).
set -uo pipefail

root=$(pwd)
OUT=${OUT:-/tmp/gpu-speed-out}
dist=${FERROTRON_DIST:-$root/dist}
skip=${SKIP:-}
# The device tool returns at most 8 files: everything is written to $W and tarred into
# $OUT/all.tar.gz at the end; the key tables are copied next to it.
final_out=$OUT
W=/tmp/gpu-speed-work
rm -rf "$W"
mkdir -p "$W" "$final_out"
OUT=$W
tools=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

cudnn_lib=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null || true)
nccl_lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
if [[ -n "$nccl_lib" && -e "$nccl_lib/libnccl.so.2" && ! -e "$nccl_lib/libnccl.so" ]]; then
    links=$(mktemp -d)
    ln -s "$nccl_lib/libnccl.so.2" "$links/libnccl.so"
    nccl_lib="$links:$nccl_lib"
fi
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${cudnn_lib:+:$cudnn_lib}${nccl_lib:+:$nccl_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
export FERROTRON_KERNEL_CACHE=/tmp/ferrotron-kernels
echo "cuDNN lib: ${cudnn_lib:-none}" >"$OUT/env.txt"
ls "$cudnn_lib" >>"$OUT/env.txt" 2>&1 || true

step() { echo "=== $* ($(date +%T))"; }

if [[ $skip != *1* ]]; then
    step "(1) fused ops"
    CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG="$OUT/cudnn.log" FERROTRON_CUDA_POISON=1 \
        timeout 300 "$dist/gpu_check" --filter fused >"$OUT/fused.md" 2>"$OUT/fused.log"
    echo "exit $?"
    grep -v "^| matmul\|^| add\|^| softmax" "$OUT/fused.md"
    tail -5 "$OUT/fused.log"
    if [[ -s "$OUT/cudnn.log" ]]; then
        head -c 4000000 "$OUT/cudnn.log" >"$OUT/cudnn.tmp" && mv "$OUT/cudnn.tmp" "$OUT/cudnn.log"
        grep -m 20 -i "error\|not_supported\|warn" "$OUT/cudnn.log" | cut -c1-300
    fi
fi

if [[ $skip != *2* ]]; then
    step "(2) PyTorch SDPA reference"
    timeout 120 python3 "$tools/sdpa_ref.py" 2>&1 | tail -20
fi

if [[ $skip != *3* ]]; then
    step "(3) full op table"
    FERROTRON_CUDA_POISON=1 timeout 400 "$dist/gpu_check" --no-timings >"$OUT/op-table.md" 2>"$OUT/op-table.log"
    echo "exit $?"
    grep -v '| yes |' "$OUT/op-table.md" | head -40
fi

big=(--world-size 1 --set checkpoint.dir=null --set parallel.data=1 --set parallel.distributed_optimizer=false
    --set training.train_tokens=null --set training.schedule.warmup_iters=3 --set training.log_interval=1
    --set training.eval_interval=1000 --set 'data.blend=[{path: recipes/data/shakespeare.jsonl}]')

if [[ $skip != *4* ]]; then
    step "(4a) gpt-350m, ${STEPS_T:-6} steps (micro batch 4, one microbatch) with per-op GPU timing"
    FERROTRON_OP_TIMING="$OUT/op-timing-350m.md" timeout 240 "$dist/recipe" run recipes/gpt-350m.yaml \
        --backend cuda --run-dir /tmp/t350 "${big[@]}" --set training.train_iters=${STEPS_T:-6} --set training.schedule.warmup_iters=1 \
        --set training.global_batch_size=4 --set training.micro_batch_size=4 >"$OUT/timing-350m.log" 2>&1
    echo "exit $?"
    tail -4 "$OUT/timing-350m.log" | cut -c1-300
    head -40 "$OUT/op-timing-350m.md" 2>/dev/null
    step "(4b) gpt-350m speed (tools/gpu-train.sh part c)"
    OUT="$OUT/train" FERROTRON_DIST="$dist" PARTS=${PARTS:-c} STEPS_C=${STEPS_C:-10} \
        RUN_TIMEOUT=${RUN_TIMEOUT:-240} bash "$tools/gpu-train.sh" >"$OUT/gpu-train.log" 2>&1
    echo "exit $?"
    tail -30 "$OUT/train/gpu-train.md" 2>/dev/null
    tail -6 /tmp/ferrotron-gpu-train/logs/gpt-350m-bf16.log 2>/dev/null | cut -c1-300
    if [[ ${DROPOUT0_350:-0} == 1 ]]; then
        step "(4c) gpt-350m, dropout 0, micro batch 4 x 2"
        timeout 240 "$dist/recipe" run recipes/gpt-350m.yaml --backend cuda --run-dir /tmp/t350d0 "${big[@]}" \
            --set training.train_iters=10 --set training.global_batch_size=8 --set training.micro_batch_size=4 \
            --set model.attention_dropout=0.0 --set model.hidden_dropout=0.0 >"$OUT/350m-d0.log" 2>&1
        echo "exit $?"
        grep "ferrotron::progress: step" "$OUT/350m-d0.log" | tail -2 | sed 's/.*progress: //' | cut -c1-220
    fi
fi

if [[ ${GPT13:-0} == 1 ]]; then
    step "(5) recipe plan, gpt-1.3b micro batch 2 on one H200"
    "$dist/recipe" plan recipes/gpt-1.3b.yaml --set parallel.data=1 --set parallel.distributed_optimizer=false \
        --set training.global_batch_size=2 --set training.micro_batch_size=2 --set training.train_tokens=null \
        --set training.train_iters=8 --nodes 1 --gpus-per-node 1 --gpu h200 2>&1 | grep -i "total\|predicted\|FLOPs" | head -5
    # "MB:DROPOUT" pairs; DROPOUT "preset" keeps the recipe's 0.1 / 0.1.
    for run in ${RUNS13:-2:preset 8:preset 8:0}; do
        mb=${run%%:*}
        dropout=${run##*:}
        extra=()
        if [[ $dropout != preset ]]; then
            extra=(--set model.attention_dropout=$dropout --set model.hidden_dropout=$dropout)
        fi
        step "(5) gpt-1.3b micro batch $mb, dropout $dropout"
        timeout 300 "$dist/recipe" run recipes/gpt-1.3b.yaml --backend cuda --run-dir /tmp/gpt13-$mb-$dropout \
            "${big[@]}" --set training.train_iters=${STEPS13:-8} "${extra[@]}" \
            --set training.global_batch_size=$mb --set training.micro_batch_size=$mb >"$OUT/gpt13-$mb-$dropout.log" 2>&1
        echo "exit $?"
        grep "ferrotron::progress: step" "$OUT/gpt13-$mb-$dropout.log" | tail -3 | sed 's/.*progress: //' | cut -c1-220
        grep -i "peak device memory\|error" "$OUT/gpt13-$mb-$dropout.log" | tail -3 | cut -c1-300
    done
fi

if [[ ${FE_LOG:-0} == 1 ]]; then
    step "(6) cudnn-frontend's own SDPA graph (torch), for comparison"
    CUDNN_FRONTEND_LOG_INFO=1 CUDNN_FRONTEND_LOG_FILE="$OUT/frontend.log" CUDNN_LOGLEVEL_DBG=3 \
        CUDNN_LOGDEST_DBG="$OUT/torch-cudnn.log" timeout 60 python3 -c "
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
q = torch.randn(2, 4, 128, 64, device='cuda', dtype=torch.bfloat16, requires_grad=True)
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    o = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    o.sum().backward()
torch.cuda.synchronize(); print('torch cudnn sdpa ok')" 2>&1 | tail -2
    head -c 8000000 "$OUT/torch-cudnn.log" >"$OUT/t.tmp" 2>/dev/null && mv "$OUT/t.tmp" "$OUT/torch-cudnn.log"
fi
cp -r /tmp/ferrotron-gpu-train/logs "$W/train-logs" 2>/dev/null || true
tar czf "$final_out/all.tar.gz" -C "$W" . 2>/dev/null || true
for f in fused.md op-timing-350m.md op-table.md; do
    [[ -f $W/$f ]] && cp "$W/$f" "$final_out/"
done
[[ -f $W/train/gpu-train.md ]] && cp "$W/train/gpu-train.md" "$final_out/"
