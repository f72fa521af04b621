"""Plan: exact graph rewrites, then fusion groups (anchor + fused pointwise chains)."""
from kernelwright.plan.fusion import Group, Pair, Plan, PoolChain, Unit, plan_graph
from kernelwright.plan.rewrites import simplify

__all__ = ["Group", "Pair", "Plan", "PoolChain", "Unit", "plan_graph", "simplify"]
