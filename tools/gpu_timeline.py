#!/usr/bin/env python3
"""Where the GPU waits for the host: the gaps of a FERROTRON_OP_TIMELINE file.

The timeline has one `op<TAB>start ms<TAB>end ms` line per timed op (generated kernels, cuBLASLt,
cuDNN), measured on the compute stream. Between two ops the stream idles when the host had not
queued the next one yet. This prints, for the steady-state window (from the end of the third
optimizer step to the end of the last one): the window, the time some op ran, the idle time
and its share, then the idle time summed by the op that ended each wait (what the host was
late to queue) and the longest single gaps with the ops around them.

    python3 tools/gpu_timeline.py run.timeline [--skip-steps 3]
"""

import argparse
import collections


def load(path):
    ops = []
    for line in open(path):
        name, start, end = line.rstrip("\n").split("\t")
        ops.append((float(start), float(end), name))
    ops.sort()
    return ops


def step_ends(ops):
    """End times of the optimizer's last kernel of each step (AdamW ends a step)."""
    ends, last = [], None
    for start, end, name in ops:
        if name.startswith("adamw"):
            last = end
        elif last is not None and not name.startswith("adamw"):
            ends.append(last)
            last = None
    if last is not None:
        ends.append(last)
    return ends


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("timeline")
    parser.add_argument("--skip-steps", type=int, default=3)
    args = parser.parse_args()
    ops = load(args.timeline)
    ends = step_ends(ops)
    if len(ends) <= args.skip_steps:
        print(f"only {len(ends)} optimizer steps in the timeline; nothing to measure")
        return
    lo, hi = ends[args.skip_steps - 1] if args.skip_steps else ops[0][0], ends[-1]
    steps = len(ends) - args.skip_steps
    window = [op for op in ops if op[0] >= lo and op[1] <= hi]
    busy, idle = 0.0, 0.0
    by_next = collections.Counter()
    gaps = []
    cursor, previous = lo, "(step start)"
    for start, end, name in window:
        if start > cursor:
            gap = start - cursor
            idle += gap
            by_next[name] += gap
            gaps.append((gap, previous, name))
        busy += max(0.0, end - max(start, cursor))
        if end > cursor:
            cursor, previous = end, name
    span = hi - lo
    print(f"steady window: {steps} steps, {span:.1f} ms ({span / steps:.1f} ms a step)")
    print(f"busy {busy:.1f} ms, idle {idle:.1f} ms: {100 * idle / span:.1f} % idle, "
          f"{idle / steps:.2f} ms a step, over {len(gaps)} gaps")
    print("\n| idle before op | ms a step | gaps a step |")
    print("|---|---:|---:|")
    counts = collections.Counter(name for _, _, name in gaps)
    for name, ms in by_next.most_common(12):
        print(f"| {name} | {ms / steps:.2f} | {counts[name] / steps:.1f} |")
    print("\n| longest gaps (ms) | after | before |")
    print("|---:|---|---|")
    for gap, before, after in sorted(gaps, reverse=True)[:12]:
        print(f"| {gap:.3f} | {before} | {after} |")


if __name__ == "__main__":
    main()
