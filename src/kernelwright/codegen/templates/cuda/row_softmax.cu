// kernelwright: {{ "log_softmax" if log else "softmax" }} over the last, contiguous dim of an [M, N] fp32 tensor: "{{ name }}".
//
// Compile-time knobs (pass with -D):
//   THREADS    threads per block (also the __launch_bounds__); a multiple of 32
//   VEC        elements per load/store: 4 = 16-byte float4 (needs N % 4 == 0, 16-byte aligned rows), 2, or 1
//   WARP_ROW   1: one warp per row, THREADS/32 rows per block (small N); 0: one block per row
//   REG_ITEMS  > 0: each thread keeps REG_ITEMS vectors of its row in registers, so the row is read once
//              (needs N <= GROUP * VEC * REG_ITEMS); 0: the row is streamed from memory on each pass
//   ONLINE     1: single pass for max and sum (running max with rescaled sum); 0: a max pass, then a sum pass
//   LOG        1: log_softmax (x - max - log(sum)); 0: softmax
//   FAST_EXP   1: __expf (fast, approximate); 0: expf (accurate)
// Kernel arguments: x, y, M, N, ldx, ldy (row strides in elements). Grid: ceil(M / ROWS_PER_BLOCK) blocks.
{% include "codegen/templates/cuda/common.cuh" %}
#ifndef ONLINE
#define ONLINE 0
#endif
#ifndef LOG
#define LOG {{ 1 if log else 0 }}
#endif
#ifndef FAST_EXP
#define FAST_EXP 0
#endif

__device__ __forceinline__ float kw_exp(float x) {
#if FAST_EXP
    return __expf(x);
#else
    return expf(x);
#endif
}

// Merge a (max, sum-of-exp) pair into another; empty partials (max == -inf) leave it unchanged.
__device__ __forceinline__ void kw_ms_merge(float& m, float& s, float m2, float s2) {
    const float mn = fmaxf(m, m2);
    if (mn == KW_NEG_INF) return;
    s = s * kw_exp(m - mn) + s2 * kw_exp(m2 - mn);
    m = mn;
}

__device__ __forceinline__ void kw_warp_ms(float& m, float& s) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(KW_FULL_MASK, m, o);
        const float s2 = __shfl_xor_sync(KW_FULL_MASK, s, o);
        kw_ms_merge(m, s, m2, s2);
    }
}

// The (max, sum) pair across the row's threads, as kw_group_fold (common.cuh) reduces one value.
__device__ __forceinline__ void kw_group_ms(float& m, float& s, float* buf_m, float* buf_s) {
    kw_warp_ms(m, s);
#if !WARP_ROW && KW_WARPS > 1
    const int lane = threadIdx.x & 31;
    if (lane == 0) { buf_m[threadIdx.x >> 5] = m; buf_s[threadIdx.x >> 5] = s; }
    __syncthreads();
    m = lane < KW_WARPS ? buf_m[lane] : KW_NEG_INF;
    s = lane < KW_WARPS ? buf_s[lane] : 0.0f;
    kw_warp_ms(m, s);
#endif
}

// Per-thread statistics over one vector.
__device__ __forceinline__ void kw_upd_online(float& m, float& s, const KwVec& q) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
        const float v = q.v[j];
        if (v > m) { s = s * kw_exp(m - v) + 1.0f; m = v; }
        else if (m != KW_NEG_INF) { s += kw_exp(v - m); }
    }
}
__device__ __forceinline__ void kw_upd_max(float& m, const KwVec& q) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) m = fmaxf(m, q.v[j]);
}
__device__ __forceinline__ void kw_upd_sum(float& s, float m, const KwVec& q) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) s += kw_exp(q.v[j] - m);
}
// Output of one vector: softmax uses (max, 1/sum), log_softmax uses (max + log(sum)).
__device__ __forceinline__ KwVec kw_out(const KwVec& q, float m, float k) {
    KwVec r;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
#if LOG
        r.v[j] = q.v[j] - k;
#else
        r.v[j] = kw_exp(q.v[j] - m) * k;
#endif
    }
    return r;
}

extern "C" __global__ void __launch_bounds__(THREADS) {{ name }}(
    const float* __restrict__ x, float* __restrict__ y, kw_i64 M, kw_i64 N, kw_i64 ldx, kw_i64 ldy)
{
    __shared__ float kw_red[3][KW_WARPS];
    const kw_i64 row = kw_row();
    const int g = kw_lane();
    if (WARP_ROW && row >= M) return;  // whole warp leaves together; no block barriers in this mode
    const KwVec* __restrict__ xr = reinterpret_cast<const KwVec*>(x + row * ldx);
    KwVec* __restrict__ yr = reinterpret_cast<KwVec*>(y + row * ldy);
    const kw_i64 nv = N / VEC;  // the launcher guarantees N % VEC == 0

    float m = KW_NEG_INF, s = 0.0f;
#if REG_ITEMS > 0
    // The row lives in registers: one read, one write.
    KwVec r[REG_ITEMS];
    kw_load_row(r, xr, g, nv, KW_NEG_INF);
    const auto row_vec = [&](int k, kw_i64) { return r[k]; };
#else
    // Streaming: the row is read on each pass (ONLINE: 2 reads, else 3), then written once.
    const auto row_vec = [&](int, kw_i64 c) { return xr[c]; };
#endif
#if ONLINE
    kw_row_steps(g, nv, [&](int k, kw_i64 c) { kw_upd_online(m, s, row_vec(k, c)); });
    kw_group_ms(m, s, kw_red[0], kw_red[1]);
#else
    kw_row_steps(g, nv, [&](int k, kw_i64 c) { kw_upd_max(m, row_vec(k, c)); });
    m = kw_group_fold(m, kw_red[0], KW_NEG_INF, KwFmax());
    kw_row_steps(g, nv, [&](int k, kw_i64 c) { kw_upd_sum(s, m, row_vec(k, c)); });
    s = kw_group_sum(s, kw_red[1]);
#endif
#if LOG
    const float k_out = m + logf(s);
#else
    const float k_out = 1.0f / s;
#endif
    kw_row_steps(g, nv, [&](int k, kw_i64 c) { yr[c] = kw_out(row_vec(k, c), m, k_out); });
}
