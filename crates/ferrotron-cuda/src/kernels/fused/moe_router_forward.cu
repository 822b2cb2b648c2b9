// moe router forward {{DTYPE_NAME}} experts {{EXPERTS}} k {{K}} {{SCORE_NOTE}}{{BIAS_NOTE}}{{GROUPS_NOTE}}
{{#if HALF}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{{/if}}
{{WARP_SUM}}
{{! moe_key: a score's `total_cmp` key; warp_best: the lanes' best (key, expert, value), the }}
{{! higher key first, then the lower expert, `e < 0` meaning none; all lanes get the same. }}
{{ROUTER_WARP}}
{{! One warp per token, expert e in lane e % 32, slot e / 32. `basis` is what the weights are }}
{{! made of (the logit; pre-softmax the probability; the sigmoid), `score` what the selection }}
{{! compares (the basis plus the bias). Each pick is the warp's best untaken allowed score, so }}
{{! the decisions are `select_topk`'s; slot t's expert and weight end in lane t. }}
struct Params { unsigned long long logits, bias, chosen, weights; long long rows; double scale; };
extern "C" __global__ void ferrotron_kernel(const Params p) {
  const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  const int lane = threadIdx.x & 31;
  const {{T}}* __restrict__ logits = (const {{T}}*)p.logits + row * {{EXPERTS}};
  float basis[{{PER_LANE}}];
  float score[{{PER_LANE}}];
#pragma unroll
  for (int j = 0; j < {{PER_LANE}}; ++j) {
    const int e = lane + 32 * j;
    basis[j] = e < {{EXPERTS}} ? {{LOAD_LOGIT}} : 0.f;
  }
{{#if PRE_SOFTMAX}}
  float m;
  const float sum = row_exps(basis, basis, {{EXPERTS}}, m);
#pragma unroll
  for (int j = 0; j < {{PER_LANE}}; ++j) basis[j] = basis[j] / sum;
{{/if}}
{{#if SIGMOID}}
#pragma unroll
  for (int j = 0; j < {{PER_LANE}}; ++j) basis[j] = 1.0f / (1.0f + expf(-basis[j]));
{{/if}}
#pragma unroll
  for (int j = 0; j < {{PER_LANE}}; ++j) {
    score[j] = basis[j];
{{#if BIAS}}
    if (lane + 32 * j < {{EXPERTS}}) score[j] += ((const float*)p.bias)[lane + 32 * j];
{{/if}}
  }
{{#if GROUPS}}
{{! Each group's sum of its best PER_GROUP scores, best first from -0.0 (Rust's `Sum`), then }}
{{! the best GROUP_TOPK groups by those sums; every lane holds the same sums and groups. }}
  const int group_size = {{EXPERTS}} / {{NUM_GROUPS}};
  float sums[{{NUM_GROUPS}}];
  for (int g = 0; g < {{NUM_GROUPS}}; ++g) {
    unsigned taken = 0u;
    float sum = -0.0f;
    for (int t = 0; t < {{PER_GROUP}}; ++t) {
      int key = 0, e = -1; float v = 0.f;
#pragma unroll
      for (int j = 0; j < {{PER_LANE}}; ++j) {
        const int x = lane + 32 * j;
        if (x < {{EXPERTS}} && x / group_size == g && !((taken >> j) & 1u)) {
          const int k = moe_key(score[j]);
          if (e < 0 || k > key) { key = k; e = x; v = score[j]; }
        }
      }
      warp_best(key, e, v);
      if ((e & 31) == lane) taken |= 1u << (e >> 5);
      sum += v;
    }
    sums[g] = sum;
  }
  unsigned long long allowed = 0ull;
  for (int t = 0; t < {{GROUP_TOPK}}; ++t) {
    int best = -1, best_key = 0;
    for (int g = 0; g < {{NUM_GROUPS}}; ++g) {
      const int key = moe_key(sums[g]);
      if (!((allowed >> g) & 1ull) && (best < 0 || key > best_key)) { best = g; best_key = key; }
    }
    allowed |= 1ull << best;
  }
{{/if}}
  unsigned taken = 0u;
  int pick = -1;
  float pick_basis = 0.f;
#pragma unroll
  for (int t = 0; t < {{K}}; ++t) {
    int key = 0, e = -1; float v = 0.f;
#pragma unroll
    for (int j = 0; j < {{PER_LANE}}; ++j) {
      const int x = lane + 32 * j;
      bool open = x < {{EXPERTS}} && !((taken >> j) & 1u);
{{#if GROUPS}}
      open = open && ((allowed >> (x / group_size)) & 1ull);
{{/if}}
      if (open) {
        const int k = moe_key(score[j]);
        if (e < 0 || k > key) { key = k; e = x; v = basis[j]; }
      }
    }
    warp_best(key, e, v);
    if ((e & 31) == lane) taken |= 1u << (e >> 5);
    if (lane == t) { pick = e; pick_basis = v; }
  }
  const bool live = lane < {{K}};
{{#if SOFTMAX_AFTER}}
  const float m_k = warp_max(live ? pick_basis : -__int_as_float(0x7f800000));
  const float ex = live ? expf(pick_basis - m_k) : 0.f;
  float w = ex / warp_sum(ex);
{{/if}}
{{#if NORMALISE}}
  float w = pick_basis / (warp_sum(live ? pick_basis : 0.f) + 1e-20f);
{{/if}}
{{#if AS_IS}}
  float w = pick_basis;
{{/if}}
  w = w * (float)p.scale;
  if (live) {
    ((long long*)p.chosen)[row * {{K}} + lane] = pick;
    (({{T}}*)p.weights)[row * {{K}} + lane] = {{STORE_WEIGHT}};
  }
}
