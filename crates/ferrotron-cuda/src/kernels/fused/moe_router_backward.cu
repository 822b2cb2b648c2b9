// moe router backward {{DTYPE_NAME}} experts {{EXPERTS}} k {{K}} {{SCORE_NOTE}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
{{WARP_SUM}}
{{ROUTER_WARP}}
{{! One warp per token: lane t < K takes slot t (its expert, logit and scaled weight gradient g), }}
{{! recomputes the weights from the logits and forms its expert's gradient; every lane then }}
{{! writes its experts' gradients, zero where not chosen (pre-softmax: every expert's). }}
struct Params { unsigned long long logits, chosen, grad, d_logits; long long rows; double scale; };
extern "C" __global__ void ferrotron_kernel(const Params p) {
  const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  const int lane = threadIdx.x & 31;
  const bool live = lane < {{K}};
  const {{T}}* __restrict__ logits = (const {{T}}*)p.logits + row * {{EXPERTS}};
  const int e = live ? (int)((const long long*)p.chosen)[row * {{K}} + lane] : -1;
  const {{T}}* __restrict__ grad = (const {{T}}*)p.grad + row * {{K}};
  const float g = live ? {{LOAD_GRAD}} * (float)p.scale : 0.f;
  const float l = live ? {{LOAD_CHOSEN}} : 0.f;
{{#if SOFTMAX_AFTER}}
  const float m = warp_max(live ? l : -__int_as_float(0x7f800000));
  const float ex = live ? expf(l - m) : 0.f;
  const float w = ex / warp_sum(ex);
  const float dot = warp_sum(w * g);
  const float slot = w * (g - dot);
{{/if}}
{{#if SIGMOID}}
  const float s = live ? 1.0f / (1.0f + expf(-l)) : 0.f;
{{#if NORMALISE}}
  const float total = warp_sum(s) + 1e-20f;
  const float dot = warp_sum(g * s);
  const float d_s = g / total - dot / (total * total);
{{#else}}
  const float d_s = g;
{{/if}}
  const float slot = d_s * s * (1.0f - s);
{{/if}}
{{#if PRE_SOFTMAX}}
  float ex[{{PER_LANE}}];
#pragma unroll
  for (int j = 0; j < {{PER_LANE}}; ++j) {
    const int x_e = lane + 32 * j;
    ex[j] = x_e < {{EXPERTS}} ? {{LOAD_LOGIT}} : 0.f;
  }
  float m;
  const float sum = row_exps(ex, ex, {{EXPERTS}}, m);
  const float dot = warp_sum(live ? expf(l - m) / sum * g : 0.f);
  const float slot = g;
{{/if}}
  float d[{{PER_LANE}}];
#pragma unroll
  for (int j = 0; j < {{PER_LANE}}; ++j) d[j] = 0.f;
#pragma unroll
  for (int t = 0; t < {{K}}; ++t) {
    const int e_t = __shfl_sync(0xffffffffu, e, t);
    const float slot_t = __shfl_sync(0xffffffffu, slot, t);
#pragma unroll
    for (int j = 0; j < {{PER_LANE}}; ++j) {
      if (lane + 32 * j == e_t) d[j] = slot_t;
    }
  }
  {{T}}* __restrict__ out = ({{T}}*)p.d_logits + row * {{EXPERTS}};
#pragma unroll
  for (int j = 0; j < {{PER_LANE}}; ++j) {
    const int x_e = lane + 32 * j;
    if (x_e >= {{EXPERTS}}) continue;
{{#if PRE_SOFTMAX}}
    const float p_e = ex[j] / sum;
    out[x_e] = {{STORE_PRE}};
{{#else}}
    out[x_e] = {{STORE_D}};
{{/if}}
  }
}
