"""Schedule spaces: typed, frozen config records generated from axes and constraints."""
from .axes import Axis, Constraint, Space, pow2_range, union
from .config import Config, Value

__all__ = ["Axis", "Config", "Constraint", "Space", "Value", "pow2_range", "union"]
