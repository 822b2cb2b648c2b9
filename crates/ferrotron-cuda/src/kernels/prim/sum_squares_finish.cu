// sum squares finish
struct Params { long long n; unsigned long long in, out; };
extern "C" __global__ void __launch_bounds__({{THREADS}}) ferrotron_kernel(const Params p) {
  const double* in = (const double*)p.in;
  double acc = 0.0;
  for (long long i = threadIdx.x; i < p.n; i += blockDim.x) acc += in[i];
{{BLOCK_TOTAL}}
  if (threadIdx.x == 0) *(float*)p.out = (float)total;
}
