// bias gelu backward {{X_NAME}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
{{FAST_MATH}}
struct Params { long long rows, cols, column_blocks; unsigned long long x, bias, dy, dx, partial; };
{{#if HALF}}
__device__ __forceinline__ unsigned pack2(const float lo, const float hi) {
  const {{PAIR}} h = {{TO_PAIR}}(lo, hi);
  return *reinterpret_cast<const unsigned*>(&h);
}
{{/if}}
// Eight consecutive elements of a row, loaded as vectors.
struct __align__({{PACK_BYTES}}) Pack { {{X}} v[8]; };
__device__ __forceinline__ float gelu_grad(const float a, const float b) { return {{GELU_BACKWARD}}; }
// Eight values stored as two (f32) or one (16-bit) 16-byte vector (the intrinsic keeps the
// compiler from splitting the store once the loop's pointer has lost its alignment).
__device__ __forceinline__ void store8({{X}}* dst, const float* d) {
{{#if HALF}}
  uint4 w;
  w.x = pack2(d[0], d[1]);
  w.y = pack2(d[2], d[3]);
  w.z = pack2(d[4], d[5]);
  w.w = pack2(d[6], d[7]);
  __stcg(reinterpret_cast<uint4*>(dst), w);
{{#else}}
  __stcg(reinterpret_cast<float4*>(dst), make_float4(d[0], d[1], d[2], d[3]));
  __stcg(reinterpret_cast<float4*>(dst) + 1, make_float4(d[4], d[5], d[6], d[7]));
{{/if}}
}
{{! A thread takes 8 columns down a band of rows: dx = gelu'(x + bias) · dy, stored, and the }}
{{! f32 column sums of dx written as the band's partial row (column_sum adds the bands). }}
extern "C" __global__ void __launch_bounds__({{THREADS}}) ferrotron_kernel(const Params p) {
  const long long band = blockIdx.x / p.column_blocks, column_block = blockIdx.x % p.column_blocks;
  const long long c0 = (column_block * {{THREADS}} + threadIdx.x) * 8;
  if (c0 >= p.cols) return;
  const long long r0 = band * {{BAND_ROWS}};
  const long long r1 = r0 + {{BAND_ROWS}} < p.rows ? r0 + {{BAND_ROWS}} : p.rows;
  const Pack bias = *reinterpret_cast<const Pack*>((const {{X}}*)p.bias + c0);
  float b[8], sum[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    b[j] = {{LOAD_BIAS}};
    sum[j] = 0.f;
  }
  for (long long r = r0; r < r1; ++r) {
    const long long at = r * p.cols + c0;
    const Pack x = *reinterpret_cast<const Pack*>((const {{X}}*)p.x + at);
    const Pack g = *reinterpret_cast<const Pack*>((const {{X}}*)p.dy + at);
    float d[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      d[j] = gelu_grad({{LOAD_X}} + b[j], {{LOAD_G}});
      sum[j] += d[j];
    }
    store8(({{X}}*)p.dx + at, d);
  }
  float4* partial = reinterpret_cast<float4*>((float*)p.partial + band * p.cols + c0);
  __stcg(partial, make_float4(sum[0], sum[1], sum[2], sum[3]));
  __stcg(partial + 1, make_float4(sum[4], sum[5], sum[6], sum[7]));
}
