#!/usr/bin/env bash
# cpu-speed.sh — the CPU quick start against PyTorch eager (issue 23), same machine, same run:
# shakespeare-tiny through `recipe run --backend cpu` at each thread count (`runtime.threads`),
# then tools/cpu_ref.py (the same model and step in PyTorch eager) at the same counts; one table
# of median step time and tokens/s with the ratio ours / PyTorch's. A benchmark, not a test: run
# it on a quiet machine with the cores you name (the GPU machine has 16).
#
#   RECIPE_BIN=target/release/recipe THREADS="1 4 16" STEPS=20 tools/cpu-speed.sh
#
# Env: RECIPE_BIN (default target/release/recipe, built when missing), THREADS ("1 4 16"),
# STEPS (20; the median skips the first 3), OUT (logs; default a temporary folder).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${RECIPE_BIN:-target/release/recipe}"
THREADS="${THREADS:-1 4 16}"
STEPS="${STEPS:-20}"
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
[ -x "$BIN" ] || cargo build --release --locked -p ferrotron-cli

ours="$OUT/ours.tsv"
: >"$ours"
for t in $THREADS; do
    dir="$OUT/run-$t"
    "$BIN" run recipes/shakespeare-tiny.yaml --backend cpu --run-dir "$dir" \
        --set "training.train_iters=$STEPS" --set training.eval_interval=0 --set training.log_interval=1 \
        --set checkpoint.resume=never --set "checkpoint.dir=$dir/ckpt" --set checkpoint.interval=100000 \
        --set "logging.jsonl=$dir/metrics.jsonl" --set "runtime.threads=$t" >"$OUT/run-$t.log" 2>&1
    python3 - "$dir/metrics.jsonl" "$t" >>"$ours" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"train"' in l]
print(f"{sys.argv[2]}\t{statistics.median(r['step_seconds'] for r in rows[3:]) * 1000:.1f}")
PY
done

# shellcheck disable=SC2086
python3 tools/cpu_ref.py --threads $THREADS --steps $((STEPS + 5)) >"$OUT/torch.md"
python3 - "$ours" "$OUT/torch.md" <<'PY'
import sys
tokens = 8 * 64
ours = dict(line.split("\t") for line in open(sys.argv[1]).read().split("\n") if line)
torch = {}
for line in open(sys.argv[2]):
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) == 3 and cells[0].isdigit():
        torch[cells[0]] = float(cells[1])
print(open(sys.argv[2]).readline().strip())
print("| threads | recipe ms/step | recipe tokens/s | PyTorch eager ms/step | PyTorch tokens/s | ours / PyTorch (tokens/s) |")
print("|---:|---:|---:|---:|---:|---:|")
for t, ms in ours.items():
    ms = float(ms)
    ref = torch.get(t)
    ratio = f"{ref / ms:.2f}×" if ref else "–"
    ref_cells = f"{ref:.1f} | {tokens / ref * 1000:,.0f}" if ref else "– | –"
    print(f"| {t} | {ms:.1f} | {tokens / ms * 1000:,.0f} | {ref_cells} | {ratio} |")
first = next(iter(ours), None)
for t, ms in list(ours.items())[1:]:
    ref, base = torch.get(t), torch.get(first)
    theirs = f", PyTorch {base / ref:.2f}×" if ref and base else ""
    print(f"{first} → {t} threads: recipe {float(ours[first]) / float(ms):.2f}×{theirs}")
PY
