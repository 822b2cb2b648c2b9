// moe offsets experts {{EXPERTS}}
struct Params { unsigned long long block_counts, counts; long long blocks; };
extern "C" __global__ void ferrotron_kernel(const Params p) {
  __shared__ long long first[{{EXPERTS}}];
  long long* bc = (long long*)p.block_counts;
  for (int e = threadIdx.x; e < {{EXPERTS}}; e += blockDim.x) {
    long long run = 0;
    for (long long b = 0; b < p.blocks; ++b) {
      const long long c = bc[b * {{EXPERTS}} + e];
      bc[b * {{EXPERTS}} + e] = run;
      run += c;
    }
    first[e] = run;
    ((long long*)p.counts)[e] = run;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    long long run = 0;
    for (int e = 0; e < {{EXPERTS}}; ++e) { const long long c = first[e]; first[e] = run; run += c; }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < {{EXPERTS}}; e += blockDim.x)
    for (long long b = 0; b < p.blocks; ++b) bc[b * {{EXPERTS}} + e] += first[e];
}
