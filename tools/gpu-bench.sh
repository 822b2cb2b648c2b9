#!/usr/bin/env bash
# gpu-bench.sh — one call on the GPU machine: train each benchmark model for a few dozen steps
# on one GPU and print one table: tokens/s, TFLOP/s, MFU (Megatron's FLOPs against 989 TFLOP/s
# dense bf16), peak memory (the live tensors, from the allocator, and the whole device, sampled
# with nvidia-smi), and the planner's predicted step time and memory for the same layout with the
# ratios measured / predicted (memory: the device's peak, the number a plan must bound).
#
# Built here, run there (the GPU machine has no Rust toolchain):
#   CARGO_PROFILE_DEV_OPT_LEVEL=3 cargo build --workspace --bins
#   strip -o .gpu-dist/recipe target/debug/recipe       (.gpu-dist is git-ignored locally)
#   device run: FERROTRON_DIST=.gpu-dist bash tools/gpu-bench.sh     (carry: [".gpu-dist"])
#
# Env: OUT (table and logs), FERROTRON_DIST (the folder holding `recipe`), STEPS (30), SKIP (the
# first steps the table leaves out as warm-up, 5; the 8B rows take a minute a step and their
# first update is ten times the later ones': STEPS=3 SKIP=1; no row evaluates,
# `training.eval_iters=0`),
# ONLY (space-separated model names to run; default all), RUN_TIMEOUT (seconds per run, 300),
# OP_TIMING=1 (each run also writes its per-op GPU time table, FERROTRON_OP_TIMING, to
# logs/<name>.ops.md, and where the stream waited for the host, from FERROTRON_OP_TIMELINE
# through tools/gpu_timeline.py, to logs/<name>.gaps.md; the events around every op slow the
# host, so the speed of such a run is not the bench's and its gaps are an upper bound),
# LOG_INTERVAL (1: every step's statistics are read, so the host waits for the GPU once a step;
# a larger interval lets the host queue the next step while the GPU runs, as a real run logging
# every 10–100 steps does; each logged row is the mean over its interval), EXTRA_SETS (more
# `--set key=value` words for every run, e.g. "--set model.activation=gelu" to compare), TAG (a
# suffix for every row's name, so two settings of the same model in one OUT keep their rows: run
# again with TAG=-notune EXTRA_SETS='--set runtime.gemm_tune=false' to compare), TORCH=1 (after each row, PyTorch +
# torch.compile trains the same model at the same shapes, `tools/torch_ref.py` reading the row's
# plan; a second table puts the two side by side; fp8 rows have no reference and say so),
# PLAN_ONLY=1 (no run: each row's plan, its memory, step and MFU, on the card named by GPU, h100
# or h200 (default: this machine's); works on a machine without a GPU).
set -uo pipefail

root=$(pwd)
OUT=${OUT:-/tmp/gpu-bench-out}
dist=${FERROTRON_DIST:-$root/dist}
steps=${STEPS:-30}
mkdir -p "$OUT/logs"

cudnn_lib=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${cudnn_lib:+:$cudnn_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FERROTRON_KERNEL_CACHE=${FERROTRON_KERNEL_CACHE:-/tmp/ferrotron-kernels}

# The planner's chip: the one on this machine (an H100's step is predicted with its own HBM
# bandwidth and memory, not an H200's).
case ${GPU:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)} in
    *H100* | h100) gpu=h100 ;;
    *) gpu=h200 ;;
esac
common=(--set checkpoint.dir=null --set parallel.data=1 --set parallel.distributed_optimizer=false
    --set training.train_tokens=null --set training.schedule.warmup_iters=3 --set training.log_interval=${LOG_INTERVAL:-1}
    --set training.eval_interval=100000 --set training.eval_iters=0
    --set 'data.blend=[{path: recipes/data/shakespeare.jsonl}]'
    --set data.split=98,2,0)  # the presets' 969,30,1 leaves the small corpus no test document
# The LLaMA and MoE shapes read the shipped corpus with the GPT-2 tokenizer.
gpt2_tokenizer=(--set 'data.tokenizer={type: gpt2-bpe, vocab_file: recipes/data/gpt2/vocab.json, merge_file: recipes/data/gpt2/merges.txt}'
    --set data.tokenizer.file=null --set model.vocab_size=50257)
llama_1b=("${gpt2_tokenizer[@]}" --set model.num_layers=16 --set model.hidden_size=2048
    --set model.ffn_hidden_size=8192 --set model.num_attention_heads=32 --set model.num_query_groups=8
    --set model.seq_length=4096 --set recompute.granularity=none --set recompute.method=null
    --set recompute.num_layers=null)
moe_small=("${gpt2_tokenizer[@]}" --set model.num_layers=8 --set model.hidden_size=1024
    --set model.ffn_hidden_size=2816 --set model.num_attention_heads=16 --set model.num_query_groups=4
    --set model.seq_length=2048 --set parallel.tensor=1 --set parallel.pipeline=1 --set parallel.expert=1
    --set parallel.sequence_parallel=false --set recompute.granularity=none)

# Today's dense 8B-class families (issue 45) at 4 layers: the real hidden size, heads, query
# groups, head dim, QKV bias, QK-norm, sliding window and RoPE scaling, on one GPU.
dense_4l=(--set 'data.tokenizer={type: gpt2-bpe, vocab_file: recipes/data/gpt2/vocab.json, merge_file: recipes/data/gpt2/merges.txt}'
    --set data.tokenizer.file=null --set model.num_layers=4 --set parallel.tensor=1 --set parallel.pipeline=1
    --set parallel.context=1 --set parallel.sequence_parallel=false --set recompute.granularity=none
    --set recompute.method=null --set recompute.num_layers=null)
mistral_4l=("${dense_4l[@]}" --set model.vocab_size=50257) # GPT-2 ids exceed Mistral's 32000

# Issue 46's fine-grained MoE presets cut to one GPU. qwen3-30b-a3b at 4 layers: the real hidden
# size, heads, query groups, head dim, QK-norm, vocabulary and every layer's 128 experts of 768,
# top-8, no expert parallelism. deepseek-v3 at 3 layers (one dense, as its first three are, then
# two MoE: Megatron's list form of layer_freq): its multi-latent attention at the real sizes (128
# heads, latents 1536 and 512, d_qk 192 ≠ d_v 128 in cuDNN's attention, YaRN's softmax scale),
# hidden 7168, dense FFN 18432, experts of 2048 with one shared, top-8 by sigmoid scores with the
# expert bias in 4 of 8 groups, scaled by 2.5 — but 16 of its 256 experts, so the 3.2B
# parameters and their optimizer state fit 80 GB (a token still takes 8 routed experts and the
# shared one: the real MoE layer's FLOPs per token), and the GPT-2 vocabulary (the corpus's ids;
# 50257 rows instead of 129280). qwen3-235b-a22b at 2 layers with 32 of its 128 experts of 1536
# (hidden 4096, 64 heads on 4 groups of 128, top-8: the real layer's FLOPs per token).
moe_1gpu=(--set parallel.tensor=1 --set parallel.pipeline=1 --set parallel.expert=1
    --set parallel.context=1 --set parallel.sequence_parallel=false --set recompute.granularity=none
    --set recompute.method=null --set recompute.num_layers=null)
qwen3_moe_4l=("${dense_4l[@]}" "${moe_1gpu[@]}")
# Issue 47's Mixtral shape: hidden 4096, 8 SwiGLU experts of 14336, top-2, sequence 4096, GQA 8,
# at the 2 layers whose 3.3 B parameters and fp32 optimizer state fit an 80 GB card at micro batch
# 4 (plan 68.1 GiB; 3 layers need 86).
mixtral_2l=("${dense_4l[@]}" "${moe_1gpu[@]}" --set model.num_layers=2 --set model.vocab_size=50257)
deepseek_3l=("${gpt2_tokenizer[@]}" "${moe_1gpu[@]}" --set model.num_layers=3
    --set 'model.moe.layer_freq=[0, 1, 1]' --set model.moe.num_experts=16
    --set parallel.num_layers_in_first_pipeline_stage=null
    --set parallel.num_layers_in_last_pipeline_stage=null)
qwen3_235b_2l=("${dense_4l[@]}" "${moe_1gpu[@]}" --set model.num_layers=2 --set model.moe.num_experts=32
    --set parallel.num_layers_in_first_pipeline_stage=null
    --set parallel.num_layers_in_last_pipeline_stage=null)

# Issue 49: Megatron's optimizer CPU offload (the distributed optimizer and the precision-aware
# one, which it needs, in both rows of a pair so that only the offload differs), and the
# Llama-3.1-8B shape on one GPU (32 layers, hidden 4096, GQA 8, seq 8192, full recompute), its
# optimizer offloaded on an 80 GB card or kept there with bf16 moments on a larger one.
zero1=(--set parallel.distributed_optimizer=true --set training.optimizer.use_precision_aware_optimizer=true)
offload=("${zero1[@]}" --set training.optimizer.optimizer_cpu_offload=true)
# The 8B rows draw their initial weights on the device: one CPU core drawing 8 B of them took
# 186 s of the offload row's start (the step times do not depend on where they are drawn).
llama8b=("${dense_4l[@]}" --set model.num_layers=32 --set recompute.granularity=full
    --set recompute.method=uniform --set recompute.num_layers=1
    --set runtime.use_cpu_initialization=false)
llama8b_offload=("${llama8b[@]}" "${offload[@]}")
# The offloaded 8B with 26 of 32 layers recomputed (block), 6 kept: plan 74.0 GiB of 80, 49.7 %.
llama8b_offload_b26=("${llama8b_offload[@]}" --set recompute.method=block --set recompute.num_layers=26)
llama8b_bf16_states=("${llama8b[@]}" "${zero1[@]}" --set training.optimizer.exp_avg_dtype=bf16
    --set training.optimizer.exp_avg_sq_dtype=bf16)
# The same with the first 24 of 32 layers recomputed (Megatron's block method), the rest kept:
# the plan gives 133.1 GiB of an H200's 140 and 48.8 % MFU (block 20: 136.5 GiB, 50.3 %).
llama8b_bf16_states_b24=("${llama8b_bf16_states[@]}" --set recompute.method=block --set recompute.num_layers=24)
# bf16 gradient sums too (Megatron's --main-grads-dtype bf16: 2 bytes a parameter, not 4) leave
# room to recompute fewer layers: block 8 plans 131.8 GiB and 55.2 %, block 12 128.4 GiB, 53.4 %.
llama8b_bf16_grads=("${llama8b_bf16_states[@]}" --set training.optimizer.main_grads_dtype=bf16)
llama8b_bf16_grads_b8=("${llama8b_bf16_grads[@]}" --set recompute.method=block --set recompute.num_layers=8)
llama8b_bf16_grads_b12=("${llama8b_bf16_grads[@]}" --set recompute.method=block --set recompute.num_layers=12)

# Long context (issue 48): the LLaMA-style 1B, one sequence a step, at 32k and 128k tokens, its
# recomputation `auto` (the plan's choice on one H100: none at 32k, 61.8 GiB, 47.6 %; both ran
# with full recompute before, 36.3 % and 33.6 % MFU). At 128k the fp32 logits alone are 25.6 GiB:
# with them the plan recomputes 14 of 16 layers (block method, 78.7 GiB, 33.8 %); with Megatron's
# linear cross-entropy fusion (one chunk of logits alive) every attention block stays and only
# the MLP blocks are recomputed (`selective` with `modules: [core_attn, mlp]`, 41.9 %; 78.0 GiB
# with the re-run block's gradients counted, since the first plan, 71.5 GiB, ran out of memory).
# And the Llama-3.1-8B shape at 32k, its optimizer offloaded: 87.0 GiB with whole logits (16 GiB
# of them), 76.2 GiB with the linear fusion, so it fits one 80 GB card (40.3 % planned).
long_ctx=(--set recompute.granularity=auto --set recompute.method=null --set recompute.num_layers=null)
linear_loss=(--set runtime.cross_entropy_fusion_impl=linear)
llama_1b_32k=("${llama_1b[@]}" "${long_ctx[@]}" --set model.seq_length=32768 --set model.max_position_embeddings=32768)
llama_1b_128k=("${llama_1b[@]}" "${long_ctx[@]}" "${linear_loss[@]}" --set model.seq_length=131072
    --set model.max_position_embeddings=131072)
# The recomputed MLP blocks' memory measured where it fits for sure: at 128k the first plan of
# them (71.5 GiB) ran out of the H100's 80 GB; the plan now counts the re-run block's gradients.
llama_1b_64k_mlp=("${llama_1b[@]}" "${linear_loss[@]}" --set model.seq_length=65536
    --set model.max_position_embeddings=65536 --set recompute.granularity=selective
    --set 'recompute.modules=[core_attn, mlp]')
llama8b_offload_32k=("${llama8b_offload[@]}" "${linear_loss[@]}" --set model.seq_length=32768
    --set model.max_position_embeddings=32768)

# name | recipe | micro batch | extra overrides (an array's name) | global batch (default: the
# micro batch, one microbatch a step)
benches=(
    "gpt2-124m|recipes/gpt2-124m.yaml|16|none"
    "gpt-350m|recipes/gpt-350m.yaml|16|none"
    "gpt-350m-mb24|recipes/gpt-350m.yaml|24|none"
    "gpt-350m-mb32|recipes/gpt-350m.yaml|32|none"
    "gpt-350m-mb48|recipes/gpt-350m.yaml|48|none"
    "gpt-1.3b-mb2|recipes/gpt-1.3b.yaml|2|none"
    "gpt-1.3b-mb8|recipes/gpt-1.3b.yaml|8|none"
    "gpt-1.3b|recipes/gpt-1.3b.yaml|12|none"
    "gpt-1.3b-mb16|recipes/gpt-1.3b.yaml|16|none"
    "gpt-1.3b-mb24|recipes/gpt-1.3b.yaml|24|none"
    "gpt-1.3b-mb32|recipes/gpt-1.3b.yaml|32|none"
    "gpt-1.3b-nodrop|recipes/gpt-1.3b.yaml|12|nodrop"
    "gpt-1.3b-full|recipes/gpt-1.3b.yaml|12|full"
    "gpt-1.3b-full-mb24|recipes/gpt-1.3b.yaml|24|full"
    "llama-1b|recipes/llama3-8b.yaml|2|llama_1b"
    "llama-1b-mb4|recipes/llama3-8b.yaml|4|llama_1b"
    "llama-1b-mb6|recipes/llama3-8b.yaml|6|llama_1b"
    "llama3.1-8b-4l|recipes/llama3.1-8b.yaml|2|dense_4l"
    "qwen2.5-7b-4l|recipes/qwen2.5-7b.yaml|4|dense_4l"
    "qwen3-8b-4l|recipes/qwen3-8b.yaml|4|dense_4l"
    "mistral-7b-4l|recipes/mistral-7b.yaml|2|mistral_4l"
    "qwen3-30b-a3b-4l|recipes/qwen3-30b-a3b.yaml|2|qwen3_moe_4l"
    "qwen3-30b-a3b-4l-mb4|recipes/qwen3-30b-a3b.yaml|4|qwen3_moe_4l"
    # Accumulated over 8 micro batches, as a real run's global batch is: one row's 3 B
    # parameters' AdamW (31 ms) and gradient gather are a quarter of a one-micro-batch step.
    "qwen3-30b-a3b-4l-gb16|recipes/qwen3-30b-a3b.yaml|2|qwen3_moe_4l|16"
    "qwen3-30b-a3b-4l-gb16-fp8|recipes/qwen3-30b-a3b.yaml|2|qwen3_moe_4l_fp8|16"
    "deepseek-v3-3l|recipes/deepseek-v3.yaml|1|deepseek_3l"
    "deepseek-v3-3l-mb2|recipes/deepseek-v3.yaml|2|deepseek_3l"
    "qwen3-235b-a22b-2l|recipes/qwen3-235b-a22b.yaml|2|qwen3_235b_2l"
    "mixtral-8x7b-2l|recipes/mixtral-8x7b.yaml|4|mixtral_2l"
    "moe-8x|recipes/mixtral-8x7b.yaml|4|moe_small"
    "moe-8x-mb16|recipes/mixtral-8x7b.yaml|16|moe_small"
    "gpt-1.3b-zero1-gb96|recipes/gpt-1.3b.yaml|12|zero1|96"
    "gpt-1.3b-offload-gb96|recipes/gpt-1.3b.yaml|12|offload|96"
    "gpt-1.3b-zero1-gb480|recipes/gpt-1.3b.yaml|12|zero1|480"
    "gpt-1.3b-offload-gb480|recipes/gpt-1.3b.yaml|12|offload|480"
    "llama3.1-8b-offload|recipes/llama3.1-8b.yaml|1|llama8b_offload|64"
    "llama3.1-8b-offload-b26|recipes/llama3.1-8b.yaml|1|llama8b_offload_b26|64"
    "llama3.1-8b-bf16-states|recipes/llama3.1-8b.yaml|1|llama8b_bf16_states|64"
    "llama3.1-8b-bf16-states-b24|recipes/llama3.1-8b.yaml|1|llama8b_bf16_states_b24|64"
    "llama3.1-8b-bf16-grads-b8|recipes/llama3.1-8b.yaml|1|llama8b_bf16_grads_b8|64"
    "llama3.1-8b-bf16-grads-b12|recipes/llama3.1-8b.yaml|1|llama8b_bf16_grads_b12|64"
    "llama-1b-32k|recipes/llama3-8b.yaml|1|llama_1b_32k"
    "llama-1b-128k|recipes/llama3-8b.yaml|1|llama_1b_128k"
    "llama-1b-64k-mlp|recipes/llama3-8b.yaml|1|llama_1b_64k_mlp"
    "llama3.1-8b-offload-32k|recipes/llama3.1-8b.yaml|1|llama8b_offload_32k|16"
    "gpt-1.3b-fp8|recipes/gpt-1.3b.yaml|12|fp8"
    "llama-1b-fp8|recipes/llama3-8b.yaml|2|llama_1b_fp8"
    "llama-1b-mb4-fp8|recipes/llama3-8b.yaml|4|llama_1b_fp8"
    "llama-1b-mb6-fp8|recipes/llama3-8b.yaml|6|llama_1b_fp8"
)
# fp8 GEMMs (issue 17): Megatron's hybrid format with its default delayed scaling. A row named
# NAME-fp8 is also reported against row NAME of the same call in the speed-up table.
fp8=(--set precision.fp8=hybrid)
llama_1b_fp8=("${llama_1b[@]}" "${fp8[@]}")
# Issue 47's fp8 experts: the Qwen3-30B-A3B shape with the attention projections and the routed
# experts (precision.fp8_experts: the device-count fp8 grouped GEMMs) in fp8.
qwen3_moe_4l_fp8=("${qwen3_moe_4l[@]}" "${fp8[@]}" --set precision.fp8_experts=true)
nodrop=(--set model.attention_dropout=0.0 --set model.hidden_dropout=0.0)
# Full recomputation, every layer its own range (Megatron's uniform, num_layers 1).
full=(--set recompute.granularity=full --set recompute.method=uniform --set recompute.num_layers=1)
none=()

for entry in "${benches[@]}"; do
    IFS='|' read -r name recipe mb extra gbs <<<"$entry"
    if [[ -n ${ONLY:-} && " $ONLY " != *" $name "* ]]; then
        continue
    fi
    name+=${TAG:-}
    declare -n more=$extra
    sets=("${common[@]}" "${more[@]}" --set training.global_batch_size=${gbs:-$mb} --set training.micro_batch_size=$mb
        --set training.train_iters=$steps --set "logging.jsonl=/tmp/bench-$name/metrics.jsonl")
    # shellcheck disable=SC2206 # words on purpose
    sets+=(${EXTRA_SETS:-})
    "$dist/recipe" plan "$recipe" "${sets[@]}" --nodes 1 --gpus-per-node 1 --gpu "$gpu" --format json \
        >"$OUT/logs/$name.plan.json" 2>"$OUT/logs/$name.plan.err"
    if [[ ${PLAN_ONLY:-0} == 1 ]]; then
        python3 -c 'import json, sys
p = json.load(open(sys.argv[2]))
r = p["recipe"]["recompute"]
print("| %s | %s | %.1f GiB | %.3f s | %.1f %% | %s %s %s |" % (sys.argv[1], sys.argv[3],
      p["memory"]["per_gpu_bytes"]["total"] / 2**30, p["predicted"]["step_seconds"],
      100 * p["predicted"]["mfu"], r["granularity"], r.get("method") or "",
      r.get("num_layers") or " ".join(r.get("modules", []))))' \
            "$name" "$OUT/logs/$name.plan.json" "$gpu" 2>/dev/null || sed 's/^/    /' "$OUT/logs/$name.plan.err" | head -5
        unset -n more
        continue
    fi
    echo "=== $name: micro batch $mb, $steps steps ($(date +%T))"
    timing=()
    if [[ ${OP_TIMING:-0} == 1 ]]; then
        timing=(env "FERROTRON_OP_TIMING=$OUT/logs/$name.ops.md" "FERROTRON_OP_TIMELINE=/tmp/bench-$name.timeline")
    fi
    # What the device holds (context, cuBLAS workspaces and the allocator's pool included),
    # sampled every 100 ms while the run lasts: the number a plan's memory must be compared with;
    # and the driver's utilisation (the share of each sample period in which a kernel ran), whose
    # steady-state mean says how long the GPU waits for the host within a step.
    nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader,nounits -lms 100 >"$OUT/logs/$name.smi" 2>/dev/null &
    smi=$!
    timeout "${RUN_TIMEOUT:-300}" "${timing[@]}" "$dist/recipe" run "$recipe" --backend cuda --world-size 1 \
        --run-dir "/tmp/bench-$name" "${sets[@]}" >"$OUT/logs/$name.log" 2>&1
    echo "exit $?"
    kill "$smi" 2>/dev/null
    cp "/tmp/bench-$name/metrics.jsonl" "$OUT/logs/$name.metrics.jsonl" 2>/dev/null || true
    if [[ -f /tmp/bench-$name.timeline ]]; then
        python3 "$root/tools/gpu_timeline.py" "/tmp/bench-$name.timeline" >"$OUT/logs/$name.gaps.md" 2>&1
    fi
    grep -i "error\|peak device memory" "$OUT/logs/$name.log" | tail -3 | cut -c1-300
    if [[ ${TORCH:-0} == 1 ]]; then
        timeout "${RUN_TIMEOUT:-300}" python3 "$root/tools/torch_ref.py" --plan "$OUT/logs/$name.plan.json" \
            --steps "$steps" --out "$OUT/logs/$name.torch.json" >"$OUT/logs/$name.torch.log" 2>&1
        echo "PyTorch reference: exit $? $(tail -c 300 "$OUT/logs/$name.torch.log")"
    fi
    unset -n more
done
[[ ${PLAN_ONLY:-0} == 1 ]] && exit 0

python3 - "$OUT" <<'EOF'
import glob, json, os, re, statistics, sys

out = sys.argv[1]
rows = []
losses = {}  # name -> the training loss of every logged step
for plan_path in sorted(glob.glob(f"{out}/logs/*.plan.json")):
    name = os.path.basename(plan_path)[: -len(".plan.json")]
    try:
        plan = json.load(open(plan_path))
    except Exception:
        plan = None
    metrics_path = f"{out}/logs/{name}.metrics.jsonl"
    records = []
    if os.path.exists(metrics_path):
        records = [json.loads(l) for l in open(metrics_path) if l.strip()]
    losses[name] = [r["loss"] for r in records if r.get("kind") == "train" and "loss" in r]
    steps = [r for r in records if "tokens_per_second" in r and r.get("step", 0) > int(os.environ.get("SKIP", 5))]
    log = open(f"{out}/logs/{name}.log", errors="replace").read() if os.path.exists(f"{out}/logs/{name}.log") else ""
    peak = re.findall(r"peak device memory ([0-9.]+) GiB", log)
    med = lambda k: statistics.median(r[k] for r in steps) if steps else float("nan")
    pred_s = plan["predicted"]["step_seconds"] if plan else float("nan")
    pred_mem = plan["memory"]["per_gpu_bytes"]["total"] / 2**30 if plan else float("nan")
    step_s = med("step_seconds")
    peak_gib = float(peak[-1]) if peak else float("nan")
    smi_path = f"{out}/logs/{name}.smi"
    samples = []
    for l in open(smi_path) if os.path.exists(smi_path) else []:
        cells = [c.strip() for c in l.split(",")]
        if len(cells) == 2 and all(c.replace(".", "").isdigit() for c in cells):
            samples.append((float(cells[0]), float(cells[1])))
    device_gib = max(m for m, _ in samples) / 1024 if samples else float("nan")  # MiB
    # Steady state: the samples once the device holds 90 % of its peak, less the last tenth
    # (the final evaluation and the exit).
    steady = [u for m, u in samples if m >= 0.9 * device_gib * 1024]
    steady = steady[: max(1, len(steady) * 9 // 10)] if steady else []
    busy = statistics.mean(steady) if steady else float("nan")
    rows.append((name, med("tokens_per_second"), med("tflops_per_gpu"), 100 * med("mfu"), peak_gib,
                 device_gib, step_s, pred_s, step_s / pred_s if pred_s else float("nan"), pred_mem,
                 device_gib / pred_mem if pred_mem else float("nan"), busy, len(steps)))
table = ["| model | tokens/s | TFLOP/s | MFU % | tensors peak GiB | device peak GiB | step s | predicted s | measured/predicted | predicted GiB | device/predicted | GPU busy % | steps |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
for r in rows:
    table.append("| {} | {:,.0f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.3f} | {:.3f} | {:.2f} | {:.1f} | {:.2f} | {:.0f} | {} |".format(*r))
speed = {r[0]: r[1] for r in rows}
pairs = [(n, n[: -len("-fp8")]) for n in speed if n.endswith("-fp8") and n[: -len("-fp8")] in speed]
if pairs:
    table += ["", "| fp8 row | bf16 row | fp8 tokens/s | bf16 tokens/s | speed-up |", "|---|---|---:|---:|---:|"]
    for fp8, bf16 in pairs:
        table.append(f"| {fp8} | {bf16} | {speed[fp8]:,.0f} | {speed[bf16]:,.0f} | {speed[fp8] / speed[bf16]:.2f}x |")
# The PyTorch + torch.compile reference of the same plans (TORCH=1), same call, same GPU.
refs = []
for r in rows:
    path = f"{out}/logs/{r[0]}.torch.json"
    if os.path.exists(path):
        try:
            ref = json.load(open(path))
        except Exception:
            ref = {"error": "no result"}
        refs.append((r, ref))
if refs:
    table += ["", "| model | tokens/s | PyTorch + compile tokens/s | ours / PyTorch | MFU % | PyTorch MFU % | PyTorch peak GiB | PyTorch first step s |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r, ref in refs:
        if "tokens_per_second" in ref:
            table.append("| {} | {:,.0f} | {:,.0f} | {:.2f}x | {:.1f} | {:.1f} | {:.1f} | {:.0f} |".format(
                r[0], r[1], ref["tokens_per_second"], r[1] / ref["tokens_per_second"], r[3], 100 * ref["mfu"],
                ref.get("peak_memory_gib") or float("nan"), ref.get("first_step_seconds", float("nan"))))
        else:
            why = ref.get("unsupported") or ref.get("error") or "no result"
            table.append(f"| {r[0]} | {r[1]:,.0f} | {why} | | {r[3]:.1f} | | | |")
# The first steps' losses show a divergence (an fp8 scale, a warm-up too short) that the
# throughput columns hide; a pair's two rows start from the same weights and batches.
table += ["", "| model | loss, steps 1–5 | last |", "|---|---|---:|"]
for name, curve in losses.items():
    first = " ".join(f"{v:.3f}" for v in curve[:5])
    table.append(f"| {name} | {first} | {curve[-1]:.3f} |" if curve else f"| {name} | – | – |")
text = "\n".join(table)
open(f"{out}/gpu-bench.md", "w").write(text + "\n")
print(text)
EOF
