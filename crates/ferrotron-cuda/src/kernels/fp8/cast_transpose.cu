// fp8 cast{{TRANSPOSE_NOTE}} {{X_NAME}} {{FORMAT_NAME}} {{SCALING}}{{SOURCE_NOTE}}{{DBIAS_NOTE}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
#include <cuda_fp8.h>
{{LOAD8}}{{HELPERS}}
{{BLOCK_MAX}}
{{SCALE_FROM_AMAX}}struct Params { long long rows, cols; unsigned long long x, q, qt, scale, amax_src, amax_dst, scale_inv; double scaled_max; unsigned long long aux, partial{{EXTRA_PARAMS}}; };
#define TILE {{TILE}}
#define ROW_TILES {{ROW_TILES}}
extern "C" __global__ void __launch_bounds__(256) ferrotron_kernel(const Params p) {
  __shared__ unsigned int tile[TILE][TILE / 4 + 1];
  __shared__ unsigned int red[8];
  const long long tiles_c = (p.cols + TILE - 1) / TILE;
  const long long band = blockIdx.x / tiles_c, c0 = (blockIdx.x % tiles_c) * TILE;
{{#if CURRENT}}
  const float scale = scale_from_amax(*(const float*)p.amax_src, (float)p.scaled_max, 1.f);
{{#else}}
  const float scale = *(const float*)p.scale;
{{/if}}
  if (blockIdx.x == 0 && threadIdx.x == 0) *(float*)p.scale_inv = 1.f / scale;
  const {{X}}* __restrict__ x = (const {{X}}*)p.x;
  const {{X}}* __restrict__ aux = (const {{X}}*)p.aux;
  (void)aux;
{{#if NORM}}
  const {{X}}* __restrict__ gamma = (const {{X}}*)p.gamma;
  const {{X}}* __restrict__ beta = (const {{X}}*)p.beta;
  (void)beta;
{{/if}}
{{#if ROPE}}
  const {{X}}* __restrict__ cosines = (const {{X}}*)p.cos;
  const {{X}}* __restrict__ sines = (const {{X}}*)p.sin;
{{/if}}
  unsigned char* __restrict__ q = (unsigned char*)p.q;
  const int lr = threadIdx.x >> 3, lc = (threadIdx.x & 7) * 8;
  unsigned int amax = 0u;
{{#if DBIAS}}
  float colsum[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
{{/if}}
{{! The loads of the next row tile are issued before this tile's math, so a thread always has }}
{{! its next bytes in flight. }}
  raw8 raw[2][{{INPUTS}}], next[2][{{INPUTS}}];
  { const long long r0 = band * ROW_TILES * TILE;
#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {
    const int tr = lr + pass * 32;
    const long long r = r0 + tr, c = c0 + lc;
    if (r < p.rows && c < p.cols) {
      raw8* in = raw[pass];
{{FETCH}}
    }
  }
  }
  for (int k = 0; k < ROW_TILES; ++k) {
  const long long r0 = (band * ROW_TILES + k) * TILE;
  if (r0 >= p.rows) break;
  if (k + 1 < ROW_TILES) { const long long r0 = (band * ROW_TILES + k + 1) * TILE;
#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {
    const int tr = lr + pass * 32;
    const long long r = r0 + tr, c = c0 + lc;
    if (r < p.rows && c < p.cols) {
      raw8* in = next[pass];
{{FETCH}}
    }
  }
  }
#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {
    const int tr = lr + pass * 32;
    const long long r = r0 + tr, c = c0 + lc;
    if (r < p.rows && c < p.cols) {
      const raw8* in = raw[pass];
      float v[8];
{{COMPUTE}}
{{#if DBIAS}}
#pragma unroll
      for (int j = 0; j < 8; ++j) colsum[j] += v[j];
{{/if}}
      unsigned int lo = 0u, hi = 0u;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        amax = max(amax, max(__float_as_uint(fabsf(v[2 * j])), __float_as_uint(fabsf(v[2 * j + 1]))));
        const unsigned int pair = (unsigned int)__nv_cvt_float2_to_fp8x2(make_float2(v[2 * j] * scale, v[2 * j + 1] * scale), __NV_SATFINITE, {{FORMAT}});
        if (j < 2) lo |= pair << (16 * j); else hi |= pair << (16 * (j - 2));
      }
      const uint2 packed = make_uint2(lo, hi);
      *(uint2*)(q + r * p.cols + c) = packed;
      tile[tr][lc >> 2] = lo;
      tile[tr][(lc >> 2) + 1] = hi;
    }
  }
{{#if TRANSPOSE}}
{{! The transposed copy of the tile in shared memory (`tile[row][word]`, four fp8 bytes a word, }}
{{! rows padded to an odd number of words): a thread reads the word of four columns in each of }}
{{! four consecutive rows, and four byte permutes turn those into four columns' four rows, stored }}
{{! as one word each. Sixteen threads cover a column's 64 rows, so a warp's store is two runs of }}
{{! 64 bytes, and the odd pitch keeps the reads to two banks' worth of conflict (byte reads of }}
{{! 8-byte-apart rows had been a four-way conflict on every byte). }}
  __syncthreads();
  {
    unsigned char* __restrict__ qt = (unsigned char*)p.qt;
    const int rg = threadIdx.x & 15, cw = threadIdx.x >> 4;
    const long long r = r0 + 4 * rg;
    if (r < p.rows) {
      const unsigned int w0 = tile[4 * rg][cw], w1 = tile[4 * rg + 1][cw], w2 = tile[4 * rg + 2][cw], w3 = tile[4 * rg + 3][cw];
      const unsigned int lo01 = __byte_perm(w0, w1, 0x5140), lo23 = __byte_perm(w2, w3, 0x5140);
      const unsigned int hi01 = __byte_perm(w0, w1, 0x7362), hi23 = __byte_perm(w2, w3, 0x7362);
      const unsigned int col[4] = {__byte_perm(lo01, lo23, 0x5410), __byte_perm(lo01, lo23, 0x7632), __byte_perm(hi01, hi23, 0x5410), __byte_perm(hi01, hi23, 0x7632)};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const long long c = c0 + 4 * cw + i;
        if (c < p.cols) *(unsigned int*)(qt + c * p.rows + r) = col[i];
      }
    }
  }
{{! the next row tile overwrites the shared tile only after every thread read it }}
  __syncthreads();
{{/if}}
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < {{INPUTS}}; ++j) raw[i][j] = next[i][j];
  }
{{#if DBIAS}}
  __shared__ float csum[32][TILE + 1];
#pragma unroll
  for (int j = 0; j < 8; ++j) csum[lr][lc + j] = colsum[j];
  __syncthreads();
  if (threadIdx.x < TILE && c0 + threadIdx.x < p.cols) {
    float sum = 0.f;
    for (int i = 0; i < 32; ++i) sum += csum[i][threadIdx.x];
    ((float*)p.partial)[band * p.cols + c0 + threadIdx.x] = sum;
  }
{{/if}}
  if (p.amax_dst) block_max_into(amax, (unsigned int*)p.amax_dst, red);
}
