"""A generated forward replayed as CUDA graphs (plain Python over torch; no kernelwright import).

An emitted module whose forward ships replayed carries a copy of this file as kernels/_graphs.py
(emit/module.py); the runtime (kernels/_runtime.py) calls `graphed` for calls made under no_grad
on CUDA inputs. What a capture depends on and when it is replayed: `graphed`.
"""
import operator
import warnings
import weakref

import torch

_ptr, _version, _dtype = torch.Tensor.data_ptr, operator.attrgetter("_version"), operator.attrgetter("dtype")


def stamp(*params):
    """Identity of the parameters and buffers (address, version, dtype): a CUDA-graph capture is
    valid while it holds. A change through `.data` moves none of it, which is safe: a replay reads
    the parameters' memory as it is then, and nothing computed from them is kept between calls."""
    # (addresses are unique across devices)
    return (*map(_ptr, params), *map(_version, params), *map(_dtype, params))


class Capture:
    """One capture of a forward.

    graph: the CUDA graph (None: the forward could not be captured); replay: its replay method;
    inputs: buffers of ours the graph reads its tensor inputs from, each call copying its inputs
    into them, or None when the graph reads the tensors it was captured on where they were: `ptrs`,
    their addresses (a call passing tensors at those addresses replays with no copy); outputs: the
    tensors each replay writes; lend: when calls return those outputs themselves, each output's
    storage use count while nothing outside holds it (replaying is safe while every output is back
    to it; `storages` are the addresses of those storages), None when calls return copies; single:
    the forward returns one bare tensor; state: the global switches and the parameters' and
    buffers' identity (address, version, dtype) the capture is valid for; reads: what the graph
    reads besides its inputs (the parameters and buffers), held so that a replay never reads freed
    memory, even one made before the state is checked (see `graphed`); writes: the replay method
    of a second graph, the forward's commit (its buffer updates from the first graph's tensors),
    replayed once the state is found unmoved (None: no commit); new: the first graph's tensors it
    reads; waits: calls that waited for the GPU (no capture: see `graphed`)."""

    def __init__(self, graph=None, inputs=None, ptrs=(), outputs=(), lend=None, single=True, state=None,
                 reads=None, writes=None, new=None, waits=0):
        self.waits = waits
        self.graph, self.inputs, self.ptrs, self.outputs = graph, inputs, ptrs, outputs
        self.lend, self.single, self.state, self.reads = lend, single, state, reads
        self.writes, self.new = (writes.replay if writes is not None else None), new
        self.replay = graph.replay if graph is not None else None
        self.storages = [o.untyped_storage()._cdata for o in outputs] if lend is not None else None


PER_MODULE = 8  # signatures kept per module; all captures are dropped past this
# module -> {signature: Capture}, kept outside the module: copying or pickling a module never
# meets a CUDA graph (a copy captures its own on its first calls)
_GRAPHS = weakref.WeakKeyDictionary()


def graphs_of(module):
    """The captures of `module`'s forward, by signature (empty before its first graphed call)."""
    return _GRAPHS.get(module, {})


_VALUES = (bool, int, float, str, type(None))


def signature(args):
    """What a capture depends on besides the weights and the global switches: each argument's
    shape, strides, dtype and device (other arguments by type and value); None when an argument
    cannot be part of a key."""
    key = []
    for a in args:
        if isinstance(a, torch.Tensor):
            key += (a.shape, a.stride(), a.dtype, a.device)
        elif isinstance(a, _VALUES):
            key += (type(a), a)
        else:
            return None
    return tuple(key)


def capturable(args):
    """Whether a forward on `args` can be captured: CUDA tensors (at least one) in a layout our
    buffers can hold (contiguous or channels-last), other arguments plain values."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return bool(tensors) and all(a.device.type == "cuda" and (
        a.is_contiguous() or a.is_contiguous(memory_format=torch.channels_last)) for a in tensors)


def _switch_readers():
    """Readers of the global state a capture bakes in: autocast, inference mode, and the switches
    that choose library kernels (TF32, reduced-precision reductions, determinism). torch's own
    getters where it has them (a few times cheaper than the torch.backends properties)."""
    C = torch._C
    names = ("_get_cublas_allow_tf32", "_get_cudnn_allow_tf32", "_get_cublas_allow_bf16_reduced_precision_reduction",
             "_get_cublas_allow_fp16_reduced_precision_reduction", "_get_deterministic_algorithms",
             "_get_cudnn_deterministic")
    if all(hasattr(C, n) for n in names + ("is_autocast_enabled", "get_autocast_dtype", "is_inference_mode_enabled")):
        g0, g1, g2, g3, g4, g5 = [getattr(C, n) for n in names]
        autocast, autocast_dtype, inference = C.is_autocast_enabled, C.get_autocast_dtype, C.is_inference_mode_enabled
        return lambda: (autocast("cuda"), autocast_dtype("cuda"), inference(), g0(), g1(), g2(), g3(), g4(), g5())
    matmul = torch.backends.cuda.matmul
    return lambda: (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"),
                    torch.is_inference_mode_enabled(), matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                    matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction,
                    torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic)


switches = _switch_readers()
_use_count = torch._C._storage_Use_Count


def _ptrs(args):
    return [a.data_ptr() for a in args if isinstance(a, torch.Tensor)]


class sync_errors:
    """Synchronizing CUDA operations raise inside the block (torch's sync debug mode "error")."""

    def __enter__(self):
        self.mode = torch.cuda.get_sync_debug_mode() if torch.cuda.is_available() else None
        if self.mode is not None:
            with warnings.catch_warnings():  # ("a prototype feature": said once per process)
                warnings.simplefilter("ignore")
                torch.cuda.set_sync_debug_mode("error")

    def __exit__(self, *exc):
        if self.mode is not None:
            torch.cuda.set_sync_debug_mode(self.mode)


def _run(forward, args, commit):
    """forward(*args) as it is, its buffer updates made (`commit`, see `graphed`)."""
    if commit is None:
        return forward(*args)
    out, new = forward(*args)
    commit(*new)
    return out


def _result(hit):
    """A replay's outputs as the call returns them: the graph's own tensors when lent, else copies."""
    if hit.single:
        o = hit.outputs[0]
        return o.detach() if hit.lend is not None else o.clone(memory_format=torch.preserve_format)
    return tuple(o.detach() if hit.lend is not None else o.clone(memory_format=torch.preserve_format)
                 for o in hit.outputs)


def graphed(module, tag, forward, args, state, reads=None, commit=None):
    """`forward(*args)` replayed as a CUDA graph: the launch overhead of a forward of many small
    kernels is paid once per capture instead of once per call. `state()` is the identity of the
    parameters and buffers the forward reads; `reads()` what the graph reads besides its inputs
    (held by the capture, so that no replay reads freed memory). With `commit`, `forward` makes
    no buffer update itself but returns (result, new values) and `commit(*new values)` writes them
    into the buffers in place (running statistics). `tag` names the forward among the module's.

    The first call with a signature (shapes, dtypes, ...: `signature`) runs the forward as it
    is -- that is the call's result -- and then captures it on the call's own input tensors. A
    later call replays it when the state has not moved (the global switches `switches` are as
    they were, no parameter or buffer replaced or changed in place) and the graph can read its
    inputs: they are at the addresses it was captured on (no copy), or, once a call passed tensors
    elsewhere, buffers of ours it copies them into. Its outputs are the graph's own tensors when
    nothing outside holds the ones the previous call returned (else a caller that keeps its results
    gets copies from then on). Anything else -- the state moved, a kept result would be overwritten
    -- runs the forward as it is and captures again.

    Given `reads`, the replay is issued before the state is checked (the check's host time then
    overlaps the GPU's work instead of delaying it): the graph writes only its own tensors, so when
    the state has moved its results are dropped and the forward runs as above. The buffer updates
    are captured as a second graph, replayed only once the state is found unmoved (a graph's
    in-place writes move no version, so the state stays the captured one): each call updates the
    buffers exactly once. Without `reads` (a forward that may write buffers itself) the state is
    checked first.

    A forward that cannot be captured (it waits for the GPU, or returns other than tensors) runs
    as it is from then on, for that signature. As with any CUDA-graph replay, a result read on
    another stream must be synchronised before the next call."""
    key = signature(args)
    if key is None:
        return _run(forward, args, commit)
    key = (tag, key)  # one module may hold a forward per training mode
    graphs = _GRAPHS.get(module)
    if graphs is None:
        graphs = _GRAPHS[module] = {}
    hit = graphs.get(key)
    owned, lend = False, True
    if hit is None:
        if not capturable(args):
            return _run(forward, args, commit)  # checked on a miss only: a hit was captured on such args
    elif hit.replay is None and hit.waits != 1:
        return _run(forward, args, commit)  # not capturable
    elif hit.replay is None:
        pass  # it waited for the GPU once (filling a per-version cache, say): one more try
    else:
        copies = hit.inputs
        same = copies is not None or _ptrs(args) == hit.ptrs
        free = hit.lend is None or list(map(_use_count, hit.storages)) == hit.lend
        if same and free:
            early = reads is not None
            if early or (switches(), state()) == hit.state:
                if copies is not None:
                    for s, a in zip(copies, args):
                        if isinstance(s, torch.Tensor):
                            s.copy_(a)
                hit.replay()
                if not early or (switches(), state()) == hit.state:
                    if hit.writes is not None:
                        hit.writes()  # the buffer updates (a replay moves no version: the state holds)
                    return _result(hit)
        owned = copies is not None or not same  # what this caller needs from now on
        lend = hit.lend is not None and free
    # this call's result; it also compiles the kernels. It runs with synchronizing operations made
    # errors: a forward that waits for the GPU (.item(), a data-dependent shape) is not captured --
    # its capture would fail, and a failed capture leaves torch's CUDA generator unusable
    waits = 0
    try:
        with sync_errors():
            out = _run(forward, args, commit)
    except RuntimeError as e:
        if "synchroniz" not in str(e):
            raise
        out = _run(forward, args, commit)  # (it raised before its buffer updates)
        waits = (hit.waits if hit is not None else 0) + 1
    graphs.pop(key, None)
    if len(graphs) >= PER_MODULE:
        graphs.clear()
    graphs[key] = _capture(forward, args, state, reads, commit, out, owned, lend, waits)
    return out


def _capture(forward, args, state, reads, commit, out, owned, lend, waits):
    """The Capture of `forward` on `args` after a run that returned `out` (see `graphed`): an
    empty one when the forward waited for the GPU, returned other than tensors, or failed to be
    captured."""
    single = isinstance(out, torch.Tensor)
    if waits or not (single or (type(out) is tuple and all(isinstance(o, torch.Tensor) for o in out))):
        return Capture(waits=waits)
    dev = next(a.device for a in args if isinstance(a, torch.Tensor))
    static = [a.clone(memory_format=torch.preserve_format) if owned and isinstance(a, torch.Tensor) else a
              for a in args]
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.current_stream(dev)
    try:
        with torch.cuda.device(dev):
            with torch.cuda.graph(graph):
                captured = forward(*static)
            writes = new = None
            if commit is not None:  # the updates: a graph of their own, replayed once the state holds
                captured, new = captured
                writes = torch.cuda.CUDAGraph()
                with torch.cuda.graph(writes, pool=graph.pool()):
                    commit(*new)
        captured = [captured] if single else list(captured)
        # outputs only the graph holds (not a parameter, an input or another output) can be lent
        fresh = torch.empty(1, device=dev)
        sole = _use_count(fresh.untyped_storage()._cdata)
        ptrs = [o.untyped_storage().data_ptr() for o in captured]
        counts = [_use_count(o.untyped_storage()._cdata) for o in captured]
        lent = lend and len(set(ptrs)) == len(ptrs) and counts == [sole] * len(captured)
        # (capturing runs the forward's Python but none of its kernels: its in-place updates moved
        # the buffers' versions, so the state to match is the one after the capture)
        return Capture(graph, static if owned else None, _ptrs(static), captured, counts if lent else None,
                       single, (switches(), state()), reads() if reads is not None else None, writes, new)
    except Exception:  # noqa: BLE001 - not capturable: run it as it is
        # a capture that ends in an error leaves torch on its capture stream: back to the caller's
        torch.cuda.set_stream(stream)
        return Capture()
