// gather flat {{OUT_NAME}} <- {{GRAD_NAME}}{{ACCUMULATE_NOTE}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
struct Params { unsigned long long out, into; unsigned long long src[{{PIECES}}]; long long offset[{{PIECES}}], len[{{PIECES}}], first_block[{{PIECES}}]; long long pieces; };
extern "C" __global__ void ferrotron_kernel(const Params p) {
  int k = 0;
  while (k + 1 < p.pieces && p.first_block[k + 1] <= (long long)blockIdx.x) ++k;
  const long long blocks = (k + 1 < p.pieces ? p.first_block[k + 1] : (long long)gridDim.x) - p.first_block[k];
  const long long n = p.len[k];
  {{OUT}}* out = ({{OUT}}*)p.out + p.offset[k];
{{#if ACCUMULATE}}
  const {{OUT}}* into = (const {{OUT}}*)p.into + p.offset[k];
{{/if}}
  const {{GRAD}}* src = (const {{GRAD}}*)p.src[k];
  const long long step = (long long)blockDim.x * blocks;
  for (long long i = ((long long)blockIdx.x - p.first_block[k]) * blockDim.x + threadIdx.x; i < n; i += step) {
    const float g = src ? {{LOAD_GRAD}} : 0.f;
    out[i] = {{STORE_SUM}};
  }
}
