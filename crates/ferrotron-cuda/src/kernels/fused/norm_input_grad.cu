// norm backward input {{KIND}} {{X_NAME}} gamma {{GAMMA_NAME}} grad {{GRAD_NAME}}{{INTO_NOTE}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}

{{WARP_SUM}}{{BLOCK_SUM}}struct Params { long long rows, hidden; unsigned long long x, gamma, dy, mean, rstd, dx, into; };
extern "C" __global__ void ferrotron_kernel(const Params p) {
  __shared__ float red[32];
  const long long row = blockIdx.x;
  const {{X}}* x = (const {{X}}*)p.x + row * p.hidden;
  {{X}}* dx = ({{X}}*)p.dx + row * p.hidden;
  const {{GAMMA}}* gamma = (const {{GAMMA}}*)p.gamma;
  const float inv_n = 1.f / (float)p.hidden;
{{#if INTO}}
  const {{X}}* into = (const {{X}}*)p.into + row * p.hidden;
{{/if}}
  const {{GRAD}}* dy = (const {{GRAD}}*)p.dy + row * p.hidden;
{{#if RMS}}
  const float mean = 0.f;
{{#else}}
  const float mean = ((const float*)p.mean)[row];
{{/if}}
  const float rstd = ((const float*)p.rstd)[row];
  float sum_g = 0.f, sum_gx = 0.f;
  for (long long j = threadIdx.x; j < p.hidden; j += blockDim.x) {
    const float g = {{LOAD_DY}} * {{LOAD_GAMMA}};
    const float xh = ({{LOAD_X}} - mean) * rstd;
    sum_g += g; sum_gx += g * xh;
  }
{{#if RMS}}
  const float mean_g = 0.f;
{{#else}}
  const float mean_g = block_sum(sum_g, red) * inv_n;
{{/if}}
  const float mean_gx = block_sum(sum_gx, red) * inv_n;
  for (long long j = threadIdx.x; j < p.hidden; j += blockDim.x) {
    const float g = {{LOAD_DY}} * {{LOAD_GAMMA}};
    const float xh = ({{LOAD_X}} - mean) * rstd;
    dx[j] = {{STORE_DX}};
  }
}
