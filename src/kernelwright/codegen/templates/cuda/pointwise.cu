// kernelwright: elementwise kernel "{{ name }}" (fp32).
//   out[i] = {{ expr }}
// Inputs (all fp32, contiguous, length n): {{ inputs | join(", ") }}
{% if scalars %}
// Scalar arguments (fp32): {{ scalars | join(", ") }}
{% endif %}
//
// Compile-time knobs (pass with -D):
//   THREADS  threads per block (also the __launch_bounds__)
//   VEC      4: 16-byte float4 loads/stores over the aligned body, scalar tail; 1: scalar only
//   UNROLL   independent vectors (or scalars) in flight per thread per loop step
// The grid is a grid-stride loop: any grid size is correct; the launcher sizes it to fill the GPU.
{% include "codegen/templates/cuda/common.cuh" %}
#ifndef UNROLL
#define UNROLL 1
#endif
#if VEC != 1 && VEC != 4
#error "VEC must be 1 or 4"
#endif

typedef unsigned long long kw_u64;

// The fused expression, one element at a time. Inputs are named as in the graph.
__device__ __forceinline__ float kw_op({% for x in inputs %}float {{ x }}{% if not loop.last %}, {% endif %}{% endfor %}{% for s in scalars %}, float {{ s }}{% endfor %}) {
    return {{ expr }};
}

extern "C" __global__ void __launch_bounds__(THREADS) {{ name }}(
{% for x in inputs %}
    const float* __restrict__ {{ x }}_ptr,
{% endfor %}
{% for s in scalars %}
    float {{ s }},
{% endfor %}
    float* __restrict__ out_ptr,
    kw_i64 n)
{
    const kw_i64 tid = (kw_i64)blockIdx.x * THREADS + threadIdx.x;
    const kw_i64 stride = (kw_i64)gridDim.x * THREADS;
    kw_i64 tail_start = 0;
#if VEC == 4
    // 16-byte path when every pointer is 16-byte aligned (a uniform branch: same for all threads).
    const kw_u64 align_bits = (kw_u64)out_ptr{% for x in inputs %} | (kw_u64){{ x }}_ptr{% endfor %};
    if ((align_bits & 15ull) == 0ull) {
        const kw_i64 nvec = n >> 2;
{% for x in inputs %}
        const float4* __restrict__ {{ x }}_v = reinterpret_cast<const float4*>({{ x }}_ptr);
{% endfor %}
        float4* __restrict__ out_v = reinterpret_cast<float4*>(out_ptr);
        kw_i64 i = tid;
        // Main loop: UNROLL independent 16-byte loads per input issued before any use.
        for (; i + (UNROLL - 1) * stride < nvec; i += UNROLL * stride) {
{% for x in inputs %}
            float4 {{ x }}_r[UNROLL];
{% endfor %}
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
{% for x in inputs %}
                {{ x }}_r[u] = {{ x }}_v[i + u * stride];
{% endfor %}
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                float4 r;
{% for c in ["x", "y", "z", "w"] %}
                r.{{ c }} = kw_op({% for x in inputs %}{{ x }}_r[u].{{ c }}{% if not loop.last %}, {% endif %}{% endfor %}{% for s in scalars %}, {{ s }}{% endfor %});
{% endfor %}
                out_v[i + u * stride] = r;
            }
        }
        // Remainder of the vector body (fewer than UNROLL steps left for this thread).
        for (; i < nvec; i += stride) {
{% for x in inputs %}
            const float4 {{ x }}_q = {{ x }}_v[i];
{% endfor %}
            float4 r;
{% for c in ["x", "y", "z", "w"] %}
            r.{{ c }} = kw_op({% for x in inputs %}{{ x }}_q.{{ c }}{% if not loop.last %}, {% endif %}{% endfor %}{% for s in scalars %}, {{ s }}{% endfor %});
{% endfor %}
            out_v[i] = r;
        }
        tail_start = nvec << 2;
    }
#endif
    // Scalar path: the tail after the vector body, or everything when VEC == 1 / misaligned.
    kw_i64 i = tail_start + tid;
#if UNROLL > 1
    for (; i + (UNROLL - 1) * stride < n; i += UNROLL * stride) {
{% for x in inputs %}
        float {{ x }}_s[UNROLL];
{% endfor %}
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
{% for x in inputs %}
            {{ x }}_s[u] = {{ x }}_ptr[i + u * stride];
{% endfor %}
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            out_ptr[i + u * stride] = kw_op({% for x in inputs %}{{ x }}_s[u]{% if not loop.last %}, {% endif %}{% endfor %}{% for s in scalars %}, {{ s }}{% endfor %});
        }
    }
#endif
    for (; i < n; i += stride) {
        out_ptr[i] = kw_op({% for x in inputs %}{{ x }}_ptr[i]{% if not loop.last %}, {% endif %}{% endfor %}{% for s in scalars %}, {{ s }}{% endfor %});
    }
}
