// gather sum {{DTYPE_NAME}} group {{GROUP}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
{{! One block per output row: the group's rows of the gradient, summed in f32 in group order. }}
struct Params { unsigned long long grad, back, out; long long hidden; };
extern "C" __global__ void ferrotron_kernel(const Params p) {
  const long long row = blockIdx.x;
  const long long* __restrict__ back = (const long long*)p.back + row * {{GROUP}};
  const {{T}}* __restrict__ grad = (const {{T}}*)p.grad;
  const {{T}}* from[{{GROUP}}];
#pragma unroll
  for (int j = 0; j < {{GROUP}}; ++j) from[j] = grad + back[j] * p.hidden;
  {{T}}* out = ({{T}}*)p.out + row * p.hidden;
  for (long long h = threadIdx.x; h < p.hidden; h += blockDim.x) {
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < {{GROUP}}; ++j) acc += {{LOAD}};
    out[h] = {{STORE}};
  }
}
