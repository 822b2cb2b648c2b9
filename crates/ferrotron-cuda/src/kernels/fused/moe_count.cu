// moe count experts {{EXPERTS}}
struct Params { unsigned long long experts, block_counts; long long n; };
extern "C" __global__ void ferrotron_kernel(const Params p) {
  __shared__ int hist[{{EXPERTS}}];
  for (int e = threadIdx.x; e < {{EXPERTS}}; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  const long long start = (long long)blockIdx.x * {{CHUNK}};
  const long long end = min(start + {{CHUNK}}LL, p.n);
  const long long* __restrict__ x = (const long long*)p.experts;
  for (long long i = start + threadIdx.x; i < end; i += blockDim.x) {
    const long long e = x[i];
    if (e >= 0 && e < {{EXPERTS}}) atomicAdd(&hist[e], 1);
  }
  __syncthreads();
  long long* out = (long long*)p.block_counts + (long long)blockIdx.x * {{EXPERTS}};
  for (int e = threadIdx.x; e < {{EXPERTS}}; e += blockDim.x) out[e] = hist[e];
}
