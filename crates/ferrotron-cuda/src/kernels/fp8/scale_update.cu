// fp8 scale update

{{SCALE_FROM_AMAX}}struct Params { long long blocks, history, max_algo; unsigned long long state; double scaled_max[3]; };
extern "C" __global__ void __launch_bounds__(256) ferrotron_kernel(const Params p) {
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= p.blocks) return;
  float* b = (float*)p.state + i * (3 + p.history);
  const float amax = b[2];
  for (long long h = p.history - 1; h > 0; --h) b[3 + h] = b[2 + h];
  b[3] = amax;
  float basis = amax;
  if (p.max_algo) {
    unsigned int m = 0u;
    for (long long h = 0; h < p.history; ++h) m = max(m, __float_as_uint(b[3 + h]));
    basis = __uint_as_float(m);
  }
  const float scale = scale_from_amax(basis, (float)p.scaled_max[i % 3], b[0]);
  b[0] = scale;
  b[1] = 1.f / scale;
  b[2] = 0.f;
}
