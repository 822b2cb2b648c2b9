__device__ __forceinline__ int moe_key(float v) {
  const int bits = __float_as_int(v);
  return bits ^ ((bits >> 31) & 0x7fffffff);
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ void warp_best(int& key, int& e, float& v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const int other_key = __shfl_xor_sync(0xffffffffu, key, o);
    const int other_e = __shfl_xor_sync(0xffffffffu, e, o);
    const float other_v = __shfl_xor_sync(0xffffffffu, v, o);
    if (other_e >= 0 && (e < 0 || other_key > key || (other_key == key && other_e < e))) {
      key = other_key; e = other_e; v = other_v;
    }
  }
}
