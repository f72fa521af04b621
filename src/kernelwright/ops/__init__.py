"""Facts about ATen ops shared by the planner and the kernel generators: target sets, pooling
kinds, and the reduction spec of a node."""
from kernelwright.ops.reductions import reduction_spec, row_shapes
from kernelwright.ops.targets import (COMPOSITES, CONVS, EVAL_BN, FLOAT_DTYPES, FREE_VIEWS, GEMMS, NORMS, POINTWISE,
                                      POOLS, REDUCTIONS, RESHAPES, layout_clone)

__all__ = ["COMPOSITES", "CONVS", "EVAL_BN", "FLOAT_DTYPES", "FREE_VIEWS", "GEMMS", "NORMS", "POINTWISE", "POOLS", "REDUCTIONS",
           "RESHAPES", "layout_clone", "reduction_spec", "row_shapes"]
