// norm forward {{KIND}} {{X_NAME}} gamma {{GAMMA_NAME}}{{STATS_ONLY_NOTE}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}

{{WARP_SUM}}{{BLOCK_SUM}}struct Params { long long rows, hidden; unsigned long long x, gamma, beta, y, mean, rstd; double eps; };
extern "C" __global__ void ferrotron_kernel(const Params p) {
  __shared__ float red[32];
  const long long row = blockIdx.x;
  const {{X}}* x = (const {{X}}*)p.x + row * p.hidden;
  {{X}}* y = ({{X}}*)p.y + row * p.hidden;
  const {{GAMMA}}* gamma = (const {{GAMMA}}*)p.gamma;
  const float inv_n = 1.f / (float)p.hidden;
  const {{GAMMA}}* beta = (const {{GAMMA}}*)p.beta;
{{#if RMS}}
  const float mean = 0.f;
{{#else}}
  float sum = 0.f;
  for (long long j = threadIdx.x; j < p.hidden; j += blockDim.x) sum += {{LOAD_X}};
  const float mean = block_sum(sum, red) * inv_n;
{{/if}}
  float sq = 0.f;
  for (long long j = threadIdx.x; j < p.hidden; j += blockDim.x) { const float d = {{LOAD_X}} - mean; sq += d * d; }
  const float rstd = rsqrtf(block_sum(sq, red) * inv_n + (float)p.eps);
{{#if STATS_ONLY}}
  (void)y; (void)gamma; (void)beta;
{{#else}}
  for (long long j = threadIdx.x; j < p.hidden; j += blockDim.x) {
    float v = ({{LOAD_X}} - mean) * rstd * {{LOAD_GAMMA}};
{{#if BETA}}
    v += {{LOAD_BETA}};
{{/if}}
    y[j] = {{STORE_V}};
  }
{{/if}}
  if (threadIdx.x == 0) {
{{#if !RMS}}
    ((float*)p.mean)[row] = mean;
{{/if}}
    ((float*)p.rstd)[row] = rstd;
  }
}
