// fp8 amax {{X_NAME}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
#include <cuda_fp8.h>
{{LOAD8}}
{{BLOCK_MAX}}struct Params { long long chunks; unsigned long long x, amax_dst; };
extern "C" __global__ void __launch_bounds__(256) ferrotron_kernel(const Params p) {
  __shared__ unsigned int red[8];
  const {{X}}* x = (const {{X}}*)p.x;
  unsigned int amax = 0u;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < p.chunks; i += (long long)gridDim.x * blockDim.x) {
    float v[8];
    load8(x + i * 8, v);
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = max(amax, __float_as_uint(fabsf(v[j])));
  }
  block_max_into(amax, (unsigned int*)p.amax_dst, red);
}
