// moe topk {{DTYPE_NAME}} k {{K}}{{GROUPS_NOTE}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
{{! A score's `total_cmp` key, and the scan that keeps the first of the best keys. }}
__device__ __forceinline__ int moe_key(float v) {
  const int bits = __float_as_int(v);
  return bits ^ ((bits >> 31) & 0x7fffffff);
}
struct Params { unsigned long long scores, out; long long rows, experts; };
extern "C" __global__ void ferrotron_kernel(const Params p) {
  const long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= p.rows) return;
  const int experts = (int)p.experts;
  const {{T}}* __restrict__ s = (const {{T}}*)p.scores + row * experts;
{{#if GROUPS}}
  const int group_size = experts / {{NUM_GROUPS}};
  float sums[{{NUM_GROUPS}}];
  for (int g = 0; g < {{NUM_GROUPS}}; ++g) {
    int taken[32]; float sum = -0.0f;
    for (int j = 0; j < {{PER_GROUP}}; ++j) {
      int best = -1; int best_key = 0; float best_v = 0.f;
      for (int e = g * group_size; e < (g + 1) * group_size; ++e) {
        bool used = false;
        for (int t = 0; t < j; ++t) used |= taken[t] == e;
        const float v = {{SCORE}};
        const int key = moe_key(v);
        if (!used && (best < 0 || key > best_key)) { best = e; best_key = key; best_v = v; }
      }
      taken[j] = best; sum += best_v;
    }
    sums[g] = sum;
  }
  unsigned long long allowed = 0ull;
  for (int j = 0; j < {{GROUP_TOPK}}; ++j) {
    int best = -1; int best_key = 0;
    for (int g = 0; g < {{NUM_GROUPS}}; ++g) {
      const int key = moe_key(sums[g]);
      if (!((allowed >> g) & 1ull) && (best < 0 || key > best_key)) { best = g; best_key = key; }
    }
    allowed |= 1ull << best;
  }
{{/if}}
  long long* out = (long long*)p.out + row * {{K}};
  int picked[{{K}}];
  for (int j = 0; j < {{K}}; ++j) {
    int best = -1; int best_key = 0;
    for (int e = 0; e < experts; ++e) {
{{#if GROUPS}}
      if (!((allowed >> (e / group_size)) & 1ull)) continue;
{{/if}}
      bool used = false;
      for (int t = 0; t < j; ++t) used |= picked[t] == e;
      const int key = moe_key({{SCORE}});
      if (!used && (best < 0 || key > best_key)) { best = e; best_key = key; }
    }
    picked[j] = best; out[j] = best;
  }
}
