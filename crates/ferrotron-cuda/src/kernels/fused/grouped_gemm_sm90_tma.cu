// grouped gemm sm90 tma {{NAME}} {{MODE}}
{{! The device-count grouped GEMM of grouped_gemm_sm90.cu, warp-specialised and persistent, as }}
{{! CUTLASS's Hopper kernels are: one block an SM walks the tiles (blockIdx.x, + gridDim.x, ...); }}
{{! warpgroup 0 is the producer, one thread of it issuing the Tensor Memory Accelerator's bulk }}
{{! copies (cp.async.bulk.tensor) into STAGES stages of 128-byte-swizzled shared memory, each }}
{{! stage's arrival counted by an mbarrier; warpgroups 1 and 2 are the consumers, 64 rows of the }}
{{! 128 × BN tile each, releasing a stage through a second mbarrier once their MMAs on it are }}
{{! done. The producer runs ahead across tiles, so the next tile's loads overlap this tile's }}
{{! last MMAs and its stores (what the cp.async kernel's 8-step reductions of an expert's rows }}
{{! in the weight gradient wait for), and no thread of the consumers issues a copy. }}
{{! The tensor maps (host-encoded, by value in the parameters, __grid_constant__) cut the boxes: }}
{{! the routed rows' map over all rows, one map per group's weight, the weight gradient's two }}
{{! row maps. Each box is 64 elements (128 bytes) wide, so the TMA's 128-byte swizzle lays it }}
{{! out exactly as wgmma's canonical K-major or MN-major layout reads it. }}
{{!   ROWS (forward, input gradient): C[r] = A[r] · B_g for the rows r of group g; rows of the }}
{{!     tile past the group's (the next group's, or past the end: zeros) are computed, not stored. }}
{{!   INNER (weight gradient): C_g = A_gᵀ · B_g, the sum running over group g's rows; the rows of }}
{{!     the last step past the group's are zeroed in shared memory before the MMAs read them. }}
{{!   CLUSTER: blocks run in clusters of two on neighbouring column tiles of one row tile, so }}
{{!     they share A: each loads half of it and the TMA multicasts that half into both blocks' }}
{{!     shared memory (a third less read from L2 a step at 128 × 256), and a stage is refilled }}
{{!     once both blocks' consumers released it (their arrivals counted on both barriers). }}
{{!   FP8: fp8 operands, both stored with the reduction contiguous (Hopper's fp8 wgmma reads no }}
{{!     other layout): ROWS takes A [rows, K] and each group's B as [N, K]; INNER takes Aᵀ [M, }}
{{!     rows] and Bᵀ [N, rows] and reduces over the group's columns of both, the last step's }}
{{!     columns past the group zeroed. A step is 128 elements (128 bytes, the swizzle's span); }}
{{!     the tile is scaled by A's inverse scale and the group's B's before it is stored. }}
{{!   SPLIT (fp8, 128-wide tiles): each step's MMAs into a zeroed partial sum, added to the f32 }}
{{!     total once they completed (the gradients' accumulation; the forward's is fast). }}
{{!   PINGPONG (16-bit, 128 × 128 tiles): CUTLASS's ping-pong schedule. Each consumer warpgroup }}
{{!     takes every other tile of the block's walk whole (all 128 rows, two m64 MMAs a step), so }}
{{!     one warpgroup's stores and next tile's start run while the other's MMAs do; the stages of }}
{{!     the other's tiles pass by, counted. Aimed at the short reductions (an expert's rows in }}
{{!     the weight gradient, Qwen3-30B-A3B's 768-wide input gradient), where a tile's epilogue is }}
{{!     a large part of its time. }}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define BM 128
#define BN {{BN}}
#define STAGES {{STAGES}}
#define BAND 16
#define GROUPS {{GROUPS}}
{{#if FP8}}
// Elements a reduction step (of 1 byte) and a wgmma instruction.
#define BK 128
#define MMA_K 32
#define ELEM_BYTES 1
{{#else}}
#define BK 64
#define MMA_K 16
#define ELEM_BYTES 2
{{/if}}
#define A_BYTES (BM * BK * ELEM_BYTES)
#define STAGE_BYTES (A_BYTES + BK * BN * ELEM_BYTES)
// The two consumer warpgroups' named barrier (0 is __syncthreads').
#define CONSUMERS_BARRIER 1
{{#if PINGPONG}}
// Ping-pong: each warpgroup's own barrier for its zeroing (2, 3), and the signals that its
// mainloop is done, one per warpgroup (4, 5).
#define ORDER_BARRIER 4
{{/if}}
{{#if CLUSTER}}
#define CLUSTER 2
{{#else}}
#define CLUSTER 1
{{/if}}
// Arrivals that release a stage: every consumer warp of every block the stage's loads reach.
{{#if PINGPONG}}
// Arrivals that release a stage: the consumer warps of the one warpgroup whose tile it holds.
#define RELEASES 4
{{#else}}
#define RELEASES (8 * CLUSTER)
{{/if}}
typedef {{ELEM}} elem;

struct __align__(128) TensorMap {
  unsigned long long opaque[16];
};

// 16 scalar words (128 bytes, so the maps after them are aligned), then the maps.
struct __align__(128) Params {
  unsigned long long c, counts;
  long long n_tiles, k_tiles, k, ldc;
  // FP8: A's [1] and B's [groups] (or [1], `b_scale_step` 0) f32 inverse scales
  unsigned long long a_scale, b_scale;
  long long b_scale_step;
  long long reserved[7];
  TensorMap a;
{{#if ROWS}}
  TensorMap w[GROUPS];
{{#else}}
  TensorMap b;
{{/if}}
};

{{TILES}}

{{WGMMA_HELPERS}}
__device__ __forceinline__ void bar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Cycles a wait may take (2^34: about 9 s at Hopper's clocks) before the launch fails. A
// stage whose loads or release never come is a protocol bug; a trap makes it a launch error the
// caller reports, where a spin would hang the process (one GPU has no collective timeout).
#define WAIT_LIMIT (1ll << 34)

__device__ __forceinline__ void bar_wait(unsigned bar, unsigned parity) {
  long long start = -1;
  for (;;) {
    unsigned done;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    if (done) return;
    const long long now = clock64();
    if (start < 0) {
      start = now;
    } else if (now - start > WAIT_LIMIT) {
      asm volatile("trap;");
    }
  }
}

__device__ __forceinline__ void bar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void bar_expect(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// One box of `map` at (column `x`, row `y`) into shared `dst`, counted on `bar`.
__device__ __forceinline__ void tma_load(unsigned dst, const TensorMap* map, int x, int y, unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"((unsigned long long)map), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

// A release of this block's stage: one arrival on its barrier in every block of the cluster.
__device__ __forceinline__ void release(unsigned bar) {
{{#if CLUSTER}}
#pragma unroll
  for (unsigned rank = 0; rank < CLUSTER; ++rank) {
    asm volatile(
        "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
        "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}\n"
        ::"r"(bar), "r"(rank)
        : "memory");
  }
{{#else}}
  bar_arrive(bar);
{{/if}}
}
{{#if CLUSTER}}

// One box into the same place of every block of the cluster, counted on each one's `bar`.
__device__ __forceinline__ void tma_multicast(unsigned dst, const TensorMap* map, int x, int y, unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n"
      ::"r"(dst), "l"((unsigned long long)map), "r"(x), "r"(y), "r"(bar), "h"((unsigned short)((1 << CLUSTER) - 1))
      : "memory");
}

__device__ __forceinline__ unsigned cluster_rank() {
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// Every thread of both blocks: what one did before is seen by the other after.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
{{/if}}

// The groups' scans, in shared memory for every warpgroup's tile lookups.
struct Groups {
  long long rows[GROUPS + 1];   // first row of each group; rows[GROUPS] = all rows
  long long tiles[GROUPS + 1];  // first row tile of each group (ROWS)
};

// Tile `i` of the walk: its group, first row `r0` of that group's rows, output rows `m0` (ROWS:
// a routed row; INNER: a row of the group's [k, n] gradient), first column `n0`, and how many
// of its rows may be written (ROWS) or how many rows the reduction runs over (INNER).
struct Work {
  int group;
  long long r0, m0, n0, valid;
};

// With clusters, `i` walks pairs of column tiles and block `rank` of the pair takes one of them.
__device__ __forceinline__ Work tile_work(const Params& p, const Groups& g, long long i, unsigned rank) {
  Work w;
  const long long n_steps = p.n_tiles / CLUSTER;
{{#if ROWS}}
  long long m_tile;
  band_tile(i, g.tiles[GROUPS], n_steps, &m_tile, &w.n0);
  int lo = 0, hi = GROUPS - 1;  // the last group whose first tile is <= m_tile
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (g.tiles[mid] <= m_tile) lo = mid; else hi = mid - 1;
  }
  w.group = lo;
  const long long local = (m_tile - g.tiles[lo]) * BM;
  w.r0 = g.rows[lo];
  w.m0 = g.rows[lo] + local;
  w.valid = min((long long)BM, g.rows[lo + 1] - g.rows[lo] - local);
{{#else}}
  const long long m_tiles = p.k / BM;
  const long long per_group = m_tiles * n_steps;
  w.group = (int)(i / per_group);
  long long m_tile;
  band_tile(i % per_group, m_tiles, n_steps, &m_tile, &w.n0);
  w.r0 = g.rows[w.group];
  w.m0 = m_tile * BM;
  w.valid = g.rows[w.group + 1] - g.rows[w.group];
{{/if}}
  w.n0 = w.n0 * CLUSTER + rank * BN;
  return w;
}

// Reduction steps of a tile.
__device__ __forceinline__ int steps(const Params& p, const Work& w) {
{{#if ROWS}}
  return (int)p.k_tiles;
{{#else}}
  return (int)((w.valid + BK - 1) / BK);
{{/if}}
}

// The producer's one thread: every stage's copies, tile after tile, as the stages come free.
__device__ __forceinline__ void produce(const Params& p, const Groups& groups, unsigned smem,
                                        unsigned long long* full_bar, unsigned long long* empty_bar,
                                        long long first, long long stride, long long total, unsigned rank) {
  int stage = 0;
  unsigned phase = 0;
  for (long long i = first; i < total; i += stride) {
    const Work w = tile_work(p, groups, i, rank);
    const int k_steps = steps(p, w);
    for (int kt = 0; kt < k_steps; ++kt) {
      // A fresh barrier is in phase 0, so waiting on parity 1 passes at once: the first
      // STAGES loads need no release.
      bar_wait(smem_addr(&empty_bar[stage]), phase ^ 1);
      const unsigned full = smem_addr(&full_bar[stage]);
      bar_expect(full, STAGE_BYTES);
      const unsigned a_s = smem + stage * STAGE_BYTES, b_s = a_s + A_BYTES;
      const int k0 = kt * BK;
{{#if FP8}}
{{#if ROWS}}
      const int x = k0;
      const TensorMap* b_map = &p.w[w.group];
{{#else}}
      // the group's columns of Aᵀ and Bᵀ
      const int x = (int)(w.r0 + k0);
      const TensorMap* b_map = &p.b;
{{/if}}
{{#if CLUSTER}}
      tma_multicast(a_s + rank * (A_BYTES / 2), &p.a, x, (int)w.m0 + rank * (BM / 2), full);
{{#else}}
      tma_load(a_s, &p.a, x, (int)w.m0, full);
{{/if}}
      // B: BN rows of the reduction's 128 bytes (K-major)
      tma_load(b_s, b_map, x, (int)w.n0, full);
{{#else}}
{{#if ROWS}}
{{#if CLUSTER}}
      // A: this block's half of the BM routed rows of 64 (K-major), into both blocks
      tma_multicast(a_s + rank * (A_BYTES / 2), &p.a, k0, (int)w.m0 + rank * (BM / 2), full);
{{#else}}
      // A: BM routed rows of 64 (K-major)
      tma_load(a_s, &p.a, k0, (int)w.m0, full);
{{/if}}
{{#if B_MN}}
      // B (forward): the weight's [k, n], 64 reduction rows of BN columns (MN-major blocks)
#pragma unroll
      for (int j = 0; j < BN / 64; ++j) tma_load(b_s + j * 8192, &p.w[w.group], (int)w.n0 + j * 64, k0, full);
{{#else}}
      // B (input gradient): the weight's [k, n] as BN rows of 64 of the reduction (K-major)
      tma_load(b_s, &p.w[w.group], k0, (int)w.n0, full);
{{/if}}
{{#else}}
      // A: x's rows (the reduction) × BM columns; B: the output gradient's rows × BN columns
      const int row = (int)(w.r0 + k0);
{{#if CLUSTER}}
      // (this block's 64 of A's columns, into both blocks)
      tma_multicast(a_s + rank * 8192, &p.a, (int)w.m0 + rank * 64, row, full);
{{#else}}
#pragma unroll
      for (int j = 0; j < BM / 64; ++j) tma_load(a_s + j * 8192, &p.a, (int)w.m0 + j * 64, row, full);
{{/if}}
#pragma unroll
      for (int j = 0; j < BN / 64; ++j) tma_load(b_s + j * 8192, &p.b, (int)w.n0 + j * 64, row, full);
{{/if}}
{{/if}}
      if (++stage == STAGES) {
        stage = 0;
        phase ^= 1;
      }
    }
  }
}

{{#if !FP8}}
{{#if !ROWS}}
// The weight gradient's last step: its reduction rows `live..BK - 1`, past the group's, zeroed
// in A and B (128-byte lines; the swizzle permutes chunks within a line only) by `threads`
// threads, this one `t` of them, then made visible to the async proxy. The caller's barrier
// makes every thread's part done before the MMAs read the stage.
__device__ __forceinline__ void zero_rows_past(unsigned a_s, unsigned b_s, int live, int t, int threads) {
  const int lines = (BK - live) * (BM / 64 + BN / 64);
  for (int l = t; l < lines * 8; l += threads) {
    const int line = l >> 3, chunk = l & 7;
    const int block = line / (BK - live), krow = live + line % (BK - live);
    const unsigned base = block < BM / 64 ? a_s + block * 8192 : b_s + (block - BM / 64) * 8192;
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(base + krow * 128 + chunk * 16), "r"(0)
                 : "memory");
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

{{/if}}
{{/if}}
// The tile's output from its first row, and how many of its rows may be written.
__device__ __forceinline__ elem* tile_output(const Params& p, const Work& w, long long* writable) {
{{#if ROWS}}
  *writable = w.valid;
  return (elem*)p.c + w.m0 * p.ldc;
{{#else}}
  *writable = BM;
  return (elem*)p.c + ((long long)w.group * p.k + w.m0) * p.ldc;
{{/if}}
}

// Rows `first..first + 63` of a tile from a warpgroup's m64nBN accumulator: warp w of the
// warpgroup holds rows 16w..16w+15; register 4j + {0,1} is row lane / 4, columns 8j + 2 (lane %
// 4) + {0,1}; 4j + {2,3} the row 8 below. Rows from `writable` on are not stored.
__device__ __forceinline__ void store_m64(elem* C, long long writable, long long ldc, long long n0, int first,
                                          const float* acc) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wrow = first + (warp & 3) * 16 + (lane >> 2);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = wrow + half * 8;
    if (row >= writable) continue;
    elem* out = C + (long long)row * ldc + n0 + (lane & 3) * 2;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      *reinterpret_cast<unsigned*>(out + j * 8) = pack(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
    }
  }
}

// A consumer warpgroup (`cw` 0 takes the tile's rows 0..63, 1 rows 64..127): the MMAs of every
// stage, tile after tile, then the tile's stores.
__device__ __forceinline__ void consume(const Params& p, const Groups& groups, unsigned smem,
                                        unsigned long long* full_bar, unsigned long long* empty_bar,
                                        long long first, long long stride, long long total, unsigned rank) {
  const int tid = threadIdx.x, lane = tid & 31;
  const int cw = (tid >> 7) - 1;
  int stage = 0;
  unsigned phase = 0;
  float acc[BN / 2];
{{#if SPLIT}}
  float part[BN / 2];
{{/if}}
  for (long long i = first; i < total; i += stride) {
    const Work w = tile_work(p, groups, i, rank);
    const int k_steps = steps(p, w);
#pragma unroll
    for (int r = 0; r < BN / 2; ++r) acc[r] = 0.f;
    int held = -1;  // the stage whose MMAs may still be reading it
    for (int kt = 0; kt < k_steps; ++kt) {
      bar_wait(smem_addr(&full_bar[stage]), phase);
      const unsigned a_s = smem + stage * STAGE_BYTES, b_s = a_s + A_BYTES;
{{#if !ROWS}}
      const int live = (int)min((long long)BK, w.valid - (long long)kt * BK);
{{#if FP8}}
      if (live < BK) {
        // The last step's columns past the group's: zero bytes live..127 of every 128-byte row
        // of A and B, whose 16-byte chunks the swizzle permutes by the row (chunk ^ row % 8).
        const int first_chunk = live >> 4, chunks = 8 - first_chunk;
        for (int l = tid - 128; l < (BM + BN) * chunks; l += 256) {
          const int row = l / chunks, chunk = first_chunk + l % chunks;
          const unsigned line = row < BM ? a_s + row * 128 : b_s + (row - BM) * 128;
          const unsigned at = line + ((chunk ^ (row & 7)) << 4);
          // the first chunk keeps its bytes below live % 16
          const int keep = chunk == first_chunk ? (live & 15) : 0;
          unsigned v[4] = {0u, 0u, 0u, 0u};
          if (keep > 0) {
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                         : "r"(at)
                         : "memory");
#pragma unroll
            for (int word = 0; word < 4; ++word) {
              const int kept = min(max(keep - word * 4, 0), 4);
              v[word] &= kept == 4 ? 0xffffffffu : (1u << (8 * kept)) - 1u;
            }
          }
          asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(at), "r"(v[0]), "r"(v[1]), "r"(v[2]),
                       "r"(v[3])
                       : "memory");
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        asm volatile("bar.sync %0, 256;\n" ::"n"(CONSUMERS_BARRIER) : "memory");
      }
{{#else}}
      if (live < BK) {
        zero_rows_past(a_s, b_s, live, tid - 128, 256);
        asm volatile("bar.sync %0, 256;\n" ::"n"(CONSUMERS_BARRIER) : "memory");
      }
{{/if}}
{{/if}}
{{#if SPLIT}}
      // This step's products alone, added to the f32 total below.
#pragma unroll
      for (int r = 0; r < BN / 2; ++r) part[r] = 0.f;
      fence_acc(part);
{{#else}}
      fence_acc(acc);
{{/if}}
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int kk = 0; kk < BK / MMA_K; ++kk) {
{{#if A_MN}}
        const unsigned long long da = descriptor(a_s + cw * 8192 + kk * 2048, 8192, 1024);
{{#else}}
        const unsigned long long da = descriptor(a_s + cw * 64 * 128 + kk * 32, 16, 1024);
{{/if}}
{{#if B_MN}}
        const unsigned long long db = descriptor(b_s + kk * 2048, 8192, 1024);
{{#else}}
        const unsigned long long db = descriptor(b_s + kk * 32, 16, 1024);
{{/if}}
{{#if SPLIT}}
        wgmma(part, da, db);
{{#else}}
        wgmma(acc, da, db);
{{/if}}
      }
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
{{#if SPLIT}}
      // Promoted every step (128 products), as cuBLASLt's split accumulation and DeepSeek-V3's
      // recipe do: fp8 MMAs keep about 14 bits of their running sum. This step is done, so its
      // stage goes back at once.
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
      fence_acc(part);
#pragma unroll
      for (int r = 0; r < BN / 2; ++r) acc[r] += part[r];
      if (lane == 0) release(smem_addr(&empty_bar[stage]));
{{#else}}
      // The step before this one is done: its stage goes back to the producer.
      asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
      fence_acc(acc);
      if (held >= 0 && lane == 0) release(smem_addr(&empty_bar[held]));
      held = stage;
{{/if}}
      if (++stage == STAGES) {
        stage = 0;
        phase ^= 1;
      }
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    fence_acc(acc);
    if (held >= 0 && lane == 0) release(smem_addr(&empty_bar[held]));

    long long writable;
    elem* __restrict__ C = tile_output(p, w, &writable);
{{#if FP8}}
    const float scale = ((const float*)p.a_scale)[0] * ((const float*)p.b_scale)[w.group * p.b_scale_step];
#pragma unroll
    for (int r = 0; r < BN / 2; ++r) acc[r] *= scale;
{{/if}}
    store_m64(C, writable, p.ldc, w.n0, cw * 64, acc);
  }
}

{{#if PINGPONG}}
// A ping-pong consumer warpgroup (`cw` 0 takes the block's even tiles, 1 its odd ones): the
// MMAs of every stage of its tiles, two m64 halves of the 128 rows a step, then its stores.
__device__ __forceinline__ void consume_pingpong(const Params& p, const Groups& groups, unsigned smem,
                                                 unsigned long long* full_bar, unsigned long long* empty_bar,
                                                 long long first, long long stride, long long total) {
  const int tid = threadIdx.x, lane = tid & 31;
  const int cw = (tid >> 7) - 1, wtid = tid & 127;
  int stage = 0;
  unsigned phase = 0;
  float acc0[BN / 2], acc1[BN / 2];
  long long turn = 0;
  for (long long i = first; i < total; i += stride, ++turn) {
    const Work w = tile_work(p, groups, i, 0);
    const int k_steps = steps(p, w);
    if ((int)(turn & 1) != cw) {
      // The other warpgroup's tile: its stages pass by, each wrap of the ring a new phase.
      const int next = stage + k_steps;
      phase ^= (unsigned)((next / STAGES) & 1);
      stage = next % STAGES;
      continue;
    }
    // The mainloops take turns in the walk's order: this one starts once the other warpgroup
    // has waited for every stage of the tile before. A parity wait tells phases apart only one
    // apart, so a warpgroup that ran ahead over the other's stages could take a stage two fills
    // early for its own.
    if (turn > 0) asm volatile("bar.sync %0, 256;\n" ::"r"(ORDER_BARRIER + (1 - cw)) : "memory");
#pragma unroll
    for (int r = 0; r < BN / 2; ++r) acc0[r] = acc1[r] = 0.f;
    int held = -1;  // the stage whose MMAs may still be reading it
    for (int kt = 0; kt < k_steps; ++kt) {
      bar_wait(smem_addr(&full_bar[stage]), phase);
      const unsigned a_s = smem + stage * STAGE_BYTES, b_s = a_s + A_BYTES;
{{#if !ROWS}}
      const int live = (int)min((long long)BK, w.valid - (long long)kt * BK);
      if (live < BK) {
        // by this warpgroup alone, behind its own named barrier
        zero_rows_past(a_s, b_s, live, wtid, 128);
        asm volatile("bar.sync %0, 128;\n" ::"r"(CONSUMERS_BARRIER + 1 + cw) : "memory");
      }
{{/if}}
      fence_acc(acc0);
      fence_acc(acc1);
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int kk = 0; kk < BK / MMA_K; ++kk) {
{{#if A_MN}}
        const unsigned long long da0 = descriptor(a_s + kk * 2048, 8192, 1024);
        const unsigned long long da1 = descriptor(a_s + 8192 + kk * 2048, 8192, 1024);
{{#else}}
        const unsigned long long da0 = descriptor(a_s + kk * 32, 16, 1024);
        const unsigned long long da1 = descriptor(a_s + 64 * 128 + kk * 32, 16, 1024);
{{/if}}
{{#if B_MN}}
        const unsigned long long db = descriptor(b_s + kk * 2048, 8192, 1024);
{{#else}}
        const unsigned long long db = descriptor(b_s + kk * 32, 16, 1024);
{{/if}}
        wgmma(acc0, da0, db);
        wgmma(acc1, da1, db);
      }
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      // The step before this one is done: its stage goes back to the producer.
      asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
      fence_acc(acc0);
      fence_acc(acc1);
      if (held >= 0 && lane == 0) release(smem_addr(&empty_bar[held]));
      held = stage;
      if (++stage == STAGES) {
        stage = 0;
        phase ^= 1;
      }
    }
    // Every stage of this tile waited for: the other warpgroup's next tile may start.
    if (i + stride < total) asm volatile("bar.arrive %0, 256;\n" ::"r"(ORDER_BARRIER + cw) : "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    fence_acc(acc0);
    fence_acc(acc1);
    if (held >= 0 && lane == 0) release(smem_addr(&empty_bar[held]));

    long long writable;
    elem* __restrict__ C = tile_output(p, w, &writable);
    store_m64(C, writable, p.ldc, w.n0, 0, acc0);
    store_m64(C, writable, p.ldc, w.n0, 64, acc1);
  }
}

{{/if}}
{{#if CLUSTER}}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(384, 1) ferrotron_kernel(const __grid_constant__ Params p) {
{{#else}}
extern "C" __global__ void __launch_bounds__(384, 1) ferrotron_kernel(const __grid_constant__ Params p) {
{{/if}}
  extern __shared__ unsigned char dynamic_smem[];
  __shared__ __align__(8) unsigned long long full_bar[STAGES], empty_bar[STAGES];
  __shared__ Groups groups;
  __shared__ long long scratch[16];
  // The swizzle is a function of the address: the stages start on a 1024-byte boundary.
  const unsigned smem = (smem_addr(dynamic_smem) + 1023u) & ~1023u;
  const int tid = threadIdx.x, wg = tid >> 7;

  // Every thread: the groups' scans (threads 0..GROUPS-1 hold a group's count each).
  const long long* __restrict__ counts = (const long long*)p.counts;
  const long long count = tid < GROUPS ? counts[tid] : 0;
  const long long rows_end = block_scan(count, scratch);
  const long long tiles_end = block_scan((count + BM - 1) / BM, scratch);
  if (tid < GROUPS) {
    groups.rows[tid + 1] = rows_end;
    groups.tiles[tid + 1] = tiles_end;
  }
  if (tid == 0) {
    groups.rows[0] = 0;
    groups.tiles[0] = 0;
    for (int s = 0; s < STAGES; ++s) {
      bar_init(smem_addr(&full_bar[s]), 1);
      bar_init(smem_addr(&empty_bar[s]), RELEASES);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
{{#if CLUSTER}}
  // The peer's barriers exist before this block's copies or releases reach them.
  cluster_sync();
  const unsigned rank = cluster_rank();
  const long long first = blockIdx.x / CLUSTER, stride = gridDim.x / CLUSTER;
{{#else}}
  const unsigned rank = 0;
  const long long first = blockIdx.x, stride = gridDim.x;
{{/if}}
{{#if ROWS}}
  const long long total = groups.tiles[GROUPS] * (p.n_tiles / CLUSTER);
{{#else}}
  const long long total = (long long)GROUPS * (p.k / BM) * (p.n_tiles / CLUSTER);
{{/if}}

  if (wg == 0) {
    // The producer: one thread issues every copy; the rest of the warpgroup has nothing to do.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (tid == 0) produce(p, groups, smem, full_bar, empty_bar, first, stride, total, rank);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
{{#if PINGPONG}}
    consume_pingpong(p, groups, smem, full_bar, empty_bar, first, stride, total);
{{#else}}
    consume(p, groups, smem, full_bar, empty_bar, first, stride, total, rank);
{{/if}}
  }
{{#if CLUSTER}}
  // Neither block leaves while the other may still copy into it or release its stages.
  cluster_sync();
{{/if}}
}
