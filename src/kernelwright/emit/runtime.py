"""What an emitted model_new.py runs at call time (plain Python over torch; no kernelwright import).

Every emitted module carries a copy of this file as kernels/_runtime.py (emit/module.py). Its
generated forwards are specialised for one call: `Specialised.forward` runs one of them for a call
like that one and the model's original forward, with a warning once per reason, for any other
(README, "How calls behave"). It also holds the helpers a generated forward's body calls
(`constant`, `causal_or_mask`) and `attach` for modules of the Python API.
"""
import copy
import functools
import inspect
import operator
import types
import warnings
import weakref
from typing import Callable, NamedTuple

import torch

_training, _requires_grad = operator.attrgetter("training"), operator.attrgetter("requires_grad")
_dtype = operator.attrgetter("dtype")


class Forward(NamedTuple):
    """One generated forward. `tag` names it (its training mode); `flags`: the training flags of
    the mode-dependent submodules it answers for (one tuple per mode it was captured and verified
    in); `tensors(module)` returns the parameters and buffers it reads, whose dtypes must be
    `dtypes`; `forward(module, *args)` runs it. `shapes`: (position, shape, strides) of the tensor
    attributes among them, whose sizes must stay the specialised ones.
    A forward that updates buffers is given as `compute(module, *args)` -> (result, new values) and
    `commit(module, *new values)`, which writes them in place (kept apart so that a CUDA-graph
    replay of `compute` can be issued before its state is checked and the update made only once
    the state holds)."""

    tag: str
    flags: list
    tensors: Callable
    dtypes: tuple
    forward: Callable | None = None
    compute: Callable | None = None
    commit: Callable | None = None
    shapes: tuple = ()


class Fallback:
    """A generated forward's answer when the module's parameters differ from the specialised ones."""

    def __init__(self, why):
        self.why = why


def mode_name(flags):
    return "train" if all(flags) else "eval" if not any(flags) else "mixed"


def _on_the_inputs_device(run, tensors):
    """`run` on the GPU its tensor arguments are on: generated kernels launch on the current
    device (as Triton's do), which need not be the inputs' (a model moved to cuda:1, called without
    torch.cuda.set_device). A Fallback when the module's GPU tensors are on another GPU than the inputs
    (the original forward then raises eager's own error)."""
    current = torch.cuda.current_device

    def on_device(module, args):
        at = next((a.get_device() for a in args if isinstance(a, torch.Tensor)), -1)
        state = tensors(module)
        if next((t.get_device() for t in state if t.is_cuda), at) != at:
            return Fallback("parameters on another device than the inputs")
        if at < 0 or at == current():
            return run(module, args, state)
        with torch.cuda.device(at):
            return run(module, args, state)
    return on_device


def _composed(compute, commit):
    def forward(module, *args):
        out, new = compute(module, *args)
        commit(module, *new)
        return out
    return forward


class Specialised:
    """The call guard of an emitted module.

    `original`: the model's own forward (None: the module's class's, for attach()); `policy`: the
    precision policy (under "bf16" the original forward runs in bf16 autocast unless the caller
    chose an autocast); `device`: the device type the kernels run on; `args`: (shape, strides,
    dtype) of each positional tensor argument the forwards were specialised for, ("=", value) of
    a number (the call must pass that number); `mode_modules`: the
    submodules whose result depends on their training flag; `forwards`: the generated forwards
    (Forward); `graphs`: the CUDA-graph replay module
    (kernels/_graphs.py) when the replay ships, else None (the replay is then loaded from
    kernelwright when a module's `_kw_cuda_graphs` is set); `result`: where the model returns its
    tensors in dicts, lists or nested tuples, the function that builds that structure from the
    generated forward's flat tuple (None: the forward returns the model's result as it is).

    `forward` is the module's forward; `warned` the reasons it ran the original forward for."""

    def __init__(self, original, policy, device, args, mode_modules=(), forwards=None, graphs=None, result=None):
        self.original_forward, self.policy, self.device, self.result = original, policy, device, result
        self.args, self.mode_modules = tuple(args), tuple(mode_modules)
        self.forwards = list(forwards or ())
        self.graphs = graphs
        self.warned = set()
        self._signatures = {}
        self.forward = self._make_forward()

    # -- why a call is not the specialised one -------------------------------------------------
    def positional(self, module, args, kwargs):
        """The call's arguments by position, where the forward's signature binds each keyword to a
        parameter after the positional ones (`model(x, mask=m)` is `model(x, m)`); None where it
        does not (a keyword of `**kwargs`, a parameter skipped before a later one given)."""
        forward = self.original_forward or type(module).forward
        sig = self._signatures.get(forward)
        if sig is None:
            try:
                sig = self._signatures[forward] = inspect.signature(forward)
            except (TypeError, ValueError):
                return None
        try:
            bound = sig.bind(module, *args, **kwargs)
        except TypeError:
            return None
        return bound.args[1:] if not bound.kwargs else None

    def call_mismatch(self, args, kwargs):
        """Why this call differs from the specialised one (None: it does not)."""
        expected, device = self.args, self.device
        if kwargs:
            return "keyword arguments " + ", ".join(sorted(kwargs))
        if len(args) != len(expected):
            return f"{len(args)} positional arguments (specialised for {len(expected)})"
        for i, (a, spec) in enumerate(zip(args, expected)):
            if spec[0] == "=":  # a number the forward was specialised for
                if type(a) is not type(spec[1]) or a != spec[1]:
                    return f"argument {i} is {a!r} (specialised for {spec[1]!r})"
                continue
            shape, stride, dtype = spec
            if not isinstance(a, torch.Tensor):
                return f"argument {i} is a {type(a).__name__}"
            if a.shape != shape or a.dtype != dtype or a.device.type != device or a.stride() != stride:
                return (f"argument {i} is {a.dtype} {tuple(a.shape)} strides {a.stride()} on {a.device.type} "
                        f"(specialised for {dtype} {tuple(shape)} strides {stride} on {device})")
        if torch.is_autocast_enabled(device):
            return "the caller's autocast"
        if torch.is_grad_enabled() and any(getattr(a, "requires_grad", False) for a in args):
            return "gradients (an input requires grad)"
        return None

    @staticmethod
    def params_mismatch(tensors, dtypes, shapes=()):
        """Why the module's parameters, buffers and tensor attributes differ from the specialised
        ones (None: they do not)."""
        if tuple(map(_dtype, tensors)) != dtypes:
            return "parameters of another dtype"
        for k, shape, stride in shapes:
            if tuple(tensors[k].shape) != shape or tensors[k].stride() != stride:
                return f"a tensor attribute of shape {tuple(tensors[k].shape)} (specialised for {shape})"
        if torch.is_grad_enabled() and any(map(_requires_grad, tensors)):
            return "gradients (parameters require grad)"
        return None

    def mode(self, module):
        """The training flags of the mode-dependent submodules (the key of a generated forward)."""
        mods = module.__dict__.get("_kw_mode_mods")
        if mods is None:
            mods = module.__dict__["_kw_mode_mods"] = [module.get_submodule(name) for name in self.mode_modules]
        return tuple(map(_training, mods))

    def warn_once(self, why):
        if why not in self.warned:
            self.warned.add(why)
            # (the caller's line: above forward, nn.Module's _call_impl and _wrapped_call_impl)
            warnings.warn(f"kernelwright: running the original forward for a call with {why}", stacklevel=5)

    def original(self, module, args, kwargs):
        """The model's own forward, as eager PyTorch runs it (under the bf16 policy in bf16
        autocast, unless the caller chose an autocast)."""
        forward = self.original_forward or type(module).forward
        if self.policy == "bf16" and not torch.is_autocast_enabled(self.device):
            with torch.autocast(device_type=self.device, dtype=torch.bfloat16):
                return forward(module, *args, **kwargs)
        return forward(module, *args, **kwargs)

    # -- the forward -----------------------------------------------------------------------------
    def _make_forward(self):
        """The module's forward: the generated forward of its training mode for a specialised call,
        the original forward for any other. A closure over its tables (host time per call)."""
        runs = {}
        for f in self.forwards:
            runs.update(dict.fromkeys(map(tuple, f.flags), self._make_run(f, self.result)))
        call_mismatch, mode, warn_once, original = self.call_mismatch, self.mode, self.warn_once, self.original
        positional = self.positional
        if not runs:
            def forward(self, *args, **kwargs):
                return original(self, args, kwargs)
            return forward

        def forward(self, *args, **kwargs):
            if kwargs and (by_position := positional(self, args, kwargs)) is not None:
                args, kwargs = by_position, {}
            why = call_mismatch(args, kwargs)
            if why is None:
                flags = mode(self)
                run = runs.get(flags)
                if run is None:
                    why = f"the module in {mode_name(flags)} mode {flags} (no generated forward for it)"
                else:
                    out = run(self, args)
                    if type(out) is not Fallback:
                        return out
                    why = out.why
            warn_once(why)
            return original(self, args, kwargs)
        return forward

    def _make_run(self, f: Forward, result=None):
        """`f` on a specialised call's `args`; a Fallback when the parameters differ. Replayed as a
        CUDA graph when the module's `_kw_cuda_graphs` is set, under no_grad, outside torch.compile.
        `result` (see Specialised) builds the model's output structure from what `f` returns."""
        if result is not None:
            run = self._make_run(f)
            return lambda module, args: out if type(out := run(module, args)) is Fallback else result(out)
        tensors, dtypes, tag, commit, shapes = f.tensors, f.dtypes, f.tag, f.commit, f.shapes
        forward = f.forward if f.forward is not None else _composed(f.compute, f.commit)
        first = f.compute if f.commit is not None else forward  # what the graph captures
        params_mismatch, graphed = self.params_mismatch, self._graphed
        partial = functools.partial

        def run(module, args, state=None):
            why = params_mismatch(tensors(module) if state is None else state, dtypes, shapes)
            if why is not None:
                return Fallback(why)
            if module._kw_cuda_graphs and not torch.is_grad_enabled() and not torch.compiler.is_compiling():
                g = graphed()
                read = partial(tensors, module)
                return g.graphed(module, tag, partial(first, module), args, lambda: g.stamp(*read()), read,
                                 None if commit is None else partial(commit, module))
            return forward(module, *args)
        if self.device != "cuda":
            return run
        return _on_the_inputs_device(run, tensors)

    def _graphed(self):
        """The CUDA-graph replay module: kernels/_graphs.py when it ships, else kernelwright's own
        (a module whose replay was not chosen, timed replayed by kernelwright)."""
        if self.graphs is None:
            try:
                from kernelwright.emit import graphs
            except ImportError:
                raise RuntimeError("this module's forward does not replay CUDA graphs (kernels/_graphs.py "
                                   "is not shipped): leave _kw_cuda_graphs False") from None
            self.graphs = graphs
        return self.graphs

    def graphs_of(self, module):
        """The CUDA-graph captures of `module`'s forward, by signature ({} before any)."""
        return self.graphs.graphs_of(module) if self.graphs is not None else {}

    # -- modules of the Python API ---------------------------------------------------------------
    ATTACHED = ("forward", "_kw_cuda_graphs", "_kw_mode_mods", "__getstate__", "__deepcopy__")

    def attach(self, model, cuda_graphs=False):
        """`model` running this forward (its parameters and buffers are used as they are); it
        pickles without it (an unpickled module runs its own class's forward) and deep-copies with it."""
        model.__dict__["_kw_cuda_graphs"] = cuda_graphs
        model.__dict__["forward"] = types.MethodType(self.forward, model)
        model.__dict__["__getstate__"] = types.MethodType(self._detached_state, model)
        model.__dict__["__deepcopy__"] = types.MethodType(functools.partial(self._deepcopy, cuda_graphs=cuda_graphs),
                                                          model)
        return model

    def _detached_state(self, model):
        """`model`'s attributes without the attached forward: what pickling keeps."""
        state = torch.nn.Module.__getstate__(model).copy()
        for name in self.ATTACHED:
            state.pop(name, None)
        return state

    def _deepcopy(self, model, memo, cuda_graphs):
        """A deep copy of an attached module, attached too."""
        new = type(model).__new__(type(model))
        memo[id(model)] = new
        new.__dict__.update(copy.deepcopy(self._detached_state(model), memo))
        return self.attach(new, cuda_graphs)


# -- helpers of the generated forwards' bodies --------------------------------------------------

_CONSTANTS = {}  # (name, device) -> the tensor


def constant(name, value, dtype, device):
    """A tensor the original forward made from Python data (torch.tensor(...)), made once per
    device and reused (so a captured CUDA graph keeps reading the same one)."""
    key = (name, device)
    t = _CONSTANTS.get(key)
    if t is None:
        t = _CONSTANTS[key] = torch.tensor(value, dtype=dtype, device=device)
    return t


def eager_layout(t, stride):
    """A returned tensor in the strides the original forward returns it with (a kernel or library
    call may have computed it in another memory order, channels-last say): copied only where the
    order differs, so callers' .view(), .is_contiguous() and memory-order reads see eager's layout."""
    if isinstance(t, torch.Tensor) and t.stride() != stride and t.dim() == len(stride) and any(
            n > 1 and a != b for n, a, b in zip(t.shape, t.stride(), stride)):
        return torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device).copy_(t)
    return t


_CAUSAL = {}  # id(mask) -> (weak reference to it, its version, whether it is the causal mask)


def causal_or_mask(mask, q, k, dropout_p):
    """SDPA's (attn_mask, dropout_p, is_causal) for a boolean mask computed from weights alone:
    (None, dropout_p, True) when it is the lower-triangular mask of q's and k's lengths (what
    is_causal=True means; SDPA then skips the masked half), else (mask, dropout_p, False). The
    check (one comparison on the GPU) runs once per mask tensor and version."""
    hit = _CAUSAL.get(id(mask))
    if hit is None or hit[0]() is not mask or hit[1] != mask._version:
        L, S = q.shape[-2], k.shape[-2]
        causal = (mask.dtype == torch.bool and tuple(mask.shape[-2:]) == (L, S) and torch.equal(
            mask, torch.ones(L, S, dtype=torch.bool, device=mask.device).tril().expand(mask.shape)))
        for key in [key for key, entry in _CAUSAL.items() if entry[0]() is None]:
            del _CAUSAL[key]  # masks gone since
        hit = _CAUSAL[id(mask)] = (weakref.ref(mask), mask._version, causal)
    return (None, dropout_p, True) if hit[2] else (mask, dropout_p, False)
