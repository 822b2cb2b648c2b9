// bias gelu backward {{X_NAME}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
{{FAST_MATH}}
struct Params { long long rows, cols, column_blocks; unsigned long long x, bias, dy, dx, partial; };
// Eight consecutive elements of a row, moved by vector loads and stores.
struct __align__({{PACK_BYTES}}) Pack { {{X}} v[8]; };
__device__ __forceinline__ float gelu_grad(const float a, const float b) { return {{GELU_BACKWARD}}; }
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
    Pack out;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float d = gelu_grad({{LOAD_X}} + b[j], {{LOAD_G}});
      out.v[j] = {{STORE_D}};
      sum[j] += d;
    }
    *reinterpret_cast<Pack*>(({{X}}*)p.dx + at) = out;
  }
  float* partial = (float*)p.partial + band * p.cols + c0;
#pragma unroll
  for (int j = 0; j < 8; ++j) partial[j] = sum[j];
}
