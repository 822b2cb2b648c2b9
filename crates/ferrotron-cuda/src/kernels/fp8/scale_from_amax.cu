__device__ __forceinline__ float scale_from_amax(const float amax, const float scaled_max, const float keep) {
  if (!(isfinite(amax) && amax > 0.f)) return keep;
  const float s = __fdiv_rn(scaled_max, amax);
  return isinf(s) ? 3.402823466e+38f : s;
}
