"""Kernels for single library nodes (pooling, scans, ...): the interface templates implement.

A node template turns one ATen node into a module with a `launch(*inputs)` function that returns
a tuple with one entry per node output (None for outputs nobody reads). The optimizer treats it
like a fusion group: the library call is always a candidate, and the template only wins when it
is verified and faster.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Protocol

from kernelwright.analyze.device import DeviceSpec
from kernelwright.capture.graph import Graph, OpNode, Ref
from kernelwright.space.config import Config


@dataclass
class NodeKernel:
    source: str  # module text: the kernel(s) and `launch`, each argument documented
    inputs: list[str]  # graph values passed to launch(), in order
    outputs: int  # number of entries in the tuple launch() returns (= len(node.outs))


class NodeTemplate(Protocol):
    """Optional methods a template may add: ``absorbed(graph, node)`` -> (nodes, value(s) read,
    value produced) when one kernel also computes neighbouring nodes (a scan's flips, a depthwise
    conv's input cast), and ``seeds(graph, node, spec)`` -> the configs timed first (default:
    [default]).

    `spec` is the device the configs are for (a `DeviceSpec`; None: `device_spec()`, the GPU this
    process sees, or the H200's numbers without one); templates whose schedules do not depend on
    the device ignore it.

    A template whose configs depend on the precision policy (tensor-core matvecs allowed under
    tf32 / bf16 only) sets ``by_policy = True``: its ``space``, ``default`` and ``seeds`` then also
    take ``policy=`` (the policy's name; see `policy_kwargs`)."""

    name: str

    def supports(self, graph: Graph, node: OpNode, used: set[int]) -> str | None:
        """None when the template can compute `node` (outputs `used` are read), else why not."""

    def space(self, graph: Graph, node: OpNode, spec: DeviceSpec | None = None) -> list[Config]:
        """Candidate configs, generated from axes with constraints."""

    def default(self, graph: Graph, node: OpNode, spec: DeviceSpec | None = None) -> Config:
        """The documented heuristic choice (used without a GPU)."""

    def render(self, graph: Graph, node: OpNode, config: dict, used: set[int]) -> NodeKernel:
        """The module text for `config`."""


class OneConfig:
    """A node template with a single config (a library variant): its space is its default,
    `Config.make(name, **CONFIG)`."""

    name: str
    CONFIG: dict

    def space(self, graph: Graph, node: OpNode, spec: DeviceSpec | None = None) -> list[Config]:
        return [self.default(graph, node, spec)]

    def default(self, graph: Graph, node: OpNode, spec: DeviceSpec | None = None) -> Config:
        return Config.make(self.name, **self.CONFIG)


class OneTensorOp:
    """A node template for the ops in `TARGETS` (a `KIND`, for its messages) that read a tensor value
    first: ``supports`` checks that, then asks the template's own ``check`` (same arguments)."""

    TARGETS: Collection[str]
    KIND: str

    def supports(self, graph: Graph, node: OpNode, used: set[int]) -> str | None:
        if node.target not in self.TARGETS:
            return f"{node.target} is not a {self.KIND}"
        if not node.args or not isinstance(node.args[0], Ref):
            return f"the {self.KIND}'s input is not a tensor value"
        return self.check(graph, node, used)

    def check(self, graph: Graph, node: OpNode, used: set[int]) -> str | None:
        raise NotImplementedError


def policy_kwargs(template: NodeTemplate, policy: str | None) -> dict:
    """``{"policy": policy}`` for a template whose configs depend on the precision policy
    (``by_policy``), else nothing: the keyword arguments its space / default / seeds take."""
    return {"policy": policy} if policy is not None and getattr(template, "by_policy", False) else {}


def seeds(template: NodeTemplate, graph: Graph, node: OpNode, spec: DeviceSpec | None = None,
          policy: str | None = None) -> list[Config]:
    """The configs a search times first: the template's ``seeds`` if it has them, else its default
    (`policy`: the precision policy's name, passed to templates that take it)."""
    kw = policy_kwargs(template, policy)
    own = getattr(template, "seeds", None)
    return own(graph, node, spec, **kw) if own is not None else [template.default(graph, node, spec, **kw)]


def absorbed(template: NodeTemplate, graph: Graph, node: OpNode):
    """The template's ``absorbed`` pattern for `node` (nodes, value(s) read, value produced), or
    None (also for a template without that method)."""
    own = getattr(template, "absorbed", None)
    return own(graph, node) if own is not None else None


def used_outputs(graph: Graph, node: OpNode) -> set[int]:
    """Which outputs of `node` are read: getitem indices for tuple outputs, else {0}."""
    if len(node.outs) <= 1:
        return {0}
    used = set()
    for u in graph.users(node.name):
        if u.target == "getitem":
            used.add(int(u.args[1]))
        else:
            return set(range(len(node.outs)))
    if node.name in graph.outputs:
        return set(range(len(node.outs)))
    return used


def templates() -> list[NodeTemplate]:
    """Every node template, in the order template_for tries them. A template module that fails
    to import raises here: a missing template would otherwise only show as slower programs."""
    from kernelwright.codegen.conv_layout import TEMPLATE as conv_layout
    from kernelwright.codegen.triton_attention import TEMPLATE as attention
    from kernelwright.codegen.conv_transpose_forward import TEMPLATE as conv_transpose_forward
    from kernelwright.codegen.triton_depthwise import TEMPLATE as depthwise
    from kernelwright.codegen.triton_layout import TEMPLATE as layout_copy
    from kernelwright.codegen.triton_pool import TEMPLATE as pool
    from kernelwright.codegen.triton_rnn import TEMPLATE as rnn
    from kernelwright.codegen.triton_scan import TEMPLATE as scan
    from kernelwright.codegen.triton_score_attention import TEMPLATE as score_attention
    from kernelwright.codegen.triton_strided_copy import TEMPLATE as strided_copy

    # a depthwise conv gets the direct kernel before the layout variant
    return [pool, scan, depthwise, layout_copy, strided_copy, conv_layout, conv_transpose_forward, rnn, attention, score_attention]


def templates_for(graph: Graph, node: OpNode) -> list[NodeTemplate]:
    """Every template that supports `node`, in template_for's order: each one choice of its unit
    (a transposed convolution's channels-last variant and its forward-convolution form)."""
    used = used_outputs(graph, node)
    return [t for t in templates() if t.supports(graph, node, used) is None]


def template_for(graph: Graph, node: OpNode) -> tuple[NodeTemplate | None, str]:
    """The first template that supports `node`, or None and the reasons."""
    reasons = []
    used = used_outputs(graph, node)
    for t in templates():
        why = t.supports(graph, node, used)
        if why is None:
            return t, ""
        reasons.append(f"{t.name}: {why}")
    return None, "; ".join(reasons)
