// moe combine backward {{DTYPE_NAME}} k {{K}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
{{WARP_SUM}}
{{BLOCK_SUM}}
{{! One block per slot: its row's gradient (its weight times its token's gradient) and its weight's. }}
{{! Each row is read by one slot, so no two blocks write a row; a dropped slot's weight gets 0. }}
struct Params { unsigned long long rows, index, weights, grad, d_rows, d_weights; long long hidden, num_rows; };
extern "C" __global__ void ferrotron_kernel(const Params p) {
  __shared__ float red[32];
  const long long slot = blockIdx.x;
  const long long token = slot / {{K}};
  const long long row = ((const long long*)p.index)[slot];
  const bool live = row >= 0 && row < p.num_rows;
  const {{T}}* __restrict__ weights = (const {{T}}*)p.weights;
  const float w = {{LOAD_WEIGHT}};
  const {{T}}* __restrict__ grad = (const {{T}}*)p.grad + token * p.hidden;
  const {{T}}* __restrict__ x = (const {{T}}*)p.rows + (live ? row : 0) * p.hidden;
  {{T}}* d_row = ({{T}}*)p.d_rows + (live ? row : 0) * p.hidden;
  float dot = 0.f;
  if (live) {
    for (long long h = threadIdx.x; h < p.hidden; h += blockDim.x) {
      const float g = {{LOAD_GRAD}};
      dot += g * {{LOAD_ROW}};
      d_row[h] = {{STORE_D_ROW}};
    }
  }
  dot = block_sum(dot, red);
  if (threadIdx.x == 0) (({{T}}*)p.d_weights)[slot] = {{STORE_D_WEIGHT}};
}
