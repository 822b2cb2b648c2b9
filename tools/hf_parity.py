#!/usr/bin/env python3
"""Ferrotron <-> transformers parity, for tools/hf-parity.sh.

Both directions, for every class `recipe export` / `recipe import` speak (GPT2LMHeadModel,
LlamaForCausalLM with llama3 / linear / yarn RoPE scaling, MixtralForCausalLM,
Qwen2ForCausalLM with its q/k/v biases (and a sliding window on every layer),
Qwen3ForCausalLM with per-head q/k norms and a head_dim other than hidden / heads,
MistralForCausalLM with a sliding window, Qwen3MoeForCausalLM with normalised and unnormalised
top-k probabilities, dense layers between the MoE ones or a sliding window,
DeepseekV3ForCausalLM with multi-latent attention (with or without a query latent, its rotary
channels stored as pairs or as halves), YaRN, sigmoid group-limited routing with a selection
bias, a shared expert, routed_scaling_factor and a dense first layer), each from a one-rank and
from a tp2·pp2 layout, the MoE classes also from an ep2 and a tp2·ep2 (ep·etp) one:
  export: train a tiny checkpoint with `recipe run` (CPU, fp32) on that layout, `recipe export
          --format hf`, load the folder with transformers;
  import: build transformers' own randomly initialised small model of the class, save_pretrained,
          then `recipe import` it (one rank), or start a multi-rank `recipe run` from it
          (`checkpoint.init_from`, one step at lr 0, so the checkpoint it saves went through the
          layout's loader and saver and still holds the imported weights);
then the same token batch through both sides (`recipe logits` on ours) and print, per row, the
max absolute logit difference over the real vocabulary and both models' next-token losses.
The batch is SEQ tokens long: past the RoPE scaling's original context and past the sliding
window, so both change the logits. A row passes under 1e-4 (fp32). Everything is written under
--work; the table is printed last.
"""

import argparse
import json
import os
import subprocess
import sys
import traceback

TOLERANCE = 1e-4
WORDS = 63  # the word-level tokenizer's words; with <|endoftext|> a vocabulary of 64
VOCAB = WORDS + 1
SEQ = 48  # tokens per row of the compared batch, and every model's training sequence
ORIGINAL_CONTEXT = 16  # the RoPE scaling's original_max_position_embeddings (< SEQ)
WINDOW = 8  # transformers' sliding_window (< SEQ): a query sees itself and the 7 tokens before
TRAIN_ITERS = 20


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


# Each variant is a recipe model section (Megatron's names) and the transformers class that
# computes the same function; `hf_config` spells the section in the class's own keys, written
# here independently of ferrotron-hf's config.rs so that the two check each other.
GPT2 = {
    "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": SEQ,
    "max_position_embeddings": SEQ, "norm_epsilon": 1.0e-5, "hidden_dropout": 0.0,
    "attention_dropout": 0.0, "activation": "gelu",
}
LLAMA = {
    "num_layers": 2, "hidden_size": 32, "ffn_hidden_size": 64, "num_attention_heads": 4,
    "num_query_groups": 2, "seq_length": SEQ, "position_embedding": "rope",
    "rotary_base": 10000.0, "normalization": "rmsnorm", "activation": "swiglu",
    "tie_embeddings": False, "add_bias_linear": False, "norm_epsilon": 1.0e-5,
    "hidden_dropout": 0.0, "attention_dropout": 0.0,
}
LLAMA3 = {"type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": ORIGINAL_CONTEXT}
YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL_CONTEXT,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.0}
# DeepSeek-style temperature: both set, so transformers and Megatron-Core agree on the factor
YARN_TEMPERED = dict(YARN, beta_fast=16.0, beta_slow=2.0, mscale=0.707, mscale_all_dim=0.5)
SLIDING = {"window_size": [WINDOW - 1, 0]}
QWEN3 = dict(LLAMA, qk_layernorm=True, kv_channels=16, norm_epsilon=1.0e-6, rotary_base=1.0e6)
# MLA with a query latent, a rotary part (4) other than the rest of a q/k head (8) and a value
# head (6) of its own; DeepSeek's MoE on the second layer only (first_k_dense_replace 1); YaRN
# whose mscale_all_dim (the softmax's) differs from mscale
DEEPSEEK = {k: v for k, v in LLAMA.items() if k != "num_query_groups"}
DEEPSEEK.update(
    qk_layernorm=True, norm_epsilon=1.0e-6,
    mla={"q_lora_rank": 24, "kv_lora_rank": 16, "qk_head_dim": 8, "qk_pos_emb_head_dim": 4,
         "v_head_dim": 6},
    rope_scaling=dict(YARN, mscale=1.0, mscale_all_dim=0.8),
    moe={"num_experts": 8, "router_topk": 2, "ffn_hidden_size": 12, "score_function": "sigmoid",
         "expert_bias": True, "num_groups": 2, "group_topk": 1,
         "shared_expert_ffn_hidden_size": 12, "router_topk_scaling_factor": 2.5,
         "layer_freq": [0, 1]})
VARIANTS = {
    "gpt2": ("GPT2LMHeadModel", GPT2),
    "llama3": ("LlamaForCausalLM", dict(LLAMA, rotary_base=500000.0, rope_scaling=LLAMA3)),
    "llama-linear": ("LlamaForCausalLM", dict(LLAMA, rope_scaling={"type": "linear",
                                                                   "factor": 2.0})),
    "llama-yarn": ("LlamaForCausalLM", dict(LLAMA, rope_scaling=YARN_TEMPERED)),
    "mixtral": ("MixtralForCausalLM", dict(LLAMA, moe={"num_experts": 4, "router_topk": 2,
                                                       "ffn_hidden_size": 48})),
    "qwen2": ("Qwen2ForCausalLM", dict(LLAMA, add_qkv_bias=True, norm_epsilon=1.0e-6,
                                       rotary_base=1.0e6, rope_scaling=YARN)),
    "qwen2-sliding": ("Qwen2ForCausalLM", dict(LLAMA, add_qkv_bias=True, **SLIDING)),
    "qwen3": ("Qwen3ForCausalLM", dict(LLAMA, qk_layernorm=True, kv_channels=16,
                                       norm_epsilon=1.0e-6, rotary_base=1.0e6)),
    "mistral": ("MistralForCausalLM", dict(LLAMA, **SLIDING)),
    # the second layer dense (mlp_only_layers [1])
    "qwen3-moe": ("Qwen3MoeForCausalLM", dict(QWEN3, moe={"num_experts": 8, "router_topk": 2,
                                                          "ffn_hidden_size": 24,
                                                          "layer_freq": [1, 0]})),
    # a sliding window on every layer (use_sliding_window)
    "qwen3-moe-sliding": ("Qwen3MoeForCausalLM", dict(QWEN3, **SLIDING,
                                                      moe={"num_experts": 4, "router_topk": 2,
                                                           "ffn_hidden_size": 24})),
    # norm_topk_prob false: softmax over all experts, then top-k
    "qwen3-moe-unnormalised": ("Qwen3MoeForCausalLM",
                               dict(QWEN3, moe={"num_experts": 4, "router_topk": 2,
                                                "ffn_hidden_size": 24, "pre_softmax": True})),
    "deepseek-v3": ("DeepseekV3ForCausalLM", DEEPSEEK),
    # the same, but transformers' model stores its rotary channels as halves
    # (rope_interleave false), which import reorders into pairs (export writes pairs)
    "deepseek-v3-rope-halves": ("DeepseekV3ForCausalLM", DEEPSEEK),
    # a full-rank query projection (q_proj, no q_lora_rank: DeepSeek-V2-Lite's)
    "deepseek-v3-q-proj": ("DeepseekV3ForCausalLM",
                           dict(DEEPSEEK, mla={k: v for k, v in DEEPSEEK["mla"].items()
                                               if k != "q_lora_rank"})),
}
# (tensor, pipeline, expert) parallel degrees; expert parallelism over 2 data-parallel ranks
# (expert tensor parallelism is the tensor degree: tp2·ep2 cuts each expert over 2 ranks too)
LAYOUTS = {"1 rank": (1, 1, 1), "tp2·pp2": (2, 2, 1), "ep2": (1, 1, 2), "tp2·ep2": (2, 1, 2)}


def rope(model):
    """rope_theta and rope_scaling, the spelling transformers 4.x and 5 both take (5 turns
    them into its rope_parameters)."""
    scaling = dict(model.get("rope_scaling") or {})
    if scaling:
        scaling["rope_type"] = scaling.pop("type")
    return dict(rope_theta=model["rotary_base"], rope_scaling=scaling or None)


def hf_config(variant):
    import transformers
    cls, model = VARIANTS[variant]
    common = dict(vocab_size=VOCAB, initializer_range=0.1, bos_token_id=0, eos_token_id=0,
                  tie_word_embeddings=model.get("tie_embeddings", True))
    if cls == "GPT2LMHeadModel":
        # exact GELU, as our MLP computes; GPT-2's default gelu_new is the tanh approximation
        return transformers.GPT2Config(
            n_layer=model["num_layers"], n_embd=model["hidden_size"],
            n_head=model["num_attention_heads"], n_positions=model["max_position_embeddings"],
            activation_function="gelu", layer_norm_epsilon=model["norm_epsilon"],
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)
    heads = model["num_attention_heads"]
    llama = dict(
        hidden_size=model["hidden_size"], num_hidden_layers=model["num_layers"],
        num_attention_heads=heads, num_key_value_heads=model.get("num_query_groups", heads),
        head_dim=model.get("kv_channels", model["hidden_size"] // heads),
        intermediate_size=model["ffn_hidden_size"], max_position_embeddings=SEQ,
        rms_norm_eps=model["norm_epsilon"], **rope(model), **common)
    window = model.get("window_size", [None])[0]
    window = None if window is None else window + 1
    if cls == "LlamaForCausalLM":
        return transformers.LlamaConfig(attention_bias=False, mlp_bias=False, **llama)
    if cls == "MixtralForCausalLM":
        moe = model["moe"]
        return transformers.MixtralConfig(
            num_local_experts=moe["num_experts"], num_experts_per_tok=moe["router_topk"],
            sliding_window=window, **dict(llama, intermediate_size=moe["ffn_hidden_size"]))
    if cls == "MistralForCausalLM":
        return transformers.MistralConfig(sliding_window=window, **llama)
    # Qwen: a window on every layer is use_sliding_window with max_window_layers 0
    qwen = dict(use_sliding_window=window is not None, sliding_window=window,
                max_window_layers=0 if window else model["num_layers"], **llama)
    if cls == "Qwen2ForCausalLM":
        return transformers.Qwen2Config(**qwen)
    if cls == "Qwen3ForCausalLM":
        return transformers.Qwen3Config(attention_bias=False, **qwen)
    moe = model["moe"]
    layers = model["num_layers"]
    pattern = moe.get("layer_freq", 1)
    if isinstance(pattern, int):
        pattern = [1 if i % pattern == 0 else 0 for i in range(layers)]
    if cls == "Qwen3MoeForCausalLM":
        return transformers.Qwen3MoeConfig(
            attention_bias=False, num_experts=moe["num_experts"],
            num_experts_per_tok=moe["router_topk"], moe_intermediate_size=moe["ffn_hidden_size"],
            norm_topk_prob=not moe.get("pre_softmax", False), decoder_sparse_step=1,
            mlp_only_layers=[i for i in range(layers) if not pattern[i]],
            use_sliding_window=window is not None, sliding_window=window, **llama)
    mla = model["mla"]
    return transformers.DeepseekV3Config(
        attention_bias=False, q_lora_rank=mla.get("q_lora_rank"),
        kv_lora_rank=mla["kv_lora_rank"], qk_nope_head_dim=mla["qk_head_dim"],
        qk_rope_head_dim=mla["qk_pos_emb_head_dim"], v_head_dim=mla["v_head_dim"],
        rope_interleave=variant != "deepseek-v3-rope-halves", n_routed_experts=moe["num_experts"],
        num_experts_per_tok=moe["router_topk"], moe_intermediate_size=moe["ffn_hidden_size"],
        n_shared_experts=moe["shared_expert_ffn_hidden_size"] // moe["ffn_hidden_size"],
        routed_scaling_factor=moe.get("router_topk_scaling_factor", 1.0),
        n_group=moe.get("num_groups", 1), topk_group=moe.get("group_topk", 1),
        norm_topk_prob=moe["router_topk"] > 1, first_k_dense_replace=pattern.index(1),
        num_nextn_predict_layers=0,
        # head_dim is qk_rope_head_dim there, which the config derives itself
        **{k: v for k, v in llama.items() if k not in ("head_dim", "num_key_value_heads")},
        num_key_value_heads=heads)


def random_model(variant):
    """transformers' own initialisation, with every norm weight and bias moved off its
    initial one or zero, so a norm or bias that lands in the wrong place shows."""
    import torch
    import transformers
    torch.manual_seed(0)
    config = hf_config(variant)
    model = getattr(transformers, VARIANTS[variant][0])(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or "ln_" in name:
                param.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                param.uniform_(-0.2, 0.2)
            elif name.endswith("mlp.gate.weight"):
                # routers far from ties, so both sides pick the same experts
                param.normal_(0.0, 1.0)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.uniform_(-0.3, 0.3)
    return model.eval()


def recipe(work, name, model, parallel, training=None, checkpoint=None):
    tp, pp, ep = parallel
    world = tp * pp * ep
    train = {
        "micro_batch_size": 2, "global_batch_size": 4, "train_iters": TRAIN_ITERS,
        "log_interval": 1, "eval_interval": 0, "seed": 1234,
        "optimizer": {"lr": 0.01, "weight_decay": 0.0},
        "schedule": {"decay": "constant", "warmup_iters": 0},
    }
    train.update(training or {})
    return {
        "version": 2, "name": name, "model": dict(model, make_vocab_size_divisible_by=64 // tp),
        "precision": {"dtype": "fp32"},
        "parallel": {"tensor": tp, "pipeline": pp, "data": ep, "expert": ep,
                     "sequence_parallel": tp > 1},
        "training": train,
        "data": {
            "tokenizer": {"type": "hf", "file": os.path.join(work, "tokenizer.json")},
            "blend": [{"path": os.path.join(work, "corpus.jsonl")}],
            "split": "100,0,0", "cache_dir": os.path.join(work, "cache"),
        },
        "checkpoint": dict({"dir": os.path.join(work, name, "checkpoints")}, **(checkpoint or {})),
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
            # the first diagnostic line for the table; the whole output is in the log
            lines = [l.strip(" ×") for l in done.stdout.splitlines()]
            said = [l for l in lines if l.startswith("×") or "error" in l.lower()] or lines[-1:]
            raise RuntimeError(f"recipe {args[0]} exited {done.returncode}: {said[0] if said else ''}")
        return done.stdout

    def run(self, work, name, parallel, **recipe_args):
        """`recipe run` of the recipe `recipe_args` describe, on the layout's thread ranks."""
        path = os.path.join(work, f"{name}.json")  # JSON is YAML
        with open(path, "w") as f:
            json.dump(recipe(work, name, parallel=parallel, **recipe_args), f, indent=1)
        args = ["run", path]
        world = parallel[0] * parallel[1] * parallel[2]
        if world > 1:
            args += ["--world-size", world]
        self.recipe(*args)
        return os.path.join(work, name, "checkpoints")


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


def tokens(seed):
    import torch
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (2, SEQ), generator=generator)


def loss(logits, ids):
    import torch
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)).item()


def compare(runner, checkpoint, model, ids, work, tag):
    """max |Δ logit| over the real vocabulary, our loss, transformers' loss."""
    import torch
    from safetensors.torch import load_file
    tokens_file = os.path.join(work, f"{tag}.tokens.json")
    logits_file = os.path.join(work, f"{tag}.logits.safetensors")
    with open(tokens_file, "w") as f:
        json.dump(ids.tolist(), f)
    runner.recipe("logits", checkpoint, "--tokens", tokens_file, "--out", logits_file)
    ours = load_file(logits_file)["logits"][..., :VOCAB].double()
    with torch.no_grad():
        theirs = model(input_ids=ids).logits[..., :VOCAB].double()
    return (ours - theirs).abs().max().item(), loss(ours, ids), loss(theirs, ids)


def export_row(runner, work, variant, layout):
    parallel = LAYOUTS[layout]
    name = f"export-{variant}-tp{parallel[0]}pp{parallel[1]}ep{parallel[2]}"
    checkpoints = runner.run(work, name, parallel, model=VARIANTS[variant][1])
    hf_dir = os.path.join(work, name, "hf")
    runner.recipe("export", checkpoints, "--format", "hf", "--out", hf_dir)
    model = load_hf(hf_dir)
    if type(model).__name__ != VARIANTS[variant][0]:
        raise RuntimeError(f"transformers loaded {type(model).__name__}")
    return compare(runner, checkpoints, model, tokens(1), work, name)


def import_row(runner, work, variant, layout):
    parallel = LAYOUTS[layout]
    name = f"import-{variant}-tp{parallel[0]}pp{parallel[1]}ep{parallel[2]}"
    hf_dir = os.path.join(work, name, "hf")
    model = random_model(variant)
    model.save_pretrained(hf_dir, safe_serialization=True)
    if parallel == (1, 1, 1):
        checkpoints = os.path.join(work, name, "checkpoints")
        runner.recipe("import", hf_dir, "--out", checkpoints)
    else:
        # the recipe's model section must be config.json's (`recipe run` refuses otherwise);
        # one step at lr 0 saves the imported weights through the layout's shards
        section = VARIANTS[variant][1]
        if section.get("moe", {}).get("expert_bias"):
            # the selection bias's update does not stop at lr 0: keep the imported one
            section = dict(section, moe=dict(section["moe"], expert_bias_update_rate=0.0))
        checkpoints = runner.run(
            work, name, parallel, model=section,
            training={"train_iters": 1, "optimizer": {"lr": 0.0, "weight_decay": 0.0}},
            checkpoint={"init_from": {"hf": hf_dir}})
    return compare(runner, checkpoints, model, tokens(2), work, name)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe-bin", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--only", nargs="*", choices=sorted(VARIANTS),
                        help="these variants only (default: all)")
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    write_data(args.work)
    runner = Runner(os.path.abspath(args.recipe_bin), args.work)
    rows = []
    variants = args.only or list(VARIANTS)
    jobs = [(direction, job, variant, layout)
            for direction, job in (("export", export_row), ("import", import_row))
            for variant in variants for layout in LAYOUTS
            if LAYOUTS[layout][2] == 1 or "moe" in VARIANTS[variant][1]
            # export always writes pairs: that variant's export rows would repeat deepseek-v3's
            if not (direction == "export" and variant == "deepseek-v3-rope-halves")]
    for direction, job, variant, layout in jobs:
        cls = VARIANTS[variant][0]
        try:
            diff, ours, theirs = job(runner, args.work, variant, layout)
            status = "ok" if diff < TOLERANCE else "FAIL"
            rows.append((direction, variant, cls, layout, f"{diff:.2e}", f"{ours:.6f}",
                         f"{theirs:.6f}", status))
        except Exception as error:  # one broken row must not hide the others
            runner.log.write(traceback.format_exc())
            rows.append((direction, variant, cls, layout, "-", "-", "-", f"ERROR: {error}"))
    import torch
    import transformers
    print(f"\nferrotron vs transformers {transformers.__version__} (torch {torch.__version__}), "
          f"fp32, CPU; {SEQ} tokens a row (RoPE scaling's original context "
          f"{ORIGINAL_CONTEXT}, sliding window {WINDOW}); tolerance {TOLERANCE:g}; "
          f"log: {os.path.join(args.work, 'parity.log')}")
    header = ("direction", "variant", "class", "layout", "max|Δlogit|", "loss ours", "loss hf",
              "status")
    count = len(header) - 1
    widths = [max(len(str(r[i]).splitlines()[0]) for r in rows + [header]) for i in range(count)]
    line = lambda r: " | ".join(str(c).splitlines()[0].ljust(w)
                                for c, w in zip(r, widths + [0]))
    print(line(header))
    print("-|-".join("-" * w for w in widths + [6]))
    for row in rows:
        print(line(row))
    return 0 if all(r[-1] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
