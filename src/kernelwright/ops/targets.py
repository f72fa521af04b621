"""ATen targets grouped by what the planner and the kernel generators can do with them.

Plain data, read by plan/ (which ops may join a fusion group) and by codegen/ (which ops a
template or op table renders), so neither has to import the other for it.
"""
from __future__ import annotations

#: Elementwise targets that fusion groups compute. Every dialect's op table (codegen.triton_ops)
#: has an expression for exactly these targets.
POINTWISE = frozenset({
    "aten._to_copy.default",
    "aten.add.Tensor", "aten.add.Scalar", "aten.sub.Tensor", "aten.sub.Scalar", "aten.rsub.Scalar",
    "aten.mul.Tensor", "aten.mul.Scalar", "aten.div.Tensor", "aten.div.Scalar",
    "aten.neg.default", "aten.reciprocal.default",
    "aten.relu.default", "aten.leaky_relu.default", "aten.gelu.default", "aten.sigmoid.default",
    "aten.tanh.default", "aten.exp.default", "aten.exp2.default", "aten.expm1.default",
    "aten.log.default", "aten.log2.default", "aten.log1p.default", "aten.sqrt.default",
    "aten.rsqrt.default", "aten.abs.default", "aten.sign.default", "aten.sin.default",
    "aten.cos.default", "aten.erf.default", "aten.floor.default", "aten.ceil.default",
    "aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.maximum.default", "aten.minimum.default",
    "aten.clamp.default", "aten.clamp_min.default", "aten.clamp_max.default", "aten.hardtanh.default",
    "aten.elu.default", "aten.mish.default",
    "aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther",
    "aten.isnan.default", "aten.isinf.default",
    "aten.gt.Scalar", "aten.gt.Tensor", "aten.lt.Scalar", "aten.lt.Tensor",
    "aten.ge.Scalar", "aten.ge.Tensor", "aten.le.Scalar", "aten.le.Tensor",
    "aten.eq.Scalar", "aten.eq.Tensor", "aten.ne.Scalar", "aten.ne.Tensor",
    "aten.logical_not.default",
})

#: Reductions a fusion group computes over one set of dims (see ops.reductions.reduction_spec).
REDUCTIONS = {
    "aten.sum.dim_IntList", "aten.sum.default", "aten.mean.dim", "aten.mean.default",
    "aten.amax.default", "aten.amin.default", "aten.argmax.default", "aten.argmin.default",
    "aten.max.dim", "aten.min.dim", "aten.var.correction", "aten.linalg_vector_norm.default",
}
#: Normalizations with per-row statistics (tuple outputs: the normalized value, then statistics).
NORMS = {"aten.native_layer_norm.default", "aten.native_group_norm.default", "aten._native_batch_norm_legit.no_stats",
         "aten._native_batch_norm_legit_functional.default"}
#: Row composites: a reduction and the domain-shaped values computed from it, in one op.
COMPOSITES = {"aten._softmax.default", "aten._log_softmax.default"} | NORMS
#: Eval-mode batch norm: elementwise with per-channel statistics.
EVAL_BN = "aten._native_batch_norm_legit_no_training.default"
#: Dtypes fusion groups compute (in float32 registers).
FLOAT_DTYPES = {"float32", "float16", "bfloat16"}
#: Reshapes: element i of the result is element i of the input in row-major order.
RESHAPES = ("aten.view.default", "aten._unsafe_view.default")
#: Views that only re-label a value inside a fusion group.
FREE_VIEWS = {"aten.expand.default", "aten.squeeze.dims", "aten.squeeze.dim", "aten.unsqueeze.default",
              "aten.view.default", "aten._unsafe_view.default"}


def layout_clone(node) -> bool:
    """A clone that changes nothing but the memory format (a convolution's channels-last input):
    the same values, stored in other strides."""
    return node.target == "aten.clone.default" and set(node.kwargs) <= {"memory_format"}


#: Pooling targets -> (kind, pooled dims).
POOLS = {
    "aten.max_pool1d_with_indices.default": ("max", 1),
    "aten.max_pool2d_with_indices.default": ("max", 2),
    "aten.max_pool3d_with_indices.default": ("max", 3),
    "aten.avg_pool1d.default": ("avg", 1),
    "aten.avg_pool2d.default": ("avg", 2),
    "aten.avg_pool3d.default": ("avg", 3),
}
#: Matrix products a GEMM template computes (with a fused epilogue).
GEMMS = {"aten.mm.default", "aten.addmm.default"}
#: Convolutions (dense, grouped, transposed) the convolution template computes (with a fused epilogue).
CONVS = {"aten.convolution.default"}
