// ---- shared by kernelwright's CUDA templates (templates/cuda/common.cuh) ----------------------
#ifndef THREADS
#define THREADS 256
#endif
#ifndef VEC
#define VEC 4
#endif

typedef long long kw_i64;
{% if rows %}

// ---- rows: a row of N elements per warp (WARP_ROW) or per block -------------------------------
#ifndef WARP_ROW
#define WARP_ROW 0
#endif
#ifndef REG_ITEMS
#define REG_ITEMS 0
#endif
#if VEC != 1 && VEC != 2 && VEC != 4
#error "VEC must be 1, 2 or 4"
#endif
#if THREADS % 32 != 0 || THREADS > 1024
#error "THREADS must be a multiple of 32, at most 1024"
#endif

#define KW_WARPS (THREADS / 32)
#if WARP_ROW
#define KW_GROUP 32
#define KW_ROWS_PER_BLOCK KW_WARPS
#else
#define KW_GROUP THREADS
#define KW_ROWS_PER_BLOCK 1
#endif
#define KW_NEG_INF __int_as_float(0xff800000)
#define KW_POS_INF __int_as_float(0x7f800000)
#define KW_FULL_MASK 0xffffffffu

// VEC consecutive floats; aligned so one load/store instruction moves the whole vector.
struct __align__(VEC * 4) KwVec { float v[VEC]; };

// The row this thread works on, and its index among the KW_GROUP threads of that row.
__device__ __forceinline__ kw_i64 kw_row() {
#if WARP_ROW
    return (kw_i64)blockIdx.x * KW_ROWS_PER_BLOCK + (threadIdx.x >> 5);
#else
    return blockIdx.x;
#endif
}
__device__ __forceinline__ int kw_lane() { return WARP_ROW ? threadIdx.x & 31 : threadIdx.x; }

// Reductions over a row's threads: a warp's lanes by shuffles, then (one block per row) across
// warps. Lane 0 of each warp writes its partial to shared memory; then every warp reads all
// KW_WARPS partials (lane i reads word i: 32 distinct banks, no conflicts) and reduces them with
// shuffles, so the result reaches every thread without a second barrier. Each reduction uses its
// own buffer, so no barrier is needed after it. `op` combines two values, `identity` fills the
// lanes past the last warp.
struct KwAdd { __device__ __forceinline__ float operator()(float a, float b) const { return a + b; } };
struct KwFmax { __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); } };

template <class Op>
__device__ __forceinline__ float kw_warp_fold(float v, Op op) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(KW_FULL_MASK, v, o));
    return v;
}

template <class Op>
__device__ __forceinline__ float kw_group_fold(float v, float* buf, float identity, Op op) {
    v = kw_warp_fold(v, op);
#if !WARP_ROW && KW_WARPS > 1
    const int lane = threadIdx.x & 31;
    if (lane == 0) buf[threadIdx.x >> 5] = v;
    __syncthreads();
    v = kw_warp_fold(lane < KW_WARPS ? buf[lane] : identity, op);
#endif
    return v;
}

__device__ __forceinline__ float kw_group_sum(float v, float* buf) { return kw_group_fold(v, buf, 0.0f, KwAdd()); }

// f(k, c) for each vector c of this thread's share of a row of nv vectors (c = g, g + KW_GROUP, ...),
// k its step. With REG_ITEMS > 0 the share is at most REG_ITEMS vectors (the launcher checks), the
// steps are unrolled fully and k indexes the registers kw_load_row fills; otherwise it is a loop.
template <class F>
__device__ __forceinline__ void kw_row_steps(int g, kw_i64 nv, F f) {
#if REG_ITEMS > 0
#pragma unroll
    for (int k = 0; k < REG_ITEMS; ++k) {
        const kw_i64 c = g + (kw_i64)k * KW_GROUP;
        if (c < nv) f(k, c);
    }
#else
#pragma unroll 4
    for (kw_i64 c = g; c < nv; c += KW_GROUP) f(0, c);
#endif
}

#if REG_ITEMS > 0
// This thread's REG_ITEMS vectors of the row `xr` (nv vectors long) into registers; `pad` past its end.
__device__ __forceinline__ void kw_load_row(KwVec (&r)[REG_ITEMS], const KwVec* __restrict__ xr, int g, kw_i64 nv,
                                            float pad) {
#pragma unroll
    for (int k = 0; k < REG_ITEMS; ++k) {
        const kw_i64 c = g + (kw_i64)k * KW_GROUP;
        if (c < nv) r[k] = xr[c];
        else {
#pragma unroll
            for (int j = 0; j < VEC; ++j) r[k].v[j] = pad;
        }
    }
}
#endif
{% endif %}
// ------------------------------------------------------------------------------------------------
