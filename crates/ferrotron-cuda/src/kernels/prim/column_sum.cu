// column sum {{OUT_NAME}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
struct Params { long long bands, cols; unsigned long long partial, out; };
#define GROUPS {{GROUPS}}
extern "C" __global__ void __launch_bounds__(32 * GROUPS) ferrotron_kernel(const Params p) {
  __shared__ float part[GROUPS][33];
  const int lane = threadIdx.x & 31, group = threadIdx.x >> 5;
  const long long c = blockIdx.x * 32LL + lane;
  const float* partial = (const float*)p.partial;
  float sum = 0.f;
  if (c < p.cols) for (long long t = group; t < p.bands; t += GROUPS) sum += partial[t * p.cols + c];
  part[group][lane] = sum;
  __syncthreads();
  if (group == 0 && c < p.cols) {
    float total = 0.f;
#pragma unroll
    for (int g = 0; g < GROUPS; ++g) total += part[g][lane];
    (({{OUT}}*)p.out)[c] = {{STORE_TOTAL}};
  }
}
