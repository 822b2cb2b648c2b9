// scan {{OP}} {{DTYPE_NAME}} rank {{RANK}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
struct Params {
  long long rows;
  long long len;
  long long shape[{{RANK}}];
  long long in_strides[{{RANK}}];
  long long out_strides[{{RANK}}];
  long long in_red_stride;
  long long out_red_stride;
  long long in_offset;
  long long out_offset;
  unsigned long long in_ptr;
  unsigned long long out_ptr;
};
extern "C" __global__ void ferrotron_kernel(const Params p) {
  const {{T}}* in = (const {{T}}*)p.in_ptr;
  {{T}}* out = ({{T}}*)p.out_ptr;
  const long long step = (long long)blockDim.x * gridDim.x;
  for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < p.rows; o += step) {
    long long ib = p.in_offset, ob = p.out_offset, rem = o;
#pragma unroll
    for (int d = {{RANK}} - 1; d >= 0; --d) {
      const long long c = rem % p.shape[d];
      rem /= p.shape[d];
      ib += c * p.in_strides[d];
      ob += c * p.out_strides[d];
    }
    {{ACC}} acc = {{INIT}};
    for (long long j = 0; j < p.len; ++j) {
      const {{ACC}} v = ({{ACC}}){{LOAD}};
      acc = {{STEP}};
      out[ob + j * p.out_red_stride] = {{STORE}};
    }
  }
}
