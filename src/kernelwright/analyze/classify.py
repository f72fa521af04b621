"""Op classes of captured ATen nodes.

Every node of a captured `Graph` gets one class:

    gemm, conv, pointwise, reduction, normalization, pooling, scan, data_movement, other

Classification looks at the overload packet (`OpNode.op`, e.g. "addmm"), and at the overload
where the packet alone is ambiguous (`aten.max.dim` is a reduction, `aten.max.other` is the
elementwise maximum). Both core-ATen names (what `capture()` produces after decomposition) and
the common pre-decomposition names (`linear`, `conv2d`, `softmax`, `layer_norm`, ...) are known.
"""
from __future__ import annotations

from kernelwright.capture.graph import OpNode

CLASSES = ("gemm", "conv", "pointwise", "reduction", "normalization", "pooling", "scan",
           "data_movement", "other")

GEMM_OPS = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "mv", "addmv", "dot", "vdot",
    "_addmm_activation", "einsum", "bilinear",
    # attention kernels as single nodes (only seen without decomposition)
    "scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
})

CONV_OPS = frozenset({
    "convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "cudnn_convolution", "cudnn_convolution_transpose",
    "mkldnn_convolution", "_slow_conv2d_forward", "slow_conv3d", "slow_conv_transpose2d",
    "slow_conv_transpose3d", "slow_conv_dilated2d", "slow_conv_dilated3d", "convolution_overrideable",
    "conv_depthwise2d", "_conv_depthwise2d", "conv_depthwise3d",
})

#: Elementwise ATen ops (overload packet names). Codegen maps each to an expression per dialect.
POINTWISE_OPS = frozenset({
    # arithmetic
    "add", "sub", "rsub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod",
    "neg", "abs", "reciprocal", "square", "pow", "float_power", "sqrt", "rsqrt", "lerp",
    "addcmul", "addcdiv", "maximum", "minimum", "fmax", "fmin", "clamp", "clamp_min", "clamp_max",
    "clip", "sign", "sgn", "signbit", "copysign", "hypot", "floor", "ceil", "round", "trunc",
    "frac", "xlogy", "logaddexp", "logaddexp2", "heaviside", "nextafter",
    # transcendental
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos",
    "atan", "atan2", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "erfinv",
    "lgamma", "digamma", "i0", "sinc", "logit", "sigmoid",
    # activations
    "relu", "relu6", "gelu", "silu", "mish", "elu", "celu", "selu", "leaky_relu", "hardtanh",
    "hardsigmoid", "hardswish", "hardshrink", "softshrink", "softplus", "threshold", "prelu",
    "_prelu_kernel", "rrelu", "glu", "tanhshrink", "logsigmoid", "log_sigmoid_forward",
    # comparisons, logic, selection
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "logical_not",
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "bitwise_left_shift",
    "bitwise_right_shift", "isnan", "isinf", "isfinite", "isposinf", "isneginf", "nan_to_num",
    "where", "masked_fill", "tril", "triu",
    # casts, fills, dropout (identity in eval mode)
    "_to_copy", "to", "type_as", "fill", "full_like", "zeros_like", "ones_like", "native_dropout",
    "dropout", "positive", "conj_physical", "real", "imag",
})

#: Overloads of otherwise-reducing packets that are binary elementwise ops.
_POINTWISE_OVERLOADS = frozenset({"aten.max.other", "aten.min.other", "aten.max.binary_out",
                                  "aten.min.binary_out"})

REDUCTION_OPS = frozenset({
    "sum", "mean", "amax", "amin", "max", "min", "aminmax", "argmax", "argmin", "prod", "var",
    "var_mean", "std", "std_mean", "logsumexp", "linalg_vector_norm", "norm", "frobenius_norm",
    "nansum", "nanmean", "all", "any", "count_nonzero", "median", "nanmedian", "kthvalue", "mode",
})

NORMALIZATION_OPS = frozenset({
    "_softmax", "_log_softmax", "softmax", "log_softmax", "_safe_softmax",
    "native_layer_norm", "layer_norm", "native_group_norm", "group_norm",
    "native_batch_norm", "batch_norm", "_native_batch_norm_legit",
    "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional",
    "_batch_norm_with_update", "_batch_norm_with_update_functional", "_batch_norm_no_update",
    "cudnn_batch_norm", "miopen_batch_norm", "instance_norm", "rms_norm", "_fused_rms_norm",
    "local_response_norm",
})

POOLING_OPS = frozenset({
    "max_pool1d", "max_pool2d", "max_pool3d", "max_pool1d_with_indices",
    "max_pool2d_with_indices", "max_pool3d_with_indices", "avg_pool1d", "avg_pool2d",
    "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
    "_adaptive_avg_pool2d", "_adaptive_avg_pool3d", "adaptive_max_pool1d", "adaptive_max_pool2d",
    "adaptive_max_pool3d", "lp_pool1d", "lp_pool2d", "lp_pool3d", "_low_memory_max_pool_with_offsets",
    "_low_memory_max_pool2d_with_offsets", "fractional_max_pool2d", "fractional_max_pool3d",
})

SCAN_OPS = frozenset({"cumsum", "cumprod", "logcumsumexp", "cummax", "cummin", "_logcumsumexp"})

#: Data-movement ops that only create a view (no bytes moved).
VIEW_OPS = frozenset({
    "view", "_unsafe_view", "reshape", "_reshape_alias", "permute", "expand", "expand_as",
    "view_as", "alias", "getitem", "squeeze", "unsqueeze", "t", "transpose", "numpy_T", "slice",
    "select", "narrow", "detach", "as_strided", "diagonal", "split", "split_with_sizes",
    "unsafe_split", "unsafe_split_with_sizes", "chunk", "unbind", "unfold", "movedim",
    "view_as_real", "view_as_complex", "unflatten", "flatten", "lift_fresh", "_assert_tensor_metadata",
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
})

#: Data-movement ops that write a new tensor.
COPY_OPS = frozenset({
    "clone", "contiguous", "copy", "_copy_from", "lift_fresh_copy", "cat", "concat", "stack",
    "hstack", "vstack", "index", "index_select", "gather", "scatter", "scatter_add",
    "scatter_reduce", "index_put", "index_add", "index_copy", "index_fill", "masked_scatter",
    "masked_select", "embedding", "flip", "roll", "repeat", "tile", "repeat_interleave",
    "constant_pad_nd", "pad", "reflection_pad1d", "reflection_pad2d", "reflection_pad3d",
    "replication_pad1d", "replication_pad2d", "replication_pad3d", "slice_scatter",
    "select_scatter", "diagonal_scatter", "as_strided_scatter", "pixel_shuffle",
    "pixel_unshuffle", "channel_shuffle", "native_channel_shuffle", "upsample_nearest1d",
    "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
    "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "im2col", "col2im",
    "expand_copy", "permute_copy", "view_copy", "transpose_copy", "t_copy", "unsqueeze_copy",
    "squeeze_copy", "slice_copy", "select_copy", "alias_copy", "detach_copy", "split_copy",
    "unbind_copy", "as_strided_copy", "diagonal_copy",
})

DATA_MOVEMENT_OPS = VIEW_OPS | COPY_OPS

_BY_OP: dict[str, str] = {}
for _cls, _ops in (("data_movement", DATA_MOVEMENT_OPS), ("scan", SCAN_OPS), ("pooling", POOLING_OPS),
                   ("normalization", NORMALIZATION_OPS), ("reduction", REDUCTION_OPS),
                   ("pointwise", POINTWISE_OPS), ("conv", CONV_OPS), ("gemm", GEMM_OPS)):
    for _op in _ops:
        _BY_OP[_op] = _cls


def _packet(name: str) -> str:
    """Overload packet of an ATen op name; in-place variants ("add_") map to their packet."""
    if name.endswith("_") and not name.endswith("__") and name[:-1] in _BY_OP:
        return name[:-1]
    return name


def op_class_of(target: str) -> str:
    """Class of an op given its target string ("aten.addmm.default", "getitem", "aten.relu_")."""
    if target in _POINTWISE_OVERLOADS:
        return "pointwise"
    parts = target.split(".")
    op = parts[1] if len(parts) >= 2 and parts[0] == "aten" else target
    return _BY_OP.get(_packet(op), "other")


def op_class(node: OpNode) -> str:
    """Class of a captured node: one of `CLASSES`."""
    return op_class_of(node.target)


def anchor(nodes) -> str:
    """What anchors a program of these nodes, for grouping problems in benchmarks: "conv" when it
    has a convolution, else "gemm" when it has a matrix product (attention included), else "none"."""
    classes = {op_class(n) for n in nodes}
    return "conv" if "conv" in classes else "gemm" if "gemm" in classes else "none"


def is_view(node: OpNode) -> bool:
    """True for data-movement nodes that create a view and move no bytes.

    `reshape`/`flatten` copy when their input is not contiguous; capture decomposes those into
    `clone` + `view`, so a remaining `reshape` is counted as a view.
    """
    return _packet(node.op) in VIEW_OPS and node.target not in _POINTWISE_OVERLOADS


def is_pointwise(node: OpNode) -> bool:
    return op_class(node) == "pointwise"
