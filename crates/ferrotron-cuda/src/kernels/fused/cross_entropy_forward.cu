// cross entropy forward {{X_NAME}} labels {{LABELS_NAME}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
{{! Merge of two (maximum, rescaled sum) pairs, then the same over a warp and a block; thread 0 }}
{{! ends with the row's pair. }}

#define NEG_INF __int_as_float(0xff800000)
__device__ __forceinline__ void merge(float& m, float& s, const float m2, const float s2) {
  const float mm = fmaxf(m, m2);
  if (mm == NEG_INF) return;
  s = s * expf(m - mm) + s2 * expf(m2 - mm);
  m = mm;
}
__device__ __forceinline__ void warp_merge(float& m, float& s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    merge(m, s, m2, s2);
  }
}
__device__ void block_merge(float& m, float& s, float* red_m, float* red_s) {
  warp_merge(m, s);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) { red_m[warp] = m; red_s[warp] = s; }
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  m = lane < warps ? red_m[lane] : NEG_INF;
  s = lane < warps ? red_s[lane] : 0.f;
  if (warp == 0) warp_merge(m, s);
}
{{#if VECTOR}}
{{! A chunk of eight elements, aligned to its size (16 bytes for 16-bit types). }}
template <typename T> struct alignas(sizeof(T) * 8) Chunk { T v[8]; };
{{/if}}
struct Params { long long rows, vocab; unsigned long long logits, labels, losses, lse; };
extern "C" __global__ void ferrotron_kernel(const Params p) {
  __shared__ float red_m[32], red_s[32];
  const long long row = blockIdx.x;
  const {{X}}* x = (const {{X}}*)p.logits + row * p.vocab;
  float m = NEG_INF, sum = 0.f;
{{#if VECTOR}}
  const Chunk<{{X}}>* xv = (const Chunk<{{X}}>*)x;
  for (long long c = threadIdx.x; c < p.vocab / 8; c += blockDim.x) {
    const auto t = xv[c];
    float v[8];
    float mm = m;
#pragma unroll
    for (int e = 0; e < 8; ++e) { v[e] = {{LOAD_CHUNK}}; mm = fmaxf(mm, v[e]); }
    if (mm == NEG_INF) continue;
    float add = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) add += expf(v[e] - mm);
    sum = sum * expf(m - mm) + add;
    m = mm;
  }
{{#else}}
  for (long long j = threadIdx.x; j < p.vocab; j += blockDim.x) {
    const float v = {{LOAD_X}};
    if (v > m) { sum = sum * expf(m - v) + 1.f; m = v; } else { sum += expf(v - m); }
  }
{{/if}}
  block_merge(m, sum, red_m, red_s);
  if (threadIdx.x == 0) {
    const float lse = m + logf(sum);
    const long long label = (long long)((const {{LABELS}}*)p.labels)[row];
    const float target = label >= 0 && label < p.vocab ? {{LOAD_TARGET}} : __int_as_float(0x7fc00000);
    ((float*)p.losses)[row] = lse - target;
    ((float*)p.lse)[row] = lse;
  }
}
