#!/usr/bin/env python3
"""gemm_ceiling.py — what cuBLAS reaches, through PyTorch, on the GEMMs of one of our runs.

Reads an op table written with FERROTRON_OP_TIMING (tools/gpu-bench.sh OP_TIMING=1), whose GEMM
rows name their problem (`matmul_bias(cublaslt) 24576x6144x2048 NN`: m x n x k, each operand
row-major N or transposed T), times the same problem in bf16 with torch.matmul / torch.addmm
(CUDA events, after warm-up) and prints one table: our mean time and TFLOP/s beside PyTorch's,
and each shape's share of our GEMM time. Where ours is slower on a shape that carries much of
the step, that shape is worth tuning; where both agree, the GEMMs are at what cuBLAS does.

Usage (on the GPU machine): python3 tools/gemm_ceiling.py OPS_MD [--repeats 30]
"""
import argparse
import re

import torch

ROW = re.compile(
    r"^\| (matmul(?:_bias)?)\(cublaslt\) (\d+)x(\d+)x(\d+) ([NT])([NT])(?: x(\d+))? \| (\d+) \| ([\d.]+) \| ([\d.]+) \|"
)


def operand(rows, cols, order, device):
    """A bf16 `rows x cols` matrix, row-major (N) or the transpose of a row-major one (T)."""
    if order == "N":
        return torch.randn(rows, cols, device=device, dtype=torch.bfloat16)
    return torch.randn(cols, rows, device=device, dtype=torch.bfloat16).t()


def time_ms(fn, repeats):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("ops")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    shapes = []
    for line in open(args.ops):
        m = ROW.match(line)
        if m:
            op, mm, nn, kk, oa, ob, batch, calls, total, mean = m.groups()
            shapes.append((op, int(mm), int(nn), int(kk), oa, ob, int(batch or 1), int(calls), float(total), float(mean)))
    if not shapes:
        raise SystemExit(f"no GEMM rows with shapes in {args.ops}")
    device = "cuda"
    gemm_total = sum(s[8] for s in shapes)
    print("| GEMM (m x n x k, a b) | calls | share of GEMM time | ours µs | ours TFLOP/s | PyTorch µs | PyTorch TFLOP/s | ours / PyTorch time |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    ours_total = torch_total = 0.0
    for op, m, n, k, oa, ob, batch, calls, total, mean in sorted(shapes, key=lambda s: -s[8]):
        if batch == 1:
            a, b = operand(m, k, oa, device), operand(k, n, ob, device)
        else:
            a = torch.stack([operand(m, k, oa, device) for _ in range(batch)])
            b = torch.stack([operand(k, n, ob, device) for _ in range(batch)])
        if op == "matmul_bias" and batch == 1:
            bias = torch.randn(n, device=device, dtype=torch.bfloat16)
            fn = lambda: torch.addmm(bias, a, b)
        else:
            fn = lambda: torch.matmul(a, b)
        ms = time_ms(fn, args.repeats)
        flops = 2.0 * m * n * k * batch
        ours_total += mean * calls
        torch_total += ms * 1000 * calls
        print(
            f"| {op} {m}x{n}x{k} {oa}{ob}{f' x{batch}' if batch > 1 else ''} | {calls} | {100 * total / gemm_total:.1f} % "
            f"| {mean:.1f} | {flops / mean / 1e6:.0f} | {ms * 1000:.1f} | {flops / ms / 1e9:.0f} | {mean / (ms * 1000):.2f} |"
        )
        del a, b
    print(f"\nAll GEMMs: ours {ours_total / 1000:.1f} ms, PyTorch {torch_total / 1000:.1f} ms "
          f"at the same calls ({ours_total / torch_total:.3f}×).")


if __name__ == "__main__":
    main()
