"""host_probe.py — what the optimizer CPU offload can reach on the GPU machine's host.

Prints the host's memory bandwidth (a 256 MiB copy and add on every core), PyTorch's fused CPU
AdamW over 64M fp32 elements (the bar for Ferrotron's host pass, `HostAdamW`), and the PCIe
link's rate each way between the device and page-locked memory, and from the device into
pageable memory: the planner's offload rates (`ferrotron-plan` `hardware.rs`, `GPU_HOST`) come
from here. Needs PyTorch with CUDA (the GPU machine has it):

    device run: python3 tools/host_probe.py
"""
import time, torch, os
torch.set_num_threads(os.cpu_count())
n = 64 << 20
def t(f, reps=5):
    f(); best = 1e9
    for _ in range(reps):
        s = time.perf_counter(); f(); best = min(best, time.perf_counter() - s)
    return best
a = torch.empty(n, dtype=torch.float32).normal_(); b = torch.empty_like(a)
s = t(lambda: b.copy_(a)); print(f"copy f32 {n} el: {s*1e3:.1f} ms, {8*n/s/1e9:.1f} GB/s (read+write)")
c = torch.empty_like(a)
s = t(lambda: torch.add(a, b, out=c)); print(f"add: {s*1e3:.1f} ms, {12*n/s/1e9:.1f} GB/s")
p = a.clone(); g = b.clone(); m = torch.zeros_like(a); v = torch.zeros_like(a)
steps = torch.tensor([1.0])
def fused():
    torch._fused_adamw_([p], [g], [m], [v], [], [steps], lr=1e-4, beta1=0.9, beta2=0.95, weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False)
try:
    s = t(fused); print(f"torch fused adamw cpu fp32: {s*1e3:.1f} ms per {n} el, {28*n/s/1e9:.1f} GB/s")
except Exception as e: print("fused adamw:", e)
pin = torch.empty(n, dtype=torch.float32, pin_memory=True)
dev = torch.empty(n, dtype=torch.float32, device="cuda").normal_()
torch.cuda.synchronize()
s = t(lambda: (pin.copy_(dev, non_blocking=True), torch.cuda.synchronize())); print(f"D2H pinned: {4*n/s/1e9:.1f} GB/s")
s = t(lambda: (dev.copy_(pin, non_blocking=True), torch.cuda.synchronize())); print(f"H2D pinned: {4*n/s/1e9:.1f} GB/s")
s = t(lambda: (b.copy_(dev), torch.cuda.synchronize())); print(f"D2H pageable: {4*n/s/1e9:.1f} GB/s")
print("cpu:", open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0], "flags avx512f" if "avx512f" in open("/proc/cpuinfo").read() else "no avx512")
