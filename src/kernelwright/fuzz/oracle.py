"""The fuzzer's oracle: optimize one KernelBench-format program with kernelwright, then call the
emitted ModelNew the ways users call a module, against the eager Model with the same weights,
on the same inputs and from the same random state (torch.manual_seed before each call).

Checks, each on a fresh pair of modules (so one failure does not carry into the next):

  train    train() mode under no_grad;
  buffers  after that call, every buffer (running statistics, counters) as eager's;
  eval     eval() mode under no_grad, running statistics drawn non-trivially (equal in both);
  batch    the problem module's `batch_size` global set to a second size, inputs drawn again;
  grad     train() mode with gradients on, inputs requiring grad: the outputs, then the input
           and parameter gradients of backward() on a random weighted sum of them; an emitted
           module that raises an exception with a one-line message is `refused` (fine);
  double   both modules .double(), float64 inputs (skipped when eager cannot run so): the
           outputs' dtype and values as eager's.

Eager's result is itself rounded: under a reduced-precision policy (tf32, bf16), and under fp32 in
an ill-conditioned model (a batch norm over two values magnifies float32 rounding a thousandfold).
A result (a buffer, a gradient) off by more than the tolerance still passes when it is no farther
from the eager model run in float64 than twice eager's own distance from it (plus the tolerance);
the float64 run is made only for a result that is off.

Dropout draws its mask from the random state, and a generated kernel may draw differently: in a
program with dropout, train-mode results (train, buffers, grad) are compared only for type,
shape, dtype and finiteness (the check says so), and `batch` and `double` run in eval() mode.
"""
from __future__ import annotations

import contextlib
import copy
import io
import logging
import re
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils import _pytree
from torch.nn.modules.dropout import _DropoutNd

from kernelwright.capture.shapes import dense_permuted
from kernelwright.emit.module import import_model_new, model_new_like
from kernelwright.fuzz.generate import second_batch_size
from kernelwright.pipeline import Options, optimize_problem
from kernelwright.policy import get_policy
from kernelwright.problem import load_problem
from kernelwright.problem.load import output_skeleton

INPUT_SEED = 11  # the inputs of every call
CALL_SEED = 1234  # torch.manual_seed before every call
WEIGHT_SEED = 99  # the weights of the gradient check's weighted sum
TOLERANCE = {"train": 1e-4, "eval": 1e-3, "grad": 1e-3}  # rtol = atol, by the mode a call runs in


@dataclass
class Check:
    """One check's result. `status`: ok | wrong | refused | skipped; `error`: the largest
    absolute difference from eager (None when it is not a number: a dtype, a shape, an
    exception); `detail`: what differed, what was refused or not compared, and which calls ran
    the original forward (the emitted module's own warnings)."""

    name: str
    status: str
    error: float | None = None
    detail: str = ""


@dataclass
class Outcome:
    """One program's result. `status`: ok | wrong (a check is wrong) | failed (optimize raised, or
    no module could be built) | kept (the pipeline kept the original forward, in some mode, and
    every check passed). `reason`: what failed, the first wrong check, or what was kept."""

    path: str
    status: str
    checks: list[Check] = field(default_factory=list)
    reason: str = ""
    kept: str = ""
    optimize_s: float = 0.0
    check_s: float = 0.0

    @property
    def wrong(self) -> list[Check]:
        return [c for c in self.checks if c.status == "wrong"]


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def _one_line(e: BaseException) -> bool:
    """Whether an exception's message is a single clear line (a refusal, not a crash)."""
    text = str(e).strip()
    return bool(text) and "\n" not in text and len(text) <= 300


def _tensors(out) -> list:
    """The leaves of an output (tensors, and whatever else the model returns), in order."""
    return _pytree.tree_leaves(out)


def _memory_order(t: torch.Tensor) -> tuple:
    """The dims of size > 1 from the largest stride to the smallest, and whether the tensor is
    dense (a permutation of a contiguous layout): what a caller's .view(), .is_contiguous() or
    memory-order reads (a dropout mask) see of a layout."""
    dims = [d for d in range(t.dim()) if t.shape[d] > 1]
    order = tuple(sorted(dims, key=lambda d: (-t.stride(d), d)))
    return order, t.numel() == 0 or dense_permuted(t.shape, t.stride())


def _difference(got, want, tol: float, values: bool = True, layout: bool = False) -> tuple[float | None, str] | None:
    """None when `got` matches `want`: the same structure, shapes and dtypes, (with `layout`) the
    same memory order, finite where eager is, and (with `values`) every element within tol + tol *
    |eager| (NaN where eager has NaN); else (the largest absolute difference, or None, and what
    differs)."""
    if output_skeleton(got) != output_skeleton(want):
        return None, f"returns {output_skeleton(got)}, eager {output_skeleton(want)}"
    gots, wants = _tensors(got), _tensors(want)
    if len(gots) != len(wants):
        return None, f"{len(gots)} outputs, eager {len(wants)}"
    worst: tuple[float | None, str] | None = None
    for k, (g, w) in enumerate(zip(gots, wants)):
        at = f"output {k}: " if len(wants) > 1 else ""
        if not isinstance(g, torch.Tensor) or not isinstance(w, torch.Tensor):
            if type(g) is not type(w) or (not isinstance(g, torch.Tensor) and g != w):
                return None, f"{at}{type(g).__name__} {g!r:.40}, eager {type(w).__name__} {w!r:.40}"
            continue
        if g.shape != w.shape:
            return None, f"{at}shape {tuple(g.shape)}, eager {tuple(w.shape)}"
        if g.dtype != w.dtype:
            return None, f"{at}dtype {g.dtype}, eager {w.dtype}"
        if layout and _memory_order(g) != _memory_order(w):
            return None, f"{at}strides {tuple(g.stride())}, eager {tuple(w.stride())}"
        g64, w64 = g.detach().cpu().double(), w.detach().cpu().double()
        if not torch.equal(torch.isfinite(g64), torch.isfinite(w64)):
            return None, f"{at}non-finite values where eager's are finite (or the reverse)"
        if not values:
            continue
        finite = torch.isfinite(w64)
        err = torch.where(finite, (g64 - w64).abs(), torch.zeros_like(g64))
        if g64.numel() and bool((err > tol + tol * w64.abs()).any()):
            e = float(err.max())
            if worst is None or e > (worst[0] or 0):
                biggest = float(w64.abs().max())
                worst = (e, f"{at}max error {e:.3g} (tolerance {tol:g}), eager max |value| {biggest:.3g}")
    return worst


class _Subject:
    """A program and its emitted module on a device, under a precision policy: builds fresh
    (eager, emitted) pairs with the same weights and runs both sides of a call."""

    def __init__(self, problem, module, device: str, policy):
        self.problem, self.module, self.device, self.policy = problem, module, device, policy
        self.warned: list[str] = []
        ref = problem.make_model("meta")
        self.dropout = _has_dropout(ref, problem.source or "")
        self.has_buffers = any(True for _ in ref.buffers())

    def pair(self, training: bool) -> tuple[torch.nn.Module, torch.nn.Module]:
        """(eager Model, emitted ModelNew) in `training` mode, the reference's state loaded into the
        emitted one; in eval mode with non-trivial running statistics."""
        ref = self.problem.in_mode(training).make_model(self.device)
        return ref, model_new_like(self.module, self.problem, ref, self.device)

    def inputs(self, grad: bool = False, dtype: torch.dtype | None = None) -> list:
        xs = self.problem.make_inputs(INPUT_SEED, self.device)
        if dtype is not None:
            xs = [x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in xs]
        if grad:
            xs = [x.requires_grad_() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in xs]
        return xs

    def run_eager(self, model, inputs):
        torch.manual_seed(CALL_SEED)
        with self.policy.active(), self.policy.baseline(self.device):
            return model(*inputs)

    def run_emitted(self, model, inputs):
        """The emitted module's call; its warnings (which calls ran the original forward) are kept."""
        torch.manual_seed(CALL_SEED)
        with self.policy.active(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = model(*inputs)
        self.warned += [str(w.message) for w in caught if "kernelwright" in str(w.message)]
        return out

    def notes(self) -> str:
        """The emitted module's warnings since the last call of notes(), shortened: "original
        forward: <why>" without what the module was specialised for."""
        whys = [re.sub(r" \(specialised for .*\)$", "", m.split(" a call with ", 1)[-1]) for m in self.warned]
        text = "; ".join(f"original forward: {why}" for why in whys)
        self.warned = []
        return text

    def tolerance(self, mode: str) -> float:
        return max(TOLERANCE[mode], self.policy.tol)

    def float64(self, model, inputs):
        """A float64 copy of the eager `model` run on float64 copies of `inputs`, without autocast:
        the yardstick of a result farther from eager's than the tolerance (None where the copy
        cannot run in float64: a forward reaching float32 modules through a closure of the
        original, say; results are then judged against eager alone)."""
        return self._float64_run(copy.deepcopy(model), inputs)[0]

    def float64_buffers(self, inputs) -> dict | None:
        """The buffers a fresh eager model in train() mode, turned float64, holds after one call on
        float64 copies of `inputs`: the yardstick of buffers off by more than the tolerance."""
        model = self.problem.in_mode(True).make_model(self.device)
        _, ok = self._float64_run(model, inputs)
        return dict(model.named_buffers()) if ok else None

    def _float64_run(self, model, inputs):
        """(output, ran) of `model` turned float64 in place, on float64 copies of `inputs`."""
        xs = [x.detach().double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
        torch.manual_seed(CALL_SEED)
        try:
            with torch.no_grad():
                return model.double()(*xs), True
        except Exception:  # noqa: BLE001 - the model's own limits, not the emitted module's
            return None, False


class _BackendSubject(_Subject):
    """A program compiled with torch.compile(backend="kernelwright") instead of an emitted module:
    each pair's second module is a copy of eager's whose forward is compiled with the backend
    (Dynamo's caches reset first, so every pair compiles afresh; the backend's own cache of
    optimised graphs is kept), called as a PyTorch user calls a compiled model: under the
    policy's autocast, as eager."""

    def __init__(self, problem, device: str, policy, budget: int):
        super().__init__(problem, None, device, policy)
        self.budget = budget
        self.kept = ""  # the first graph kept in its captured form, and why

    def pair(self, training: bool) -> tuple[torch.nn.Module, torch.nn.Module]:
        from kernelwright.backend import backend

        torch._dynamo.reset()
        ref = self.problem.in_mode(training).make_model(self.device)
        new = copy.deepcopy(ref)
        new.forward = torch.compile(new.forward, backend=backend(budget_trials=self.budget, precision=self.policy.name),
                                    dynamic=False)
        return ref, new

    def run_emitted(self, model, inputs):
        with self.policy.baseline(self.device):
            return super().run_emitted(model, inputs)

    def notes(self) -> str:
        """The backend's warnings since the last call (graphs kept in their captured form)."""
        text = "; ".join(m.removeprefix("kernelwright: ") for m in dict.fromkeys(self.warned))
        self.kept = self.kept or next((m.removeprefix("kernelwright: ") for m in self.warned if "keeps" in m), "")
        self.warned = []
        return text


def _has_dropout(model: torch.nn.Module, source: str) -> bool:
    """Whether the model may draw a dropout mask: a Dropout module with p > 0, or a functional
    dropout call in its source."""
    if any(isinstance(m, _DropoutNd) and m.p > 0 for m in model.modules()):
        return True
    return re.search(r"(\.|\b)(dropout|alpha_dropout|feature_alpha_dropout)\w*\(", source) is not None


def _max_error(got, want) -> float:
    return max(float((g.detach().cpu().double() - w.detach().cpu().double()).abs().max())
               for g, w in zip(_tensors(got), _tensors(want)) if isinstance(w, torch.Tensor) and w.numel())


def _judge(name: str, s: _Subject, got, want, tol: float, values: bool = True, exact=None) -> Check:
    """The check's result from comparing `got` with eager's `want`; `exact`: the float64 eager
    result, or a function making it (called only for a result off by more than `tol`), against
    which such a result may pass.
    The `train` check also compares memory orders: the pipeline gives the returned values the
    layout eager returns in that call (eager's own layout can change with the mode and with
    gradients: an LSTM's h_n on the CPU)."""
    diff = _difference(got, want, tol, values, layout=name == "train")
    notes = ["" if values else "dropout: values not compared", s.notes()]
    if diff is not None and diff[0] is not None and callable(exact):
        exact = exact()
    if diff is not None and diff[0] is not None and exact is not None:
        mine, eager = _max_error(got, exact), _max_error(want, exact)
        verdict = f"from float64: {mine:.3g}, eager {eager:.3g}"
        if mine <= 2 * eager + tol:
            diff, notes = None, [f"{diff[1]}, within eager's own error ({verdict})"] + notes
        else:
            diff = (diff[0], f"{diff[1]}; {verdict}")
    detail = "; ".join(n for n in notes if n)
    if diff is None:
        return Check(name, "ok", detail=detail)
    error, what = diff
    return Check(name, "wrong", error, "; ".join(n for n in (what, detail) if n))


def _raised(name: str, s: _Subject, e: BaseException, refusable: bool = False) -> Check:
    if refusable and _one_line(e):
        return Check(name, "refused", detail=first_line(e))
    return Check(name, "wrong", detail=f"raised {first_line(e)}" + (f"; {s.notes()}" if s.warned else ""))


def check_train(s: _Subject) -> list[Check]:
    """train() under no_grad, then the buffers both calls left."""
    ref, new = s.pair(True)
    with torch.no_grad():
        want = s.run_eager(ref, s.inputs())
        try:
            got = s.run_emitted(new, s.inputs())
        except Exception as e:  # noqa: BLE001 - the emitted module's failure is a finding
            return [_raised("train", s, e), Check("buffers", "skipped", detail="the train call raised")]
    values = not s.dropout
    tol = s.tolerance("train")
    result = [_judge("train", s, got, want, tol, values, lambda: s.float64(ref, s.inputs()))]
    if not s.has_buffers:
        return result + [Check("buffers", "skipped", detail="no buffers")]
    mine = dict(new.named_buffers())
    exact: dict | None = None
    notes = [] if values else ["dropout: values not compared"]
    for name, buf in ref.named_buffers():
        if name not in mine:
            return result + [Check("buffers", "wrong", detail=f"{name} missing")]
        diff = _difference(mine[name], buf, tol, values)
        if diff is None:
            continue
        if diff[0] is not None and buf.is_floating_point():
            exact = s.float64_buffers(s.inputs()) if exact is None else exact
            if exact is not None and name in exact:
                m, e = _max_error(mine[name], exact[name]), _max_error(buf, exact[name])
                verdict = f"from float64: {m:.3g}, eager {e:.3g}"
                if m <= 2 * e + tol:
                    notes.append(f"{name}: {diff[1]}, within eager's own error ({verdict})")
                    continue
                diff = (diff[0], f"{diff[1]}; {verdict}")
        return result + [Check("buffers", "wrong", diff[0], f"{name}: {diff[1]}")]
    return result + [Check("buffers", "ok", detail="; ".join(notes))]


def _compare(name: str, s: _Subject, training: bool, tol_mode: str) -> Check:
    """One call of a fresh pair in `training` mode under no_grad: the emitted module against eager
    (and against the model in float64, for reduced-precision policies)."""
    ref, new = s.pair(training)
    with torch.no_grad():
        try:
            want = s.run_eager(ref, s.inputs())
        except Exception as e:  # noqa: BLE001 - e.g. a model that holds a state of its own batch size
            return Check(name, "skipped", detail=f"the model itself fails: {first_line(e)}")
        try:
            got = s.run_emitted(new, s.inputs())
        except Exception as e:  # noqa: BLE001
            return _raised(name, s, e)
    return _judge(name, s, got, want, s.tolerance(tol_mode), exact=lambda: s.float64(ref, s.inputs()))


def check_eval(s: _Subject) -> Check:
    """eval() under no_grad with non-trivial running statistics."""
    return _compare("eval", s, False, "eval")


def _free_mode(s: _Subject) -> str:
    """The mode whose values can be compared: train, or eval in a program with dropout."""
    return "eval" if s.dropout else "train"


def check_batch(s: _Subject) -> Check:
    """A second batch size: the problem module's `batch_size` global changed, inputs drawn again."""
    module = s.problem._module
    if module is None or not isinstance(getattr(module, "batch_size", None), int):
        return Check("batch", "skipped", detail="no batch_size global")
    mode, size = _free_mode(s), module.batch_size
    module.batch_size = second_batch_size(size)
    try:
        c = _compare("batch", s, mode == "train", mode)
    finally:
        module.batch_size = size
    c.detail = "; ".join(n for n in (f"{mode}, batch_size {second_batch_size(size)}", c.detail) if n)
    return c


def _weighted_sum(out) -> torch.Tensor:
    """A random weighted sum of the floating outputs (weights drawn under WEIGHT_SEED)."""
    torch.manual_seed(WEIGHT_SEED)
    total = 0
    for o in _tensors(out):
        if isinstance(o, torch.Tensor) and o.is_floating_point():  # (drawn in float32: a float64 run weighs alike)
            total = total + (o * torch.randn(o.shape, dtype=torch.float32, device=o.device).to(o.dtype)).sum()
    return total


def _float64_grads(model: torch.nn.Module, inputs: list) -> dict | None:
    """The gradients ("input k" / "parameter name") of the weighted sum of a float64 copy of the
    eager `model` (taken before its call) on float64 copies of `inputs`, without autocast: the
    yardstick of a gradient farther from eager's than the tolerance (None where the copy cannot
    run or differentiate in float64)."""
    m = copy.deepcopy(model).double()
    xs = [x.detach().double().requires_grad_() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
          for x in inputs]
    torch.manual_seed(CALL_SEED)
    try:
        with torch.enable_grad():
            _weighted_sum(m(*xs)).backward()
    except Exception:  # noqa: BLE001 - the model's own limits, not the compiled one's
        return None
    grads = {f"input {k}": x.grad for k, x in enumerate(xs) if isinstance(x, torch.Tensor) and x.requires_grad}
    grads.update({f"parameter {n}": p.grad for n, p in m.named_parameters()})
    return grads


def check_grad(s: _Subject) -> Check:
    """train() with gradients: outputs, then input and parameter gradients of a weighted sum. A
    gradient off by more than the tolerance passes when it is no farther from the float64 model's
    than twice eager's own distance from it (plus the tolerance), as outputs do: a gradient through
    a norm of a nearly constant row is rounding noise magnified a hundredfold in eager too."""
    ref, new = s.pair(True)
    before = copy.deepcopy(ref)  # (the float64 yardstick starts from the weights and buffers of the call)
    tol, values = s.tolerance("grad"), not s.dropout
    xs_ref, xs_new = s.inputs(grad=True), s.inputs(grad=True)
    with torch.enable_grad():
        try:
            want = s.run_eager(ref, xs_ref)
        except Exception as e:  # noqa: BLE001 - eager itself cannot (a forward writing into its input)
            return Check("grad", "skipped", detail=f"eager raises with gradients: {first_line(e)}")
        try:
            got = s.run_emitted(new, xs_new)
        except Exception as e:  # noqa: BLE001
            return _raised("grad", s, e, refusable=True)
        c = _judge("grad", s, got, want, tol, values, exact=lambda: s.float64(before, s.inputs()))
        if c.status != "ok":
            return c
        needs = [isinstance(o, torch.Tensor) and o.requires_grad for o in _tensors(want)]
        has = [isinstance(o, torch.Tensor) and o.requires_grad for o in _tensors(got)]
        if needs != has:
            return Check("grad", "wrong", detail="the outputs that require grad differ from eager's (gradients dropped)")
        if not any(needs):  # (an argmin, a comparison: eager's outputs have no gradient either)
            return Check("grad", "ok", detail="no output has a gradient in eager")
        try:
            _weighted_sum(want).backward()
        except Exception as e:  # noqa: BLE001 - e.g. an in-place add into a value its backward needs
            return Check("grad", "skipped", detail=f"eager's backward raises: {first_line(e)}")
        try:
            _weighted_sum(got).backward()
        except Exception as e:  # noqa: BLE001
            return Check("grad", "wrong", detail=f"backward raised {first_line(e)}")
    pairs = [(f"input {k}", a.grad, b.grad) for k, (a, b) in enumerate(zip(xs_new, xs_ref))
             if isinstance(b, torch.Tensor) and b.requires_grad]
    mine = dict(new.named_parameters())
    pairs += [(f"parameter {n}", mine[n].grad if n in mine else None, p.grad) for n, p in ref.named_parameters()]
    exact: dict | None = None
    tried = False  # (the float64 gradients: computed once, for the first gradient that is off)
    notes = [c.detail] if c.detail else []
    for what, g, w in pairs:
        if w is None:
            continue
        if g is None:
            return Check("grad", "wrong", detail=f"no gradient for {what} (gradients dropped)")
        diff = _difference(g, w, tol, values)
        if diff is not None and diff[0] is not None:
            if not tried:
                exact, tried = _float64_grads(before, s.inputs()), True
            e = (exact or {}).get(what)
            if e is not None:
                err, eager_err = _max_error(g, e), _max_error(w, e)
                verdict = f"from float64: {err:.3g}, eager {eager_err:.3g}"
                if err <= 2 * eager_err + tol:
                    notes.append(f"gradient of {what}: {diff[1]}, within eager's own error ({verdict})")
                    continue
                diff = (diff[0], f"{diff[1]}; {verdict}")
        if diff is not None:
            return Check("grad", "wrong", diff[0], f"gradient of {what}: {diff[1]}")
    return Check("grad", "ok", detail="; ".join(notes))


def check_double(s: _Subject) -> Check:
    """Both modules .double() with float64 inputs: dtype and values as eager's."""
    mode = _free_mode(s)
    ref, new = s.pair(mode == "train")
    ref.double(), new.double()
    with torch.no_grad():
        try:
            want = s.run_eager(ref, s.inputs(dtype=torch.float64))
        except Exception as e:  # noqa: BLE001 - the model does not allow float64
            return Check("double", "skipped", detail=f"eager cannot run in float64: {first_line(e)}")
        try:
            got = s.run_emitted(new, s.inputs(dtype=torch.float64))
        except Exception as e:  # noqa: BLE001
            return _raised("double", s, e)
    c = _judge("double", s, got, want, s.tolerance(mode))
    c.detail = "; ".join(n for n in (mode, c.detail) if n)
    return c


def kept_original(result: dict, model_new: Path) -> str:
    """Why the emitted module runs the original forward, in some mode ("" when it does not):
    a generated forward failed verification or lost to eager, capture failed, or the module's
    header says so."""
    records = result.get("modes") or {"": result}
    why = []
    for mode, r in records.items():
        at = f"{mode}: " if mode else ""
        if r.get("verify_fallback"):
            why.append(f"{at}generated forward failed verification")
        if r.get("whole_model_fallback"):
            why.append(f"{at}generated forward slower than eager")
        if r.get("capture", "ok") != "ok":
            why.append(f"{at}capture failed: {str(r['capture']).splitlines()[0][:120]}")
    if not why and model_new.exists():
        for line in model_new.read_text().splitlines():
            if not line.startswith("#"):
                break
            if "original forward" in line:
                why.append(line.lstrip("# ").strip())
    return "; ".join(dict.fromkeys(why))


def _verify_failure(result: dict) -> str:
    """The pipeline's own verification failure, in a line, for a kept program."""
    for mode, r in (result.get("modes") or {"": result}).items():
        v = r.get("verify_fallback") or {}
        if v:
            return f"{mode or 'model'}: {v.get('reason') or v.get('failed_check') or 'failed'}"
    return ""


QUIET_LOGGERS = ("torch.fx.experimental.symbolic_shapes", "torch._subclasses.fake_tensor", "torch._dynamo",
                 "torch.export", "torch._export")


@contextlib.contextmanager
def _quiet():
    """Optimize without its warnings (the verifier's calls of candidates warn too), torch's export
    logs and stderr (a failed torch.export prints the graph there): the run's lines stay one per
    program."""
    loggers = [logging.getLogger(n) for n in QUIET_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def check(path: str | Path, device: str = "cpu", precision: str = "fp32", budget: int = 2,
          work: Path | None = None, small: bool = False, no_library: bool = False, backend: bool = False) -> Outcome:
    """Optimize the program at `path` (into `work`, a temporary folder when None; with `small`, its
    SMALL size overrides applied; with `no_library`, every unit that has a generated kernel ships it,
    so the generated convolutions and fused pairs are what the checks see) and run every check on the
    emitted module; see the module docstring. With `backend`, the checks call the model compiled
    with torch.compile(backend="kernelwright") instead (`check_backend`)."""
    policy = get_policy(precision)
    started = time.time()
    problem = load_problem(path, small=small)
    if backend:
        return check_backend(path, problem, device, policy, budget)
    temp = None if work is not None else Path(tempfile.mkdtemp(prefix="kw_fuzz_"))
    out_dir = Path(work) if work is not None else temp
    try:
        try:
            with _quiet():
                result = optimize_problem(problem, out_dir, Options(budget_trials=budget, precision=precision,
                                                                    device=device, small=small, no_library=no_library,
                                                                    log=lambda s: None))
        except Exception as e:  # noqa: BLE001 - the finding
            return Outcome(str(path), "failed", reason=f"optimize raised {first_line(e)}",
                           optimize_s=time.time() - started)
        optimize_s = time.time() - started
        try:
            module = import_model_new(out_dir / "model_new.py")
            subject = _Subject(problem, module, device, policy)
            subject.pair(True)
        except Exception as e:  # noqa: BLE001
            return Outcome(str(path), "failed", reason=f"no module: {first_line(e)}", optimize_s=optimize_s)
        checks = check_train(subject) + [check_eval(subject), check_batch(subject), check_grad(subject),
                                         check_double(subject)]
        kept = kept_original(result, out_dir / "model_new.py")
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
    outcome = Outcome(str(path), "ok", checks, kept=kept, optimize_s=optimize_s,
                      check_s=time.time() - started - optimize_s)
    if outcome.wrong:
        first = outcome.wrong[0]
        outcome.status, outcome.reason = "wrong", f"{first.name}: {first.detail}"
    elif kept:
        outcome.status, outcome.reason = "kept", kept
        failure = _verify_failure(result)
        if failure:
            outcome.reason += f" ({failure})"
    return outcome


def check_backend(path, problem, device: str, policy, budget: int) -> Outcome:
    """Every check of the module docstring on the program compiled with the torch.compile backend
    (`_BackendSubject`): its inference graphs, and with gradients AOTAutograd's forward and
    backward graphs, each optimised and verified by the backend. `kept`: a graph the backend
    kept in its captured form, and why."""
    started = time.time()
    subject = _BackendSubject(problem, device, policy, budget)
    try:
        with _quiet():
            checks = check_train(subject) + [check_eval(subject), check_batch(subject), check_grad(subject),
                                             check_double(subject)]
    finally:
        torch._dynamo.reset()
    outcome = Outcome(str(path), "ok", checks, kept=subject.kept, check_s=time.time() - started)
    if outcome.wrong:
        first = outcome.wrong[0]
        outcome.status, outcome.reason = "wrong", f"{first.name}: {first.detail}"
    elif subject.kept:
        outcome.status, outcome.reason = "kept", subject.kept
    return outcome
