// norm backward params {{KIND}} {{X_NAME}} grad {{GRAD_NAME}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
struct Params { long long rows, hidden, tiles, rows_per_block; unsigned long long x, dy, mean, rstd, dgamma, dbeta; };
extern "C" __global__ void ferrotron_kernel(const Params p) {
  __shared__ float acc_g[{{LANES}}][{{COLS}}];
  __shared__ float acc_b[{{LANES}}][{{COLS}}];
  const long long tile = blockIdx.x % p.tiles, chunk = blockIdx.x / p.tiles;
  const int c = threadIdx.x % {{COLS}}, lane = threadIdx.x / {{COLS}};
  const long long col = tile * {{COLS}} + c;
  const long long first = chunk * p.rows_per_block;
  const long long last = first + p.rows_per_block < p.rows ? first + p.rows_per_block : p.rows;
  float g = 0.f, b = 0.f;
  if (col < p.hidden) {
    for (long long r = first + lane; r < last; r += {{LANES}}) {
      const float d = {{LOAD_DY}};
{{#if RMS}}
      const float xh = ({{LOAD_X}} - 0.f) * ((const float*)p.rstd)[r];
{{#else}}
      const float xh = ({{LOAD_X}} - ((const float*)p.mean)[r]) * ((const float*)p.rstd)[r];
{{/if}}
      g += d * xh; b += d;
    }
  }
  acc_g[lane][c] = g; acc_b[lane][c] = b;
  __syncthreads();
  if (lane == 0 && col < p.hidden) {
    for (int l = 1; l < {{LANES}}; ++l) { g += acc_g[l][c]; b += acc_b[l][c]; }
    atomicAdd((float*)p.dgamma + col, g);
{{#if BETA}}
    atomicAdd((float*)p.dbeta + col, b);
{{/if}}
  }
}
