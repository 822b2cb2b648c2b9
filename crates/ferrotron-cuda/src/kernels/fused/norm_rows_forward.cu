// norm forward {{KIND}} warp per row {{X_NAME}} gamma {{GAMMA_NAME}}{{STATS_ONLY_NOTE}}, {{CHUNKS}} chunks per lane
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
struct Params { long long rows, hidden; unsigned long long x, gamma, beta, y, mean, rstd; double eps; };
template <typename T> struct alignas(sizeof(T) * 8) Chunk { T v[8]; };
{{WARP_SUM}}extern "C" __global__ void ferrotron_kernel(const Params p) {
  constexpr int C = {{CHUNKS}};
  const int lane = threadIdx.x & 31;
  const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  const long long chunks = p.hidden >> 3;
  const Chunk<{{X}}>* x = (const Chunk<{{X}}>*)((const {{X}}*)p.x + row * p.hidden);
  float v[C][8];
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < C; ++k) {
    const long long c = lane + k * 32;
    if (c < chunks) {
      const Chunk<{{X}}> t = x[c];
#pragma unroll
      for (int e = 0; e < 8; ++e) { v[k][e] = {{LOAD_CHUNK}}; sum += v[k][e]; }
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) v[k][e] = 0.f;
    }
  }
  const float inv_n = 1.f / (float)p.hidden;
{{#if RMS}}
  (void)sum;
  const float mean = 0.f;
{{#else}}
  const float mean = warp_sum(sum) * inv_n;
{{/if}}
  float sq = 0.f;
#pragma unroll
  for (int k = 0; k < C; ++k) {
    if (lane + k * 32 < chunks) {
#pragma unroll
      for (int e = 0; e < 8; ++e) { const float d = v[k][e] - mean; sq += d * d; }
    }
  }
  const float rstd = rsqrtf(warp_sum(sq) * inv_n + (float)p.eps);
{{#if !STATS_ONLY}}
  const Chunk<{{GAMMA}}>* gamma = (const Chunk<{{GAMMA}}>*)p.gamma;
  const Chunk<{{GAMMA}}>* beta = (const Chunk<{{GAMMA}}>*)p.beta;
  Chunk<{{X}}>* y = (Chunk<{{X}}>*)(({{X}}*)p.y + row * p.hidden);
#pragma unroll
  for (int k = 0; k < C; ++k) {
    const long long c = lane + k * 32;
    if (c < chunks) {
      const Chunk<{{GAMMA}}> gc = gamma[c];
{{#if BETA}}
      const Chunk<{{GAMMA}}> bc = beta[c];
{{#else}}
      (void)beta;
{{/if}}
      Chunk<{{X}}> o;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float r = (v[k][e] - mean) * rstd * {{LOAD_GAMMA}};
{{#if BETA}}
        r += {{LOAD_BETA}};
{{/if}}
        o.v[e] = {{STORE_R}};
      }
      y[c] = o;
    }
  }
{{/if}}
  if (lane == 0) {
{{#if !RMS}}
    ((float*)p.mean)[row] = mean;
{{/if}}
    ((float*)p.rstd)[row] = rstd;
  }
}
