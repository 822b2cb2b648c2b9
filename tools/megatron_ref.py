#!/usr/bin/env python3
"""Ferrotron against a reference with Megatron-LM's training semantics, step for step (CPU, fp32).

The reference is PyTorch with Megatron's own parts where Megatron has them (the `megatron-core`
package): its `GPTDataset` through `BlendedMegatronDatasetBuilder` over the `.bin/.idx` files
Ferrotron tokenized (same split, seed and sequence length), its `OptimizerParamScheduler` built
and stepped as `megatron/training/training.py` does, and, written from Megatron's code,
its parameter groups (no weight decay on biases and 1-D parameters), the loss averaged over the
global batch's microbatches, `clip_grad_norm_fp32` (coefficient `max / (norm + 1e-6)`), and
AdamW (decoupled weight decay, as Megatron's fused Adam in `adam_w_mode`). Both start from the
same weights: a transformers `GPT2LMHeadModel` (exact GELU) saved here and loaded by Ferrotron
through `checkpoint.init_from: {hf: DIR}`, its embedding padded with zero rows to the padded
vocabulary, whose logits take part in the softmax as in Megatron.

Runs `recipe run` on the shakespeare-tiny recipe (global batch 8 in microbatches of 2, dropout
0, fp32), trains the reference on the same batches, and prints per step the loss, the gradient
norm and the learning rate of both, then the largest relative loss difference over steps 1–10
and over the whole run. Exit 1 when steps 1–10 differ by more than 1e-6 (relative).

    pip install megatron-core torch transformers
    python3 tools/megatron_ref.py --recipe-bin target/release/recipe --work /tmp/megatron-ref
"""

import argparse
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import types

STEPS = 60
MICRO = 2
TOLERANCE = 1e-6


def save_initial_model(work, resolved):
    import torch
    import transformers

    model = resolved["model"]
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=resolved["vocab_size"], n_positions=model["max_position_embeddings"],
        n_embd=model["hidden_size"], n_layer=model["num_layers"],
        n_head=model["num_attention_heads"], activation_function="gelu",
        layer_norm_epsilon=model["norm_epsilon"], resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=50256, eos_token_id=50256)
    path = os.path.join(work, "initial-hf")
    transformers.GPT2LMHeadModel(config).save_pretrained(path, safe_serialization=True)
    return path


def recipe(binary, *args):
    done = subprocess.run([binary, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    if done.returncode != 0:
        sys.exit(f"recipe {args[0]} exited {done.returncode}:\n{done.stdout[-3000:]}")
    return done.stdout


def megatron_batches(resolved, cache_dir, samples):
    """The training samples Megatron's dataset builder gives for this recipe, in order."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder)
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    prefixes = sorted(p[:-len(".bin")] for p in glob.glob(os.path.join(cache_dir, "**", "*.bin"),
                                                           recursive=True))
    assert len(prefixes) == 1, f"one tokenized corpus expected in {cache_dir}: {prefixes}"
    tokenizer = types.SimpleNamespace(vocab_size=resolved["vocab_size"], eod=50256,
                                      unique_identifiers={"class": "gpt2-bpe"})
    config = GPTDatasetConfig(
        random_seed=resolved["training"]["seed"],
        sequence_length=resolved["model"]["seq_length"],
        blend=([prefixes[0]], None), split=resolved["data"]["split"],
        path_to_cache=os.path.join(cache_dir, "megatron-ref"), tokenizer=tokenizer,
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        create_attention_mask=False)
    train, _, _ = BlendedMegatronDatasetBuilder(
        GPTDataset, [samples, None, None], lambda: True, config).build()
    return train


def param_groups(model, weight_decay):
    """Megatron's default: biases and 1-D parameters (norms) get no weight decay."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if name.endswith(".bias") or param.dim() == 1 else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay, "wd_mult": 1.0},
            {"params": no_decay, "weight_decay": 0.0, "wd_mult": 0.0}]


def train_reference(resolved, hf_dir, dataset, steps):
    import torch
    import transformers
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    torch.set_default_dtype(torch.float32)
    model = transformers.GPT2LMHeadModel.from_pretrained(hf_dir, attn_implementation="eager")
    # Megatron's embedding has the padded vocabulary's rows, and the padded logits take part in
    # the softmax; an imported model's padding rows are zeros (as Ferrotron's import makes them).
    real = model.transformer.wte.weight.data
    padded = torch.zeros(resolved["padded_vocab_size"], real.shape[1])
    padded[: real.shape[0]] = real
    model.transformer.wte.weight = torch.nn.Parameter(padded)
    model.lm_head.weight = model.transformer.wte.weight
    model.train()
    training = resolved["training"]
    opt, schedule = training["optimizer"], training["schedule"]
    optimizer = torch.optim.AdamW(param_groups(model, opt["weight_decay"]), lr=opt["lr"],
                                  betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"])
    gbs = training["global_batch_size"]
    decay_iters = schedule.get("decay_iters") or training["train_iters"]
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=schedule.get("warmup_init", 0.0), max_lr=opt["lr"],
        min_lr=opt["min_lr"], lr_warmup_steps=schedule["warmup_iters"] * gbs,
        lr_decay_steps=decay_iters * gbs, lr_decay_style={"wsd": "WSD"}.get(schedule["decay"], schedule["decay"]),
        start_wd=opt["weight_decay"], end_wd=opt["weight_decay"],
        wd_incr_steps=training["train_iters"] * gbs, wd_incr_style="constant")
    microbatches = gbs // MICRO
    rows = []
    for iteration in range(1, steps + 1):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for m in range(microbatches):
            first = (iteration - 1) * gbs + m * MICRO
            samples = [dataset[i] for i in range(first, first + MICRO)]
            tokens = torch.stack([torch.as_tensor(s["tokens"]) for s in samples])
            labels = torch.stack([torch.as_tensor(s["labels"]) for s in samples])
            logits = model(input_ids=tokens).logits
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
            (loss / microbatches).backward()
            total += loss.item() / microbatches
        # clip_grad_norm_fp32: the norm of all gradients, exactly (f64 here).
        norm = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in model.parameters()))
        coefficient = training["clip_grad"] / (norm + 1.0e-6)
        if coefficient < 1.0:
            for p in model.parameters():
                p.grad.mul_(coefficient)
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step(increment=gbs)
        rows.append({"step": iteration, "loss": total, "grad_norm": norm, "lr": lr})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe-bin", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--recipe", default="recipes/shakespeare-tiny.yaml")
    parser.add_argument("--steps", type=int, default=STEPS)
    args = parser.parse_args()
    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    binary = os.path.abspath(args.recipe_bin)
    cache_dir = os.path.join(work, "cache")
    sets = ["--set", f"training.train_iters={args.steps}", "--set", "training.log_interval=1",
            "--set", "training.eval_interval=0", "--set", f"training.micro_batch_size={MICRO}",
            "--set", f"data.cache_dir={cache_dir}",
            "--set", f"checkpoint.dir={work}/run/checkpoints",
            "--set", f"logging.jsonl={work}/run/metrics.jsonl", "--no-env"]
    plan = json.loads(recipe(binary, "plan", args.recipe, *sets, "--format", "json"))
    resolved = dict(plan["recipe"], vocab_size=plan["vocab_size"],
                    padded_vocab_size=plan["padded_vocab_size"])
    hf_dir = save_initial_model(work, resolved)
    shutil.rmtree(f"{work}/run", ignore_errors=True)  # a fresh run from the imported weights
    recipe(binary, "run", args.recipe, *sets, "--set", f"checkpoint.init_from.hf={hf_dir}",
           "--force")
    with open(f"{work}/run/metrics.jsonl") as f:
        ours = [r for r in map(json.loads, f) if "grad_norm" in r]
    dataset = megatron_batches(resolved, cache_dir, args.steps * resolved["training"]["global_batch_size"])
    theirs = train_reference(resolved, hf_dir, dataset, args.steps)

    print(f"\nferrotron vs a Megatron-semantics reference, {args.recipe}, {args.steps} steps, "
          f"fp32 CPU, global batch {resolved['training']['global_batch_size']} in microbatches "
          f"of {MICRO}")
    print("| step | loss ours | loss reference | rel. diff | grad norm ours | reference | lr ours | lr reference |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    worst_10 = worst = 0.0
    for a, b in zip(ours, theirs):
        rel = abs(a["loss"] - b["loss"]) / abs(b["loss"])
        worst = max(worst, rel)
        if b["step"] <= 10:
            worst_10 = max(worst_10, rel)
        if b["step"] <= 10 or b["step"] % 10 == 0:
            print(f"| {b['step']} | {a['loss']:.9f} | {b['loss']:.9f} | {rel:.1e} | "
                  f"{a['grad_norm']:.9f} | {b['grad_norm']:.9f} | {a['lr']:.6e} | {b['lr']:.6e} |")
    print(f"\nlargest relative loss difference: steps 1-10 {worst_10:.2e}, steps 1-{args.steps} "
          f"{worst:.2e} (tolerance over 1-10: {TOLERANCE:g})")
    return 0 if len(ours) == len(theirs) and worst_10 <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
