#!/usr/bin/env python3
"""Does cuBLASLt's grouped matmul (`CUBLASLT_BATCH_MODE_GROUPED`, row counts read from the
device) run on this GPU, give the per-expert products, and at what speed against
`torch._grouped_mm` and one dense GEMM of the same rows? (issue 47: the MoE layer's host read)

Each libcublasLt found (PyTorch's wheel, /usr/local/cuda) is loaded in a child process before
torch, so the child's torch uses it too. Prints one table row per (library, shape, pass).
Usage: python3 tools/cublaslt_grouped_probe.py [--lib PATH]
"""
import ctypes
import glob
import os
import subprocess
import sys

SHAPES = [
    # name, experts, k (hidden), n (expert ffn), routed rows, seed
    ("small-moe 8x2816", 8, 1024, 2816, 16 * 2048 * 2),
    ("mixtral 8x14336", 8, 4096, 14336, 4 * 4096 * 2),
    ("qwen3 128x768", 128, 2048, 768, 4 * 4096 * 8),
    ("deepseek 64x2048", 64, 2048, 2048, 4 * 4096 * 8),
]
CUDA_R_32F, CUDA_R_16BF, COMPUTE_32F = 0, 14, 68
DESC_TRANSA, DESC_TRANSB = 3, 4
PREF_WORKSPACE, PREF_AVG_K, PREF_AVG_ROWS, PREF_AVG_COLS = 1, 13, 14, 15


def candidates():
    found = []
    import site
    roots = site.getsitepackages() + [site.getusersitepackages()]
    patterns = [os.path.join(r, "nvidia", "*", "lib", "libcublasLt.so*") for r in roots]
    patterns += [os.path.join(r, "nvidia", "*", "*", "lib", "libcublasLt.so*") for r in roots]
    for pattern in patterns + ["/usr/local/cuda/lib64/libcublasLt.so.*"]:
        found += [p for p in glob.glob(pattern) if not os.path.islink(p) or p.endswith(".so.13")]
    seen, out = set(), []
    for p in found:
        real = os.path.realpath(p)
        if real not in seen:
            seen.add(real)
            out.append(real)
    return out


def check(status, what):
    if status != 0:
        raise RuntimeError(f"{what}: cublasStatus {status}")


class Lt:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        self.lib.cublasLtGetVersion.restype = ctypes.c_size_t
        self.version = self.lib.cublasLtGetVersion()
        self.keep = []
        self.handle = ctypes.c_void_p()
        check(self.lib.cublasLtCreate(ctypes.byref(self.handle)), "create")

    def grouped_layout(self, groups, rows, cols, ld):
        self.keep += [rows, cols, ld]  # the layout holds their device addresses
        layout = ctypes.c_void_p()
        f = self.lib.cublasLtGroupedMatrixLayoutCreate
        f.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        check(f(ctypes.byref(layout), CUDA_R_16BF, groups, rows.data_ptr(), cols.data_ptr(), ld.data_ptr()), "layout")
        return layout

    def matmul(self, trans_a, trans_b, a_ptrs, a_layout, b_ptrs, b_layout, d_ptrs, d_layout, avg, workspace, stream):
        lib = self.lib
        desc = ctypes.c_void_p()
        check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), COMPUTE_32F, CUDA_R_32F), "desc")
        for attr, value in ((DESC_TRANSA, trans_a), (DESC_TRANSB, trans_b)):
            v = ctypes.c_int32(value)
            check(lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(v), 4), "trans")
        pref = ctypes.c_void_p()
        check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "pref")
        ws = ctypes.c_uint64(workspace.numel())
        check(lib.cublasLtMatmulPreferenceSetAttribute(pref, PREF_WORKSPACE, ctypes.byref(ws), 8), "ws")
        for attr, value in zip((PREF_AVG_K, PREF_AVG_ROWS, PREF_AVG_COLS), avg):
            v = ctypes.c_uint32(value)
            check(lib.cublasLtMatmulPreferenceSetAttribute(pref, attr, ctypes.byref(v), 4), "avg")
        result = (ctypes.c_byte * 96)()
        count = ctypes.c_int(0)
        check(lib.cublasLtMatmulAlgoGetHeuristic(self.handle, desc, a_layout, b_layout, d_layout, d_layout, pref, 1,
                                                 ctypes.byref(result), ctypes.byref(count)), "heuristic")
        if count.value == 0:
            raise RuntimeError("no algorithm")
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        f = lib.cublasLtMatmul
        f.argtypes = [ctypes.c_void_p] * 16
        f.argtypes[14] = ctypes.c_size_t

        def run():
            check(f(self.handle, desc, ctypes.byref(alpha), a_ptrs.data_ptr(), a_layout, b_ptrs.data_ptr(), b_layout,
                    ctypes.byref(beta), d_ptrs.data_ptr(), d_layout, d_ptrs.data_ptr(), d_layout,
                    ctypes.byref(result), workspace.data_ptr(), workspace.numel(), stream), "matmul")
        return run


def legacy_grouped(torch, problems):
    """`cublasGemmGroupedBatchedEx` (what the CUDA backend runs today, sizes from the host) over
    column-major problems `(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc)`, one per group."""
    lib = ctypes.CDLL("libcublas.so.13")
    count = len(problems)
    ints = lambda i: (ctypes.c_int * count)(*[p[i] for p in problems])
    table = torch.tensor([p[5] for p in problems] + [p[7] for p in problems] + [p[9] for p in problems],
                         dtype=torch.int64, device="cuda")
    alpha = (ctypes.c_float * count)(*([1.0] * count))
    beta = (ctypes.c_float * count)(*([0.0] * count))
    sizes = (ctypes.c_int * count)(*([1] * count))
    args = [ints(0), ints(1), ints(2), ints(3), ints(4)]
    lds = [ints(6), ints(8), ints(10)]
    handle = ctypes.c_void_p(torch.cuda.current_blas_handle())
    base = table.data_ptr()
    f = lib.cublasGemmGroupedBatchedEx

    def run():
        check(f(handle, args[0], args[1], args[2], args[3], args[4], alpha,
                ctypes.c_void_p(base), CUDA_R_16BF, lds[0], ctypes.c_void_p(base + 8 * count), CUDA_R_16BF, lds[1],
                beta, ctypes.c_void_p(base + 16 * count), CUDA_R_16BF, lds[2], count, sizes, COMPUTE_32F),
              "cublasGemmGroupedBatchedEx")
    return run


def timed(torch, fn, iters=20):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def child(path):
    lt = Lt(path)
    import torch
    dev = torch.device("cuda")
    print(f"# {path}: cublasLt {lt.version}, torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    stream = torch.cuda.current_stream().cuda_stream
    workspace = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
    print("| shape | pass | max rel err | cuBLASLt grouped ms | torch._grouped_mm ms | dense GEMM ms | grouped TFLOP/s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, experts, k, n, total in SHAPES:
        lt.keep.clear()
        gen = torch.Generator().manual_seed(7)
        weights = torch.rand(experts, generator=gen) ** 2 + 0.05
        weights[1] = 0.0  # an empty expert
        rows = (weights / weights.sum() * total).floor().long()
        rows[0] += total - rows.sum()
        x = torch.randn(total, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(experts, k, n, device=dev, dtype=torch.bfloat16) / k ** 0.5
        dy = torch.randn(total, n, device=dev, dtype=torch.bfloat16)
        rows_d = rows.to(dev)
        host_rows, offs_host = rows.tolist(), (torch.cumsum(rows, 0) - rows).tolist()
        offsets = torch.cumsum(rows_d, 0) - rows_d
        i32 = lambda t: t.to(torch.int32).contiguous()
        e = torch.arange(experts, device=dev)
        esize = 2
        # forward: per group, column-major D (n × rows_e) = A (n × k, weight as stored) · B (k × rows_e, x as stored)
        a_ptrs = (w.data_ptr() + e * k * n * esize).to(torch.int64)
        b_ptrs = (x.data_ptr() + offsets * k * esize).to(torch.int64)
        out = torch.empty(total, n, device=dev, dtype=torch.bfloat16)
        d_ptrs = (out.data_ptr() + offsets * n * esize).to(torch.int64)
        full = lambda v: torch.full((experts,), v, device=dev, dtype=torch.int32)
        avg_rows = total // experts
        offs = i32(torch.cumsum(rows_d, 0))
        flops_fwd = 2 * total * k * n
        tr = timed(torch, lambda: torch._grouped_mm(x, w, offs=offs))
        td = timed(torch, lambda: x @ w[0])
        print(f"| {name} | forward, torch._grouped_mm and dense | | | {tr:.3f} | {td:.3f} | {flops_fwd / tr / 1e9:.0f} (torch) |", flush=True)
        try:
            a_l = lt.grouped_layout(experts, full(n), full(k), full(n))
            b_l = lt.grouped_layout(experts, full(k), i32(rows_d), full(k))
            d_l = lt.grouped_layout(experts, full(n), i32(rows_d), full(n))
            fwd = lt.matmul(0, 0, a_ptrs, a_l, b_ptrs, b_l, d_ptrs, d_l, (k, n, avg_rows), workspace, stream)
            fwd()
            torch.cuda.synchronize()
            ref = torch._grouped_mm(x, w, offs=offs)
            err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            t = timed(torch, fwd)
            print(f"| {name} | forward, cuBLASLt grouped | {err:.1e} | {t:.3f} | | | {flops_fwd / t / 1e9:.0f} |", flush=True)
        except Exception as exc:  # noqa: BLE001 (the probe reports and goes on)
            print(f"| {name} | forward | {exc} | | | | |", flush=True)
        try:
            legacy = legacy_grouped(torch, [(0, 0, n, r, k, w.data_ptr() + g * k * n * esize, n,
                                             x.data_ptr() + o * k * esize, k, out.data_ptr() + o * n * esize, n)
                                            for g, (r, o) in enumerate(zip(host_rows, offs_host)) if r > 0])
            t = timed(torch, legacy)
            print(f"| {name} | forward, cublasGemmGroupedBatchedEx (today) | | {t:.3f} | | | {flops_fwd / t / 1e9:.0f} |", flush=True)
            # The same product from the weights stored transposed ([E, n, k]): TN, the layout of
            # the weight gradient that ran at CUTLASS's speed.
            wt = w.transpose(1, 2).contiguous()
            tn = legacy_grouped(torch, [(1, 0, n, r, k, wt.data_ptr() + g * k * n * esize, k,
                                         x.data_ptr() + o * k * esize, k, out.data_ptr() + o * n * esize, n)
                                        for g, (r, o) in enumerate(zip(host_rows, offs_host)) if r > 0])
            tn()
            torch.cuda.synchronize()
            err = ((out.float() - torch._grouped_mm(x, w, offs=offs).float()).abs().max()).item()
            t = timed(torch, tn)
            print(f"| {name} | forward, cublasGemmGroupedBatchedEx, weights transposed (TN) | {err:.1e} abs | {t:.3f} | | | {flops_fwd / t / 1e9:.0f} |", flush=True)
            # The input gradient (TN today): dx_g = dy_g · W_gᵀ.
            dx = torch.empty(total, k, device=dev, dtype=torch.bfloat16)
            dyt = torch.randn(total, n, device=dev, dtype=torch.bfloat16)
            dgrad = legacy_grouped(torch, [(1, 0, k, r, n, w.data_ptr() + g * k * n * esize, n,
                                            dyt.data_ptr() + o * n * esize, n, dx.data_ptr() + o * k * esize, k)
                                           for g, (r, o) in enumerate(zip(host_rows, offs_host)) if r > 0])
            t = timed(torch, dgrad)
            tr = timed(torch, lambda: torch._grouped_mm(dyt, w.transpose(1, 2), offs=offs))
            print(f"| {name} | input grad, cublasGemmGroupedBatchedEx (today, TN) | | {t:.3f} | {tr:.3f} | | {flops_fwd / t / 1e9:.0f} |", flush=True)
        except Exception as exc:  # noqa: BLE001 (the probe reports and goes on)
            print(f"| {name} | forward, cublasGemmGroupedBatchedEx | {exc} | | | | |", flush=True)
        # weight gradient: per group, column-major D (n × k) = A (n × rows_e, dy as stored) · Bᵀ (x as stored, k × rows_e)
        dw = torch.empty(experts, k, n, device=dev, dtype=torch.bfloat16)
        a2 = (dy.data_ptr() + offsets * n * esize).to(torch.int64)
        b2 = (x.data_ptr() + offsets * k * esize).to(torch.int64)
        d2 = (dw.data_ptr() + e * k * n * esize).to(torch.int64)
        tr = timed(torch, lambda: torch._grouped_mm(x.t(), dy, offs=offs))
        td = timed(torch, lambda: x.t() @ dy)
        print(f"| {name} | weight grad, torch._grouped_mm and dense | | | {tr:.3f} | {td:.3f} | {flops_fwd / tr / 1e9:.0f} (torch) |", flush=True)
        try:
            a2_l = lt.grouped_layout(experts, full(n), i32(rows_d), full(n))
            b2_l = lt.grouped_layout(experts, full(k), i32(rows_d), full(k))
            d2_l = lt.grouped_layout(experts, full(n), full(k), full(n))
            bwd = lt.matmul(0, 1, a2, a2_l, b2, b2_l, d2, d2_l, (avg_rows, n, k), workspace, stream)
            dw.fill_(float("nan"))
            bwd()
            torch.cuda.synchronize()
            ref = torch._grouped_mm(x.t(), dy, offs=offs)
            empty = dw[1].float().abs().max().item()
            err = ((dw.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            t = timed(torch, bwd)
            print(f"| {name} | weight grad, cuBLASLt grouped (empty expert max {empty}) | {err:.1e} | {t:.3f} | | | {flops_fwd / t / 1e9:.0f} |", flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"| {name} | weight grad | {exc} | | | | |", flush=True)
        try:
            legacy = legacy_grouped(torch, [(0, 1, n, k, r, dy.data_ptr() + o * n * esize, n,
                                             x.data_ptr() + o * k * esize, k, dw.data_ptr() + g * k * n * esize, n)
                                            for g, (r, o) in enumerate(zip(host_rows, offs_host)) if r > 0])
            t = timed(torch, legacy)
            print(f"| {name} | weight grad, cublasGemmGroupedBatchedEx (today) | | {t:.3f} | | | {flops_fwd / t / 1e9:.0f} |", flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"| {name} | weight grad | {exc} | | | | |", flush=True)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--lib":
        child(sys.argv[2])
        return
    libs = candidates()[:1]  # the first: torch's (the same cuBLAS on the machine seen so far)
    print(f"libcublasLt candidates: {libs}")
    for path in libs:
        subprocess.run([sys.executable, __file__, "--lib", path], timeout=240, check=False)


if __name__ == "__main__":
    main()
