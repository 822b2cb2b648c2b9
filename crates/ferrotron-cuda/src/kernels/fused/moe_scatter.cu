// moe scatter experts {{EXPERTS}}
struct Params { unsigned long long experts, block_offsets, order, rows; long long n; };
extern "C" __global__ void ferrotron_kernel(const Params p) {
  __shared__ long long next[{{EXPERTS}}];
  const long long* offsets = (const long long*)p.block_offsets + (long long)blockIdx.x * {{EXPERTS}};
  for (int e = threadIdx.x; e < {{EXPERTS}}; e += 32) next[e] = offsets[e];
  __syncwarp();
  const long long start = (long long)blockIdx.x * {{CHUNK}};
  const long long end = min(start + {{CHUNK}}LL, p.n);
  const long long* __restrict__ x = (const long long*)p.experts;
  long long* order = (long long*)p.order;
  long long* rows = (long long*)p.rows;
  const unsigned lane = threadIdx.x;
  for (long long base = start; base < end; base += 32) {
    const long long i = base + lane;
    const long long e = i < end ? x[i] : -1;
    const bool valid = e >= 0 && e < {{EXPERTS}};
    const unsigned active = __ballot_sync(0xffffffffu, valid);
    if (valid) {
      const unsigned peers = __match_any_sync(active, e);
      const unsigned rank = __popc(peers & ((1u << lane) - 1u));
      const long long row = next[e] + rank;
      order[row] = i;
      rows[i] = row;
      __syncwarp(active);
      if (rank == 0) next[e] += __popc(peers);
    }
    __syncwarp();
  }
}
