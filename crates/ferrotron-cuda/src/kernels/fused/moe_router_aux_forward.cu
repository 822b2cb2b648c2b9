// moe router aux forward {{DTYPE_NAME}} experts {{EXPERTS}}{{TERMS_NOTE}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
{{WARP_SUM}}
{{ROUTER_WARP}}
{{! A block per band of at most BAND consecutive rows of one group, a warp per row in turn, }}
{{! expert e in lane e % 32, slot e / 32. Each lane sums its experts' probabilities (and top-k }}
{{! slots) over its warp's rows in row order; the warps' sums are added in warp order into the }}
{{! band's partial, and `moe router aux reduce` adds a group's bands in order: no float atomics, }}
{{! so the sums repeat bit for bit. }}
struct Params { unsigned long long logits, mass, counts, lse; long long rows_per_group, bands_per_group; };
extern "C" __global__ void ferrotron_kernel(const Params p) {
  __shared__ float part[{{WARPS}} * {{EXPERTS}}];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long band = blockIdx.x;
  const long long group = band / p.bands_per_group;
  const long long first = group * p.rows_per_group + (band % p.bands_per_group) * {{BAND}};
  const long long end = min(first + {{BAND}}, (group + 1) * p.rows_per_group);
  float mass[{{PER_LANE}}];
  float count[{{PER_LANE}}];
#pragma unroll
  for (int j = 0; j < {{PER_LANE}}; ++j) { mass[j] = 0.f; count[j] = 0.f; }
  for (long long row = first + warp; row < end; row += {{WARPS}}) {
    const {{T}}* __restrict__ logits = (const {{T}}*)p.logits + row * {{EXPERTS}};
    float l[{{PER_LANE}}];
#pragma unroll
    for (int j = 0; j < {{PER_LANE}}; ++j) {
      const int e = lane + 32 * j;
      l[j] = e < {{EXPERTS}} ? {{LOAD_LOGIT}} : 0.f;
    }
{{#if EXPS}}
    float m;
    float ex[{{PER_LANE}}];
    const float sum = row_exps(l, ex, {{EXPERTS}}, m);
{{/if}}
{{#if LSE}}
    if (lane == 0) (({{T}}*)p.lse)[row] = {{STORE_LSE}};
{{/if}}
{{#if BALANCING}}
{{#if SIGMOID}}
    float s[{{PER_LANE}}];
    const float total = row_sigmoids(l, s, {{EXPERTS}});
#pragma unroll
    for (int j = 0; j < {{PER_LANE}}; ++j) mass[j] += s[j] / total;
{{#else}}
#pragma unroll
    for (int j = 0; j < {{PER_LANE}}; ++j) mass[j] += ex[j] / sum;
{{/if}}
{{/if}}
{{#if COUNT}}
    unsigned taken = 0u;
#pragma unroll
    for (int t = 0; t < {{K}}; ++t) {
      int key = 0, e = -1; float v = 0.f;
#pragma unroll
      for (int j = 0; j < {{PER_LANE}}; ++j) {
        const int x = lane + 32 * j;
        if (x < {{EXPERTS}} && !((taken >> j) & 1u)) {
          const int k = moe_key(l[j]);
          if (e < 0 || k > key) { key = k; e = x; }
        }
      }
      warp_best(key, e, v);
#pragma unroll
      for (int j = 0; j < {{PER_LANE}}; ++j) {
        if (lane + 32 * j == e) { taken |= 1u << j; count[j] += 1.f; }
      }
    }
{{/if}}
  }
{{#if BALANCING}}
#pragma unroll
  for (int j = 0; j < {{PER_LANE}}; ++j) {
    if (lane + 32 * j < {{EXPERTS}}) part[warp * {{EXPERTS}} + lane + 32 * j] = mass[j];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < {{EXPERTS}}; e += blockDim.x) {
    float acc = 0.f;
    for (int w = 0; w < {{WARPS}}; ++w) acc += part[w * {{EXPERTS}} + e];
    ((float*)p.mass)[band * {{EXPERTS}} + e] = acc;
  }
  __syncthreads();
{{/if}}
{{#if COUNT}}
#pragma unroll
  for (int j = 0; j < {{PER_LANE}}; ++j) {
    if (lane + 32 * j < {{EXPERTS}}) part[warp * {{EXPERTS}} + lane + 32 * j] = count[j];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < {{EXPERTS}}; e += blockDim.x) {
    float acc = 0.f;
    for (int w = 0; w < {{WARPS}}; ++w) acc += part[w * {{EXPERTS}} + e];
    ((float*)p.counts)[band * {{EXPERTS}} + e] = acc;
  }
{{/if}}
}
