// norm backward input {{KIND}} warp per row {{X_NAME}} gamma {{GAMMA_NAME}} grad {{GRAD_NAME}}{{INTO_NOTE}}, {{CHUNKS}} chunks per lane
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
struct Params { long long rows, hidden; unsigned long long x, gamma, dy, mean, rstd, dx, into; };
template <typename T> struct alignas(sizeof(T) * 8) Chunk { T v[8]; };
{{WARP_SUM}}extern "C" __global__ void ferrotron_kernel(const Params p) {
  constexpr int C = {{CHUNKS}};
  const int lane = threadIdx.x & 31;
  const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  const long long chunks = p.hidden >> 3;
  const Chunk<{{X}}>* x = (const Chunk<{{X}}>*)((const {{X}}*)p.x + row * p.hidden);
  const Chunk<{{GRAD}}>* dy = (const Chunk<{{GRAD}}>*)((const {{GRAD}}*)p.dy + row * p.hidden);
  const Chunk<{{GAMMA}}>* gamma = (const Chunk<{{GAMMA}}>*)p.gamma;
{{#if RMS}}
  const float mean = 0.f;
{{#else}}
  const float mean = ((const float*)p.mean)[row];
{{/if}}
  const float rstd = ((const float*)p.rstd)[row];
  float sum_g = 0.f, sum_gx = 0.f;
#pragma unroll
  for (int k = 0; k < C; ++k) {
    const long long c = lane + k * 32;
    if (c < chunks) {
      const Chunk<{{X}}> xc = x[c];
      const Chunk<{{GRAD}}> dc = dy[c];
      const Chunk<{{GAMMA}}> gc = gamma[c];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float g = {{LOAD_DY}} * {{LOAD_GAMMA}};
        const float xh = ({{LOAD_X}} - mean) * rstd;
        sum_g += g; sum_gx += g * xh;
      }
    }
  }
  const float inv_n = 1.f / (float)p.hidden;
{{#if RMS}}
  (void)sum_g;
  const float mean_g = 0.f;
{{#else}}
  const float mean_g = warp_sum(sum_g) * inv_n;
{{/if}}
  const float mean_gx = warp_sum(sum_gx) * inv_n;
  Chunk<{{X}}>* dx = (Chunk<{{X}}>*)(({{X}}*)p.dx + row * p.hidden);
{{#if INTO}}
  const Chunk<{{X}}>* into = (const Chunk<{{X}}>*)((const {{X}}*)p.into + row * p.hidden);
{{/if}}
#pragma unroll
  for (int k = 0; k < C; ++k) {
    const long long c = lane + k * 32;
    if (c < chunks) {
      const Chunk<{{X}}> xc = x[c];
      const Chunk<{{GRAD}}> dc = dy[c];
      const Chunk<{{GAMMA}}> gc = gamma[c];
{{#if INTO}}
      const Chunk<{{X}}> ic = into[c];
{{/if}}
      Chunk<{{X}}> o;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float g = {{LOAD_DY}} * {{LOAD_GAMMA}};
        const float xh = ({{LOAD_X}} - mean) * rstd;
        o.v[e] = {{STORE_DX}};
      }
      dx[c] = o;
    }
  }
}
