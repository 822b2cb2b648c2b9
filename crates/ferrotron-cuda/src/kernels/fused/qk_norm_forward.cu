// qk norm forward {{KIND}} {{X_NAME}} weight {{WEIGHT_NAME}} dim {{DIM}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}

{{WARP_SUM}}struct Params { long long rows, slots; unsigned long long x, qw, kw, qb, kb, y, mean, rstd; double eps; };
extern "C" __global__ void ferrotron_kernel(const Params p) {
{{! One warp a row, grid-stride; `stat` is the row's index among the normalised rows. }}
  const int lane = threadIdx.x & 31;
  const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
  for (long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < p.rows; row += warps) {
    const long long slot = row % p.slots;
    const long long stat = row / p.slots * (p.slots - 1) + slot;
    const {{X}}* x = (const {{X}}*)p.x + row * {{DIM}};
    {{X}}* y = ({{X}}*)p.y + row * {{DIM}};
    if (slot == p.slots - 1) { for (int c = lane; c < {{DIM}}; c += 32) y[c] = x[c]; continue; }
    float v[{{PER_LANE}}];
#pragma unroll
    for (int i = 0; i < {{PER_LANE}}; ++i) { const int c = lane + 32 * i; v[i] = c < {{DIM}} ? {{LOAD_X}} : 0.f; }
{{#if LAYER}}
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < {{PER_LANE}}; ++i) sum += v[i];
    const float mean = warp_sum(sum) * (1.f / {{DIM}});
{{#else}}
    const float mean = 0.f;
{{/if}}
    float sq = 0.f;
#pragma unroll
    for (int i = 0; i < {{PER_LANE}}; ++i) { const float d = lane + 32 * i < {{DIM}} ? v[i] - mean : 0.f; sq += d * d; }
    const float rstd = rsqrtf(warp_sum(sq) * (1.f / {{DIM}}) + (float)p.eps);
    const bool key = slot == p.slots - 2;
    const {{WEIGHT}}* w = (const {{WEIGHT}}*)(key ? p.kw : p.qw);
    const {{WEIGHT}}* b = (const {{WEIGHT}}*)(key ? p.kb : p.qb);
#pragma unroll
    for (int i = 0; i < {{PER_LANE}}; ++i) {
      const int c = lane + 32 * i;
      if (c < {{DIM}}) {
        float out = (v[i] - mean) * rstd * {{LOAD_W}};
{{#if LAYER}}
        out += {{LOAD_B}};
{{#else}}
        (void)b;
{{/if}}
        y[c] = {{STORE_OUT}};
      }
    }
    if (lane == 0) {
      ((float*)p.rstd)[stat] = rstd;
{{#if LAYER}}
      ((float*)p.mean)[stat] = mean;
{{/if}}
    }
  }
}
