// cross entropy backward {{X_NAME}} labels {{LABELS_NAME}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
{{#if VECTOR}}
template <typename T> struct alignas(sizeof(T) * 8) Chunk { T v[8]; };
{{/if}}
struct Params { long long rows, vocab; unsigned long long logits, labels, lse, grad, out; };
extern "C" __global__ void ferrotron_kernel(const Params p) {
  const long long row = blockIdx.x;
  const {{X}}* x = (const {{X}}*)p.logits + row * p.vocab;
  {{X}}* out = ({{X}}*)p.out + row * p.vocab;
  const float lse = ((const float*)p.lse)[row], g = ((const float*)p.grad)[row];
  const long long label = (long long)((const {{LABELS}}*)p.labels)[row];
{{#if VECTOR}}
  const Chunk<{{X}}>* xv = (const Chunk<{{X}}>*)x;
  Chunk<{{X}}>* ov = (Chunk<{{X}}>*)out;
  for (long long c = threadIdx.x; c < p.vocab / 8; c += blockDim.x) {
    const auto t = xv[c];
    auto o = t;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float d = expf({{LOAD_CHUNK}} - lse) - (c * 8 + e == label ? 1.f : 0.f);
      o.v[e] = {{STORE_D}};
    }
    ov[c] = o;
  }
}
{{#else}}
  for (long long j = threadIdx.x; j < p.vocab; j += blockDim.x) {
    const float d = expf({{LOAD_X}} - lse) - (j == label ? 1.f : 0.f);
    out[j] = {{STORE_D}};
  }
}
{{/if}}
