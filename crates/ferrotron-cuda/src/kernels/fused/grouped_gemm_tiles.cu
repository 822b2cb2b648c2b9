{{! The part of the grouped GEMMs (grouped_gemm.cu, grouped_gemm_sm90.cu) that does not }}
{{! depend on the tensor-core instructions: the parameters, the 16-byte copies, the output's }}
{{! packing, and which tile of which group a block computes. Needs BM, BN, BAND, GROUPS and }}
{{! `elem` defined first. The TMA kernel (CP_ASYNC false) takes the packing, the band order }}
{{! and the scan only. }}
{{#if CP_ASYNC}}
struct Params {
  unsigned long long a, b, c, counts;
  long long n_tiles, m_tiles, k;
  long long lda, ldb, ldc;
  unsigned long long group[GROUPS];
};
{{/if}}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}

{{#if CP_ASYNC}}
// 16 bytes global → shared; zeros where `valid` is false (nothing is read then).
__device__ __forceinline__ void copy16(unsigned dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
{{/if}}

__device__ __forceinline__ unsigned pack(float lo, float hi) {
{{#if BF16}}
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
{{#else}}
  __half2 v = __floats2half2_rn(lo, hi);
{{/if}}
  return *reinterpret_cast<unsigned*>(&v);
}

// Block `b` of `m_tiles × n_tiles` → its row tile and first column, in bands of BAND row
// tiles with the rows fastest.
__device__ __forceinline__ void band_tile(long long b, long long m_tiles, long long n_tiles,
                                          long long* m_tile, long long* n0) {
  const long long per_band = (long long)BAND * n_tiles;
  const long long first = (b / per_band) * BAND;
  const long long size = min((long long)BAND, m_tiles - first);
  const long long in_band = b % per_band;
  *m_tile = first + in_band % size;
  *n0 = (in_band / size) * BN;
}

// Inclusive sum over the block's 256 threads (8 warps).
__device__ __forceinline__ long long block_scan(long long v, long long* warp_sums) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int d = 1; d < 32; d <<= 1) {
    const long long up = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += up;
  }
  if (lane == 31) warp_sums[warp] = v;
  __syncthreads();
  long long before = 0;
  for (int w = 0; w < warp; ++w) before += warp_sums[w];
  __syncthreads();
  return v + before;
}

{{#if CP_ASYNC}}
// A block's tile: the operands advanced to its group's rows, its first row `m0` and column
// `n0`, the reduction's length and the rows it may write.
struct Tile {
  const elem* a;
  const elem* b;
  elem* c;
  long long m0, n0, k_valid;
  int m_valid;
};

// Which group, which of its tiles, where its rows start: a scan of the counts (11 words of
// shared `scratch`). False for a block past the groups' last tile (the grid is the host's upper
// bound); the whole block agrees.
__device__ __forceinline__ bool find_tile(const Params& p, long long* scratch, Tile* t) {
  const int tid = threadIdx.x;
  const long long* __restrict__ counts = (const long long*)p.counts;
  const long long count = tid < GROUPS ? counts[tid] : 0;
{{#if ROWS}}
  const long long tiles = (count + BM - 1) / BM;
  long long tile;
  band_tile(blockIdx.x, p.m_tiles, p.n_tiles, &tile, &t->n0);
  if (tid == 0) scratch[8] = -1;
  const long long rows_end = block_scan(count, scratch);
  const long long tiles_end = block_scan(tiles, scratch);
  if (tid < GROUPS && tiles_end - tiles <= tile && tile < tiles_end) {
    scratch[8] = tid;
    scratch[9] = rows_end - count + (tile - (tiles_end - tiles)) * BM;  // first row of the tile
    scratch[10] = min((long long)BM, count - (tile - (tiles_end - tiles)) * BM);
  }
  __syncthreads();
  const long long group = scratch[8];
  const long long row0 = scratch[9];
  t->m_valid = (int)scratch[10];
  __syncthreads();
  if (group < 0) return false;
  t->m0 = 0;
  t->k_valid = p.k;
  t->a = (const elem*)p.a + row0 * p.lda;
  t->b = (const elem*)p.group[group];
  t->c = (elem*)p.c + row0 * p.ldc;
{{#else}}
  const long long per_group = p.m_tiles * p.n_tiles;
  const long long group = (long long)blockIdx.x / per_group;
  long long m_tile;
  band_tile((long long)blockIdx.x % per_group, p.m_tiles, p.n_tiles, &m_tile, &t->n0);
  t->m0 = m_tile * BM;
  const long long rows_end = block_scan(count, scratch);
  if (tid == group) {
    scratch[8] = rows_end - count;
    scratch[9] = count;
  }
  __syncthreads();
  const long long row0 = scratch[8];
  t->k_valid = scratch[9];
  t->m_valid = BM;
  __syncthreads();
  t->a = (const elem*)p.a + row0 * p.lda;
  t->b = (const elem*)p.b + row0 * p.ldb;
  t->c = (elem*)p.group[group];
{{/if}}
  return true;
}
{{/if}}
