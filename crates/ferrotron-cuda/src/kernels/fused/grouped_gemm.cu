// grouped gemm {{NAME}} {{MODE}}
{{! One GEMM per group with the groups' row counts read on the device (MoE experts after a }}
{{! dropless routing): no host read of the counts, so no wait for the host in a MoE layer. }}
{{! Tiles of 128 × 128 × 32, 8 warps of 64 × 32, tensor-core mma.sync m16n8k16 with fp32 }}
{{! accumulation, three cp.async stages in 48 KiB of static shared memory, XOR-swizzled rows }}
{{! read by ldmatrix without bank conflicts. }}
{{!   ROWS (forward, input gradient): C[r] = A[r] · B_g for the rows r of group g; the grid is }}
{{!     the host's upper bound on row tiles (rows / 128 + groups) × column tiles, and blocks past }}
{{!     the groups' tiles return at once. }}
{{!   Blocks run in bands of BAND row tiles, the rows fastest, so the blocks resident at once }}
{{!   share their A rows and B columns through L2 (row-major order would stream an expert's }}
{{!   weights from memory once per row tile). }}
{{!   INNER (weight gradient): C_g = A_gᵀ · B_g, the sum running over group g's rows; one block }}
{{!     per (group, row tile, column tile), an empty group writes zeros. }}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define BM 128
#define BN 128
#define BK 32
#define STAGES 3
#define BAND 16
#define GROUPS {{GROUPS}}
typedef {{ELEM}} elem;

{{TILES}}

// Offsets (in elements) of 16-byte chunk `chunk` of row `row`: rows of 32 elements (4 chunks)
// and rows of 128 (16 chunks), each swizzled so that the 8 rows one ldmatrix reads fall in
// different banks.
__device__ __forceinline__ int narrow(int row, int chunk) {
  return row * 32 + ((chunk ^ ((row >> 1) & 3)) << 3);
}
__device__ __forceinline__ int wide(int row, int chunk) {
  return row * 128 + ((chunk ^ (row & 7)) << 3);
}

__device__ __forceinline__ void ldsm(unsigned addr, unsigned* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_t(unsigned addr, unsigned* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void mma(float* d, const unsigned* a, const unsigned* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.{{MMA}}.{{MMA}}.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

extern "C" __global__ void __launch_bounds__(256) ferrotron_kernel(const Params p) {
  __shared__ __align__(128) elem As[STAGES][BM * BK];
  __shared__ __align__(128) elem Bs[STAGES][BK * BN];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // The stage buffers hold the scan's scratch before any tile is loaded there.
  long long* scratch = (long long*)&As[0][0];
  Tile t;
  if (!find_tile(p, scratch, &t)) return;
  const elem* __restrict__ A = t.a;
  const elem* __restrict__ B = t.b;
  elem* __restrict__ C = t.c;
  const long long m0 = t.m0, n0 = t.n0, k_valid = t.k_valid;
  const int m_valid = t.m_valid;
  const int k_tiles = (int)((k_valid + BK - 1) / BK);

  // Stage `s` ← the k-th tile of A and B: 512 chunks of 16 bytes each, two per thread.
  auto load = [&](int s, int kt) {
    const long long k0 = (long long)kt * BK;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int c = tid + i * 256;
{{#if A_T}}
      // A stored k-major: shared rows are k (32 of 128 elements)
      const int row = c >> 4, chunk = c & 15;
      const bool ok = k0 + row < k_valid;
      const elem* src = ok ? A + (k0 + row) * p.lda + m0 + chunk * 8 : A;
      copy16(smem_addr(&As[s][wide(row, chunk)]), src, ok);
{{#else}}
      // A stored m-major: shared rows are m (128 of 32 elements)
      const int row = c >> 2, chunk = c & 3;
      const bool ok = row < m_valid;
      const elem* src = ok ? A + (m0 + row) * p.lda + k0 + chunk * 8 : A;
      copy16(smem_addr(&As[s][narrow(row, chunk)]), src, ok);
{{/if}}
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int c = tid + i * 256;
{{#if B_T}}
      // B stored n-major: shared rows are n (128 of 32 elements)
      const int row = c >> 2, chunk = c & 3;
      copy16(smem_addr(&Bs[s][narrow(row, chunk)]), B + (n0 + row) * p.ldb + k0 + chunk * 8, true);
{{#else}}
      // B stored k-major: shared rows are k (32 of 128 elements)
      const int row = c >> 4, chunk = c & 15;
      const bool ok = k0 + row < k_valid;
      const elem* src = ok ? B + (k0 + row) * p.ldb + n0 + chunk * 8 : B;
      copy16(smem_addr(&Bs[s][wide(row, chunk)]), src, ok);
{{/if}}
    }
  };

  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.f;

  const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;
  const int q = lane >> 3, r = lane & 7;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) load(s, s);
    asm volatile("cp.async.commit_group;\n" ::);
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
    __syncthreads();
    if (kt + STAGES - 1 < k_tiles) load((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
    asm volatile("cp.async.commit_group;\n" ::);
    const elem* as = As[kt % STAGES];
    const elem* bs = Bs[kt % STAGES];
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      unsigned a[4][4], b[4][2];
#pragma unroll
      for (int mi = 0; mi < 4; ++mi) {
        const int m = wm + mi * 16;
{{#if A_T}}
        const int k = kk + (q >> 1) * 8 + r, col = m + (q & 1) * 8;
        ldsm_t(smem_addr(&as[wide(k, col >> 3)]), a[mi]);
{{#else}}
        const int row = m + (lane & 15), k = kk + (lane >> 4) * 8;
        ldsm(smem_addr(&as[narrow(row, k >> 3)]), a[mi]);
{{/if}}
      }
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        const int n = wn + pair * 16;
        unsigned t[4];
{{#if B_T}}
        const int row = n + (q >> 1) * 8 + r, k = kk + (q & 1) * 8;
        ldsm(smem_addr(&bs[narrow(row, k >> 3)]), t);
{{#else}}
        const int k = kk + (q & 1) * 8 + r, col = n + (q >> 1) * 8;
        ldsm_t(smem_addr(&bs[wide(k, col >> 3)]), t);
{{/if}}
        b[2 * pair][0] = t[0];
        b[2 * pair][1] = t[1];
        b[2 * pair + 1][0] = t[2];
        b[2 * pair + 1][1] = t[3];
      }
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) mma(acc[mi][ni], a[mi], b[ni]);
    }
  }
  asm volatile("cp.async.wait_group 0;\n" ::);

#pragma unroll
  for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = wm + mi * 16 + (lane >> 2) + half * 8;
      if (row >= m_valid) continue;
      elem* out = C + (m0 + row) * p.ldc + n0 + wn + (lane & 3) * 2;
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        *reinterpret_cast<unsigned*>(out + ni * 8) =
            pack(acc[mi][ni][2 * half], acc[mi][ni][2 * half + 1]);
      }
    }
  }
}
