// norm backward {{KIND}} one pass {{X_NAME}} gamma {{GAMMA_NAME}} grad {{GRAD_NAME}}{{BETA_NOTE}}{{INTO_NOTE}}, {{THREADS}} threads x {{CHUNKS}} chunks
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
struct Params { long long rows, hidden; unsigned long long x, gamma, dy, mean, rstd, dx, into, dgamma, dbeta; };
template <typename T> struct alignas(sizeof(T) * 8) Chunk { T v[8]; };
{{WARP_SUM}}extern "C" __global__ void __launch_bounds__({{THREADS}}) ferrotron_kernel(const Params p) {
  constexpr int T = {{THREADS}}, C = {{CHUNKS}}, W = T / 32;
  __shared__ float sums[2][W][2];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const long long chunks = p.hidden >> 3;
  const float inv_n = 1.f / (float)p.hidden;
  const Chunk<{{GAMMA}}>* gamma = (const Chunk<{{GAMMA}}>*)p.gamma;
{{! This thread's gamma, and its sums over the block's rows, for its fixed columns. }}
  float gam[C][8], acc_g[C][8];
{{#if BETA}}
  float acc_b[C][8];
{{/if}}
#pragma unroll
  for (int k = 0; k < C; ++k) {
    const long long c = tid + k * T;
    Chunk<{{GAMMA}}> gc;
    if (c < chunks) gc = gamma[c];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      gam[k][e] = c < chunks ? {{LOAD_GAMMA}} : 0.f;
      acc_g[k][e] = 0.f;
{{#if BETA}}
      acc_b[k][e] = 0.f;
{{/if}}
    }
  }
  int slot = 0;
  Chunk<{{X}}> xc[C];
  Chunk<{{GRAD}}> dc[C];
  if (blockIdx.x < p.rows) {
#pragma unroll
    for (int k = 0; k < C; ++k) {
      const long long c = tid + k * T;
      if (c < chunks) {
        xc[k] = ((const Chunk<{{X}}>*)((const {{X}}*)p.x + (long long)blockIdx.x * p.hidden))[c];
        dc[k] = ((const Chunk<{{GRAD}}>*)((const {{GRAD}}*)p.dy + (long long)blockIdx.x * p.hidden))[c];
      }
    }
  }
  for (long long row = blockIdx.x; row < p.rows; row += gridDim.x) {
{{#if RMS}}
    const float mean = 0.f;
{{#else}}
    const float mean = ((const float*)p.mean)[row];
{{/if}}
    const float rstd = ((const float*)p.rstd)[row];
{{#if INTO}}
{{! Read with x and dy, before the barrier, so its latency hides behind the sums. }}
    Chunk<{{X}}> ic[C];
#pragma unroll
    for (int k = 0; k < C; ++k) {
      const long long c = tid + k * T;
      if (c < chunks) ic[k] = ((const Chunk<{{X}}>*)((const {{X}}*)p.into + row * p.hidden))[c];
    }
{{/if}}
    float sum_g = 0.f, sum_gx = 0.f;
#pragma unroll
    for (int k = 0; k < C; ++k) {
      const long long c = tid + k * T;
      if (c < chunks) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float d = {{LOAD_DY}};
          const float xh = ({{LOAD_X}} - mean) * rstd;
          const float gd = d * gam[k][e];
          sum_g += gd;
          sum_gx += gd * xh;
          acc_g[k][e] += d * xh;
{{#if BETA}}
          acc_b[k][e] += d;
{{/if}}
        }
      }
    }
{{! The row's two sums over the block: warps, then the warps' sums in warp order. }}
    sum_g = warp_sum(sum_g);
    sum_gx = warp_sum(sum_gx);
    if (lane == 0) { sums[slot][warp][0] = sum_g; sums[slot][warp][1] = sum_gx; }
{{! The next row's x and dy, requested before the barrier: their loads are in flight while the }}
{{! block waits and writes this row's dx (one row in flight at a time left the kernel at }}
{{! 2.35 TB/s). }}
    const long long next = row + gridDim.x;
    Chunk<{{X}}> xn[C];
    Chunk<{{GRAD}}> dn[C];
    if (next < p.rows) {
#pragma unroll
    for (int k = 0; k < C; ++k) {
      const long long c = tid + k * T;
      if (c < chunks) {
        xn[k] = ((const Chunk<{{X}}>*)((const {{X}}*)p.x + next * p.hidden))[c];
        dn[k] = ((const Chunk<{{GRAD}}>*)((const {{GRAD}}*)p.dy + next * p.hidden))[c];
      }
    }
    }
    __syncthreads();
    float total_g = 0.f, total_gx = 0.f;
#pragma unroll
    for (int w = 0; w < W; ++w) { total_g += sums[slot][w][0]; total_gx += sums[slot][w][1]; }
{{! The next row writes the other slot: a warp reaches this slot again only after every warp }}
{{! passed the next row's barrier, so after every warp read it here. }}
    slot ^= 1;
{{#if RMS}}
    (void)total_g;
    const float mean_g = 0.f;
{{#else}}
    const float mean_g = total_g * inv_n;
{{/if}}
    const float mean_gx = total_gx * inv_n;
    Chunk<{{X}}>* dx = (Chunk<{{X}}>*)(({{X}}*)p.dx + row * p.hidden);
#pragma unroll
    for (int k = 0; k < C; ++k) {
      const long long c = tid + k * T;
      if (c < chunks) {
        Chunk<{{X}}> o;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float d = {{LOAD_DY}};
          const float xh = ({{LOAD_X}} - mean) * rstd;
          o.v[e] = {{STORE_DX}};
        }
        dx[c] = o;
      }
    }
#pragma unroll
    for (int k = 0; k < C; ++k) { xc[k] = xn[k]; dc[k] = dn[k]; }
  }
{{! This block's partial sums: one row of `[blocks, hidden]` per gradient. }}
  float* pg = (float*)p.dgamma + (long long)blockIdx.x * p.hidden;
{{#if BETA}}
  float* pb = (float*)p.dbeta + (long long)blockIdx.x * p.hidden;
{{/if}}
#pragma unroll
  for (int k = 0; k < C; ++k) {
    const long long c = tid + k * T;
    if (c < chunks) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        pg[c * 8 + e] = acc_g[k][e];
{{#if BETA}}
        pb[c * 8 + e] = acc_b[k][e];
{{/if}}
      }
    }
  }
}
