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
{# The argument lists, one definition each: kw_op's parameters over element type `elem`; kw_op's
   arguments (each input's name + `suffix`, then the scalars); the pointer parameters over `elem`. #}
{% macro op_params(elem) %}{% for x in inputs %}{{ elem }} {{ x }}{% if not loop.last %}, {% endif %}{% endfor %}{% for s in scalars %}, float {{ s }}{% endfor %}{% endmacro %}
{% macro op_args(suffix) %}{% for x in inputs %}{{ x }}{{ suffix }}{% if not loop.last %}, {% endif %}{% endfor %}{% for s in scalars %}, {{ s }}{% endfor %}{% endmacro %}
{% macro ptr_params(elem, pad) %}
{% for x in inputs %}
{{ pad }}const {{ elem }}* __restrict__ {{ x }}_ptr,
{% endfor %}
{% for s in scalars %}
{{ pad }}float {{ s }},
{% endfor %}
{{ pad }}{{ elem }}* __restrict__ out_ptr{% endmacro %}

// The fused expression, one element at a time. Inputs are named as in the graph.
__device__ __forceinline__ float kw_op({{ op_params("float") }}) {
    return {{ expr }};
}

// The same over the four lanes of 16-byte vectors.
__device__ __forceinline__ float4 kw_op({{ op_params("float4") }}) {
    float4 r;
{% for c in ["x", "y", "z", "w"] %}
    r.{{ c }} = kw_op({{ op_args("." ~ c) }});
{% endfor %}
    return r;
}

// out[i] = kw_op(inputs[i]) for i = first, first + stride, ... < n: a grid-stride loop over elements
// of type T (float4: the aligned vector body; float: the tail, or everything). With UNROLL > 1 the
// main loop issues UNROLL independent loads per input before any use; the remainder (fewer than
// UNROLL steps left for this thread) goes one at a time.
template <class T>
__device__ __forceinline__ void kw_grid_stride(kw_i64 i, kw_i64 n, kw_i64 stride,
{{ ptr_params("T", "                                               ") }}) {
#if UNROLL > 1
    for (; i + (UNROLL - 1) * stride < n; i += UNROLL * stride) {
{% for x in inputs %}
        T {{ x }}_r[UNROLL];
{% endfor %}
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
{% for x in inputs %}
            {{ x }}_r[u] = {{ x }}_ptr[i + u * stride];
{% endfor %}
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) out_ptr[i + u * stride] = kw_op({{ op_args("_r[u]") }});
    }
#endif
    for (; i < n; i += stride) out_ptr[i] = kw_op({{ op_args("_ptr[i]") }});
}

extern "C" __global__ void __launch_bounds__(THREADS) {{ name }}(
{{ ptr_params("float", "    ") }},
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
        kw_grid_stride<float4>(tid, nvec, stride,{% for x in inputs %} reinterpret_cast<const float4*>({{ x }}_ptr),{% endfor %}{% for s in scalars %} {{ s }},{% endfor %} reinterpret_cast<float4*>(out_ptr));
        tail_start = nvec << 2;
    }
#endif
    // Scalar path: the tail after the vector body, or everything when VEC == 1 / misaligned.
    kw_grid_stride<float>(tail_start + tid, n, stride, {{ op_args("_ptr") }}, out_ptr);
}
