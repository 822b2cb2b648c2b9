// sort {{DTYPE_NAME}} {{DIRECTION}} rank {{RANK}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
struct Params {
  long long rows;
  long long len;
  long long pow2;
  long long shape[{{RANK}}];
  long long in_strides[{{RANK}}];
  long long out_strides[{{RANK}}];
  long long in_red_stride;
  long long out_red_stride;
  long long in_offset;
  unsigned long long in_ptr;
  unsigned long long values_ptr;
  unsigned long long indices_ptr;
  unsigned long long keys_ptr;
  unsigned long long ids_ptr;
};
{{! Keys compare with their original index as a tie-break: a strict total order, so stable. }}
__device__ __forceinline__ bool before({{KEY}} ka, long long ia, {{KEY}} kb, long long ib) {
  return ka {{CMP}} kb || (ka == kb && ia < ib);
}
extern "C" __global__ void ferrotron_kernel(const Params p) {
  const {{T}}* in = (const {{T}}*)p.in_ptr;
  {{T}}* values = ({{T}}*)p.values_ptr;
  long long* indices = (long long*)p.indices_ptr;
  for (long long o = blockIdx.x; o < p.rows; o += gridDim.x) {
    {{KEY}}* keys = ({{KEY}}*)p.keys_ptr + o * p.pow2;
    long long* ids = (long long*)p.ids_ptr + o * p.pow2;
    long long ib = p.in_offset, ob = 0, rem = o;
#pragma unroll
    for (int d = {{RANK}} - 1; d >= 0; --d) {
      const long long c = rem % p.shape[d];
      rem /= p.shape[d];
      ib += c * p.in_strides[d];
      ob += c * p.out_strides[d];
    }
{{! The row padded to a power of two; padding sorts after every real key. }}
    for (long long t = threadIdx.x; t < p.pow2; t += blockDim.x) {
      keys[t] = t < p.len ? ({{KEY}}){{LOAD}} : {{PAD}};
      ids[t] = t;
    }
    __syncthreads();
{{! The bitonic network. }}
    for (long long k = 2; k <= p.pow2; k <<= 1) {
      for (long long j = k >> 1; j > 0; j >>= 1) {
        for (long long t = threadIdx.x; t < p.pow2; t += blockDim.x) {
          const long long l = t ^ j;
          if (l > t) {
            const {{KEY}} ka = keys[t], kb = keys[l];
            const long long ia = ids[t], ibb = ids[l];
            const bool l_first = before(kb, ibb, ka, ia);
            if (((t & k) == 0) == l_first) { keys[t] = kb; keys[l] = ka; ids[t] = ibb; ids[l] = ia; }
          }
        }
        __syncthreads();
      }
    }
    for (long long t = threadIdx.x; t < p.len; t += blockDim.x) {
      if (values) values[ob + t * p.out_red_stride] = {{STORE}};
      indices[ob + t * p.out_red_stride] = ids[t];
    }
    __syncthreads();
  }
}
