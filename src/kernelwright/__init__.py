"""kernelwright: writes, verifies and times GPU kernels for PyTorch programs."""

__version__ = "0.1.0"


def optimize(model, example_inputs, out_dir, near=None, **options):
    """Optimise a live module; returns it running kernelwright's forward (parameters shared).

    Writes model_new.py (with `attach(model)`), the kernels, result.json and report.md into
    `out_dir`. `options` are those of kernelwright.pipeline.Options (budget_trials, budget_s,
    precision, device, backend, db_path, mode). Without a GPU the kernels run in the Triton
    interpreter. The forward is generated for the module's current training mode (`mode`: "train",
    "eval" or "both" to choose); in a mode without one, for calls unlike the examples (other shapes
    or dtypes, gradients needed) and after unpickling, the module runs its own forward. `near`:
    verification and timing draw their inputs near the examples' values (problem.from_module)
    instead of from a standard normal.
    """
    import os

    import torch

    from kernelwright.emit.module import import_model_new
    from kernelwright.pipeline import Options, optimize_problem
    from kernelwright.problem import from_module

    options.setdefault("device", "cuda" if torch.cuda.is_available() else "cpu")
    if options["device"] == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # must be set before any kernel module is imported
    options.setdefault("log", lambda s: None)
    options.setdefault("mode", "train" if model.training else "eval")
    problem = from_module(model, list(example_inputs), type(model).__name__, near=near)
    result = optimize_problem(problem, out_dir, Options(**options))
    if not (result.get("verify") or {}).get("passed"):
        raise RuntimeError(f"the optimised module failed verification: {(result.get('verify') or {}).get('reason')}")
    return import_model_new(os.path.join(out_dir, "model_new.py")).attach(model)
