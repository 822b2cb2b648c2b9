"""Megatron-LM's learning-rate schedule, run by Megatron's own code, for Ferrotron's tests.

Drives `megatron.core.optimizer_param_scheduler.OptimizerParamScheduler` (from the
`megatron-core` package, or a Megatron-LM checkout named by MEGATRON_LM) exactly as Megatron's
training loop does: built with Megatron's `get_optimizer_param_scheduler` arithmetic (iterations
times the global batch, `--lr-decay-iters` defaulting to `--train-iters`; sample-based training
for a token budget), its constructor's `step(0)`, then `optimizer.step()` at the group's current
rate followed by `scheduler.step(increment=global_batch_size)`, once per iteration. It records
the rate each iteration's optimizer step used, which is what Ferrotron logs (Megatron's own log
line prints the rate after the scheduler step, i.e. the next iteration's).

Writes the cases and their rates as JSON; `crates/ferrotron-train/src/lr_schedule/megatron_lr.json`
is this script's output, and `lr_schedule/tests.rs` pins Ferrotron's schedule to it:

    pip install megatron-core torch   # or MEGATRON_LM=/path/to/Megatron-LM
    python3 tools/megatron_lr_ref.py > crates/ferrotron-train/src/lr_schedule/megatron_lr.json
"""
import json
import os
import sys
import types

if os.environ.get("MEGATRON_LM"):
    sys.path.insert(0, os.environ["MEGATRON_LM"])
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler  # noqa: E402

MEGATRON_STYLE = {"constant": "constant", "linear": "linear", "cosine": "cosine", "wsd": "WSD"}


def scheduler(case, optimizer):
    """`megatron/training/training.py::get_optimizer_param_scheduler`, with the case as args."""
    gbs = case["global_batch_size"]
    if "train_iters" in case:
        lr_decay_iters = case.get("decay_iters") or case["train_iters"]
        lr_decay_steps = lr_decay_iters * gbs
        wd_incr_steps = case["train_iters"] * gbs
        wsd_decay_steps = None
        if case.get("wsd_decay_iters") is not None:
            wsd_decay_steps = case["wsd_decay_iters"] * gbs
        lr_warmup_steps = case["warmup_iters"] * gbs
    else:
        # Sample-based training: a token budget of `train_tokens` is train_samples of seq_length.
        train_samples = case["train_tokens"] // case["seq_length"]
        lr_decay_samples = (case["decay_iters"] * gbs) if case.get("decay_iters") else train_samples
        lr_decay_steps = lr_decay_samples
        wd_incr_steps = train_samples
        wsd_decay_steps = (
            case["wsd_decay_iters"] * gbs if case.get("wsd_decay_iters") is not None else None
        )
        lr_warmup_steps = case["warmup_iters"] * gbs
    return OptimizerParamScheduler(
        optimizer,
        init_lr=case.get("warmup_init", 0.0),
        max_lr=case["lr"],
        min_lr=case["min_lr"],
        lr_warmup_steps=lr_warmup_steps,
        lr_decay_steps=lr_decay_steps,
        lr_decay_style=MEGATRON_STYLE[case["decay"]],
        start_wd=0.1,
        end_wd=0.1,
        wd_incr_steps=wd_incr_steps,
        wd_incr_style="constant",
        wsd_decay_steps=wsd_decay_steps,
        lr_wsd_decay_style=case.get("wsd_decay_style", "exponential"),
    )


def rates(case):
    optimizer = types.SimpleNamespace(param_groups=[{"params": []}])
    sched = scheduler(case, optimizer)
    iterations = case.get("train_iters") or case["train_tokens"] // (
        case["global_batch_size"] * case["seq_length"]
    )
    used = []
    for _ in range(iterations):
        used.append(optimizer.param_groups[0]["lr"])  # optimizer.step() runs at this rate
        sched.step(increment=case["global_batch_size"])
    return used


def cases():
    base = {"lr": 3.0e-4, "min_lr": 3.0e-5, "global_batch_size": 8, "seq_length": 64}
    out = []
    for decay in ["constant", "linear", "cosine"]:
        out.append(dict(base, decay=decay, train_iters=60, warmup_iters=10))
        out.append(dict(base, decay=decay, train_iters=60, warmup_iters=10, warmup_init=1.0e-5))
        out.append(dict(base, decay=decay, train_iters=60, warmup_iters=20, decay_iters=30))
        out.append(dict(base, decay=decay, train_iters=40, warmup_iters=0))
        out.append(dict(base, decay=decay, train_tokens=45 * 8 * 64 + 100, warmup_iters=5))
    for style in ["exponential", "linear", "cosine", "minus_sqrt"]:
        out.append(
            dict(base, decay="wsd", train_iters=60, warmup_iters=10, wsd_decay_iters=20,
                 wsd_decay_style=style)
        )
        out.append(
            dict(base, decay="wsd", train_iters=60, warmup_iters=5, warmup_init=2.0e-5,
                 decay_iters=50, wsd_decay_iters=15, wsd_decay_style=style)
        )
    out.append(
        dict(base, decay="wsd", train_tokens=50 * 8 * 64, warmup_iters=4, wsd_decay_iters=10)
    )
    return out


if __name__ == "__main__":
    json.dump(
        {
            "source": "megatron.core.optimizer_param_scheduler.OptimizerParamScheduler, "
            "driven as megatron/training/training.py does (tools/megatron_lr_ref.py)",
            "cases": [dict(case, rates=rates(case)) for case in cases()],
        },
        sys.stdout,
        indent=1,
    )
    sys.stdout.write("\n")
