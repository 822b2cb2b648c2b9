__device__ __forceinline__ unsigned int philox_word(long long seed, long long counter, int word) {
  const uint4 r = philox4x32_10((unsigned long long)seed, (unsigned long long)counter);
  return word == 0 ? r.x : word == 1 ? r.y : word == 2 ? r.z : r.w;
}
