// moe router aux reduce {{DTYPE_NAME}}{{TERMS_NOTE}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
{{! A thread per (group, expert): the group's band partials added in band order, rounded once. }}
struct Params { unsigned long long mass_partial, count_partial, mass, counts; long long groups, experts, bands_per_group; };
extern "C" __global__ void ferrotron_kernel(const Params p) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= p.groups * p.experts) return;
  const long long group = i / p.experts, e = i % p.experts;
  const long long first = group * p.bands_per_group * p.experts + e;
  float mass = 0.f;
  for (long long b = 0; b < p.bands_per_group; ++b) mass += ((const float*)p.mass_partial)[first + b * p.experts];
  (({{T}}*)p.mass)[i] = {{STORE_MASS}};
{{#if COUNT}}
  float count = 0.f;
  for (long long b = 0; b < p.bands_per_group; ++b) count += ((const float*)p.count_partial)[first + b * p.experts];
  (({{T}}*)p.counts)[i] = {{STORE_COUNT}};
{{/if}}
}
