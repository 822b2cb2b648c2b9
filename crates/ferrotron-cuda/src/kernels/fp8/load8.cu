{{! `raw8`: eight consecutive elements' bytes as one load brings them (16-byte aligned); }}
{{! `load_raw(p)` loads them, `unpack8(raw, v)` turns them into floats, `load8(p, v)` does both. }}
{{#if PAIRS}}
typedef uint4 raw8;
__device__ __forceinline__ raw8 load_raw(const {{T}}* p) { return *(const uint4*)p; }
__device__ __forceinline__ void unpack8(const raw8& raw, float* v) {
  const {{PAIR}}* h = (const {{PAIR}}*)&raw;
#pragma unroll
  for (int j = 0; j < 4; ++j) { const float2 f = {{TO_FLOAT2}}(h[j]); v[2 * j] = f.x; v[2 * j + 1] = f.y; }
}
{{#else}}
struct raw8 { float4 a, b; };
__device__ __forceinline__ raw8 load_raw(const {{T}}* p) { raw8 r; r.a = ((const float4*)p)[0]; r.b = ((const float4*)p)[1]; return r; }
__device__ __forceinline__ void unpack8(const raw8& raw, float* v) {
  v[0] = raw.a.x; v[1] = raw.a.y; v[2] = raw.a.z; v[3] = raw.a.w; v[4] = raw.b.x; v[5] = raw.b.y; v[6] = raw.b.z; v[7] = raw.b.w;
}
{{/if}}
__device__ __forceinline__ void load8(const {{T}}* p, float* v) { unpack8(load_raw(p), v); }
