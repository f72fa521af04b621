"""Capture a problem's forward with `torch.export`, decomposed to core ATen, into a `Graph`.

Capture runs on the meta device by default: no memory is allocated and nothing is computed,
so problems with gigabyte inputs are captured in about a second.
"""
from __future__ import annotations

import contextlib
import io
import operator
import re
import warnings

import torch
from torch.export import ExportGraphSignature
from torch.export.graph_signature import ConstantArgument, InputKind

from kernelwright.capture import cumulative_bn
from kernelwright.capture.recurrent_shapes import shapes_only
from kernelwright.capture.graph import Graph, Input, OpNode, Ref, TensorMeta
from kernelwright.problem import Problem
from kernelwright.problem.load import quiet_torch_logs


class CaptureError(Exception):
    """The program could not be captured; the message says why."""


def tensor_meta(value) -> TensorMeta | None:
    if isinstance(value, torch.Tensor):
        return TensorMeta(tuple(int(s) for s in value.shape), tuple(int(s) for s in value.stride()),
                          str(value.dtype).removeprefix("torch."))
    return None


def _convert(value):
    """FX argument -> plain Python with Refs for node references."""
    if isinstance(value, torch.fx.Node):
        return Ref(value.name)
    if isinstance(value, (list, tuple)):
        return type(value)(_convert(v) for v in value)
    if isinstance(value, dict):
        return {k: _convert(v) for k, v in value.items()}
    return value


# tensors the forward makes from Python data (torch.tensor([...])) are written into the emitted
# forward as literals, so only small ones are accepted
MAX_CONSTANT = 4096
NUMBERS = (bool, int, float)  # user inputs besides tensors: the graph is specialised for their values


def _target_name(target) -> str:
    if target is operator.getitem:
        return "getitem"
    if isinstance(target, torch._ops.OpOverload):
        return f"aten.{target._schema.name.split('::')[-1]}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


def capture(problem: Problem, device: str = "meta", decompose: bool = True) -> Graph:
    """Export `problem`'s model on `device` and return its ATen graph.

    Raises CaptureError naming the reason when torch.export cannot trace the program
    (data-dependent control flow, unsupported Python, non-tensor outputs, ...).
    """
    model = problem.make_model(device)
    inputs = problem.make_inputs(0, device)
    try:
        graph = capture_module(model, inputs, problem.name, decompose)
    except CaptureError as e:
        if device == "meta" and ("meta tensor" in str(e) or ("devices" in str(e) and "meta" in str(e))
                                 or "convert all Tensors to FakeTensors" in str(e)):
            # the forward reads a value (.item()) the meta device does not have, or a tensor a
            # module holds as a plain attribute stays where it was made when the module moves
            # (the CPU, or the GPU for a live module's graph: an AOTAutograd backward's constant,
            # or Dynamo's `torch.tensor(0.5)` of the forward, which export meets as a real tensor
            # among fake ones): trace with data, on that GPU where the error names one
            gpu = re.search(r"\bcuda(?::\d+)?", str(e))
            return capture(problem, gpu.group(0) if gpu else "cpu", decompose)
        raise
    if any(getattr(graph.exported.constants.get(i.fqn), "is_meta", False) for i in graph.inputs if i.kind == "constant"):
        # a tensor the forward makes from Python data (torch.tensor(0.5)) has no value on the meta
        # device: trace again with the model on the CPU
        return capture(problem, "cpu", decompose)
    return graph


def capture_module(model: torch.nn.Module, inputs: list, name: str = "model", decompose: bool = True) -> Graph:
    if any(not isinstance(x, (torch.Tensor, *NUMBERS)) for x in inputs):
        kinds = sorted({type(x).__name__ for x in inputs if not isinstance(x, (torch.Tensor, *NUMBERS))})
        raise CaptureError(f"inputs other than tensors and numbers ({', '.join(kinds)}) are not supported")
    # (torch.export prints the whole graph when tracing fails: the reason reaches the user in one line)
    with warnings.catch_warnings(), quiet_torch_logs(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            # (tensors made in forward land beside the inputs; momentum=None batch norms trace with a
            # tensor factor: capture.cumulative_bn)
            with shapes_only():  # (recurrent ops: capture.recurrent_shapes)
                with torch.device(_device_of(inputs, model)), cumulative_bn.traceable(model):
                    ep = torch.export.export(model, tuple(inputs))
                if decompose:
                    ep = ep.run_decompositions(_decompositions())
        except Exception as e:  # noqa: BLE001 - export raises many types
            raise _export_error(e, "torch.export failed") from e
    try:
        return _to_graph(ep, name, model)
    except CaptureError:
        raise
    except Exception as e:  # noqa: BLE001 - e.g. a size only known from the data (bincount, nonzero)
        raise _export_error(e, "the exported graph cannot be read") from e


def _export_error(e: Exception, what: str) -> CaptureError:
    """The one-line CaptureError for an exception of torch.export (or of reading its graph)."""
    first = (str(e).strip().splitlines() or [""])[0]
    if "data-dependent" in str(e) or "DataDependent" in type(e).__name__:
        return CaptureError("the forward branches on or sizes by tensor values (.item(), a data-dependent "
                            f"condition or size), which torch.export cannot trace: {first[:200]}")
    return CaptureError(f"{what}: {type(e).__name__}: {first[:300]}")


def tensor_attribute(model: torch.nn.Module, fqn: str | None) -> torch.Tensor | None:
    """The tensor at module path `fqn` of `model` that is neither a parameter nor a buffer (None)."""
    if not fqn:
        return None
    *path, leaf = fqn.split(".")
    mod = model
    for part in path:
        mod = mod._modules.get(part) if isinstance(mod, torch.nn.Module) else None
        if mod is None:
            return None
    if not isinstance(mod, torch.nn.Module) or leaf in mod._parameters or leaf in mod._buffers:
        return None
    value = mod.__dict__.get(leaf)
    return value if isinstance(value, torch.Tensor) else None


# Recurrent layers stay one ATen op each: decomposed, a sequence of T steps becomes T copies of
# the cell's ops (thousands of nodes for KernelBench's GRU/LSTM sizes), each a unit to tune, where
# the library runs the whole sequence in one cuDNN call.
RECURRENT = ("gru.input", "gru.data", "lstm.input", "lstm.data", "rnn_tanh.input", "rnn_tanh.data",
             "rnn_relu.input", "rnn_relu.data")


# recurrent layers over a padded (not packed) sequence: (input, hx, params, has_biases, num_layers,
# dropout, train, bidirectional, batch_first). `train` only switches the dropout between layers on,
# so without dropout the layer is captured with train=False: one computation in either training
# mode (one generated forward serves both), and no cuDNN reserve space for a backward that the
# emitted forward never runs (calls needing gradients run the model's own forward).
RECURRENT_INPUT = ("aten.gru.input", "aten.lstm.input", "aten.rnn_tanh.input", "aten.rnn_relu.input")


def output_structure(ep) -> tuple:
    """The structure the exported forward returns its tensors in: (pytree spec of the user output,
    positions of its Nones among the spec's leaves); the graph's outputs are the other leaves, in order."""
    from torch.export.graph_signature import OutputKind

    user = [o.arg for o in ep.graph_signature.output_specs if o.kind == OutputKind.USER_OUTPUT]
    return ep.call_spec.out_spec, tuple(i for i, a in enumerate(user) if isinstance(a, ConstantArgument))


# Attention stays one op: decomposed, F.scaled_dot_product_attention becomes its math form (the
# scores written and read back, a causal mask built from aranges, a guard for fully masked rows),
# where the library computes it in one fused kernel that never writes the scores; by-hand
# attention is turned into this op by plan/attention.py.
KEPT = RECURRENT + ("scaled_dot_product_attention.default",
                    # the CPU attention of an AOTAutograd forward graph: torch's decomposition returns
                    # the attention weights [B, H, L, S] where the op returns its logsumexp [B, H, L]
                    "_scaled_dot_product_flash_attention_for_cpu.default")


def _decompositions():
    table = torch.export.default_decompositions()
    for name in KEPT:
        op, overload = name.split(".")
        packet = getattr(torch.ops.aten, op, None)  # (an op this torch lacks is not in its table either)
        if packet is not None and hasattr(packet, overload):
            table.pop(getattr(packet, overload), None)
    return table


def _device_of(inputs: list, model: torch.nn.Module) -> torch.device:
    for t in list(inputs) + list(model.parameters()):
        if isinstance(t, torch.Tensor):
            return t.device
    return torch.device("cpu")


# A `.to(dtype)` in a forward exports as the copy plus an assertion on the source's dtype and
# device, which export has already checked: kept, it would read the source tensor, so a fused group
# computing that tensor would store it for nothing.
METADATA_CHECKS = frozenset({"aten._assert_tensor_metadata.default"})


def _to_graph(ep, name: str, model: torch.nn.Module | None = None) -> Graph:
    sig: ExportGraphSignature = ep.graph_signature
    params = sig.inputs_to_parameters
    buffers = sig.inputs_to_buffers
    consts = sig.inputs_to_lifted_tensor_constants
    # user inputs in order: a tensor's placeholder name, or a number's (torch.export specialises the
    # graph for the number: its placeholder is unused)
    user_in = [s.arg.name for s in sig.input_specs if s.kind == InputKind.USER_INPUT]
    numbers = {s.arg.name: s.arg.value for s in sig.input_specs
               if s.kind == InputKind.USER_INPUT and isinstance(s.arg, ConstantArgument)}
    inputs: list[Input] = []
    nodes: list[OpNode] = []
    outputs: list[str] = []
    mutations: dict[str, str] = {}
    for n in ep.graph.nodes:
        if n.op == "placeholder":
            meta = tensor_meta(n.meta.get("val"))
            if n.name in params:
                inputs.append(Input(n.name, "param", meta, params[n.name]))
            elif n.name in buffers:
                inputs.append(Input(n.name, "buffer", meta, buffers[n.name]))
            elif n.name in consts and model is not None and tensor_attribute(model, consts[n.name]) is not None:
                # torch.export lifts a module's plain tensor attributes as constants: read from the module
                inputs.append(Input(n.name, "attribute", meta, consts[n.name]))
            elif n.name in consts:
                value = ep.constants.get(consts[n.name])
                if not isinstance(value, torch.Tensor) or value.numel() > MAX_CONSTANT:
                    size = f"{value.numel()} elements" if isinstance(value, torch.Tensor) else type(value).__name__
                    raise CaptureError(f"the forward makes a tensor constant {n.name} from Python data ({size}); "
                                       f"constants up to {MAX_CONSTANT} elements are supported")
                inputs.append(Input(n.name, "constant", meta, consts[n.name]))
            else:
                inputs.append(Input(n.name, "user", None if n.name in numbers else meta,
                                    index=user_in.index(n.name), value=numbers.get(n.name)))
        elif n.op == "call_function":
            val = n.meta.get("val")
            outs = [tensor_meta(v) for v in val] if isinstance(val, (list, tuple)) else [tensor_meta(val)]
            target, args = _target_name(n.target), _convert(n.args)
            if target in METADATA_CHECKS:
                continue
            if target in RECURRENT_INPUT and len(args) == 9 and args[5] == 0:
                args = (*args[:6], False, *args[7:])  # (see RECURRENT_INPUT)
            nodes.append(OpNode(n.name, target, args, _convert(dict(n.kwargs)), outs, fx=n))
        elif n.op == "output":
            results = n.args[0]
            mut = sig.buffers_to_mutate
            written = {**getattr(sig, "user_inputs_to_mutate", {}), **getattr(sig, "parameters_to_mutate", {})}
            for r in results:
                if r is None:  # (a None in the output's structure: see output_structure)
                    continue
                if not isinstance(r, torch.fx.Node):
                    raise CaptureError(f"output {r!r} is not a tensor")
                if r.name in written:  # (the emitted forward writes buffers only)
                    raise CaptureError(f"the forward writes into {written[r.name]} in place; models that change "
                                       "their inputs or parameters are kept as they are")
                if r.name in mut:
                    mutations[r.name] = mut[r.name]
                else:
                    outputs.append(r.name)
        else:
            raise CaptureError(f"unsupported FX node kind {n.op!r} ({n.name})")
    return Graph(name, inputs, nodes, outputs, mutations, exported=ep)
