#!/usr/bin/env bash
# gpu-resume.sh — a GPU run killed and resumed continues the same curve (issue 14, item 4): the
# GPU twin of tests/it/run.rs `sigkill_right_after_checkpoints_resumes_bit_identically`, which
# CI runs on the CPU backend.
#
# For each model family (FAMILIES, default "gpt llama"; the same variants as gpu-train.sh) the
# shipped shakespeare-tiny recipe runs on `--backend cuda` in bf16 with dropout 0.1 and two
# microbatches per step (so the fp32 master weights, both AdamW moments, the fp32 gradient
# accumulation and the dropout stream all cross a checkpoint):
#   straight   STEPS steps uninterrupted, a checkpoint every INTERVAL steps;
#   again      the same, a second time: the GPU's own run-to-run difference (cuBLASLt and our
#              kernels are deterministic, so 0 is expected; a nonzero value here would make the
#              resume comparison meaningless and is reported as such);
#   killed     the same run, SIGKILLed KILLS times, each time as soon as it has committed a
#              checkpoint of its own, then run to the end.
# The killed run's per-step losses (its metrics file after the last resume) are compared with the
# straight run's, bit for bit: "same" when every step's loss is the same f64.
#
# Built here, run there (no Rust toolchain on the GPU machine):
#   CARGO_PROFILE_DEV_OPT_LEVEL=3 cargo build --workspace --bins
#   mkdir -p .gpu-dist && strip -o .gpu-dist/recipe target/debug/recipe
#   device run: bash tools/gpu-resume.sh        (carry: [".gpu-dist"])
#
# Env: OUT (results, default /tmp/gpu-resume-out), FERROTRON_DIST (binaries, default .gpu-dist),
# FAMILIES ("gpt llama"), STEPS (24), INTERVAL (4), KILLS (3), RUN_TIMEOUT (180), BACKEND (cuda;
# cpu tries the script anywhere), EXTRA_SETS (more `--set k=v` words, e.g. "--set
# precision.fp8=hybrid": the fp8 layers' scaling state must cross the checkpoints too).
# Output: one table on stdout and in $OUT/gpu-resume.md; logs under $OUT/logs.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/gpu-resume-out}
dist=${FERROTRON_DIST:-$root/.gpu-dist}
recipe_bin=$dist/recipe
steps=${STEPS:-24}
interval=${INTERVAL:-4}
kills=${KILLS:-3}
run_timeout=${RUN_TIMEOUT:-180}
backend=${BACKEND:-cuda}
work=/tmp/ferrotron-gpu-resume
logs=$OUT/logs
rm -rf "$work"
mkdir -p "$work" "$logs"

cudnn_lib=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${cudnn_lib:+:$cudnn_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
export FERROTRON_KERNEL_CACHE=$work/kernels

if [[ ! -x "$recipe_bin" ]]; then
    echo "no recipe binary at $recipe_bin: build it and carry .gpu-dist/ (see the header)" >&2
    exit 2
fi

# The same family variants as gpu-train.sh (b).
# shellcheck source=tools/gpu-families.sh
source "$root/tools/gpu-families.sh"

# args DIR FAMILY: the run's command line (without `run`), its checkpoints and metrics in DIR.
args() {
    local dir=$1 family=$2
    local sets=()
    case $family in
        llama) sets=("${llama_sets[@]}") ;;
        moe) sets=("${moe_sets[@]}") ;;
    esac
    printf '%s\n' recipes/shakespeare-tiny.yaml --backend "$backend" --world-size 1 --run-dir "$dir" \
        --set "training.train_iters=$steps" --set training.log_interval=1 \
        --set training.eval_interval=0 --set training.seed=1234 \
        --set training.global_batch_size=16 --set precision.dtype=bf16 \
        --set model.hidden_dropout=0.1 --set model.attention_dropout=0.1 \
        --set "checkpoint.dir=$dir/ckpt" --set "checkpoint.interval=$interval" \
        --set checkpoint.keep_last=100 --set checkpoint.resume=auto \
        --set "logging.jsonl=$dir/metrics.jsonl" "${sets[@]}"
    # shellcheck disable=SC2086 # words on purpose
    [[ -n ${EXTRA_SETS:-} ]] && printf '%s\n' ${EXTRA_SETS}
    return 0
}

# newest DIR: the iteration of the newest committed checkpoint (0 when none).
newest() {
    local last
    last=$(find "$1/ckpt" -maxdepth 1 -name 'iter_*' -type d 2>/dev/null | sort | tail -1)
    [[ -n $last ]] && echo $((10#${last##*iter_})) || echo 0
}

# run DIR FAMILY TAG: one run to the end.
run() {
    mapfile -t a < <(args "$1" "$2")
    timeout "$run_timeout" "$recipe_bin" run "${a[@]}" >>"$logs/$3.log" 2>&1
}

# killed DIR FAMILY TAG: KILLS SIGKILLs right after a checkpoint of the run's own, then the end.
killed() {
    local dir=$1 family=$2 tag=$3 done=0
    mapfile -t a < <(args "$dir" "$family")
    for _ in $(seq "$kills"); do
        local before
        before=$(newest "$dir")
        "$recipe_bin" run "${a[@]}" >>"$logs/$tag.log" 2>&1 &
        local pid=$! start=$SECONDS
        while kill -0 "$pid" 2>/dev/null && [[ $(newest "$dir") -le $before ]] &&
            ((SECONDS - start < run_timeout)); do
            sleep 0.05
        done
        if kill -9 "$pid" 2>/dev/null; then
            done=$((done + 1))
            echo "-- SIGKILL after iter $(newest "$dir")" >>"$logs/$tag.log"
        fi
        wait "$pid" 2>/dev/null
    done
    run "$dir" "$family" "$tag"
    echo "$done"
}

table=$OUT/gpu-resume.md
{
    echo "| family | steps | kills | straight vs again (max abs) | straight vs killed+resumed (max abs) | same curve |"
    echo "|---|---:|---:|---:|---:|---|"
} >"$table"
for family in ${FAMILIES:-gpt llama}; do
    run "$work/$family-straight" "$family" "$family-straight" || echo "$family straight: exit $?" >&2
    run "$work/$family-again" "$family" "$family-again" || echo "$family again: exit $?" >&2
    n=$(killed "$work/$family-killed" "$family" "$family-killed")
    for tag in straight again killed; do
        cp "$work/$family-$tag/metrics.jsonl" "$logs/$family-$tag.jsonl" 2>/dev/null
    done
    python3 - "$family" "$steps" "$n" "$logs/$family-straight.jsonl" "$logs/$family-again.jsonl" \
        "$logs/$family-killed.jsonl" >>"$table" <<'PY'
import json, sys
family, steps, kills, straight, again, killed = sys.argv[1:]

def losses(path):
    try:
        rows = [json.loads(l) for l in open(path)]
    except OSError:
        return {}
    return {r["step"]: r["loss"] for r in rows if r.get("kind") == "train"}

a, b, k = losses(straight), losses(again), losses(killed)
def diff(x, y):
    if sorted(x) != sorted(y) or len(x) != int(steps):
        return None
    return max(abs(x[s] - y[s]) for s in x)
run_to_run, resumed = diff(a, b), diff(a, k)
fmt = lambda d: "steps differ" if d is None else f"{d:.3g}"
same = "yes (bit-identical)" if resumed == 0 else "no"
print(f"| {family} | {steps} | {kills} | {fmt(run_to_run)} | {fmt(resumed)} | {same} |")
PY
done
cat "$table"
