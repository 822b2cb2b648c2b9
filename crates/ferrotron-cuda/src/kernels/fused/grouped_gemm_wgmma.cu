{{! What the warpgroup-MMA kernels (grouped_gemm_sm90.cu, grouped_gemm_sm90_tma.cu) share: }}
{{! the shared-memory descriptors of the 128-byte-swizzled operands and one m64nBNk16 MMA. }}
// A shared-memory matrix descriptor: start address, leading and stride byte offsets (16-byte
// units), the 128-byte swizzle.
__device__ __forceinline__ unsigned long long descriptor(unsigned addr, unsigned lbo, unsigned sbo) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
         ((unsigned long long)(sbo >> 4) << 32) | (1ull << 62);
}

// Keeps the compiler from moving accumulator reads or writes across wgmma's asynchrony.
__device__ __forceinline__ void fence_acc(float* d) {
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

__device__ __forceinline__ void wgmma(float* d, unsigned long long a, unsigned long long b) {
{{WGMMA}}
}
