"""kernelwright as a torch.compile backend: ``torch.compile(model, backend="kernelwright")``.

Dynamo hands over each captured graph with example inputs, the module's parameters and buffers
among them (their placeholders are named ``*_parameters_*`` / ``*_buffers_*``). The backend puts
that state back on a small module (`Lifted`), optimises it like any module (capture, rewrites,
plan, search, codegen, verification against the graph itself), and returns a function that takes
Dynamo's inputs and runs the optimised forward on the data inputs, the live state read through the
module (an optimizer's in-place updates are seen). Results are kept per graph, input signature and
options under ``$XDG_CACHE_HOME/kernelwright/compiled/`` (a later process loads the verified module
instead of optimising again).

A graph that needs gradients goes through AOTAutograd: its forward graph (returning what the
backward saves) and its backward graph are plain ATen graphs, each optimised and verified like an
inference graph. The saved tensors keep the layout the forward's rewrites choose (a convolution's
channels-last result is not copied back to NCHW): the backend reports the strides the optimised
forward returns them with, and AOTAutograd compiles the backward for those strides. The backward
graph is optimised at its first call and verified on inputs near that call's values (its saved
tensors hold together); both graphs replay as CUDA graphs where measured faster. A graph with
symbolic sizes (``dynamic=True``, or Dynamo's default after a second shape) runs as a bounded set
of specialisations (`Specialisations`): the generated kernels are
specialised, so each call's concrete sizes pick a graph optimised for them on first use (and cached
on disk like any other), up to MAX_SPECIALISATIONS per graph; calls at further sizes run the graph
as captured, with one warning. What else runs a graph as captured, with one warning line: a graph
without tensor inputs and any failure to optimise or verify. ``backend(**options)`` makes a backend
with options of kernelwright.pipeline.Options (budget_trials, precision, ...): ``torch.compile(model,
backend=kernelwright.backend.backend(budget_trials=4))``.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Callable

import torch

NAME = "kernelwright"


WIDENED = (torch.float16, torch.bfloat16, torch.float32)  # dtypes a graph's float64 reference computes in float64


class Lifted(torch.nn.Module):
    """A Dynamo graph whose parameter and buffer inputs are this module's own state again; its
    forward takes the other tensor inputs, in order, and returns the graph's outputs but those
    that are always None (`none_outputs`: a backward graph's gradients of inputs that need none).
    `sizes`: the values of a graph with symbolic sizes that one specialisation fixes: {("in" or
    "out", position): value} for its size inputs and outputs (SymInts) and its value inputs
    (`_is_value`: a module's float attribute, which Dynamo then passes as a 0-d tensor)."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs, state: list[int], sizes: dict | None = None):
        super().__init__()
        self.gm = gm
        self.state = state
        self.sizes = dict(sizes or {})
        self.nones, self.n_outputs = none_outputs(gm)  # read once: with_nones runs on every call
        self.constants = {i: v for (kind, i), v in self.sizes.items() if kind == "out"}
        self.nones = self.nones | set(self.constants)
        for k, i in enumerate(state):
            t = example_inputs[i]
            if isinstance(t, torch.nn.Parameter):
                self.register_parameter(f"s{k}", t)
            else:
                self.register_buffer(f"s{k}", t)
        self.arity = len(example_inputs)

    def merged(self, data) -> list:
        """Dynamo's full input list from the data inputs and this module's state."""
        out, it = [], iter(data)
        state = dict(zip(self.state, (getattr(self, f"s{k}") for k in range(len(self.state)))))
        sizes = self.sizes
        for i in range(self.arity):
            out.append(state[i] if i in state else sizes[("in", i)] if ("in", i) in sizes else next(it))
        return out

    @property
    def lifted(self) -> set[int]:
        """Positions of the graph's inputs this module supplies (its state and fixed sizes)."""
        return set(self.state) | {i for kind, i in self.sizes if kind == "in"}

    def forward(self, *data):
        out = self.gm(*self.merged(data))
        if not self.nones:
            return out
        return tuple(o for i, o in enumerate(out) if i not in self.nones)

    def float64_copy(self) -> "Lifted":
        """A float64 copy whose graph computes in float64 throughout (the verifier's reference):
        its casts to a floating dtype (an autocast graph's bf16 operands, its float32 results)
        cast to float64 instead, so the reference is the graph's exact value rather than one
        rounded wherever the graph rounds, and the graph as captured has an error of its own. Fused
        attention ops, which have no float64 kernels, compute from their definition
        (verify/wide_attention.py)."""
        import copy

        from kernelwright.verify.wide_attention import WIDE_ATTENTION

        twin = copy.deepcopy(self)
        widen = lambda a: torch.float64 if a in WIDENED else a  # noqa: E731
        for node in twin.gm.graph.nodes:
            if node.op == "call_function":
                node.target = WIDE_ATTENTION.get(node.target, node.target)
                node.args = torch.fx.node.map_aggregate(node.args, widen)
                node.kwargs = torch.fx.node.map_aggregate(node.kwargs, widen)
        twin.gm.recompile()
        return twin.double()

    def with_nones(self, out):
        """The graph's outputs from forward's (the None outputs put back)."""
        if not self.nones:
            return out
        it, constants = iter(out if isinstance(out, (tuple, list)) else (out,)), self.constants
        return tuple(constants.get(i) if i in self.nones else next(it) for i in range(self.n_outputs))


def none_outputs(gm: torch.fx.GraphModule) -> tuple[set[int], int]:
    """(positions of a graph's outputs that are the constant None, how many outputs it has)."""
    (node,) = [n for n in gm.graph.nodes if n.op == "output"]
    outs = node.args[0]
    if not isinstance(outs, (tuple, list)):
        return set(), 1
    return {i for i, o in enumerate(outs) if o is None}, len(outs)


def state_positions(gm: torch.fx.GraphModule, example_inputs) -> list[int]:
    """Positions of the inputs that are module state: parameters, and placeholders Dynamo named
    after a module's parameters or buffers."""
    names = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    out = []
    for i, x in enumerate(example_inputs):
        name = str(names[i]) if i < len(names) else ""
        if isinstance(x, torch.nn.Parameter) or "_parameters_" in name or "_buffers_" in name:
            out.append(i)
    return out


@functools.cache
def source_digest() -> str:
    """A digest of kernelwright's own source (its modules and kernel templates), computed once per
    process: cached results of another version of the code are not reused (what a graph's
    optimisation kept or shipped, and why, may differ)."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".j2", ".cu", ".cuh") and p.is_file()):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _cache_dir(gm: torch.fx.GraphModule, example_inputs, options: dict) -> Path:
    sig = [(tuple(x.shape), str(x.dtype), x.stride(), x.requires_grad, x.device.type)
           if isinstance(x, torch.Tensor) else repr(x) for x in example_inputs]
    key = hashlib.sha256(json.dumps([gm.code, sig, sorted((k, repr(v)) for k, v in options.items()),
                                     torch.__version__, source_digest()], default=str).encode()).hexdigest()[:20]
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kernelwright" / "compiled"
    return root / key


def kept_original(out: Path) -> str | None:
    """Why the module optimised into `out` runs its own forward in some mode (its capture failed,
    or the generated forward failed verification or timed slower than the graph run as captured),
    or None where a generated forward ships."""
    try:
        result = json.loads((out / "result.json").read_text())
    except (OSError, ValueError):
        return None
    for mode, r in (result.get("modes") or {}).items():
        where = "" if mode == "any" else f"{mode} mode: "
        if r.get("capture", "ok") != "ok":
            return where + f"capture: {str(r['capture'])[:200]}"
        if r.get("verify_fallback"):
            return where + f"the generated forward failed verification ({(r['verify_fallback'] or {}).get('reason') or '?'})"
        fallback = r.get("whole_model_fallback")
        if fallback:
            return where + (f"the generated forward took {fallback['generated_ms']:.3f} ms, the graph as captured "
                            f"{fallback['eager_ms']:.3f} ms")
    return None


def _as_captured(gm: torch.fx.GraphModule, why: str) -> Callable:
    warnings.warn(f"kernelwright: {why}; the graph runs as captured", stacklevel=3)
    return gm.forward


def _is_size(x) -> bool:
    return isinstance(x, (int, torch.SymInt)) and not isinstance(x, bool)


def symbolic(example_inputs) -> bool:
    """Whether a graph's example inputs carry symbolic sizes (SymInt inputs, or tensors whose
    shape or strides are symbolic, as AOTAutograd's fake tensors are under dynamic shapes)."""
    return any(_is_size(x) or (isinstance(x, torch.Tensor) and any(
        isinstance(d, torch.SymInt) for d in (*x.shape, *x.stride()))) for x in example_inputs)


MAX_SPECIALISATIONS = 8  # per graph with symbolic sizes


class Specialisations:
    """A graph with symbolic sizes as a bounded set of specialised ones. A call's concrete sizes
    (each tensor's shape, strides and dtype, each size input's value) pick the function
    `specialise(inputs)` made for the first call with those sizes; after `limit` of them, calls at
    other sizes run the graph as captured (one warning): optimising a graph takes a search, so a
    size that changes on every call is better served by the captured graph."""

    def __init__(self, gm: torch.fx.GraphModule, specialise: Callable, limit: int | None = None):
        self.gm, self.specialise = gm, specialise
        self.limit = MAX_SPECIALISATIONS if limit is None else limit
        self.made: dict[tuple, Callable] = {}
        self.warned = False

    @staticmethod
    def key(inputs) -> tuple:
        return tuple(x.item() if _is_value(x) else (tuple(x.shape), x.stride(), x.dtype, x.device.type)
                     if isinstance(x, torch.Tensor) else int(x) if _is_size(x) else type(x).__name__ for x in inputs)

    def __call__(self, *inputs):
        key = self.key(inputs)
        run = self.made.get(key)
        if run is None:
            if len(self.made) >= self.limit:
                if not self.warned:
                    self.warned = True
                    warnings.warn(f"kernelwright: a graph with symbolic sizes met more than {self.limit} sizes; "
                                  "calls at further sizes run the graph as captured", stacklevel=2)
                return self.gm(*inputs)
            from torch.utils._python_dispatch import _disable_current_modes

            # (optimised outside the caller's dispatch modes: AOTAutograd runs a training graph's
            # first call under one of its own, through which torch.export's tensors cannot pass)
            with _disable_current_modes():
                run = self.made[key] = self.specialise(inputs)
        return run(*inputs)


NEAR = 0.05  # a backward graph's verification inputs: its first call's values plus this much noise (per std)


class AtFirstCall:
    """A graph optimised at its first call, on copies of that call's tensors: an AOTAutograd
    backward graph, whose inputs hold together (the forward's saved tensors: a softmax's
    log-sum-exp beside the scores it came from), so its verification and timing draw inputs near
    those values (`near`, problem.from_module) instead of independent random ones, which make
    such a graph's values meaningless (an exponent that overflows). The copies also carry the
    real call's signature (AOTAutograd's fake tensors can report another dtype than the real
    kernel returns: the CPU batch norm's statistics of a bf16 input)."""

    def __init__(self, gm: torch.fx.GraphModule, options: dict, near: float | None = NEAR):
        self.gm, self.options, self.near = gm, options, near
        self.run: Callable | None = None

    def __call__(self, *inputs):
        if self.run is None:
            from torch.utils._python_dispatch import _disable_current_modes

            with _disable_current_modes():  # (optimised outside AOTAutograd's modes, as Specialisations)
                self.run = _optimised(self.gm, [same_strides_copy(x) for x in inputs], [], self.options, near=self.near)
        return self.run(*inputs)


def same_strides_copy(x):
    """A copy of tensor x with x's own strides (clone() makes a tensor that is not dense, say q as
    a view of a fused qkv projection, contiguous: a module optimised for the copy would refuse x);
    a tensor whose elements share memory (an expanded one) contiguous, as clone() copies it. Other
    values as they are."""
    from kernelwright.problem.load import empty_like_strides

    return empty_like_strides(x).copy_(x.detach()) if isinstance(x, torch.Tensor) else x


def _specialised(gm: torch.fx.GraphModule, inputs, state: list[int], options: dict, copy: bool = False,
                 near: float | None = None) -> Callable:
    """`_optimised` for one call's concrete sizes of a graph with symbolic sizes: its size inputs
    and the sizes it returns are fixed. `copy`: the examples are copies of the call's tensors (an
    AOTAutograd graph), else the call's inputs themselves (a Dynamo graph, whose parameters are
    lifted). The sizes a graph returns are read from one run of it on copies (the call's own state
    is not touched; 0-d tensors of a graph with symbolic sizes can be values such as an eps)."""
    copies, returns_sizes = None, _returns_sizes(gm)
    if copy or returns_sizes:
        copies = [same_strides_copy(x) for x in inputs]
    sizes = {("in", i): int(x) if _is_size(x) else x.clone() for i, x in enumerate(inputs) if _is_size(x) or _is_value(x)}
    if returns_sizes:
        with torch.no_grad():
            outs = gm(*copies)
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        sizes.update({("out", i): int(o) for i, o in enumerate(outs) if _is_size(o)})
    return _optimised(gm, copies if copy else list(inputs), state, options, sizes, near)


def _is_value(x) -> bool:
    """Whether a graph input is a value its specialisations fix: a 0-d CPU tensor that is not a
    parameter and needs no gradient (Dynamo passes a module's float attribute, such as a norm's
    eps or momentum, so under symbolic sizes)."""
    return (isinstance(x, torch.Tensor) and not isinstance(x, torch.nn.Parameter) and x.dim() == 0
            and x.device.type == "cpu" and not x.requires_grad)


def _returns_sizes(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph returns sizes (an AOTAutograd forward graph saving them for the backward)."""
    (node,) = [n for n in gm.graph.nodes if n.op == "output"]
    outs = node.args[0] if isinstance(node.args[0], (tuple, list)) else (node.args[0],)
    return any(isinstance(o, torch.fx.Node) and _is_size(o.meta.get("val")) for o in outs)


def _optimised(gm: torch.fx.GraphModule, example_inputs, state: list[int], options: dict,
               sizes: dict | None = None, near: float | None = None) -> Callable:
    """gm's inputs -> gm's outputs through the optimised module (cached), or gm itself with a
    warning when optimisation fails. A graph with symbolic sizes: Specialisations of it. `near`:
    verification inputs are drawn near the examples' values (kernelwright.optimize)."""
    from kernelwright import optimize

    data = [x for i, x in enumerate(example_inputs) if i not in state]
    if not any(isinstance(x, torch.Tensor) for x in data):
        return _as_captured(gm, "a graph without tensor inputs")
    if sizes is None and symbolic(example_inputs):
        return Specialisations(gm, lambda inputs: _specialised(gm, inputs, state, options, near=near))
    lifted = Lifted(gm, example_inputs, state, sizes).eval()
    data = [x for i, x in enumerate(example_inputs) if i not in lifted.lifted]
    lifted._kw_patience = replay_patience(gm, lifted.lifted)
    out = _cache_dir(gm, example_inputs, options if near is None else dict(options, near=near))
    try:
        fast = _load(out, lifted)
        if fast is None:
            with torch.no_grad():
                fast = optimize(lifted, data, str(out), mode="eval", near=near, **options)
        why = kept_original(out)  # (optimised now or loaded from the cache)
        if why:  # a correct result, said once: the graph runs as captured, as the user should know
            warnings.warn(f"kernelwright: a graph keeps its captured form ({why})", stacklevel=2)
    except Exception as e:  # noqa: BLE001 - any failure runs the captured graph
        return _as_captured(gm, f"optimisation failed ({type(e).__name__}: {(str(e).splitlines() or [''])[0]})")

    lifted_at = lifted.lifted

    def run(*inputs):
        return lifted.with_nones(fast(*[x for i, x in enumerate(inputs) if i not in lifted_at]))

    return run


# moves of a backward graph's saved tensor its CUDA-graph replay follows by capturing again: the
# forward's replay settles within two (its first call runs plain, a kept output captures it once
# more); a saved tensor that keeps moving (the forward runs as captured, or copies that output out)
# is copied in from its third move, since each capture costs milliseconds of host time
# (docs/benchmarks.md, "The backward's replay settles; the RNN wavefront measured")
SAVED_PATIENCE = 2


def replay_patience(gm: torch.fx.GraphModule, lifted: set[int]) -> tuple[int, ...] | None:
    """Per data input of an AOTAutograd backward graph (placeholders `tangents_*` are the
    gradients, the others what the forward saved), how often a CUDA-graph replay captures again
    where the input moved before it copies the input into a buffer of its own (emit/graphs.py,
    `_kw_patience`): a saved tensor moves while the forward's own replay settles (its outputs are
    the forward graph's static buffers from then on), so it is followed SAVED_PATIENCE times
    before it is copied; a gradient is copied from its second move, as any input. None for other
    graphs."""
    names = [str(n.target) for n in gm.graph.nodes if n.op == "placeholder"]
    if not any(name.startswith("tangents") for name in names):
        return None
    return tuple(1 if name.startswith("tangents") else SAVED_PATIENCE for i, name in enumerate(names) if i not in lifted)


def forward_examples(fakes, values) -> list:
    """Real example inputs of an AOTAutograd forward graph: at each position where the graph's own
    input (`values`: the Dynamo graph's parameters, buffers and inputs, AOTAutograd's primals in
    order) has the fake one's shape, strides and dtype, a copy of it, else random values (`_real`).
    The weights and inputs of the call being compiled make the verification inputs drawn near them
    meaningful (independent normal weights grow a transformer's activations past a bf16 softmax's
    range)."""
    from torch._subclasses.fake_tensor import is_fake

    if len(values) != len(fakes):
        values = [None] * len(fakes)
    return [same_strides_copy(v) if isinstance(v, torch.Tensor) and isinstance(x, torch.Tensor) and not is_fake(v)
            and (v.shape, v.stride(), v.dtype, v.device) == (x.shape, x.stride(), x.dtype, x.device) else _real(x)
            for x, v in zip(fakes, values)]


def _real(x):
    """A real tensor like the fake one AOTAutograd passes (shape, dtype, strides; random values:
    only the metadata is an example, fresh inputs are drawn for verification)."""
    if not isinstance(x, torch.Tensor):
        return x
    t = torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device=x.device.type)
    return t.normal_() if t.is_floating_point() else t.zero_()


# ATen's fused backward ops, decomposed (torch._decomp) into the pointwise ops and reductions the
# planner fuses: activation, softmax and norm gradients then join the groups around them
BACKWARD_OPS = ("gelu_backward", "threshold_backward", "sigmoid_backward", "tanh_backward", "silu_backward",
                "hardtanh_backward", "leaky_relu_backward", "hardswish_backward", "hardsigmoid_backward",
                "elu_backward", "softplus_backward", "mish_backward", "_softmax_backward_data",
                "_log_softmax_backward_data", "native_layer_norm_backward", "native_group_norm_backward",
                "native_batch_norm_backward", "mse_loss_backward", "smooth_l1_loss_backward")


def backward_decompositions() -> dict:
    """The decompositions of BACKWARD_OPS that this torch has."""
    from torch._decomp import get_decompositions

    ops = [getattr(torch.ops.aten, name) for name in BACKWARD_OPS if hasattr(torch.ops.aten, name)]
    return get_decompositions(ops)


DEFAULT_TRIALS = 8  # per graph: a model compiles several graphs (two per graph in training)


PARTITIONS = ("recompute", "save")


def backend(partition: str = "recompute", **options) -> Callable:
    """A torch.compile backend optimising each graph with `options` (kernelwright.pipeline.Options;
    budget_trials defaults to DEFAULT_TRIALS per graph). A graph that needs gradients goes through
    AOTAutograd: its forward graph (which also returns what the backward saves) and its backward
    graph are each optimised as an inference graph. `partition` splits the joint graph:
    "recompute" (AOTAutograd's min-cut rematerialisation, as Inductor's: cheap pointwise values
    the backward needs are recomputed there from fewer saved tensors, so the forward writes less
    and the backward's kernels fuse the recomputation) or "save" (every value the backward reads
    is saved by the forward)."""
    from functorch.compile import default_partition, make_boxed_func, min_cut_rematerialization_partition

    if partition not in PARTITIONS:
        raise ValueError(f"partition must be one of {', '.join(PARTITIONS)} (got {partition!r})")
    options = dict(options)
    if "budget_s" not in options:
        options.setdefault("budget_trials", DEFAULT_TRIALS)
    from torch._dynamo.backends.common import aot_autograd

    from kernelwright.plan.fx_attention import sdpa_in_fx

    # A training graph's forward and backward replay as CUDA graphs where measured faster, as any
    # module's forward (emit/graphs.py): autograd lets go of the forward's saved tensors at the
    # backward and of the gradients at the optimizer's zero_grad, so the replays lend them (no
    # copies), and the backward reads the saved tensors where the forward's replay left them.
    # (what autograd.Function returns, as the joint graphs' results are, must not be a view of a
    # value computed inside: autograd refuses in-place changes to such views; plan.rewrites.returned_copies)
    joint = dict(options, view_outputs=False)

    def joint_part(gm: torch.fx.GraphModule, example_inputs, forward: bool = False):
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        near = NEAR  # (verified near the real inputs' values: a backward's saved tensors, the forward's weights)
        if symbolic(example_inputs):  # (specialised at run time, on copies of the call's tensors)
            return make_boxed_func(Specialisations(gm, lambda inputs: _specialised(gm, inputs, [], joint, copy=True,
                                                                                   near=near)))
        if not forward:  # (optimised at its first call; the forward reports its outputs' strides now)
            return make_boxed_func(AtFirstCall(gm, joint, near))
        with unset_fake_temporarily():  # AOTAutograd compiles under its fake-tensor mode
            real = forward_examples(example_inputs, dynamo_inputs[0])
            run = _optimised(gm, real, [], dict(joint, free_layouts=saved_positions(gm)), near=near)
            report_output_strides(run, real)
            return make_boxed_func(run)

    training = aot_autograd(fw_compiler=lambda gm, example_inputs: joint_part(gm, example_inputs, forward=True),
                            bw_compiler=joint_part, decompositions=backward_decompositions(),
                            partition_fn=min_cut_rematerialization_partition if partition == "recompute"
                            else default_partition)

    dynamo_inputs: list = [()]  # the graph's own inputs while AOTAutograd compiles it (its forward's values)

    def compile_graph(gm: torch.fx.GraphModule, example_inputs):
        if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs):
            # by-hand attention as one fused call before autograd splits the graph (its backward
            # then the fused kernel's, nothing of the [.., S, L] scores saved): plan/fx_attention.py
            sdpa_in_fx(gm, options.get("precision", "fp32"))
            # (AOTAutograd's order: aot_module_simplified's parameters, buffers, then the inputs)
            dynamo_inputs[0] = [*dict(gm.named_parameters(remove_duplicate=False)).values(),
                                *dict(gm.named_buffers(remove_duplicate=False)).values(), *example_inputs]
            try:
                return training(gm, example_inputs)
            finally:
                dynamo_inputs[0] = ()
        under = caller_autocast(example_inputs)
        if under is None:
            return _optimised(gm, example_inputs, state_positions(gm, example_inputs), options)
        # an inference graph Dynamo calls under the caller's autocast: optimised, verified and run
        # without it, its casts the bf16 policy's (verified against eager under that autocast)
        device, dtype = under
        if dtype != torch.bfloat16 or options.get("precision") not in (None, "bf16"):
            return _as_captured(gm, f"the caller's {str(dtype).removeprefix('torch.')} autocast is not the "
                                    f"precision policy ({options.get('precision') or 'fp32'})")
        with torch.autocast(device, enabled=False):
            run = _optimised(gm, example_inputs, state_positions(gm, example_inputs), dict(options, precision="bf16"))
        return without_autocast(run, device)

    return compile_graph


def caller_autocast(example_inputs) -> tuple[str, torch.dtype] | None:
    """(device type, dtype) of the autocast the caller has on for the graph's tensors' device, or None."""
    for kind in dict.fromkeys(x.device.type for x in example_inputs if isinstance(x, torch.Tensor)):
        if torch.is_autocast_enabled(kind):
            return kind, torch.get_autocast_dtype(kind)
    return None


def without_autocast(run: Callable, device: str) -> Callable:
    """`run` called with the caller's autocast off on `device` (its casts are its own)."""
    def call(*args):
        with torch.autocast(device, enabled=False):
            return run(*args)
    return call


def saved_positions(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """Positions, among an AOTAutograd forward graph's outputs that are not None (those the
    optimised module returns), of the tensors it saves for the backward: their layout is the
    pipeline's choice (Options.free_layouts), as Inductor's layout optimisation chooses it. Empty
    outside AOTAutograd's compile or where its metadata does not say."""
    context = torch._guards.TracingContext.try_get()
    try:
        saved = context.fw_metadata.tensors_saved_for_backwards_slice
    except (AttributeError, AssertionError, TypeError):
        return ()
    nones, n = none_outputs(gm)
    saved_at = set(range(n)[saved])
    kept = [i for i in range(n) if i not in nones]
    return tuple(k for k, i in enumerate(kept) if i in saved_at)


def report_output_strides(run: Callable, inputs: list) -> None:
    """Tell AOTAutograd the strides `run` (a compiled forward) returns its outputs with, from one
    run on `inputs`: it compiles the backward for saved tensors in those strides
    (TracingContext.output_strides, which Inductor fills the same way)."""
    context = torch._guards.TracingContext.try_get()
    if context is None or context.output_strides is None:
        return
    with torch.no_grad():
        outs = run(*inputs)
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    context.output_strides.extend(tuple(o.stride()) if isinstance(o, torch.Tensor) else None for o in outs)


def _load(out: Path, lifted: Lifted):
    """The module optimised before into `out`, attached to `lifted`, when it passed verification."""
    from kernelwright.emit.module import import_model_new

    try:
        result = json.loads((out / "result.json").read_text())
    except (OSError, ValueError):
        return None
    if not (result.get("verify") or {}).get("passed") or not (out / "model_new.py").is_file():
        return None
    return import_model_new(str(out / "model_new.py")).attach(lifted)


kernelwright_backend = backend()


def register() -> None:
    """Register the backend under "kernelwright" with torch._dynamo (once)."""
    from torch._dynamo import list_backends, register_backend

    if NAME not in list_backends(exclude_tags=()):
        register_backend(kernelwright_backend, name=NAME)
