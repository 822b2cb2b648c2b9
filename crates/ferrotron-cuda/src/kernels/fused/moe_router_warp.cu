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
// A row held a warp's way (expert e in lane e % 32, slot e / 32, `experts` of them): `ex` the
// exponentials of `l` less the row's max (zeros past the experts; `ex` may be `l`), their sum
// over the row, and the max in `m`, as softmax and log-sum-exp take them.
template <int SLOTS>
__device__ __forceinline__ float row_exps(const float (&l)[SLOTS], float (&ex)[SLOTS], int experts, float& m) {
  const int lane = threadIdx.x & 31;
  m = -__int_as_float(0x7f800000);
#pragma unroll
  for (int j = 0; j < SLOTS; ++j) {
    if (lane + 32 * j < experts) m = fmaxf(m, l[j]);
  }
  m = warp_max(m);
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < SLOTS; ++j) {
    ex[j] = lane + 32 * j < experts ? expf(l[j] - m) : 0.f;
    sum += ex[j];
  }
  return warp_sum(sum);
}
// The sigmoids of a warp's row `l` into `s` (zeros past the `experts`), and their sum over the
// row plus 1e-20, Megatron's normaliser of sigmoid scores.
template <int SLOTS>
__device__ __forceinline__ float row_sigmoids(const float (&l)[SLOTS], float (&s)[SLOTS], int experts) {
  const int lane = threadIdx.x & 31;
  float total = 0.f;
#pragma unroll
  for (int j = 0; j < SLOTS; ++j) {
    s[j] = lane + 32 * j < experts ? 1.0f / (1.0f + expf(-l[j])) : 0.f;
    total += s[j];
  }
  return warp_sum(total) + 1e-20f;
}
