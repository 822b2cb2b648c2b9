"""PyTorch SDPA at gpu_check's attention shapes (bf16, causal): the reference rates next to
ferrotron's cuDNN attention. Run by tools/gpu-speed.sh on the GPU machine."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def bench(fn, reps=10):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


print("| torch SDPA (bf16, causal) | backend | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s |")
print("|---|---|---:|---:|---:|---:|")
for b, h, g, s, d in [(4, 16, 16, 2048, 128), (4, 16, 16, 2048, 64), (2, 32, 8, 4096, 128)]:
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        try:
            q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(b, g, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            v = torch.randn(b, g, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            gqa = g != h
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
                grad = torch.randn_like(out)
                fwd = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa))
                bwd = bench(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True))
            flops = 2.0 * b * h * s * s * d
            print(f"| b {b} h {h} kv {g} s {s} d {d} | {backend.name} | {fwd:.3f} | {flops / fwd / 1e9:.0f} "
                  f"| {bwd:.3f} | {2.5 * flops / bwd / 1e9:.0f} |")
        except Exception as e:  # noqa: BLE001
            print(f"| b {b} h {h} kv {g} s {s} d {d} | {backend.name} | failed: {str(e).splitlines()[0][:80]} |")
