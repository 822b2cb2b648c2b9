// reduce {{OP}} {{INPUT_NAME}} -> {{OUT_NAME}} rank {{RANK}}{{SPLIT_NOTE}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
{{PARAMS}}
__device__ __forceinline__ {{ACC}} combine({{ACC}} x, {{ACC}} y) { return {{COMBINE}}; }
extern "C" __global__ void ferrotron_kernel(const Params p) {
  __shared__ {{ACC}} sdata[{{BLOCK}}];
  const {{IN}}* in = (const {{IN}}*)p.in_ptr;
  {{OUT}}* out = ({{OUT}}*)p.out_ptr;
{{! Split: every block reduces its share of the one output into a raw partial. }}
{{#if SPLIT}}
  {
    const long long o = 0;
{{#else}}
  for (long long o = blockIdx.x; o < p.outer_n; o += gridDim.x) {
{{/if}}
{{OUTER_OFFSET}}
    {{ACC}} acc = {{INIT}};
{{#if SPLIT}}
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < p.red_n; j += (long long)gridDim.x * blockDim.x) {
{{#else}}
    for (long long j = threadIdx.x; j < p.red_n; j += blockDim.x) {
{{/if}}
      const {{COMPUTE}} v = {{LOAD}};
      acc = combine(acc, {{LIFT}});
    }
    sdata[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) sdata[threadIdx.x] = combine(sdata[threadIdx.x], sdata[threadIdx.x + s]);
      __syncthreads();
    }
{{#if SPLIT}}
    if (threadIdx.x == 0) out[blockIdx.x] = {{STORE}};
{{#else}}
    if (threadIdx.x == 0) out[o] = {{STORE}};
{{/if}}
    __syncthreads();
  }
}
