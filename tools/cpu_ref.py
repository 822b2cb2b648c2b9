"""PyTorch eager reference for the CPU quick-start step (issue 23): shakespeare-tiny's shape.

The same model and step as `recipe run recipes/shakespeare-tiny.yaml --backend cpu`: 4 pre-norm
GPT layers, hidden 64, 4 heads, sequence 64, micro batch 8, vocabulary 50304 with tied
embeddings, learned positions, LayerNorm, GELU, biases, no dropout, fp32, AdamW (β 0.9/0.95,
weight decay 0.1), gradient clipping at 1.0. Random token batches: the step's cost does not
depend on the text. Prints one markdown row per thread count: median step time and tokens/s.

    python3 tools/cpu_ref.py --threads 1 4 16 --steps 30
"""
import argparse, statistics, time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, HIDDEN, HEADS, LAYERS, SEQ, BATCH = 50304, 64, 4, 4, 64, 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.qkv, self.proj = nn.Linear(HIDDEN, 3 * HIDDEN), nn.Linear(HIDDEN, HIDDEN)
        self.fc1, self.fc2 = nn.Linear(HIDDEN, 4 * HIDDEN), nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, HEADS, h // HEADS).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(SEQ, HIDDEN)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(HIDDEN)

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.tok.weight.t()  # tied output layer


def median_step(threads, steps):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = Gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3, betas=(0.9, 0.95), weight_decay=0.1)
    times = []
    for _ in range(steps):
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1))
        start = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[5:])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, shakespeare-tiny shape, {args.steps} steps (median of the last {args.steps - 5})")
    print("| threads | ms/step | tokens/s |")
    print("|---:|---:|---:|")
    for threads in args.threads:
        step = median_step(threads, args.steps)
        print(f"| {threads} | {step * 1000:.1f} | {BATCH * SEQ / step:,.0f} |")


if __name__ == "__main__":
    main()
