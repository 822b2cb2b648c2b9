#!/usr/bin/env bash
# The /metrics endpoint's cost to training (issue 19): shakespeare-tiny on the CPU twice, once
# quiet and once while loopback clients send requests as fast as they can (GET /metrics mixed
# with 404s, 405s and oversized heads), then the median step time of each run, what the
# clients got and the CPU time of the server thread itself. The clients share the machine's
# cores with the trainer, so the step-time difference also holds their cost; the server
# thread's CPU time is the server's own. Everything stays on 127.0.0.1 and stops with the run.
#   tools/metrics-load.sh                        # 60 steps, 4 client threads
#   STEPS=100 CLIENTS=8 RECIPE_BIN=target/release/recipe tools/metrics-load.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${RECIPE_BIN:-target/release/recipe}"
STEPS="${STEPS:-60}"
CLIENTS="${CLIENTS:-4}"
[ -x "$BIN" ] || cargo build --release --locked -p ferrotron-cli
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

run() { # $1: name; the run's stderr goes to $WORK/$1.err
    "$BIN" run recipes/shakespeare-tiny.yaml --run-dir "$WORK/$1" \
        --set "training.train_iters=$STEPS" --set training.eval_interval=0 --set training.log_interval=1 \
        --set checkpoint.resume=never --set "checkpoint.dir=$WORK/$1/ckpt" \
        --set "logging.jsonl=$WORK/$1/metrics.jsonl" \
        --set 'logging.prometheus={port: 0, address: 127.0.0.1}' 2>"$WORK/$1.err"
}

median_step() { # median step_seconds of a metrics file, first 5 steps left out (warm-up)
    python3 - "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"train"' in l]
print(statistics.median(r["step_seconds"] for r in rows[5:]))
PY
}

echo "== quiet run ($STEPS steps)" >&2
run quiet
echo "== run under load ($CLIENTS clients)" >&2
run loaded &
pid=$!
until grep -q "prometheus metrics at" "$WORK/loaded.err" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || { cat "$WORK/loaded.err" >&2; exit 1; }
    sleep 0.2
done
address="$(grep -o 'http://[^ ]*/metrics' "$WORK/loaded.err" | head -1 | sed 's|http://||; s|/metrics||')"
# The server thread's own CPU time (utime + stime, clock ticks), sampled until the run ends:
# what serving costs the trainer, apart from the clients' share of the cores.
trainer="$(pgrep -P "$pid" | head -1)"  # `run` is a subshell; the recipe process is its child
server_task=""
for task in /proc/"$trainer"/task/*; do
    [ "$(cat "$task/comm" 2>/dev/null)" = "ferrotron-metri" ] && server_task="$task"
done
( while [ -r "$server_task/stat" ]; do
      awk '{print $14 + $15}' "$server_task/stat" >"$WORK/server-ticks" 2>/dev/null || true
      sleep 1
  done ) &
python3 - "$address" "$CLIENTS" "$pid" >"$WORK/load.txt" <<'PY'
import os, socket, sys, threading, collections
host, port = sys.argv[1].rsplit(":", 1)
clients, trainer = int(sys.argv[2]), int(sys.argv[3])
asks = [(b"GET /metrics HTTP/1.1\r\n\r\n", 200)] * 3 + [
    (b"GET /x HTTP/1.1\r\n\r\n", 404), (b"POST /metrics HTTP/1.1\r\n\r\n", 405),
    (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n", 400)]
counts, lock = collections.Counter(), threading.Lock()
def alive():
    try: os.kill(trainer, 0); return True
    except OSError: return False
def client():
    i, local = 0, collections.Counter()
    while i % 200 or alive():
        request, expected = asks[i % len(asks)]
        i += 1
        try:
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.sendall(request)
                data = b""
                while chunk := s.recv(65536): data += chunk
            status = int(data.split(b" ", 2)[1])
            local["ok" if status == expected else f"wrong {status} for {expected}"] += 1
        except OSError as e:
            if not alive(): break
            local[f"error {type(e).__name__}"] += 1
    with lock: counts.update(local)
threads = [threading.Thread(target=client) for _ in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
print(dict(counts))
PY
wait "$pid"
server_seconds="$(python3 -c "import os; print(int(open('$WORK/server-ticks').read()) / os.sysconf('SC_CLK_TCK'))")"
quiet="$(median_step "$WORK/quiet/metrics.jsonl")"
loaded="$(median_step "$WORK/loaded/metrics.jsonl")"
seconds="$(python3 -c "import json; r=[json.loads(l) for l in open('$WORK/loaded/metrics.jsonl') if '\"train\"' in l]; print(sum(x['step_seconds'] for x in r))")"
python3 - "$quiet" "$loaded" "$seconds" "$(cat "$WORK/load.txt")" "$server_seconds" <<'PY'
import ast, sys
quiet, loaded, seconds, counts = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), ast.literal_eval(sys.argv[4])
server = float(sys.argv[5])
total = sum(counts.values())
print("| run | median step | requests | answered as expected | rate |")
print("|---|---:|---:|---:|---:|")
print(f"| quiet | {quiet*1000:.1f} ms | | | |")
print(f"| under load | {loaded*1000:.1f} ms ({(loaded/quiet-1)*100:+.1f} %) | {total} | {counts.get('ok', 0)} | {total/seconds:.0f}/s |")
print(f"server thread: {server:.1f} s of CPU in {seconds:.0f} s of training ({server / seconds * 100:.1f} % of one core)")
others = {k: v for k, v in counts.items() if k != "ok"}
if others: print("other outcomes:", others)
PY
