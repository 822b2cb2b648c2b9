// moe combine forward {{DTYPE_NAME}} k {{K}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
{{! One block per token: its k slots' rows, weighted, summed in f32 in slot order. }}
struct Params { unsigned long long rows, index, weights, out; long long hidden, num_rows; };
extern "C" __global__ void ferrotron_kernel(const Params p) {
  const long long token = blockIdx.x;
  const {{T}}* __restrict__ rows = (const {{T}}*)p.rows;
  const long long* __restrict__ index = (const long long*)p.index + token * {{K}};
  const {{T}}* __restrict__ weights = (const {{T}}*)p.weights + token * {{K}};
  const {{T}}* from[{{K}}];
  float w[{{K}}];
#pragma unroll
  for (int s = 0; s < {{K}}; ++s) {
    const long long row = index[s];
    const bool live = row >= 0 && row < p.num_rows;
    from[s] = live ? rows + row * p.hidden : (const {{T}}*)0;
    w[s] = {{LOAD_WEIGHT}};
  }
  {{T}}* out = ({{T}}*)p.out + token * p.hidden;
  for (long long h = threadIdx.x; h < p.hidden; h += blockDim.x) {
    float acc = 0.f;
#pragma unroll
    for (int s = 0; s < {{K}}; ++s) {
      if (from[s]) acc += w[s] * {{LOAD_ROW}};
    }
    out[h] = {{STORE_OUT}};
  }
}
