{{#if GATHER}}
// gather {{DTYPE_NAME}} by {{INDEX_NAME}} rank {{RANK}}
{{#else}}
// scatter {{REDUCE}} {{DTYPE_NAME}} by {{INDEX_NAME}} rank {{RANK}}
{{/if}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
struct Params {
  long long n;
  long long dim;
  long long dim_size;
  long long shape[{{RANK}}];
  long long data_strides[{{RANK}}];
  long long idx_strides[{{RANK}}];
  long long other_strides[{{RANK}}];
  long long data_offset;
  long long idx_offset;
  long long other_offset;
  unsigned long long data_ptr;
  unsigned long long idx_ptr;
  unsigned long long other_ptr;
};
extern "C" __global__ void ferrotron_kernel(const Params p) {
{{! Gather: `other` is the contiguous output, `data` the gathered input. Scatter: `data` is the }}
{{! destination (a fresh contiguous copy), `other` the values. }}
{{#if GATHER}}
  const {{T}}* data = (const {{T}}*)p.data_ptr;
  const {{INDEX}}* idx = (const {{INDEX}}*)p.idx_ptr;
  {{T}}* out = ({{T}}*)p.other_ptr;
{{#else}}
  {{T}}* data = ({{T}}*)p.data_ptr;
  const {{INDEX}}* idx = (const {{INDEX}}*)p.idx_ptr;
  const {{T}}* values = (const {{T}}*)p.other_ptr;
{{/if}}
  const long long step = (long long)blockDim.x * gridDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += step) {
{{! The coordinates of element `i` of the index shape, the index value `k`, the data offset }}
{{! without the indexed dim, and the other operand's offset. }}
    long long rem = i, doff = p.data_offset, ioff = p.idx_offset, ooff = p.other_offset;
#pragma unroll
    for (int d = {{RANK}} - 1; d >= 0; --d) {
      const long long c = rem % p.shape[d];
      rem /= p.shape[d];
      ioff += c * p.idx_strides[d];
      ooff += c * p.other_strides[d];
      if (d != p.dim) doff += c * p.data_strides[d];
    }
    const long long k = (long long){{LOAD_INDEX}};
    const bool valid = k >= 0 && k < p.dim_size;
    doff += (valid ? k : 0) * p.data_strides[p.dim];
{{#if GATHER}}
    out[ooff] = valid ? data[doff] : {{ZERO}};
{{#else}}
    if (!valid) continue;
{{#if ASSIGN}}
    data[doff] = values[ooff];
{{/if}}
{{#if OR}}
    if (values[ooff] != 0) data[doff] = 1;
{{/if}}
{{#if ADD_I64}}
    atomicAdd((unsigned long long*)&data[doff], (unsigned long long)values[ooff]);
{{/if}}
{{#if ADD}}
    atomicAdd(&data[doff], values[ooff]);
{{/if}}
{{/if}}
  }
}
