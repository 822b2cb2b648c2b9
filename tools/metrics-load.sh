#!/usr/bin/env bash
# The /metrics endpoint's cost to training (issue 19): shakespeare-tiny on the CPU, alternating
# quiet runs and runs while loopback clients send requests as fast as they can (GET /metrics
# mixed with 404s, 405s and oversized heads); then the median step time of each, what the
# clients got and the CPU time of the server thread itself. Everything stays on 127.0.0.1 and
# stops with the run.
# As a deployment would have it, the trainer keeps its cores: every run is pinned to all CPUs but
# the last and its hyperthread siblings (TRAINER_CPUS), the server thread and the clients to the
# last one (SIDE_CPUS), so
# the step-time difference is what serving does to the training thread (locks, caches, memory),
# not the clients' own CPU. Set both to the same list to share the cores instead.
# RATE caps the clients' requests per second in all (0: as fast as they can).
#   tools/metrics-load.sh                        # 60 steps, 4 client threads, 2 rounds, 2,000/s
#   STEPS=100 CLIENTS=8 ROUNDS=3 RATE=0 RECIPE_BIN=target/release/recipe tools/metrics-load.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${RECIPE_BIN:-target/release/recipe}"
STEPS="${STEPS:-60}"
CLIENTS="${CLIENTS:-4}"
RATE="${RATE:-2000}"
ROUNDS="${ROUNDS:-2}"
last=$(($(nproc) - 1))
SIDE_CPUS="${SIDE_CPUS:-$last}"
# The trainer keeps every CPU but the side one and its hyperthread siblings, which share a core
# with the clients. (Measured on the 16-CPU GPU machine before this exclusion, 2026-12-02: loaded
# runs 5-20 % slower while the server used 8 % of a CPU, and quiet runs themselves spread 30 %.)
siblings=$(cat "/sys/devices/system/cpu/cpu$last/topology/thread_siblings_list" 2>/dev/null || echo "$last")
trainer_default=$(python3 -c '
import sys
def cpus(text):
    out = set()
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out
n, busy = int(sys.argv[1]), cpus(sys.argv[2])
print(",".join(str(c) for c in range(n) if c not in busy) or "0")' "$((last + 1))" "$siblings")
TRAINER_CPUS="${TRAINER_CPUS:-$trainer_default}"
[ -x "$BIN" ] || cargo build --release --locked -p ferrotron-cli
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

run() { # $1: name; the run's stderr goes to $WORK/$1.err
    taskset -c "$TRAINER_CPUS" "$BIN" run recipes/shakespeare-tiny.yaml --run-dir "$WORK/$1" \
        --set "training.train_iters=$STEPS" --set training.eval_interval=0 --set training.log_interval=1 \
        --set checkpoint.resume=never --set "checkpoint.dir=$WORK/$1/ckpt" \
        --set "logging.jsonl=$WORK/$1/metrics.jsonl" \
        --set 'logging.prometheus={port: 0, address: 127.0.0.1}' 2>"$WORK/$1.err"
}

# The CPU time (clock ticks) of a run's recipe process and of its /metrics thread, sampled into
# $WORK/cpu-$2 until the process ends: the trainer's own CPU per step does not grow when other
# work on the machine delays it (the wall-clock step time does), so it is the steadier figure on
# a shared machine. $1 is the subshell `run` was started in; the recipe process is its child.
sample_cpu() {
    local recipe="" server="" task
    until [ -n "$recipe" ]; do recipe="$(pgrep -P "$1" | head -1)"; sleep 0.05; done
    while [ -r "/proc/$recipe/stat" ]; do
        for task in /proc/"$recipe"/task/*; do
            [ "$(cat "$task/comm" 2>/dev/null)" = "ferrotron-metri" ] && server="$task"
        done
        { awk '{printf "%d ", $14 + $15}' "/proc/$recipe/stat" &&
          if [ -n "$server" ]; then awk '{print $14 + $15}' "$server/stat"; else echo 0; fi
        } >"$WORK/cpu-$2.new" 2>/dev/null && mv "$WORK/cpu-$2.new" "$WORK/cpu-$2"
        sleep 0.5
    done
}

round() {
    echo "== round $r: quiet run ($STEPS steps, trainer on CPUs $TRAINER_CPUS)" >&2
    run "quiet$r" &
    local quiet=$!
    sample_cpu "$quiet" "quiet$r" &
    wait "$quiet"
    echo "== round $r: run under load ($CLIENTS clients at ${RATE}/s in all (0: unlimited), the server on CPUs $SIDE_CPUS)" >&2
    run "loaded$r" &
    pid=$!
    sample_cpu "$pid" "loaded$r" &
    until grep -q "prometheus metrics at" "$WORK/loaded$r.err" 2>/dev/null; do
        kill -0 "$pid" 2>/dev/null || { cat "$WORK/loaded$r.err" >&2; exit 1; }
        sleep 0.2
    done
    address="$(grep -o 'http://[^ ]*/metrics' "$WORK/loaded$r.err" | head -1 | sed 's|http://||; s|/metrics||')"
    trainer="$(pgrep -P "$pid" | head -1)"  # `run` is a subshell; the recipe process is its child
    for task in /proc/"$trainer"/task/*; do
        [ "$(cat "$task/comm" 2>/dev/null)" = "ferrotron-metri" ] &&
            taskset -p -c "$SIDE_CPUS" "$(basename "$task")" >/dev/null
    done
    taskset -c "$SIDE_CPUS" python3 - "$address" "$CLIENTS" "$pid" "$RATE" >"$WORK/load$r.txt" <<'PY'
import os, socket, sys, threading, time, collections
host, port = sys.argv[1].rsplit(":", 1)
clients, trainer, rate = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
gap = clients / rate if rate > 0 else 0.0  # each client's time between requests
asks = [(b"GET /metrics HTTP/1.1\r\n\r\n", 200)] * 3 + [
    (b"GET /x HTTP/1.1\r\n\r\n", 404), (b"POST /metrics HTTP/1.1\r\n\r\n", 405),
    (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n", 400)]
counts, lock = collections.Counter(), threading.Lock()
def alive():
    try: os.kill(trainer, 0); return True
    except OSError: return False
def client():
    i, local, due = 0, collections.Counter(), time.monotonic()
    while i % 200 or alive():
        due += gap
        if (wait := due - time.monotonic()) > 0: time.sleep(wait)
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
    wait  # the samplers
}

for r in $(seq 1 "$ROUNDS"); do round; done
python3 - "$WORK" "$ROUNDS" <<'PY'
import ast, json, os, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
def steps(name):
    rows = [json.loads(l) for l in open(f"{work}/{name}/metrics.jsonl") if '"train"' in l]
    return [r["step_seconds"] for r in rows]
def cpu(name):  # (trainer, server) CPU seconds of a run's process
    process, server = map(int, open(f"{work}/cpu-{name}").read().split())
    tick = os.sysconf("SC_CLK_TCK")
    return (process - server) / tick, server / tick
print("| round | quiet median step | loaded median step | change | trainer CPU per step, quiet → loaded | requests | answered as expected | rate | server thread CPU |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
cpu_quiet, cpu_loaded = [], []
quiets, loadeds, others = [], [], {}
for r in range(1, rounds + 1):
    quiet, loaded = statistics.median(steps(f"quiet{r}")[5:]), statistics.median(steps(f"loaded{r}")[5:])
    seconds = sum(steps(f"loaded{r}"))
    counts = ast.literal_eval(open(f"{work}/load{r}.txt").read())
    (trainer_quiet, _), (trainer_loaded, server) = cpu(f"quiet{r}"), cpu(f"loaded{r}")
    per_quiet, per_loaded = trainer_quiet / len(steps(f"quiet{r}")), trainer_loaded / len(steps(f"loaded{r}"))
    cpu_quiet.append(per_quiet); cpu_loaded.append(per_loaded)
    total = sum(counts.values())
    quiets.append(quiet); loadeds.append(loaded)
    others.update({k: v for k, v in counts.items() if k != "ok"})
    print(f"| {r} | {quiet*1000:.1f} ms | {loaded*1000:.1f} ms | {(loaded/quiet-1)*100:+.1f} % "
          f"| {per_quiet*1000:.1f} → {per_loaded*1000:.1f} ms ({(per_loaded/per_quiet-1)*100:+.1f} %) | {total} | {counts.get('ok', 0)} "
          f"| {total/seconds:.0f}/s | {server:.1f} s in {seconds:.0f} s ({server/seconds*100:.0f} % of a core) |")
q, l = statistics.median(quiets), statistics.median(loadeds)
print(f"all rounds: median step quiet {q*1000:.1f} ms, under load {l*1000:.1f} ms ({(l/q-1)*100:+.1f} %)")
cq, cl = statistics.median(cpu_quiet), statistics.median(cpu_loaded)
print(f"all rounds: trainer CPU per step quiet {cq*1000:.1f} ms, under load {cl*1000:.1f} ms ({(cl/cq-1)*100:+.1f} %)")
if others: print("other outcomes:", others)
PY
