// adamw f32 grad {{GRAD_NAME}}{{MOMENTS_NOTE}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
struct Params { long long n; unsigned long long value, grad, m, v, out_value, out_m, out_v, device_scale, out_rounded; double lr, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, bc1, bc2, scale; };
extern "C" __global__ void ferrotron_kernel(const Params p) {
  const {{GRAD}}* grad = (const {{GRAD}}*)p.grad;
  const float* value = (const float*)p.value;
  const {{M}}* m_in = (const {{M}}*)p.m;
  const {{V}}* v_in = (const {{V}}*)p.v;
  float* out_value = (float*)p.out_value;
  {{M}}* out_m = ({{M}}*)p.out_m;
  {{V}}* out_v = ({{V}}*)p.out_v;
  const long long step = (long long)blockDim.x * gridDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += step) {
    float g = {{LOAD_GRAD}};
{{#if SCALE}}
    g = g * (float)p.scale;
{{/if}}
{{#if DEVICE_SCALE}}
    g = g * ((const float*)p.device_scale)[0];
{{/if}}
{{#if FIRST}}
    const float m = g * (float)p.one_minus_beta1;
    const float v = (g * g) * (float)p.one_minus_beta2;
{{#else}}
    const float m = {{LOAD_M}} * (float)p.beta1 + g * (float)p.one_minus_beta1;
    const float v = {{LOAD_V}} * (float)p.beta2 + (g * g) * (float)p.one_minus_beta2;
{{/if}}
    float w = value[i];
{{#if DECAY}}
    w = w * (float)p.decay;
{{/if}}
    const float m_hat = m / (float)p.bc1, v_hat = v / (float)p.bc2;
    w = w - (m_hat / (sqrtf(v_hat) + (float)p.eps)) * (float)p.lr;
    out_value[i] = w; out_m[i] = {{STORE_M}}; out_v[i] = {{STORE_V}};
{{#if ROUNDED}}
    (({{ROUNDED_TYPE}}*)p.out_rounded)[i] = {{STORE_ROUNDED}};
{{/if}}
  }
}
