__device__ __forceinline__ uint4 philox4x32_10(unsigned long long seed, unsigned long long counter) {
  unsigned int c0 = (unsigned int)counter, c1 = (unsigned int)(counter >> 32), c2 = 0u, c3 = 0u;
  unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)(seed >> 32);
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    const unsigned int hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const unsigned int hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    c0 = hi1 ^ c1 ^ k0; c1 = lo1; c2 = hi0 ^ c3 ^ k1; c3 = lo0;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  return make_uint4(c0, c1, c2, c3);
}
__device__ __forceinline__ double philox_uniform(long long seed, long long counter) {
  const uint4 r = philox4x32_10((unsigned long long)seed, (unsigned long long)counter);
  const unsigned long long bits = ((unsigned long long)(r.x >> 5) << 26) | (r.y >> 6);
  return (double)bits * (1.0 / 9007199254740992.0);
}
__device__ __forceinline__ double philox_normal(long long seed, long long counter) {
  const uint4 r = philox4x32_10((unsigned long long)seed, (unsigned long long)counter);
  const double u1 = ((double)r.x + 1.0) * (1.0 / 4294967296.0);
  const double u2 = (double)r.y * (1.0 / 4294967296.0);
  return sqrt(-2.0 * log(u1)) * cospi(2.0 * u2);
}
