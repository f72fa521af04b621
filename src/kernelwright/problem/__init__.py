"""Problems: KernelBench-format files (`Model`, `get_inputs`, `get_init_inputs`) or a module + inputs."""
from kernelwright.problem.load import Problem, from_module, load_problem, discover

__all__ = ["Problem", "from_module", "load_problem", "discover"]
