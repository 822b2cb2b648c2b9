// grouped gemm sm90 {{NAME}} {{MODE}}
{{! The device-count grouped GEMM of grouped_gemm.cu on Hopper's warpgroup MMA (wgmma): the }}
{{! same grid, group lookup and products, with each warpgroup's 64 × BN accumulator fed from }}
{{! shared memory by descriptors instead of ldmatrix + mma.sync (which Hopper runs at about }}
{{! half its tensor-core rate). Tiles of 128 × BN × 64, two warpgroups of 64 rows each; }}
{{! STAGES cp.async stages of 128-byte-swizzled shared memory in the canonical layouts wgmma }}
{{! reads (an operand stored with its reduction dimension contiguous is K-major, the other }}
{{! MN-major: wgmma's transpose bit); tile k + STAGES - 2 loads while tile k's MMAs run and }}
{{! tile k - 1's drain. }}
{{!   ROWS (forward, input gradient): C[r] = A[r] · B_g for the rows r of group g. }}
{{!   INNER (weight gradient): C_g = A_gᵀ · B_g, the sum running over group g's rows. }}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define BM 128
#define BN {{BN}}
#define BK 64
#define STAGES {{STAGES}}
#define BAND 16
#define GROUPS {{GROUPS}}
#define A_BYTES (BM * BK * 2)
#define STAGE_BYTES (A_BYTES + BK * BN * 2)
typedef {{ELEM}} elem;

{{TILES}}

// Byte offset of 16-byte chunk `chunk` of row `row` in a K-major tile: rows of 64 elements
// (128 bytes), the 128-byte swizzle (chunk ^ row % 8) on 1024-byte-aligned groups of 8 rows.
__device__ __forceinline__ unsigned k_major(int row, int chunk) {
  return row * 128 + ((chunk ^ (row & 7)) << 4);
}
// Byte offset of column chunk `chunk` (8 elements) of reduction row `krow` in an MN-major tile:
// 64-column blocks of 64 rows × 128 bytes (8 KiB each), swizzled the same way.
__device__ __forceinline__ unsigned mn_major(int krow, int chunk) {
  return (chunk >> 3) * 8192 + krow * 128 + (((chunk & 7) ^ (krow & 7)) << 4);
}

{{WGMMA_HELPERS}}
extern "C" __global__ void __launch_bounds__(256, {{BLOCKS_PER_SM}}) ferrotron_kernel(const Params p) {
  extern __shared__ unsigned char dynamic_smem[];
  __shared__ long long scratch[16];
  // The swizzle is a function of the address: the stages start on a 1024-byte boundary.
  const unsigned smem = (smem_addr(dynamic_smem) + 1023u) & ~1023u;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = tid >> 7;
  Tile t;
  if (!find_tile(p, scratch, &t)) return;
  const elem* __restrict__ A = t.a;
  const elem* __restrict__ B = t.b;
  elem* __restrict__ C = t.c;
  const long long m0 = t.m0, n0 = t.n0, k_valid = t.k_valid;
  const int m_valid = t.m_valid;
  const int k_tiles = (int)((k_valid + BK - 1) / BK);

  // Stage `s` ← the kt-th reduction tile of A and B, 16 bytes per copy.
  auto load = [&](int s, int kt) {
    const long long k0 = (long long)kt * BK;
    const unsigned a_s = smem + s * STAGE_BYTES, b_s = a_s + A_BYTES;
#pragma unroll
    for (int i = 0; i < BM * BK / 8 / 256; ++i) {
      const int c = tid + i * 256;
{{#if A_MN}}
      // A stored with its rows (the reduction) outermost: 64 rows of BM columns
      const int krow = c / (BM / 8), chunk = c % (BM / 8);
      const bool ok = k0 + krow < k_valid;
      const elem* src = ok ? A + (k0 + krow) * p.lda + m0 + chunk * 8 : A;
      copy16(a_s + mn_major(krow, chunk), src, ok);
{{#else}}
      // A stored with the reduction contiguous: BM rows of 64
      const int row = c >> 3, chunk = c & 7;
      const bool ok = row < m_valid;
      const elem* src = ok ? A + (m0 + row) * p.lda + k0 + chunk * 8 : A;
      copy16(a_s + k_major(row, chunk), src, ok);
{{/if}}
    }
#pragma unroll
    for (int i = 0; i < BK * BN / 8 / 256; ++i) {
      const int c = tid + i * 256;
{{#if B_MN}}
      // B stored with the reduction outermost: 64 rows of BN columns
      const int krow = c / (BN / 8), chunk = c % (BN / 8);
      const bool ok = k0 + krow < k_valid;
      const elem* src = ok ? B + (k0 + krow) * p.ldb + n0 + chunk * 8 : B;
      copy16(b_s + mn_major(krow, chunk), src, ok);
{{#else}}
      // B stored with the reduction contiguous: BN rows of 64
      const int row = c >> 3, chunk = c & 7;
      copy16(b_s + k_major(row, chunk), B + (n0 + row) * p.ldb + k0 + chunk * 8, true);
{{/if}}
    }
  };

  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 2; ++s) {
    if (s < k_tiles) load(s, s);
    asm volatile("cp.async.commit_group;\n" ::);
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    // Tile kt has landed (this thread's copies), is visible to the async proxy wgmma reads
    // through, and every warpgroup has finished tile kt - 2, whose stage is refilled next.
    asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 3));
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if (kt + STAGES - 2 < k_tiles) load((kt + STAGES - 2) % STAGES, kt + STAGES - 2);
    asm volatile("cp.async.commit_group;\n" ::);
    const unsigned a_s = smem + (kt % STAGES) * STAGE_BYTES, b_s = a_s + A_BYTES;
    fence_acc(acc);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
{{#if A_MN}}
      const unsigned long long da = descriptor(a_s + wg * 8192 + kk * 2048, 8192, 1024);
{{#else}}
      const unsigned long long da = descriptor(a_s + wg * 64 * 128 + kk * 32, 16, 1024);
{{/if}}
{{#if B_MN}}
      const unsigned long long db = descriptor(b_s + kk * 2048, 8192, 1024);
{{#else}}
      const unsigned long long db = descriptor(b_s + kk * 32, 16, 1024);
{{/if}}
      wgmma(acc, da, db);
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    fence_acc(acc);
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  fence_acc(acc);
  asm volatile("cp.async.wait_group 0;\n" ::);

  // The accumulator of m64nBN: warp w of the warpgroup holds rows 16w..16w+15; register
  // 4j + {0,1} is row lane / 4, columns 8j + 2 (lane % 4) + {0,1}; 4j + {2,3} the row 8 below.
  const int wrow = wg * 64 + (warp & 3) * 16 + (lane >> 2);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = wrow + half * 8;
    if (row >= m_valid) continue;
    elem* out = C + (m0 + row) * p.ldc + n0 + (lane & 3) * 2;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      *reinterpret_cast<unsigned*>(out + j * 8) = pack(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
    }
  }
}
