// qk norm backward {{KIND}} {{X_NAME}} weight {{WEIGHT_NAME}} grad {{GRAD_NAME}} dim {{DIM}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}

{{WARP_SUM}}struct Params { long long rows, slots; unsigned long long x, qw, kw, dy, mean, rstd, dx, pg, pb; };
extern "C" __global__ void __launch_bounds__({{THREADS}}) ferrotron_kernel(const Params p) {
{{! Per lane: the query's and the key's weight (then bias) sums of its channels. }}
  float acc[4][{{PER_LANE}}];
#pragma unroll
  for (int i = 0; i < {{PER_LANE}}; ++i) { acc[0][i] = 0.f; acc[1][i] = 0.f; acc[2][i] = 0.f; acc[3][i] = 0.f; }
{{! One warp a row, grid-stride; `stat` is the row's index among the normalised rows. }}
  const int lane = threadIdx.x & 31;
  const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
  for (long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < p.rows; row += warps) {
    const long long slot = row % p.slots;
    const long long stat = row / p.slots * (p.slots - 1) + slot;
    const {{X}}* x = (const {{X}}*)p.x + row * {{DIM}};
    const {{GRAD}}* dy = (const {{GRAD}}*)p.dy + row * {{DIM}};
    {{X}}* dx = ({{X}}*)p.dx + row * {{DIM}};
    if (slot == p.slots - 1) { for (int c = lane; c < {{DIM}}; c += 32) dx[c] = {{COPY_DY}}; continue; }
    const bool key = slot == p.slots - 2;
    const {{WEIGHT}}* w = (const {{WEIGHT}}*)(key ? p.kw : p.qw);
{{#if LAYER}}
    const float mean = ((const float*)p.mean)[stat];
{{#else}}
    const float mean = 0.f;
{{/if}}
    const float rstd = ((const float*)p.rstd)[stat];
    float xh[{{PER_LANE}}], g[{{PER_LANE}}], gw[{{PER_LANE}}];
    float sum_g = 0.f, sum_gx = 0.f;
#pragma unroll
    for (int i = 0; i < {{PER_LANE}}; ++i) {
      const int c = lane + 32 * i;
      const bool in = c < {{DIM}};
      xh[i] = in ? ({{LOAD_X}} - mean) * rstd : 0.f;
      g[i] = in ? {{LOAD_DY}} : 0.f;
      gw[i] = in ? g[i] * {{LOAD_W}} : 0.f;
      sum_g += gw[i]; sum_gx += gw[i] * xh[i];
    }
{{#if LAYER}}
    const float mean_g = warp_sum(sum_g) * (1.f / {{DIM}});
{{#else}}
    const float mean_g = 0.f; (void)sum_g;
{{/if}}
    const float mean_gx = warp_sum(sum_gx) * (1.f / {{DIM}});
#pragma unroll
    for (int i = 0; i < {{PER_LANE}}; ++i) {
      const int c = lane + 32 * i;
      if (c < {{DIM}}) dx[c] = {{STORE_DX}};
{{! Constant indices keep the sums in registers. }}
      if (key) { acc[1][i] += g[i] * xh[i]; acc[3][i] += g[i]; }
      else { acc[0][i] += g[i] * xh[i]; acc[2][i] += g[i]; }
    }
  }
{{! The block's warps' sums, added in warp order, one row of partials per block. }}
  __shared__ float part[{{WARPS}}][{{SUMS}}][{{DIM}}];
  const int warp = threadIdx.x >> 5;
#pragma unroll
  for (int i = 0; i < {{PER_LANE}}; ++i) {
    const int c = lane + 32 * i;
    if (c < {{DIM}}) {
#pragma unroll
      for (int k = 0; k < {{SUMS}}; ++k) part[warp][k][c] = acc[k][i];
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < {{SUMS}} * {{DIM}}; e += blockDim.x) {
    const int k = e / {{DIM}}, c = e % {{DIM}};
    float total = 0.f;
    for (int v = 0; v < {{WARPS}}; ++v) total += part[v][k][c];
    float* out = (float*)(k < 2 ? p.pg : p.pb) + (long long)blockIdx.x * {{TWO_DIM}} + (k % 2) * {{DIM}} + c;
    *out = total;
  }
}
