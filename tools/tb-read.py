#!/usr/bin/env python3
"""Prints the scalars of a TensorBoard log directory as JSON, read by TensorBoard's own reader.

    tools/tb-read.py DIR   ->   {"files": N, "scalars": {"lm loss": [[step, value], ...], ...}}

`tests/run.rs` runs it on the event files of a training run and compares the values with the
run's metrics.jsonl, so the event format is proven by TensorBoard (the `tensorboard` package
from PyPI, which `tools/test.sh` installs), not assumed. The reader is the one TensorBoard's
own loading uses, with restart purging on: what it prints is what TensorBoard would chart.
"""

import json
import os
import sys

from tensorboard.backend.event_processing import event_accumulator


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: tb-read.py DIR", file=sys.stderr)
        return 2
    directory = sys.argv[1]
    files = [
        name for name in os.listdir(directory) if name.startswith("events.out.tfevents.")
    ]
    # size_guidance 0 keeps every point (the default samples down to 10,000 per tag).
    accumulator = event_accumulator.EventAccumulator(
        directory,
        size_guidance={event_accumulator.SCALARS: 0},
        purge_orphaned_data=True,
    )
    accumulator.Reload()
    scalars = {
        tag: [[event.step, event.value] for event in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()[event_accumulator.SCALARS]
    }
    json.dump({"files": len(files), "scalars": scalars}, sys.stdout, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
