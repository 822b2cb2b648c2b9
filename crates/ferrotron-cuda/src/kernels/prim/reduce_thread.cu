// reduce {{OP}} {{INPUT_NAME}} -> {{OUT_NAME}} rank {{RANK}} thread-per-output
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
{{PARAMS}}
__device__ __forceinline__ {{ACC}} combine({{ACC}} x, {{ACC}} y) { return {{COMBINE}}; }
extern "C" __global__ void ferrotron_kernel(const Params p) {
  const {{IN}}* in = (const {{IN}}*)p.in_ptr;
  {{OUT}}* out = ({{OUT}}*)p.out_ptr;
  const long long step = (long long)blockDim.x * gridDim.x;
  for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < p.outer_n; o += step) {
{{OUTER_OFFSET}}
    {{ACC}} acc = {{INIT}};
    for (long long j = 0; j < p.red_n; ++j) {
      const {{COMPUTE}} v = {{LOAD}};
      acc = combine(acc, {{LIFT}});
    }
    out[o] = {{STORE}};
  }
}
