{% if kind == "layernorm" %}
// kernelwright: layer norm over the last, contiguous dim of an [M, N] fp32 tensor: "{{ name }}".
//   y = (x - mean) / sqrt(var + eps) [* weight] [+ bias]     (biased variance, as torch)
{% else %}
// kernelwright: {{ op }} over the last, contiguous dim of an [M, N] fp32 tensor -> [M]: "{{ name }}".
{% endif %}
//
// Compile-time knobs (pass with -D):
//   THREADS    threads per block (also the __launch_bounds__); a multiple of 32
//   VEC        elements per load: 4 = 16-byte float4 (needs N % 4 == 0, 16-byte aligned rows), 2, or 1
//   WARP_ROW   1: one warp per row, THREADS/32 rows per block (small N); 0: one block per row
//   REG_ITEMS  > 0: each thread keeps REG_ITEMS vectors of its row in registers (N <= GROUP*VEC*REG_ITEMS)
{% if kind == "layernorm" %}
//   WELFORD    1: one pass with Welford's (count, mean, M2) merged across threads; 0: two passes
//              (mean, then sum of squared deviations) over registers (REG_ITEMS > 0) or memory
//   HAS_WEIGHT, HAS_BIAS   1 when the affine weight / bias ([N], fp32) are given
// Kernel arguments: x, weight, bias, y, M, N, ldx, ldy, eps (weight/bias may be 0 when absent).
{% else %}
//   OP         0 sum, 1 mean, 2 max, 3 min (max/min propagate NaN, as torch)
// Kernel arguments: x, y, M, N, ldx (y is [M], contiguous).
{% endif %}
// Grid: ceil(M / ROWS_PER_BLOCK) blocks.
{% include "codegen/templates/cuda/common.cuh" %}
#ifndef OP
#define OP {{ op_code }}
#endif
#ifndef WELFORD
#define WELFORD 1
#endif
#ifndef HAS_WEIGHT
#define HAS_WEIGHT 0
#endif
#ifndef HAS_BIAS
#define HAS_BIAS 0
#endif

{% if kind == "layernorm" %}
// ---- Welford statistics: (count, mean, M2) --------------------------------------------------
struct KwStat { float n, mean, m2; };

__device__ __forceinline__ void kw_stat_push(KwStat& a, float v) {
    a.n += 1.0f;
    const float d = v - a.mean;
    a.mean += d / a.n;
    a.m2 += d * (v - a.mean);
}
__device__ __forceinline__ void kw_stat_merge(KwStat& a, float nb, float meanb, float m2b) {
    const float n = a.n + nb;
    if (n == 0.0f) return;
    const float d = meanb - a.mean;
    const float fb = nb / n;
    a.mean += d * fb;
    a.m2 += m2b + d * d * a.n * fb;
    a.n = n;
}
__device__ __forceinline__ void kw_warp_stat(KwStat& a) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float nb = __shfl_xor_sync(KW_FULL_MASK, a.n, o);
        const float mb = __shfl_xor_sync(KW_FULL_MASK, a.mean, o);
        const float qb = __shfl_xor_sync(KW_FULL_MASK, a.m2, o);
        kw_stat_merge(a, nb, mb, qb);
    }
}
// The statistics across the row's threads, as kw_group_fold (common.cuh) reduces one value.
__device__ __forceinline__ void kw_group_stat(KwStat& a, float (*buf)[KW_WARPS]) {
    kw_warp_stat(a);
#if !WARP_ROW && KW_WARPS > 1
    const int lane = threadIdx.x & 31;
    if (lane == 0) { buf[0][threadIdx.x >> 5] = a.n; buf[1][threadIdx.x >> 5] = a.mean; buf[2][threadIdx.x >> 5] = a.m2; }
    __syncthreads();
    a.n = lane < KW_WARPS ? buf[0][lane] : 0.0f;
    a.mean = lane < KW_WARPS ? buf[1][lane] : 0.0f;
    a.m2 = lane < KW_WARPS ? buf[2][lane] : 0.0f;
    kw_warp_stat(a);
#endif
}
{% endif %}

__device__ __forceinline__ float kw_sum2(float a, float b) { return a + b; }
// NaN-propagating max/min (torch.max/min return NaN when the row has one).
__device__ __forceinline__ float kw_max2(float a, float b) { return (b > a || b != b) ? b : a; }
__device__ __forceinline__ float kw_min2(float a, float b) { return (b < a || b != b) ? b : a; }

#if OP == 2
#define KW_COMBINE kw_max2
#define KW_IDENTITY KW_NEG_INF
#elif OP == 3
#define KW_COMBINE kw_min2
#define KW_IDENTITY KW_POS_INF
#else
#define KW_COMBINE kw_sum2
#define KW_IDENTITY 0.0f
#endif

struct KwCombine { __device__ __forceinline__ float operator()(float a, float b) const { return KW_COMBINE(a, b); } };

{% if kind == "layernorm" %}
extern "C" __global__ void __launch_bounds__(THREADS) {{ name }}(
    const float* __restrict__ x, const float* __restrict__ weight, const float* __restrict__ bias,
    float* __restrict__ y, kw_i64 M, kw_i64 N, kw_i64 ldx, kw_i64 ldy, float eps)
{
    __shared__ float kw_red[3][KW_WARPS];
    const kw_i64 row = kw_row();
    const int g = kw_lane();
    if (WARP_ROW && row >= M) return;
    const KwVec* __restrict__ xr = reinterpret_cast<const KwVec*>(x + row * ldx);
    KwVec* __restrict__ yr = reinterpret_cast<KwVec*>(y + row * ldy);
    const KwVec* __restrict__ wv = reinterpret_cast<const KwVec*>(weight);
    const KwVec* __restrict__ bv = reinterpret_cast<const KwVec*>(bias);
    const kw_i64 nv = N / VEC;
    const float inv_n = 1.0f / (float)N;
    float mean, var;
#if REG_ITEMS > 0
    KwVec r[REG_ITEMS];
    kw_load_row(r, xr, g, nv, 0.0f);
    const auto row_vec = [&](int k, kw_i64) { return r[k]; };  // the row from registers: read once
#else
    const auto row_vec = [&](int, kw_i64 c) { return xr[c]; };  // the row from memory, on each pass
#endif
#if WELFORD
    KwStat st = {0.0f, 0.0f, 0.0f};
    kw_row_steps(g, nv, [&](int k, kw_i64 c) {
        const KwVec q = row_vec(k, c);
#pragma unroll
        for (int j = 0; j < VEC; ++j) kw_stat_push(st, q.v[j]);
    });
    kw_group_stat(st, kw_red);
    mean = st.mean;
    var = st.m2 * inv_n;
#else
    // Two passes: the mean, then the mean of squared deviations (no cancellation).
    float s = 0.0f;
    kw_row_steps(g, nv, [&](int k, kw_i64 c) {
        const KwVec q = row_vec(k, c);
#pragma unroll
        for (int j = 0; j < VEC; ++j) s += q.v[j];
    });
    mean = kw_group_sum(s, kw_red[0]) * inv_n;
    float q2 = 0.0f;
    kw_row_steps(g, nv, [&](int k, kw_i64 c) {
        const KwVec q = row_vec(k, c);
#pragma unroll
        for (int j = 0; j < VEC; ++j) { const float d = q.v[j] - mean; q2 += d * d; }
    });
    var = kw_group_sum(q2, kw_red[1]) * inv_n;
#endif
    const float rstd = 1.0f / sqrtf(fmaxf(var, 0.0f) + eps);

    kw_row_steps(g, nv, [&](int k, kw_i64 c) {
        const KwVec q = row_vec(k, c);
#if HAS_WEIGHT
        const KwVec w = wv[c];
#endif
#if HAS_BIAS
        const KwVec b = bv[c];
#endif
        KwVec o;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
            float t = (q.v[j] - mean) * rstd;
#if HAS_WEIGHT
            t *= w.v[j];
#endif
#if HAS_BIAS
            t += b.v[j];
#endif
            o.v[j] = t;
        }
        yr[c] = o;
    });
}
{% else %}
extern "C" __global__ void __launch_bounds__(THREADS) {{ name }}(
    const float* __restrict__ x, float* __restrict__ y, kw_i64 M, kw_i64 N, kw_i64 ldx)
{
    __shared__ float kw_red[KW_WARPS];
    const kw_i64 row = kw_row();
    const int g = kw_lane();
    if (WARP_ROW && row >= M) return;
    const KwVec* __restrict__ xr = reinterpret_cast<const KwVec*>(x + row * ldx);
    const kw_i64 nv = N / VEC;
    // VEC independent accumulators per thread (one per vector lane) for instruction-level parallelism.
    float acc[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[j] = KW_IDENTITY;
    // REG_ITEMS > 0 bounds this thread's share of the row, so the loop unrolls fully (one read either way).
    kw_row_steps(g, nv, [&](int, kw_i64 c) {
        const KwVec q = xr[c];
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[j] = KW_COMBINE(acc[j], q.v[j]);
    });
    float a = acc[0];
#pragma unroll
    for (int j = 1; j < VEC; ++j) a = KW_COMBINE(a, acc[j]);
    a = kw_group_fold(a, kw_red, KW_IDENTITY, KwCombine());
    if (g == 0) {
#if OP == 1
        y[row] = a / (float)N;
#else
        y[row] = a;
#endif
    }
}
{% endif %}
