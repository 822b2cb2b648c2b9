#!/usr/bin/env python3
"""Ferrotron <-> transformers parity, for tools/hf-parity.sh.

Both directions, for GPT2LMHeadModel, LlamaForCausalLM and MixtralForCausalLM:
  export: train a tiny checkpoint with `recipe run` (CPU, fp32, 20 steps), `recipe export
          --format hf`, load it with transformers;
  import: build transformers' own randomly initialised small model, save_pretrained, `recipe
          import` it;
then the same token batch through both (`recipe logits` on our side) and print, per row, the
max absolute logit difference over the real vocabulary and both models' next-token losses.
A row passes under 1e-4 (fp32). Everything is written under --work; the table is printed last.
"""

import argparse
import json
import os
import subprocess
import sys
import traceback

TOLERANCE = 1e-4
WORDS = 63  # the word-level tokenizer's words; with <|endoftext|> a vocabulary of 64
SEQ = 16


def write_data(work):
    vocab = {"<|endoftext|>": 0}
    for w in range(WORDS):
        vocab[f"w{w}"] = w + 1
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"},
    }
    with open(os.path.join(work, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f)
    state = 12345
    lines = []
    for _ in range(200):
        words = []
        state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
        word = (state >> 33) % WORDS
        for _ in range(40):
            words.append(f"w{word}")
            state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
            word = (3 * word + 1) % WORDS if (state >> 33) % 4 else (state >> 40) % WORDS
        lines.append(json.dumps({"text": " ".join(words)}))
    with open(os.path.join(work, "corpus.jsonl"), "w") as f:
        f.write("\n".join(lines) + "\n")


MODELS = {
    "gpt2": {
        "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": SEQ,
        "max_position_embeddings": SEQ, "hidden_dropout": 0.0, "attention_dropout": 0.0,
    },
    "llama": {
        "num_layers": 2, "hidden_size": 32, "ffn_hidden_size": 64, "num_attention_heads": 4,
        "num_query_groups": 2, "seq_length": SEQ, "position_embedding": "rope",
        "rotary_base": 10000.0, "normalization": "rmsnorm", "activation": "swiglu",
        "tie_embeddings": False, "add_bias_linear": False, "norm_epsilon": 1.0e-5,
        "hidden_dropout": 0.0, "attention_dropout": 0.0,
    },
}
MODELS["mixtral"] = dict(MODELS["llama"], moe={"num_experts": 4, "router_topk": 2,
                                               "ffn_hidden_size": 48})


def recipe(work, name, model, parallel):
    tp, pp = parallel
    world = tp * pp
    return {
        "version": 2, "name": name, "model": dict(model, make_vocab_size_divisible_by=64 // tp),
        "precision": {"dtype": "fp32"},
        "parallel": {"tensor": tp, "pipeline": pp, "data": 1},
        "training": {
            "micro_batch_size": 2, "global_batch_size": 4, "train_iters": 20, "log_interval": 1,
            "eval_interval": 0, "seed": 1234,
            "optimizer": {"lr": 0.01, "weight_decay": 0.0},
            "schedule": {"decay": "constant", "warmup_iters": 0},
        },
        "data": {
            "tokenizer": {"type": "hf", "file": os.path.join(work, "tokenizer.json")},
            "blend": [{"path": os.path.join(work, "corpus.jsonl")}],
            "split": "100,0,0", "cache_dir": os.path.join(work, "cache"),
        },
        "checkpoint": {"dir": os.path.join(work, name, "checkpoints")},
        "logging": {"jsonl": os.path.join(work, name, "metrics.jsonl")},
        "cluster": {"nodes": 1, "gpus_per_node": world, "gpu": "cpu"},
        "runtime": {"backend": "cpu"},
    }


class Runner:
    def __init__(self, binary, work):
        self.binary = binary
        self.log = open(os.path.join(work, "parity.log"), "a")

    def recipe(self, *args):
        command = [self.binary, *map(str, args)]
        self.log.write("$ " + " ".join(command) + "\n")
        self.log.flush()
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.log.write(done.stdout)
        self.log.flush()
        if done.returncode != 0:
            tail = "\n".join(done.stdout.strip().splitlines()[-15:])
            raise RuntimeError(f"recipe {args[0]} exited {done.returncode}:\n{tail}")
        return done.stdout


def load_hf(path):
    import torch
    from transformers import AutoModelForCausalLM
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                     attn_implementation="eager")
    except TypeError:  # transformers 4: torch_dtype
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32,
                                                     attn_implementation="eager")
    return model.eval()


def tokens(vocab, seed):
    import torch
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (2, SEQ), generator=generator)


def loss(logits, ids):
    import torch
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)).item()


def compare(runner, checkpoint, model, vocab, ids, work, tag):
    """max |Δ logit| over the real vocabulary, our loss, transformers' loss."""
    import torch
    from safetensors.torch import load_file
    tokens_file = os.path.join(work, f"{tag}.tokens.json")
    logits_file = os.path.join(work, f"{tag}.logits.safetensors")
    with open(tokens_file, "w") as f:
        json.dump(ids.tolist(), f)
    runner.recipe("logits", checkpoint, "--tokens", tokens_file, "--out", logits_file)
    ours = load_file(logits_file)["logits"][..., :vocab].double()
    with torch.no_grad():
        theirs = model(input_ids=ids).logits[..., :vocab].double()
    return (ours - theirs).abs().max().item(), loss(ours, ids), loss(theirs, ids)


def export_row(runner, work, family, parallel):
    tp, pp = parallel
    name = f"export-{family}-tp{tp}pp{pp}"
    path = os.path.join(work, f"{name}.json")  # JSON is YAML
    with open(path, "w") as f:
        json.dump(recipe(work, name, MODELS[family], parallel), f, indent=1)
    args = ["run", path]
    if tp * pp > 1:
        args += ["--world-size", tp * pp]
    runner.recipe(*args)
    checkpoints = os.path.join(work, name, "checkpoints")
    hf_dir = os.path.join(work, name, "hf")
    runner.recipe("export", checkpoints, "--format", "hf", "--out", hf_dir)
    model = load_hf(hf_dir)
    vocab = model.config.vocab_size
    return compare(runner, checkpoints, model, vocab, tokens(vocab, 1), work, name)


def random_model(family):
    import torch
    import transformers
    common = dict(vocab_size=64, initializer_range=0.1, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    if family == "gpt2":
        # exact GELU, as our MLP computes; GPT-2's default gelu_new is the tanh approximation
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=32,
                                         activation_function="gelu", **common)
        return transformers.GPT2LMHeadModel(config)
    llama = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                 **common)
    if family == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**llama))
    config = transformers.MixtralConfig(num_local_experts=4, num_experts_per_tok=2,
                                        **dict(llama, intermediate_size=48))
    return transformers.MixtralForCausalLM(config)


def import_row(runner, work, family):
    name = f"import-{family}"
    hf_dir = os.path.join(work, name, "hf")
    model = random_model(family).eval()
    model.save_pretrained(hf_dir, safe_serialization=True)
    checkpoints = os.path.join(work, name, "checkpoints")
    runner.recipe("import", hf_dir, "--out", checkpoints)
    vocab = model.config.vocab_size
    return compare(runner, checkpoints, model, vocab, tokens(vocab, 2), work, name)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe-bin", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    write_data(args.work)
    runner = Runner(os.path.abspath(args.recipe_bin), args.work)
    rows = []
    jobs = [("export", f, (1, 1), export_row) for f in ("gpt2", "llama", "mixtral")]
    jobs += [("export", "llama", (2, 2), export_row)]
    jobs += [("import", f, None, import_row) for f in ("gpt2", "llama", "mixtral")]
    for direction, family, parallel, job in jobs:
        layout = "tp2·pp2" if parallel == (2, 2) else "1 rank"
        try:
            extra = (parallel,) if parallel else ()
            diff, ours, theirs = job(runner, args.work, family, *extra)
            status = "ok" if diff < TOLERANCE else "FAIL"
            rows.append((direction, family, layout, f"{diff:.2e}", f"{ours:.6f}", f"{theirs:.6f}",
                         status))
        except Exception as error:  # one broken row must not hide the others
            runner.log.write(traceback.format_exc())
            rows.append((direction, family, layout, "-", "-", "-", f"ERROR: {error}"))
    import torch
    import transformers
    print(f"\nferrotron vs transformers {transformers.__version__} (torch {torch.__version__}), "
          f"fp32, CPU; tolerance {TOLERANCE:g}; log: {os.path.join(args.work, 'parity.log')}")
    header = ("direction", "family", "layout", "max|Δlogit|", "loss ours", "loss hf", "status")
    widths = [max(len(str(r[i]).splitlines()[0]) for r in rows + [header]) for i in range(6)]
    line = lambda r: " | ".join(str(c).ljust(w) for c, w in zip(r, widths + [0]))
    print(line(header))
    print("-|-".join("-" * w for w in widths + [6]))
    for row in rows:
        print(line(row))
    return 0 if all(r[-1] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
