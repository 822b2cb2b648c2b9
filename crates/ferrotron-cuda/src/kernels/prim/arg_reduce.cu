// argreduce {{OP}} {{INPUT_NAME}} rank {{RANK}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
{{PARAMS}}
extern "C" __global__ void ferrotron_kernel(const Params p) {
  __shared__ {{CT}} svals[{{BLOCK}}];
  __shared__ long long sidx[{{BLOCK}}];
  const {{IN}}* in = (const {{IN}}*)p.in_ptr;
  long long* out = (long long*)p.idx_ptr;
  for (long long o = blockIdx.x; o < p.outer_n; o += gridDim.x) {
{{OUTER_OFFSET}}
    {{CT}} best = {{INIT}};
    long long bi = -1;
    for (long long j = threadIdx.x; j < p.red_n; j += blockDim.x) {
      const {{CT}} v = {{LOAD}};
      if (bi < 0 || v {{BETTER}} best) { best = v; bi = j; }
    }
    svals[threadIdx.x] = best;
    sidx[threadIdx.x] = bi;
    __syncthreads();
{{! The first index wins ties. }}
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) {
        const {{CT}} v = svals[threadIdx.x + s];
        const long long i = sidx[threadIdx.x + s];
        const long long mi = sidx[threadIdx.x];
        if (i >= 0 && (mi < 0 || v {{BETTER}} svals[threadIdx.x] || (v == svals[threadIdx.x] && i < mi))) { svals[threadIdx.x] = v; sidx[threadIdx.x] = i; }
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) out[o] = sidx[0] < 0 ? 0 : sidx[0];
    __syncthreads();
  }
}
