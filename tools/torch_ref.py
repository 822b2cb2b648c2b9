#!/usr/bin/env python3
"""torch_ref.py: the PyTorch + torch.compile reference for a `recipe plan --format json` layout.

"Faster than PyTorch" is only a claim when PyTorch ran the same model, at the same shapes, on the
same GPU, in the same call. This script builds the model a plan describes (the resolved recipe's
`model` section and the padded vocabulary: GPT with learned positions, LayerNorm, GELU, biases,
tied embeddings and dropout, or LLaMA-style with RoPE, RMSNorm, SwiGLU and grouped-query
attention, and MoE layers; Qwen2.5's QKV bias, Qwen3's QK-norm, Mistral's sliding window through
`flex_attention`, Llama 3.1's and YaRN's scaled RoPE), trains it on random tokens at the plan's micro batch and reports
tokens/s, the step time and MFU by the plan's own FLOPs (`flops_per_iteration`, Megatron's
formula), so its MFU is comparable with `recipe run`'s to the digit.

It is written the way a PyTorch user gets speed today: fp32 parameters with bf16 autocast
(PyTorch's mixed precision; Megatron keeps fp32 master weights too), `torch.compile` of the
whole model, `scaled_dot_product_attention` (flash or cuDNN kernels, dropout inside), the fused
AdamW with Megatron's weight-decay rule (no decay on biases and norms), gradient clipping.
MoE layers route like Megatron's `topk_softmax_with_capacity` (dropless) and run their experts
as torchtitan does: tokens sorted by expert into 16-row-aligned groups on the device and
`torch._grouped_mm` over them, so no host read; the load-balancing loss is the switch loss.

One step reads its loss (`.item()`), as `recipe run` with `log_interval: 1` reads its
statistics. Runs on the CPU too (small shapes, for checking the script), there in fp32 unless
`--dtype bf16`.

    python3 tools/torch_ref.py --plan logs/gpt-1.3b.plan.json --steps 12 --out torch.json
"""

import argparse
import json
import math
import re
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

DENSE_BF16_PEAK = 989e12  # H100/H200 dense bf16 FLOP/s, the planner's MFU denominator


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--plan", required=True, help="`recipe plan --format json` output")
    p.add_argument("--steps", type=int, default=12, help="timed steps after the warm-up")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps (compilation happens in the first)")
    p.add_argument("--no-compile", action="store_true", help="eager PyTorch, to compare")
    p.add_argument("--dtype", choices=["bf16", "fp32"], help="autocast dtype (default: bf16 on a GPU, fp32 on the CPU)")
    p.add_argument("--out", help="write the result as JSON here too")
    return p.parse_args()


class Unsupported(Exception):
    """A plan setting this reference does not implement (refused, never approximated)."""


def moe_layers(model):
    moe = model.get("moe")
    if not moe:
        return set()
    freq = moe.get("layer_freq", 1)
    if isinstance(freq, str):
        # Megatron's `--moe-layer-freq` string (`moe_freq_type`: digits and `,[]()+*` only)
        if re.search(r"[^,\d\[\]()+*]", freq):
            raise Unsupported(f"moe.layer_freq {freq!r}")
        freq = eval(freq)
    if isinstance(freq, list):
        return {i for i, moe_layer in enumerate(freq) if moe_layer}
    return {i for i in range(model["num_layers"]) if i % freq == 0}


def check_supported(recipe, plan):
    model = recipe["model"]
    degrees = plan.get("degrees", {})
    if any(v != 1 for v in degrees.values()):
        raise Unsupported(f"one GPU only, the plan has degrees {degrees}")
    if recipe.get("precision", {}).get("fp8", "none") != "none":
        raise Unsupported("fp8 (this reference trains in bf16)")
    moe = model.get("moe")
    if moe:
        for key, ok in [("load_balancing", ("aux_loss", "none")), ("score_function", ("softmax", "sigmoid"))]:
            if moe.get(key) not in ok:
                raise Unsupported(f"moe.{key} {moe.get(key)!r}")
        for key in ("capacity_factor", "shared_expert_ffn_hidden_size", "group_topk", "num_groups", "z_loss_coeff"):
            if moe.get(key) not in (None, 0):
                raise Unsupported(f"moe.{key} {moe.get(key)!r}")
        if moe.get("expert_bias"):
            raise Unsupported("moe.expert_bias")
    if model["activation"] not in ("gelu", "gelu_tanh", "swiglu"):
        raise Unsupported(f"activation {model['activation']!r}")
    if model["normalization"] not in ("layernorm", "rmsnorm"):
        raise Unsupported(f"normalization {model['normalization']!r}")
    if model["position_embedding"] not in ("learned", "rope"):
        raise Unsupported(f"position_embedding {model['position_embedding']!r}")
    if model.get("window_size") and model["attention_dropout"] > 0:
        raise Unsupported("a sliding window with attention dropout (flex_attention has none)")


def norm(model, width=None):
    h, eps = width or model["hidden_size"], model["norm_epsilon"]
    if model["normalization"] == "layernorm":
        return nn.LayerNorm(h, eps=eps)
    return nn.RMSNorm(h, eps=eps)


def activation(model, x):
    kind = model["activation"]
    if kind == "swiglu":
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
    return F.gelu(x, approximate="tanh" if kind == "gelu_tanh" else "none")


def rotate(x, cos, sin):
    """Megatron's (non-interleaved) rotary embedding of `x` [b, s, heads, dim]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def inverse_frequencies(model):
    """RoPE's inverse frequencies, scaled as `model.rope_scaling` says (ferrotron-model's rope.rs,
    after transformers' `_compute_*_parameters`), and the factor on cos and sin (YaRN's)."""
    dim, theta = model["kv_channels"], model["rotary_base"]
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = model.get("rope_scaling")
    if not scaling:
        return inv, 1.0
    kind, factor = scaling["type"], scaling["factor"]
    if kind == "linear":
        return inv / factor, 1.0
    if kind == "llama3":
        context = scaling.get("original_max_position_embeddings") or 8192
        low, high = scaling.get("low_freq_factor") or 1.0, scaling.get("high_freq_factor") or 4.0
        wavelength = 2 * math.pi / inv
        smooth = (context / wavelength - low) / (high - low)
        blended = (1 - smooth) * inv / factor + smooth * inv
        return torch.where(wavelength < context / high, inv,
                           torch.where(wavelength > context / low, inv / factor, blended)), 1.0
    context = scaling.get("original_max_position_embeddings") or 4096
    pair = lambda rotations: dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(theta))
    lo = max(math.floor(pair(scaling.get("beta_fast") or 32.0)), 0)
    hi = min(math.ceil(pair(scaling.get("beta_slow") or 1.0)), dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - lo) / ((hi + 0.001 if lo == hi else hi) - lo)).clamp(0, 1)
    mscale = lambda m: 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0
    temperature = mscale(scaling.get("mscale", 1.0)) / mscale(scaling.get("mscale_all_dim", 0.0))
    return inv / factor * ramp + inv * (1 - ramp), temperature


class Attention(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.heads = model["num_attention_heads"]
        self.groups = model["num_query_groups"]
        self.dim = model["kv_channels"]
        self.dropout = model["attention_dropout"]
        bias = model["add_bias_linear"]
        h = model["hidden_size"]
        qkv_bias = bias or model.get("add_qkv_bias", False)
        self.qkv = nn.Linear(h, (self.heads + 2 * self.groups) * self.dim, bias=qkv_bias)
        self.proj = nn.Linear(self.heads * self.dim, h, bias=bias)
        qk_norm = model.get("qk_layernorm", False)
        self.q_norm = norm(model, self.dim) if qk_norm else None
        self.k_norm = norm(model, self.dim) if qk_norm else None
        window = model.get("window_size")
        self.window = window[0] if window and window[0] + 1 < model["seq_length"] else None
        self.block_mask = None

    def attend(self, q, k, v):
        if self.window is None:
            return F.scaled_dot_product_attention(
                q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0,
                enable_gqa=self.groups != self.heads)
        # A sliding window the way PyTorch offers it today: flex_attention with a block mask on a
        # GPU; on the CPU (no flex backward there) the band as SDPA's boolean mask.
        left, s = self.window, q.shape[2]
        band = lambda b, h, i, j: (j <= i) & (i - j <= left)
        if q.device.type == "cpu":
            i = torch.arange(s)
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=band(None, None, i[:, None], i[None, :]),
                enable_gqa=self.groups != self.heads)
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        if self.block_mask is None:
            self.block_mask = create_block_mask(band, None, None, s, s, device=q.device)
        return flex_attention(q, k, v, block_mask=self.block_mask, enable_gqa=self.groups != self.heads)

    def forward(self, x, rope):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split([self.heads * self.dim, self.groups * self.dim, self.groups * self.dim], dim=-1)
        q = q.view(b, s, self.heads, self.dim)
        k = k.view(b, s, self.groups, self.dim)
        v = v.view(b, s, self.groups, self.dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        out = self.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.proj(out.transpose(1, 2).reshape(b, s, self.heads * self.dim))


class Mlp(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model
        h, ffn, bias = model["hidden_size"], model["ffn_hidden_size"], model["add_bias_linear"]
        gated = 2 if model["activation"] == "swiglu" else 1
        self.fc1 = nn.Linear(h, gated * ffn, bias=bias)
        self.fc2 = nn.Linear(ffn, h, bias=bias)

    def forward(self, x):
        return self.fc2(activation(self.model, self.fc1(x))), None


class Moe(nn.Module):
    """Dropless top-k MoE, experts through `torch._grouped_mm` over 16-row-aligned groups."""

    ALIGN = 16

    def __init__(self, model):
        super().__init__()
        self.model = model
        moe = model["moe"]
        h = model["hidden_size"]
        ffn = moe.get("ffn_hidden_size") or model["ffn_hidden_size"]
        self.experts, self.k = moe["num_experts"], moe["router_topk"]
        self.pre_softmax = moe.get("pre_softmax", False)
        self.score = moe.get("score_function", "softmax")
        self.scaling = moe.get("router_topk_scaling_factor") or 1.0
        self.aux = moe["aux_loss_coeff"] if moe.get("load_balancing") == "aux_loss" else 0.0
        gated = 2 if model["activation"] == "swiglu" else 1
        std = model["init_method_std"]
        self.router = nn.Linear(h, self.experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(self.experts, h, gated * ffn) * std)
        self.w2 = nn.Parameter(torch.randn(self.experts, ffn, h) * std / math.sqrt(2 * model["num_layers"]))

    def route(self, logits):
        if self.score == "sigmoid":
            full = torch.sigmoid(logits)
            scores, experts = full.topk(self.k, dim=-1)
            scores = scores / scores.sum(-1, keepdim=True)
        elif self.pre_softmax:
            full = logits.softmax(-1)
            scores, experts = full.topk(self.k, dim=-1)
        else:
            top, experts = logits.topk(self.k, dim=-1)
            scores = top.softmax(-1)
            full = logits.softmax(-1)
        return scores * self.scaling, experts, full

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        tokens = x.shape[0]
        scores, experts, full = self.route(self.router(x).float())
        chosen = experts.reshape(-1)  # [tokens · k]
        order = torch.argsort(chosen, stable=True)
        token = order // self.k
        counts = torch.zeros(self.experts, dtype=torch.int64, device=x.device).scatter_add_(
            0, chosen, torch.ones_like(chosen))
        padded = (counts + self.ALIGN - 1) // self.ALIGN * self.ALIGN
        ends = padded.cumsum(0)
        starts = counts.cumsum(0) - counts
        by_expert = chosen[order]
        rows = tokens * self.k
        dest = ends[by_expert] - padded[by_expert] + torch.arange(rows, device=x.device) - starts[by_expert]
        # the upper bound of the padded rows, so every shape is static
        capacity = rows + self.ALIGN * self.experts
        # grouped GEMMs take bf16 only (autocast leaves a norm's output in fp32)
        xb = x.to(torch.bfloat16)
        grouped = xb.new_zeros(capacity, shape[-1]).index_copy(0, dest, xb[token])
        offs = ends.to(torch.int32)
        w1, w2 = self.w1.to(torch.bfloat16), self.w2.to(torch.bfloat16)
        hidden = activation(self.model, torch._grouped_mm(grouped, w1, offs=offs))
        out = torch._grouped_mm(hidden, w2, offs=offs)[dest]
        weighted = out * scores.reshape(-1)[order].unsqueeze(-1).to(out.dtype)
        y = xb.new_zeros(tokens, shape[-1]).index_add(0, token, weighted).to(x.dtype)
        aux = None
        if self.aux:
            fraction = counts.float() / rows
            aux = self.aux * self.experts * (fraction * full.mean(0)).sum()
        return y.reshape(shape), aux


class Block(nn.Module):
    def __init__(self, model, moe):
        super().__init__()
        self.norm1, self.norm2 = norm(model), norm(model)
        self.attention = Attention(model)
        self.mlp = Moe(model) if moe else Mlp(model)
        self.dropout = nn.Dropout(model["hidden_dropout"])

    def forward(self, x, rope):
        x = x + self.dropout(self.attention(self.norm1(x), rope))
        out, aux = self.mlp(self.norm2(x))
        return x + self.dropout(out), aux


class Model(nn.Module):
    def __init__(self, model, vocab):
        super().__init__()
        self.model = model
        h, s = model["hidden_size"], model["seq_length"]
        self.embedding = nn.Embedding(vocab, h)
        self.positions = nn.Embedding(s, h) if model["position_embedding"] == "learned" else None
        self.dropout = nn.Dropout(model["hidden_dropout"])
        moe = moe_layers(model)
        self.blocks = nn.ModuleList(Block(model, i in moe) for i in range(model["num_layers"]))
        self.final_norm = norm(model)
        self.output = None if model["tie_embeddings"] else nn.Linear(h, vocab, bias=False)
        std = model["init_method_std"]
        for name, p in self.named_parameters():
            if p.dim() == 2 and "w1" not in name and "w2" not in name:
                nn.init.normal_(p, std=std / math.sqrt(2 * model["num_layers"]) if name.endswith(("proj.weight", "fc2.weight")) else std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        if model["position_embedding"] == "rope":
            inv, temperature = inverse_frequencies(model)
            angles = torch.outer(torch.arange(s, dtype=torch.float64), inv)
            angles = torch.cat((angles, angles), dim=-1)[None, :, None, :]  # [1, s, 1, dim]
            self.register_buffer("cos", (angles.cos() * temperature).float(), persistent=False)
            self.register_buffer("sin", (angles.sin() * temperature).float(), persistent=False)

    def forward(self, tokens, labels):
        x = self.embedding(tokens)
        if self.positions is not None:
            x = x + self.positions.weight[: tokens.shape[1]]
        x = self.dropout(x)
        rope = (self.cos.to(x.dtype), self.sin.to(x.dtype)) if self.positions is None else None
        aux_total = 0.0
        for block in self.blocks:
            x, aux = block(x, rope)
            if aux is not None:
                aux_total = aux_total + aux
        x = self.final_norm(x)
        weight = self.embedding.weight if self.output is None else self.output.weight
        logits = F.linear(x, weight)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))
        return loss, loss + aux_total


def optimizer(model, training, fused):
    opt = training["optimizer"]
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "norm" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "norm" not in n)]
    groups = [{"params": decay, "weight_decay": opt["weight_decay"]}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=opt["lr"], betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"], fused=fused)


def main():
    args = parse()
    plan = json.load(open(args.plan))
    recipe = plan["recipe"]
    result = {"plan": args.plan, "name": recipe.get("name")}
    try:
        check_supported(recipe, plan)
    except Unsupported as e:
        result["unsupported"] = str(e)
        print(json.dumps(result))
        if args.out:
            json.dump(result, open(args.out, "w"))
        return 3
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype or ("bf16" if cuda else "fp32")]
    torch.manual_seed(recipe["training"].get("seed", 1234))
    model_cfg = recipe["model"]
    vocab = plan["padded_vocab_size"]
    mb, seq = plan["micro_batch_size"], model_cfg["seq_length"]
    # Gradient accumulation as Megatron's: each micro batch's loss over their number, one update.
    microbatches = plan.get("num_microbatches", 1)
    net = Model(model_cfg, vocab).to(device)
    opt = optimizer(net, recipe["training"], fused=cuda)
    step_fn = net if args.no_compile else torch.compile(net)
    clip = recipe["training"].get("clip_grad") or 0.0
    generator = torch.Generator(device=device).manual_seed(7)

    def step():
        lm_losses = []
        for _ in range(microbatches):
            tokens = torch.randint(0, recipe["model"]["vocab_size"], (mb, seq + 1), device=device, generator=generator)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                lm_loss, loss = step_fn(tokens[:, :-1], tokens[:, 1:])
            (loss / microbatches).backward()
            lm_losses.append(lm_loss.detach())
        if clip:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return torch.stack(lm_losses).mean().item()

    losses, times = [], []
    compile_start = time.perf_counter()
    try:
        for i in range(args.warmup + args.steps):
            start = time.perf_counter()
            losses.append(step())
            if cuda:
                torch.cuda.synchronize()
            if i == 0:
                result["first_step_seconds"] = time.perf_counter() - compile_start
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
    except torch.OutOfMemoryError as e:
        result["error"] = f"out of memory: {str(e).splitlines()[0]}"
    if times:
        step_s = statistics.median(times)
        tokens = mb * seq * microbatches
        flops = plan["flops_per_iteration"]
        result.update(
            tokens_per_second=tokens / step_s,
            step_seconds=step_s,
            tflops=flops / step_s / 1e12,
            mfu=flops / step_s / DENSE_BF16_PEAK,
            compiled=not args.no_compile,
            device=torch.cuda.get_device_name() if cuda else "cpu",
            torch=torch.__version__,
            peak_memory_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            losses=losses,
            steps=len(times),
        )
    print(json.dumps(result))
    if args.out:
        json.dump(result, open(args.out, "w"))
    return 0 if times else 1


if __name__ == "__main__":
    sys.exit(main())
