// sum squares vector {{INPUT_NAME}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
{{! `head`: the elements before the first 16-byte boundary, fewer than a chunk. }}
struct Params { long long n, head; unsigned long long in, out; };
struct alignas(16) Chunk { {{T}} v[{{PER_CHUNK}}]; };
extern "C" __global__ void __launch_bounds__({{THREADS}}) ferrotron_kernel(const Params p) {
  const {{T}}* in = (const {{T}}*)p.in;
  const Chunk* body = (const Chunk*)(in + p.head);
  const long long chunks = (p.n - p.head) / {{PER_CHUNK}};
  const long long step = (long long)gridDim.x * blockDim.x;
  double acc = 0.0;
  for (long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += step) {
    const Chunk k = body[c];
    float q[{{PER_CHUNK}}];
#pragma unroll
    for (int e = 0; e < {{PER_CHUNK}}; ++e) { const float v = {{LOAD_CHUNK}}; q[e] = v * v; }
{{! Pairwise within the chunk, so no square meets a sum much larger than itself in f32. }}
#pragma unroll
    for (int w = {{HALF_CHUNK}}; w > 0; w >>= 1)
#pragma unroll
      for (int e = 0; e < w; ++e) q[e] += q[e + w];
    acc += (double)q[0];
  }
{{! The head and the elements after the last whole chunk: the first block's first threads. }}
  if (blockIdx.x == 0) {
    const long long tail = p.n - p.head - chunks * {{PER_CHUNK}};
    long long i = -1;
    if (threadIdx.x < p.head) i = threadIdx.x;
    else if (threadIdx.x < p.head + tail) i = chunks * {{PER_CHUNK}} + threadIdx.x;
    if (i >= 0) { const float v = {{LOAD_ELEMENT}}; acc += (double)(v * v); }
  }
{{BLOCK_TOTAL}}
  if (threadIdx.x == 0) ((double*)p.out)[blockIdx.x] = total;
}
