#!/usr/bin/env bash
# gpu-nccl.sh — the NCCL communicator on the GPU machine (issue 15), one call:
#   (a) gpu_check --filter nccl: a one-rank NCCL communicator runs every collective (device
#       tensors f32/bf16, host slices of every element type, split/new_group sub-communicators)
#       against exact expected results, then a timing row per collective at 1 and 256 MiB;
#   (b) recipes/shakespeare-tiny.yaml, STEPS (30) steps in bf16 on --backend cuda, once plain
#       (the one-rank loop) and once with --comm nccl (the rank loop over NCCL groups of one
#       GPU): both loss columns and their max relative difference, and the per-collective
#       bandwidth table the NCCL run prints at exit. At world 1 every group has one rank (the
#       runtime skips collectives of one), so the runs differ only in the training loop (the
#       rank loop against the one-rank loop): expected equal up to bf16 noise (< 1e-2 relative;
#       a larger difference is a bug in the rank loop on the GPU, not in NCCL);
#   (t) two ranks of pure data parallelism on ONE GPU over TCP (--nproc-per-node 2 --comm tcp:
#       the host carries the collectives, NCCL refuses two ranks on one GPU): the replicated
#       device step (flat gradient buffers averaged per bucket during the last backward; ZeRO-1
#       parts with reduce-scatter and all-gather) against one GPU with the same global batch,
#       and each overlap switched off against on (expected: the same losses up to bf16 sums);
#       and two pipeline stages the same way (the pipeline's sends and receives); tensor
#       parallel 2 with sequence parallelism, alone and as tp 2 × dp 2 with ZeRO-1 (4 ranks);
#   (x) the device exchange of every other layout (`step/per_chunk.rs`), ranks on ONE GPU over
#       TCP against one GPU with the same global batch: pipeline 2 × data 2 with ZeRO-1 (bf16
#       and fp32), context parallel 2, and MoE (4 experts, top-2) over data 2 and over expert 2 ×
#       data 4 with ZeRO-1 (expert groups cut over expert-dp, dense ones over dp);
#   (f) failures of a GPU rank (issue 44): two data-parallel ranks on ONE GPU over TCP, rank 1
#       killed (SIGKILL) after two steps, then stopped (SIGSTOP) with a distributed timeout of
#       3 s: how long until the launcher exits, and whether rank 0's error names rank 1 (the
#       NCCL side of the watchdog is part (a)'s `watchdog_blocked_stream` row);
#   (L) context parallel 2 at 32k tokens (a 2-layer LLaMA-style model), two ranks on ONE GPU over
#       TCP against one GPU with the same batch (issue 48's long-context equivalence);
#   (m) only with PARTS containing m and at least two GPUs (2, 4 or 8): every layout over NCCL
#       (tp2 with and without SP, pp2, pp2·vpp2, dp2, dp2 + ZeRO-1, cp2, MoE ep2 and ep2·etp2,
#       tp2·pp2·dp2; each when the machine has its world size) against one GPU with the same
#       global batch, and gpt-1.3b's data-parallel scaling with the bus bandwidth per collective.
#
# Built here, run there (the GPU machine has no Rust toolchain):
#   CARGO_PROFILE_DEV_OPT_LEVEL=3 cargo build --workspace --bins
#   mkdir -p .gpu-dist && strip -o .gpu-dist/recipe target/debug/recipe \
#       && strip -o .gpu-dist/gpu_check target/debug/gpu_check
#   device run: bash tools/gpu-nccl.sh        (carry: [".gpu-dist"])
#
# NCCL comes from the image's Python (pip's nvidia-nccl wheel). cudarc loads `libnccl.so` and
# does not try `libnccl.so.2`, so when the wheel has only the latter this makes a folder with a
# `libnccl.so` symlink and puts it on LD_LIBRARY_PATH.
#
# Env: OUT (results, default /tmp/gpu-nccl-out), FERROTRON_DIST (binaries, default .gpu-dist),
# PARTS (default "ab"; t for two ranks on one GPU over TCP, x for the device exchange's
# layouts on one GPU over TCP, L for context parallel 2 at 32k on one GPU over TCP, f for the failing ranks, m for the multi-GPU run), STEPS
# (30), RUN_TIMEOUT (300).
# Output: the tables last on stdout and in $OUT/gpu-nccl.md; full logs under $OUT/logs.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/gpu-nccl-out}
dist=${FERROTRON_DIST:-$root/.gpu-dist}
parts=${PARTS:-ab}
steps=${STEPS:-30}
run_timeout=${RUN_TIMEOUT:-300}
logs=$OUT/logs
work=/tmp/ferrotron-gpu-nccl
rm -rf "$work"
mkdir -p "$logs" "$work"
tables=$OUT/gpu-nccl.md
: >"$tables"

nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
if [[ -z $nccl_dir || ! -d $nccl_dir ]]; then
    echo "NCCL: python3 has no nvidia.nccl package (pip install nvidia-nccl-cu13)" | tee -a "$tables"
fi
link_dir=$work/nccl-lib
if [[ -n $nccl_dir && ! -e $nccl_dir/libnccl.so && -e $nccl_dir/libnccl.so.2 ]]; then
    mkdir -p "$link_dir"
    ln -sf "$nccl_dir/libnccl.so.2" "$link_dir/libnccl.so"
    nccl_dir=$link_dir:$nccl_dir
fi
cudnn_lib=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${nccl_dir:+:$nccl_dir}${cudnn_lib:+:$cudnn_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
export FERROTRON_KERNEL_CACHE=${FERROTRON_KERNEL_CACHE:-$work/kernels}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/nvidia-smi.txt" 2>&1 || true
ngpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >"$logs/env.txt"
ls -l ${nccl_dir//:/ } >>"$logs/env.txt" 2>&1 || true

for bin in recipe gpu_check; do
    if [[ ! -x $dist/$bin ]]; then
        echo "no $bin binary in $dist: build it and carry the folder (see the header)" >&2
        exit 2
    fi
done

# ---- (a) every collective on a one-rank communicator, and its timing rows -------------------
if [[ $parts == *a* ]]; then
    timeout "$run_timeout" "$dist/gpu_check" --filter nccl >"$logs/gpu-check-nccl.md" 2>"$logs/gpu-check-nccl.err"
    echo "gpu_check --filter nccl: exit $?" >>"$logs/runs.txt"
    {
        echo "### (a) gpu_check --filter nccl"
        echo
        cat "$logs/gpu-check-nccl.md"
        tail -n 5 "$logs/gpu-check-nccl.err"
        echo
    } >>"$tables"
fi

# train TAG STEPS [recipe args...]: one shakespeare-tiny run in bf16, metrics in $logs/TAG.jsonl.
train() {
    local tag=$1
    shift
    local start=$SECONDS
    timeout "$run_timeout" "$dist/recipe" run recipes/shakespeare-tiny.yaml --backend cuda \
        --run-dir "$work/$tag" \
        --set "training.train_iters=$steps" \
        --set training.log_interval=1 \
        --set training.seed=1234 \
        --set precision.dtype=bf16 \
        --set checkpoint.dir=null \
        --set "logging.jsonl=$logs/$tag.jsonl" "$@" >"$logs/$tag.log" 2>&1
    local rc=$?
    echo "$tag: exit $rc in $((SECONDS - start)) s" >>"$logs/runs.txt"
    return $rc
}

compare() { # compare TITLE REF OTHER
    python3 - "$logs" "$steps" "$@" >>"$tables" <<'PY'
import json, os, sys
logs, steps, title, ref, other = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
def losses(tag):
    path = os.path.join(logs, f"{tag}.jsonl")
    rows = [json.loads(l) for l in open(path) if l.strip()] if os.path.exists(path) else []
    return {r["step"]: r["loss"] for r in rows if "loss" in r and "step" in r}
a, b = losses(ref), losses(other)
print(f"### {title}\n")
print(f"| step | {ref} | {other} | rel diff |")
print("|---|---|---|---|")
worst = 0.0
for step in range(1, steps + 1):
    x, y = a.get(step), b.get(step)
    if x is None or y is None:
        print(f"| {step} | {x if x is not None else '—'} | {y if y is not None else '—'} | — |")
        continue
    rel = abs(x - y) / abs(x)
    worst = max(worst, rel)
    print(f"| {step} | {x:.6f} | {y:.6f} | {rel:.2e} |")
n = len(set(a) & set(b))
print(f"\n{ref}: {len(a)} steps, {other}: {len(b)} steps; max relative difference over {n} common "
      f"steps: {worst:.3e}\n")
PY
}

# ---- (b) world 1 with and without NCCL ------------------------------------------------------
if [[ $parts == *b* ]]; then
    train tiny-bf16-plain --world-size 1
    FERROTRON_COMM=nccl train tiny-bf16-nccl --world-size 1
    compare "(b) shakespeare-tiny, $steps steps bf16, one H200: plain vs --comm nccl" tiny-bf16-plain tiny-bf16-nccl
    {
        echo "NCCL run, collectives at exit:"
        grep -A 9 "NCCL collectives" "$logs/tiny-bf16-nccl.log" || echo "(none recorded: at world 1 the runtime skips groups of one)"
        grep -E "NCCL world ready|error" "$logs/tiny-bf16-nccl.log" | tail -n 3
        echo
    } >>"$tables"
fi

# ---- (t) two data-parallel ranks on one GPU over TCP ----------------------------------------
if [[ $parts == *t* ]]; then
    # 8 samples per step: 2 microbatches of 4 on one rank, one of 4 on each of the two ranks
    mb=(--set training.global_batch_size=8 --set training.micro_batch_size=4)
    dp2=(--nproc-per-node 2 --set parallel.data=2 "${mb[@]}")
    train tiny-bf16-mb4 --world-size 1 "${mb[@]}"
    FERROTRON_COMM=tcp train tiny-bf16-dp2 "${dp2[@]}"
    FERROTRON_COMM=tcp train tiny-bf16-dp2-after "${dp2[@]}" --set parallel.overlap_grad_reduce=false
    FERROTRON_COMM=tcp train tiny-bf16-zero1 "${dp2[@]}" --set parallel.distributed_optimizer=true
    FERROTRON_COMM=tcp train tiny-bf16-zero1-after "${dp2[@]}" --set parallel.distributed_optimizer=true \
        --set parallel.overlap_grad_reduce=false --set parallel.overlap_param_gather=false
    compare "(t) data parallel, 2 ranks on one GPU over TCP, vs one GPU (same global batch)" \
        tiny-bf16-mb4 tiny-bf16-dp2
    compare "(t) overlapped reduction vs after the backward" tiny-bf16-dp2 tiny-bf16-dp2-after
    compare "(t) ZeRO-1, 2 ranks, vs one GPU" tiny-bf16-mb4 tiny-bf16-zero1
    compare "(t) ZeRO-1: both overlaps vs neither" tiny-bf16-zero1 tiny-bf16-zero1-after
    # two pipeline stages (2 layers each) on one GPU, 2 microbatches through 1F1B
    FERROTRON_COMM=tcp train tiny-bf16-pp2 --nproc-per-node 2 --set parallel.pipeline=2 \
        --set parallel.data=1 "${mb[@]}"
    compare "(t) two pipeline stages on one GPU over TCP vs one GPU" tiny-bf16-mb4 tiny-bf16-pp2
    # tensor parallel 2 with sequence parallelism through the replicated device step (partial
    # norm gradients summed over tp, tp collectives on the compute path), alone and under dp 2.
    # Megatron pads the vocabulary to a multiple of 128 × tp: 50432 at tp 2, so the reference
    # one-GPU runs pad to a multiple of 256 to hold the same model.
    same_vocab=(--set model.make_vocab_size_divisible_by=256)
    tp2=(--set parallel.tensor=2 --set parallel.sequence_parallel=true)
    train tiny-bf16-mb4-v256 --world-size 1 "${mb[@]}" "${same_vocab[@]}"
    FERROTRON_COMM=tcp train tiny-bf16-tp2 --nproc-per-node 2 "${tp2[@]}" --set parallel.data=1 "${mb[@]}"
    compare "(t) tensor parallel 2 (sequence parallel) on one GPU over TCP vs one GPU" \
        tiny-bf16-mb4-v256 tiny-bf16-tp2
    FERROTRON_COMM=tcp train tiny-bf16-tp2-dp2-zero1 --nproc-per-node 4 "${tp2[@]}" \
        --set parallel.data=2 --set parallel.distributed_optimizer=true "${mb[@]}"
    compare "(t) tp 2 × dp 2 with ZeRO-1, four ranks on one GPU over TCP, vs one GPU" \
        tiny-bf16-mb4-v256 tiny-bf16-tp2-dp2-zero1
    # the same tp 2 in fp32: the layout's own arithmetic without bf16's roundings of partial sums
    fp32=(--set precision.dtype=fp32)
    train tiny-f32-mb4-v256 --world-size 1 "${mb[@]}" "${same_vocab[@]}" "${fp32[@]}"
    FERROTRON_COMM=tcp train tiny-f32-tp2 --nproc-per-node 2 "${tp2[@]}" --set parallel.data=1 "${mb[@]}" "${fp32[@]}"
    compare "(t) tensor parallel 2 in fp32 vs one GPU in fp32" tiny-f32-mb4-v256 tiny-f32-tp2
    compare "(t) tensor parallel 2: bf16 vs fp32 (must differ: the TCP ranks train in the recipe's dtype)" \
        tiny-f32-tp2 tiny-bf16-tp2
    grep -h "training on the GPU" "$logs"/tiny-*-tp2.log "$logs/tiny-bf16-dp2.log" | cut -c1-200 >>"$tables"
fi

# ---- (x) the device exchange: pipeline × data with ZeRO-1, context parallel, MoE ------------
if [[ $parts == *x* ]]; then
    mb=(--set training.global_batch_size=8 --set training.micro_batch_size=4)
    fp32=(--set precision.dtype=fp32)
    pp2dp2=(--nproc-per-node 4 --set parallel.pipeline=2 --set parallel.data=2
        --set parallel.distributed_optimizer=true)
    [[ -e $logs/tiny-bf16-mb4.jsonl ]] || train tiny-bf16-mb4 --world-size 1 "${mb[@]}"
    train tiny-f32-mb4 --world-size 1 "${mb[@]}" "${fp32[@]}"
    FERROTRON_COMM=tcp train tiny-bf16-pp2-dp2-zero1 "${pp2dp2[@]}" "${mb[@]}"
    FERROTRON_COMM=tcp train tiny-f32-pp2-dp2-zero1 "${pp2dp2[@]}" "${mb[@]}" "${fp32[@]}"
    compare "(x) pipeline 2 × data 2 with ZeRO-1, four ranks on one GPU over TCP, vs one GPU" \
        tiny-bf16-mb4 tiny-bf16-pp2-dp2-zero1
    compare "(x) the same in fp32" tiny-f32-mb4 tiny-f32-pp2-dp2-zero1
    FERROTRON_COMM=tcp train tiny-bf16-pp2-dp2-zero1-after "${pp2dp2[@]}" "${mb[@]}" \
        --set parallel.overlap_grad_reduce=false --set parallel.overlap_param_gather=false
    compare "(x) pipeline × data with ZeRO-1: both overlaps vs neither (expected: 0)" \
        tiny-bf16-pp2-dp2-zero1 tiny-bf16-pp2-dp2-zero1-after
    FERROTRON_COMM=tcp train tiny-bf16-cp2 --nproc-per-node 2 --set parallel.context=2 \
        --set parallel.data=1 "${mb[@]}"
    compare "(x) context parallel 2 on one GPU over TCP vs one GPU" tiny-bf16-mb4 tiny-bf16-cp2
    # MoE: routing decisions flip on bf16 noise and part the curves later (gpu-train.sh)
    # shellcheck source=tools/gpu-families.sh
    source "$root/tools/gpu-families.sh"
    train tiny-f32-moe --world-size 1 "${mb[@]}" "${fp32[@]}" "${moe_sets[@]}"
    FERROTRON_COMM=tcp train tiny-f32-moe-dp2 --nproc-per-node 2 --set parallel.data=2 \
        "${mb[@]}" "${fp32[@]}" "${moe_sets[@]}"
    # micro batches of 2 on both sides: the load-balancing loss is a function of each
    # microbatch's routing, so other microbatch sizes are another objective
    mb2=(--set training.global_batch_size=8 --set training.micro_batch_size=2)
    train tiny-f32-moe-mb2 --world-size 1 "${mb2[@]}" "${fp32[@]}" "${moe_sets[@]}"
    FERROTRON_COMM=tcp train tiny-f32-moe-ep2-dp4-zero1 --nproc-per-node 4 --set parallel.data=4 \
        --set parallel.expert=2 --set parallel.distributed_optimizer=true "${mb2[@]}" "${fp32[@]}" \
        "${moe_sets[@]}"
    compare "(x) MoE over data 2, fp32, on one GPU over TCP vs one GPU" tiny-f32-moe tiny-f32-moe-dp2
    compare "(x) MoE over expert 2 × data 4 with ZeRO-1, fp32, vs one GPU" tiny-f32-moe-mb2 \
        tiny-f32-moe-ep2-dp4-zero1
    grep -h "training on the GPU" "$logs"/tiny-*-zero1.log "$logs/tiny-bf16-cp2.log" | cut -c1-200 >>"$tables"
    grep -h -i "error" "$logs"/tiny-*-{zero1,cp2,dp2}.log 2>/dev/null | head -n 5 >>"$tables"
fi

# ---- (L) context parallel 2 at 32k tokens on one GPU over TCP ------------------------------
# Long context is where context parallelism is used and where Megatron's tracker reports its
# crashes: a LLaMA-style model (RoPE, RMSNorm, SwiGLU, GQA 4 on 2) of 2 layers, hidden 256, at
# sequences of 32,768 tokens, two microbatches of one a step, split over two ranks sharing the
# GPU (each holds 16,384 tokens of every sequence and the causal attention's K/V exchange runs
# over TCP) against one GPU with the same batch: expected the same losses up to bf16 sums.
if [[ $parts == *L* ]]; then
    # shellcheck source=tools/gpu-families.sh
    source "$root/tools/gpu-families.sh"
    long=("${llama_sets[@]}" --set model.num_layers=2 --set model.hidden_size=256
        --set model.num_attention_heads=4 --set model.ffn_hidden_size=704
        --set model.seq_length=32768 --set model.max_position_embeddings=32768
        --set training.global_batch_size=2 --set training.micro_batch_size=1)
    train long-bf16-32k --world-size 1 "${long[@]}"
    FERROTRON_COMM=tcp train long-bf16-32k-cp2 --nproc-per-node 2 --set parallel.context=2 \
        --set parallel.data=1 "${long[@]}"
    compare "(L) context parallel 2 at 32k tokens, two ranks on one GPU over TCP, vs one GPU" \
        long-bf16-32k long-bf16-32k-cp2
    grep -h -i "error\|panicked" "$logs"/long-bf16-32k*.log 2>/dev/null | head -n 5 >>"$tables"
fi

# ---- (m) every layout over NCCL on several GPUs, and data-parallel scaling -------------------
# Each layout against one GPU with the same global batch (8 sequences a step) and the same micro
# batch, as (t) and (x) do over TCP: tp2 (with and without sequence parallelism), pp2,
# pp2·vpp2, dp2, dp2 + ZeRO-1, cp2, and the MoE over ep2 and ep2·etp2, then tp2·pp2·dp2; a
# layout runs when the machine has its world size in GPUs. Then gpt-1.3b's data-parallel
# scaling (12 sequences of 2048 a GPU, 10 steps) on 1, 2, 4 and 8 GPUs up to the machine's
# count: tokens/s per GPU and the per-collective bus bandwidth the NCCL run prints at exit.
fault() { # fault TAG SIGNAL [recipe args]: signal rank 1 after two logged steps
    local tag=$1 signal=$2
    shift 2
    FERROTRON_COMM=tcp "$dist/recipe" run recipes/shakespeare-tiny.yaml --backend cuda \
        --nproc-per-node 2 --set parallel.data=2 --set training.train_iters=100000 \
        --set training.global_batch_size=8 --set training.micro_batch_size=4 \
        --set training.log_interval=1 --set checkpoint.dir=null --run-dir "$work/$tag" \
        --set "logging.jsonl=$logs/$tag.jsonl" "$@" >"$logs/$tag.log" 2>&1 &
    local launcher=$! waited=0
    while [[ $(wc -l <"$logs/$tag.jsonl" 2>/dev/null || echo 0) -lt 2 && $waited -lt 1200 ]]; do
        sleep 0.1
        waited=$((waited + 1))
    done
    local victim=""
    for pid in $(cat /proc/$launcher/task/*/children 2>/dev/null); do
        tr '\0' '\n' </proc/$pid/environ 2>/dev/null | grep -qx RANK=1 && victim=$pid
    done
    local start=$SECONDS
    [[ -n $victim ]] && kill "-$signal" "$victim"
    timeout 120 tail --pid="$launcher" -f /dev/null
    wait "$launcher"
    local rc=$? named=no
    grep -q "rank 1" "$logs/$tag.log" && named=yes
    echo "| $tag | SIG$signal | $rc | $((SECONDS - start)) s | $named | $(grep -m1 '^error' "$logs/$tag.log" | cut -c1-150) |" >>"$tables"
}

if [[ $parts == *f* ]]; then
    echo "### (f) a failing GPU rank of two on one GPU over TCP" >>"$tables"
    echo >>"$tables"
    echo "| run | signal to rank 1 | launcher exit | ended after | names rank 1 | first error line |" >>"$tables"
    echo "|---|---|---:|---:|---|---|" >>"$tables"
    fault fault-kill KILL
    fault fault-stop STOP --set parallel.distributed_timeout_minutes=0.05
    echo >>"$tables"
fi

if [[ $parts == *m* && $ngpu -ge 2 ]]; then
    mb=(--set training.global_batch_size=8 --set training.micro_batch_size=4)
    mb2=(--set training.global_batch_size=8 --set training.micro_batch_size=2)
    fp32=(--set precision.dtype=fp32)
    same_vocab=(--set model.make_vocab_size_divisible_by=256)
    sp=(--set parallel.sequence_parallel=true)
    # shellcheck source=tools/gpu-families.sh
    source "$root/tools/gpu-families.sh"
    [[ -e $logs/tiny-bf16-mb4.jsonl ]] || train tiny-bf16-mb4 --world-size 1 "${mb[@]}"
    [[ -e $logs/tiny-bf16-mb4-v256.jsonl ]] || train tiny-bf16-mb4-v256 --world-size 1 "${mb[@]}" "${same_vocab[@]}"
    train tiny-bf16-mb2 --world-size 1 "${mb2[@]}"
    train tiny-f32-moe-m --world-size 1 "${mb[@]}" "${fp32[@]}" "${moe_sets[@]}"
    train tiny-f32-moe-m-v256 --world-size 1 "${mb[@]}" "${fp32[@]}" "${moe_sets[@]}" "${same_vocab[@]}"
    # name | GPUs | reference | overrides (one string, split on spaces)
    layouts=(
        "nccl-tp2|2|tiny-bf16-mb4-v256|--set parallel.tensor=2 --set parallel.data=1"
        "nccl-tp2-sp|2|tiny-bf16-mb4-v256|--set parallel.tensor=2 --set parallel.sequence_parallel=true --set parallel.data=1"
        "nccl-pp2|2|tiny-bf16-mb4|--set parallel.pipeline=2 --set parallel.data=1"
        "nccl-pp2-vpp2|2|tiny-bf16-mb2|--set parallel.pipeline=2 --set parallel.virtual_pipeline=2 --set parallel.data=1 --set training.micro_batch_size=2"
        "nccl-dp2|2|tiny-bf16-mb4|--set parallel.data=2"
        "nccl-dp2-zero1|2|tiny-bf16-mb4|--set parallel.data=2 --set parallel.distributed_optimizer=true"
        "nccl-cp2|2|tiny-bf16-mb4|--set parallel.context=2 --set parallel.data=1"
        "nccl-moe-ep2|2|tiny-f32-moe-m|--set parallel.data=2 --set parallel.expert=2 --set precision.dtype=fp32 MOE"
        "nccl-moe-ep2-etp2|4|tiny-f32-moe-m-v256|--set parallel.tensor=2 --set parallel.sequence_parallel=true --set parallel.data=2 --set parallel.expert=2 --set parallel.expert_tensor=2 --set precision.dtype=fp32 MOE"
        "nccl-tp2-pp2-dp2|8|tiny-bf16-mb4-v256|--set parallel.tensor=2 --set parallel.sequence_parallel=true --set parallel.pipeline=2 --set parallel.data=2 --set parallel.distributed_optimizer=true"
    )
    for layout in "${layouts[@]}"; do
        IFS='|' read -r name gpus reference sets <<<"$layout"
        if [[ $ngpu -lt $gpus ]]; then
            echo "$name: needs $gpus GPUs, the machine has $ngpu" >>"$logs/runs.txt"
            continue
        fi
        read -r -a words <<<"${sets/ MOE/}"
        [[ $sets == *MOE ]] && words+=("${moe_sets[@]}")
        train "$name" --nproc-per-node "$gpus" "${mb[@]}" "${words[@]}"
        compare "(m) $name over NCCL on $gpus GPUs vs one GPU ($reference)" "$reference" "$name"
        grep -A 9 "NCCL collectives" "$logs/$name.log" >>"$tables" || true
    done
    big=(--set checkpoint.dir=null --set training.train_tokens=null --set training.train_iters=10
        --set training.schedule.warmup_iters=3 --set training.log_interval=1
        --set training.eval_interval=100000 --set 'data.blend=[{path: recipes/data/shakespeare.jsonl}]'
        --set data.split=98,2,0 --set training.micro_batch_size=12)
    echo "### (m) gpt-1.3b data-parallel scaling over NCCL (12 × 2048 a GPU, 10 steps)" >>"$tables"
    echo >>"$tables"
    echo "| GPUs | tokens/s (steps 4–10) | tokens/s a GPU |" >>"$tables"
    echo "|---:|---:|---:|" >>"$tables"
    for n in 1 2 4 8; do
        [[ $n -le $ngpu ]] || break
        start=$SECONDS
        timeout "$run_timeout" "$dist/recipe" run recipes/gpt-1.3b.yaml --backend cuda --nproc-per-node "$n" \
            --run-dir "$work/gpt13-dp$n" "${big[@]}" --set parallel.data="$n" \
            --set parallel.distributed_optimizer=$([[ $n -gt 1 ]] && echo true || echo false) \
            --set training.global_batch_size=$((12 * n)) \
            --set "logging.jsonl=$logs/gpt13-dp$n.jsonl" >"$logs/gpt13-dp$n.log" 2>&1
        echo "gpt13-dp$n: exit $? in $((SECONDS - start)) s" >>"$logs/runs.txt"
        python3 - "$logs/gpt13-dp$n.jsonl" "$n" >>"$tables" <<'PY'
import json, os, sys
path, n = sys.argv[1], int(sys.argv[2])
rows = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
rates = [r["tokens_per_second"] for r in rows if r.get("step", 0) >= 4 and "tokens_per_second" in r]
mean = sum(rates) / len(rates) if rates else float("nan")
print(f"| {n} | {mean:,.0f} | {mean / n:,.0f} |")
PY
        grep -A 9 "NCCL collectives" "$logs/gpt13-dp$n.log" >>"$tables" || true
    done
    echo >>"$tables"
fi

echo >>"$tables"
cat "$logs/runs.txt" >>"$tables" 2>/dev/null
cat "$tables"
