// moe router aux backward {{DTYPE_NAME}} experts {{EXPERTS}}{{TERMS_NOTE}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
{{WARP_SUM}}
{{ROUTER_WARP}}
{{! One warp per row, expert e in lane e % 32: the row's probabilities recomputed from its }}
{{! logits, its group's row of the mass gradient and its log-sum-exp's gradient. }}
struct Params { unsigned long long logits, grad_mass, grad_lse, d_logits; long long rows, rows_per_group; };
extern "C" __global__ void ferrotron_kernel(const Params p) {
  const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  const int lane = threadIdx.x & 31;
  const {{T}}* __restrict__ logits = (const {{T}}*)p.logits + row * {{EXPERTS}};
  float l[{{PER_LANE}}];
  float d[{{PER_LANE}}];
#pragma unroll
  for (int j = 0; j < {{PER_LANE}}; ++j) {
    const int e = lane + 32 * j;
    l[j] = e < {{EXPERTS}} ? {{LOAD_LOGIT}} : 0.f;
    d[j] = 0.f;
  }
{{#if EXPS}}
  float m;
  float ex[{{PER_LANE}}];
  const float sum = row_exps(l, ex, {{EXPERTS}}, m);
{{/if}}
{{#if BALANCING}}
  const {{T}}* __restrict__ grad_mass = (const {{T}}*)p.grad_mass + (row / p.rows_per_group) * {{EXPERTS}};
  float dm[{{PER_LANE}}];
#pragma unroll
  for (int j = 0; j < {{PER_LANE}}; ++j) {
    const int e = lane + 32 * j;
    dm[j] = e < {{EXPERTS}} ? {{LOAD_GRAD_MASS}} : 0.f;
  }
{{#if SIGMOID}}
  float s[{{PER_LANE}}];
  const float total = row_sigmoids(l, s, {{EXPERTS}});
  float dot = 0.f;
#pragma unroll
  for (int j = 0; j < {{PER_LANE}}; ++j) dot += s[j] / total * dm[j];
  dot = warp_sum(dot);
#pragma unroll
  for (int j = 0; j < {{PER_LANE}}; ++j) d[j] += s[j] * (1.0f - s[j]) * (dm[j] - dot) / total;
{{#else}}
  float dot = 0.f;
#pragma unroll
  for (int j = 0; j < {{PER_LANE}}; ++j) dot += ex[j] / sum * dm[j];
  dot = warp_sum(dot);
#pragma unroll
  for (int j = 0; j < {{PER_LANE}}; ++j) d[j] += ex[j] / sum * (dm[j] - dot);
{{/if}}
{{/if}}
{{#if LSE}}
  const {{T}}* __restrict__ grad_lse = (const {{T}}*)p.grad_lse;
  const float g_lse = {{LOAD_GRAD_LSE}};
#pragma unroll
  for (int j = 0; j < {{PER_LANE}}; ++j) d[j] += ex[j] / sum * g_lse;
{{/if}}
  {{T}}* __restrict__ out = ({{T}}*)p.d_logits + row * {{EXPERTS}};
#pragma unroll
  for (int j = 0; j < {{PER_LANE}}; ++j) {
    const int e = lane + 32 * j;
    if (e < {{EXPERTS}}) out[e] = {{STORE_D}};
  }
}
