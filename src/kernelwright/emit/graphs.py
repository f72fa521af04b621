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
    inputs: per argument, a buffer of ours the graph reads that tensor input from (each call copies
    its argument into it) or None where the graph reads the tensor it was captured on where it is;
    None as a whole when no argument is copied in; `ptrs`: per argument, the address of a tensor
    read in place (a call passing a tensor at that address replays with no copy), else None;
    outputs: the tensors each replay writes; lend: per output, its storage's use count while
    nothing outside holds it when calls return the output itself (replaying is safe while every
    lent output's storage is back to its count; `checked` holds (output, storage address, count)
    of each lent one), else None; alias: per output, whether it is a view of a tensor read in place (returned as it
    is, as the forward itself returns it); an output neither lent nor an alias is copied out on
    every call. single: the forward returns one bare tensor; state: the global switches and the
    parameters' and buffers' identity (address, version, dtype) the capture is valid for; reads:
    what the graph reads besides its inputs (the parameters and buffers), held so that a replay
    never reads freed memory, even one made before the state is checked (see `graphed`); writes:
    the replay method of a second graph, the forward's commit (its buffer updates from the first
    graph's tensors), replayed once the state is found unmoved (None: no commit); new: the first
    graph's tensors it reads; waits: calls that waited for the GPU (no capture: see `graphed`)."""

    def __init__(self, graph=None, inputs=None, ptrs=(), outputs=(), lend=(), single=True, state=None,
                 reads=None, writes=None, new=None, waits=0, alias=()):
        self.waits = waits
        self.graph, self.inputs, self.ptrs, self.outputs = graph, inputs, ptrs, outputs
        self.lend, self.alias, self.single, self.state, self.reads = lend, alias, single, state, reads
        self.writes, self.new = (writes.replay if writes is not None else None), new
        self.replay = graph.replay if graph is not None else None
        self.checked = [(j, o.untyped_storage()._cdata, c) for j, (o, c) in enumerate(zip(outputs, lend)) if c is not None]
        self.placed = [(i, p) for i, p in enumerate(ptrs) if p is not None]  # inputs read in place
        self.copied = [(b, i) for i, b in enumerate(inputs) if b is not None] if inputs is not None else []
        self.moved = {}  # input -> how often calls passed it elsewhere than an earlier capture read it


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
    """Whether a forward on `args` can be captured: CUDA tensors (at least one), other arguments
    plain values."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return bool(tensors) and all(a.device.type == "cuda" for a in tensors)


def _strided_copy(t):
    """A copy of tensor t with t's own strides (a view with gaps, say a slice of a fused
    projection, stays one: what reads it was made for those strides); None where t's elements
    share memory (an expanded tensor), which no buffer of ours can hold as it is. (The rule of
    kernelwright.problem.load.non_overlapping, written out here: this file ships in emitted
    modules, which run without kernelwright.)"""
    reach = 0  # the farthest element offset the smaller strides reach
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz > 1):
        if stride <= reach:
            return None
        reach += stride * (size - 1)
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device).copy_(t)


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
    """A replay's outputs as the call returns them: the graph's own tensors where lent or views of
    the inputs, else copies."""
    outs = [o.detach() if c is not None or a else _copy_out(o) for o, c, a in zip(hit.outputs, hit.lend, hit.alias)]
    return outs[0] if hit.single else tuple(outs)


def _copy_out(o):
    c = _strided_copy(o)
    return c if c is not None else o.clone(memory_format=torch.preserve_format)


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
    inputs: each is at the address it was captured on (no copy), or, once calls passed that input
    elsewhere more often than its patience allows (the module's `_kw_patience`, one count per
    input; by default once), in a buffer of ours it is copied into (inputs at stable addresses, such
    as a training step's saved tensors, are read in place beside one that moves). Each output is the
    graph's own tensor while nothing outside holds the one the previous call returned (a caller
    that keeps that result gets copies of it from then on; the outputs it lets go stay lent); an
    output that is a view of an input read in place is returned as that view. Anything else -- the
    state moved, a kept result would be overwritten, an input moved -- runs the forward as it is
    and captures again.

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
    owned = lend = None  # (a first capture reads every input in place and lends what it can)
    moves = {}
    if hit is None:
        if not capturable(args):
            return _run(forward, args, commit)  # checked on a miss only: a hit was captured on such args
    elif hit.replay is None and hit.waits != 1:
        return _run(forward, args, commit)  # not capturable
    elif hit.replay is None:
        pass  # it waited for the GPU once (filling a per-version cache, say): one more try
    else:
        moved = [i for i, p in hit.placed if args[i].data_ptr() != p]
        held = [j for j, s, c in hit.checked if _use_count(s) != c]
        if not moved and not held:
            early = reads is not None
            if early or (switches(), state()) == hit.state:
                for b, i in hit.copied:
                    b.copy_(args[i])
                hit.replay()
                if not early or (switches(), state()) == hit.state:
                    if hit.writes is not None:
                        hit.writes()  # the buffer updates (a replay moves no version: the state holds)
                    return _result(hit)
        # what this caller needs from now on: its kept outputs copied out, its inputs read where
        # they are now, but one that moved more often than its patience copied in (a first capture
        # may have been made on example tensors: every input moves once)
        copied = hit.inputs or [None] * len(args)
        moves = dict(hit.moved)
        for i in moved:
            moves[i] = moves.get(i, 0) + 1
        patience = getattr(module, "_kw_patience", None) or ()
        owned = [copied[i] is not None or moves.get(i, 0) > (patience[i] if i < len(patience) else 1)
                 for i in range(len(args))]
        lend = [j not in held and (c is not None or a) for j, (c, a) in enumerate(zip(hit.lend, hit.alias))]
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
    graphs[key].moved = moves
    return out


def _on_memory_of(view):
    """A tensor on `view`'s memory, with its shape, strides and offset, that is no view."""
    return torch.empty(0, dtype=view.dtype, device=view.device).set_(
        view.untyped_storage(), view.storage_offset(), view.size(), view.stride())


def _capture(forward, args, state, reads, commit, out, owned, lend, waits):
    """The Capture of `forward` on `args` after a run that returned `out` (see `graphed`): an
    empty one when the forward waited for the GPU, returned other than tensors, needs a buffer of
    ours for an input no buffer can hold, or failed to be captured. `owned`: per argument, whether
    the graph reads it from a buffer of ours (None: none does); `lend`: per output, whether it may
    be lent (None: every one)."""
    single = isinstance(out, torch.Tensor)
    if waits or not (single or (type(out) is tuple and all(isinstance(o, torch.Tensor) for o in out))):
        return Capture(waits=waits)
    dev = next(a.device for a in args if isinstance(a, torch.Tensor))
    owned = owned or [False] * len(args)
    static = [_strided_copy(a) if own and isinstance(a, torch.Tensor) else a for a, own in zip(args, owned)]
    if any(s is None and a is not None for s, a in zip(static, args)):
        return Capture()
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
        # an output is lent where only the graph's outputs hold its storage (not a parameter or a
        # buffer of ours); a view of an input read in place is that input's (the forward's own
        # result would be the same view). A view of a tensor the graph computes (q, k, v split
        # from one projection; a permuted weight gradient) is held as a plain tensor on the same
        # memory: the views it was made through, which its view metadata can keep alive (under
        # AOTAutograd they stayed), then go.
        in_place = {a.untyped_storage().data_ptr() for a, own in zip(args, owned) if isinstance(a, torch.Tensor) and not own}
        where = [o.untyped_storage().data_ptr() for o in captured]
        alias = [w in in_place for w in where]
        captured = [o if a or not o._is_view() else _on_memory_of(o) for o, a in zip(captured, alias)]
        fresh = torch.empty(1, device=dev)
        sole = _use_count(fresh.untyped_storage()._cdata)  # (one tensor's; each further one adds one)
        holders: dict = {}  # storage -> the outputs holding it
        for o, w in zip(captured, where):
            holders.setdefault(w, set()).add(id(o))
        counts = [_use_count(o.untyped_storage()._cdata) for o in captured]
        lent = [counts[j] if not alias[j] and (lend is None or lend[j]) and counts[j] == sole + len(holders[where[j]]) - 1
                else None for j in range(len(captured))]
        # (capturing runs the forward's Python but none of its kernels: its in-place updates moved
        # the buffers' versions, so the state to match is the one after the capture)
        inputs = [s if own else None for s, own in zip(static, owned)] if any(owned) else None
        ptrs = [a.data_ptr() if isinstance(a, torch.Tensor) and not own else None for a, own in zip(args, owned)]
        return Capture(graph, inputs, ptrs, captured, lent, single, (switches(), state()),
                       reads() if reads is not None else None, writes, new, alias=alias)
    except Exception:  # noqa: BLE001 - not capturable: run it as it is
        # a capture that ends in an error leaves torch on its capture stream: back to the caller's
        torch.cuda.set_stream(stream)
        return Capture()
