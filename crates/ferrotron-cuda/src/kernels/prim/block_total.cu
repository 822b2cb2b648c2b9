{{! A block's `acc`s summed into thread 0's `total` (f64) in a fixed order: a butterfly within }}
{{! each warp, then the warps in order. }}
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  __shared__ double warps[{{WARPS}}];
  if ((threadIdx.x & 31) == 0) warps[threadIdx.x >> 5] = acc;
  __syncthreads();
  double total = 0.0;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 0; w < {{WARPS}}; ++w) total += warps[w];
  }
