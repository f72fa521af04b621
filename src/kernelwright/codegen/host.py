"""Host helpers of the generated kernel modules (plain Python over torch and triton).

A kernel module imports the ones it calls (codegen/helpers.py writes the import): from the copy
kernels/_host.py beside it in an emitted folder (emit/module.py ships it), or from this module when
kernelwright's tuner loads the kernel on its own.
"""
import torch
import triton


def _cdiv(a, b):
    """ceil(a / b) for a grid's size: triton.cdiv is a constexpr function, whose call wrapper costs
    several Python calls per launch."""
    return -(-a // b)


def _alloc(shape, dtype, device, stride=None):
    """Output allocation (contiguous, or with the given strides, e.g. channels-last); verification
    replaces this with a NaN-poisoning allocator."""
    if stride is not None:
        return torch.empty_strided(shape, stride, dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def _expect(t, shape, stride, name, dtype=None):
    """The input in the layout the kernel was specialised for.

    Shape (and dtype, when given) must match. Other strides are copied into the expected layout
    first (correct, one extra copy), except where the kernel expects a broadcast (stride 0), which
    a copy cannot produce."""
    if t.stride() == stride and t.shape == shape and (dtype is None or t.dtype == dtype):
        return t  # the usual case, checked in one comparison
    if tuple(t.shape) != tuple(shape) or (dtype is not None and t.dtype != dtype):
        raise ValueError(f"{name}: expected {dtype or t.dtype} shape {tuple(shape)}, got {t.dtype} {tuple(t.shape)}")
    if any(n != 1 and s != e for n, s, e in zip(shape, t.stride(), stride)):
        if any(n != 1 and e == 0 for n, e in zip(shape, stride)):
            raise ValueError(f"{name}: expected a broadcast (stride 0) layout {stride}, got strides {t.stride()}")
        t = torch.empty_strided(shape, stride, dtype=t.dtype, device=t.device).copy_(t)
    return t


_COMPILED = {}


def _launch(kernel, grid, *args, **meta):
    """kernel[grid](*args, **meta), for less CPU time: the first call for a device and an argument
    signature goes through Triton's JIT (which compiles or finds the kernel); later ones call that
    compiled kernel's launcher directly, skipping the JIT's argument binding, specialisation and
    cache lookup (most of a launch's CPU time, measured with scripts/launch_overhead.py --profile). The signature
    is what Triton specialises on: each tensor's dtype and 16-byte alignment, each integer's being
    1 or a multiple of 16, so any call the JIT would compile differently takes the JIT path again. With
    Triton launch hooks installed (a profiler), or in the interpreter, every call takes the JIT path."""
    if not any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):  # the interpreter's CPU tensors
        kernel[grid](*args, **meta)
        return
    dev = torch._C._cuda_getDevice()  # the JIT launches on the current device too
    key = (kernel, dev, *[(a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor)
                          else (a == 1, a % 16 == 0) if isinstance(a, int) and not isinstance(a, bool)
                          else type(a) for a in args])
    hit = _COMPILED.get(key)
    if hit is not None and not _hooked(triton.knobs.runtime.launch_enter_hook) \
            and not _hooked(triton.knobs.runtime.launch_exit_hook):
        compiled, tail = hit
        g = tuple(grid) + (1,) * (3 - len(grid))
        compiled.run(g[0], g[1], g[2], torch._C._cuda_getCurrentRawStream(dev), compiled.function,
                     compiled.packed_metadata, None, None, None, *args, *tail)
        return
    compiled = kernel[grid](*args, **meta)
    names = getattr(kernel, "arg_names", None)
    rest = names[len(args):] if names is not None else None
    if getattr(compiled, "packed_metadata", None) is not None and rest is not None \
            and all(name in meta for name in rest):
        # the JIT passes every parameter, constexprs included, in declaration order (a parameter
        # left to its default is not cached: the JIT path stays)
        _COMPILED[key] = (compiled, tuple(meta[name] for name in rest))


def _hooked(hook):
    """Whether a Triton launch hook is installed (Triton 3.6 keeps an empty HookChain otherwise)."""
    return hook is not None and bool(getattr(hook, "calls", True))


_SCRATCH = {}


def _scratch(name, shape, device):
    """A float32 work buffer (a split reduction's partial results, its per-row values), allocated
    once per name, shape, device and stream and reused by later calls, of any kernel: each launch
    writes it before reading it, and launches on one stream run in order (another stream gets
    its own buffer). While a CUDA graph is being captured the buffer is a new one, from that
    graph's memory: two graphs replayed on two streams at once never share one."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return torch.empty(shape, dtype=torch.float32, device=device)
    stream = torch._C._cuda_getCurrentRawStream(device.index) if device.type == "cuda" else 0
    key = (name, tuple(shape), device, stream)
    buf = _SCRATCH.get(key)
    if buf is None:
        buf = _SCRATCH[key] = torch.empty(shape, dtype=torch.float32, device=device)
    return buf


def _epilogue_args(kinds, tensors, M, N, device, *, batch=None, full_shape=None):
    """Kernel arguments for the epilogue operands, in the order of the kernel's parameters.

    kinds: one of "col", "row", "full", "scalar" per operand.
    tensors: one tensor per operand (a Python number is accepted for a "scalar").
    M, N: the output's logical GEMM shape ([M, N]; per batch when batched).
    batch: the batch count for batched GEMMs (None: not batched). col/row operands may then be
        [L] (shared by all batches) or [B, L]; full operands anything expandable to [B, M, N].
    full_shape: the shape a "full" operand is expanded to (default (M, N), or (B, M, N));
        its strides follow in order, the batch stride last.
    """
    args = []
    for kind, t in zip(kinds, tensors):
        if not torch.is_tensor(t):
            t = torch.tensor(float(t), device=device, dtype=torch.float32)
        if t.device != torch.device(device) and t.numel() != 1:
            raise ValueError(f"epilogue operand on {t.device}, expected {device}")
        if kind == "scalar":
            if t.numel() != 1:
                raise ValueError(f"scalar epilogue operand has {t.numel()} elements")
            args.append(t.reshape(()).to(device))
        elif kind in ("col", "row"):
            length = N if kind == "col" else M
            if batch is None:
                if t.numel() != length:
                    raise ValueError(f"{kind} epilogue operand has {t.numel()} elements, expected {length}")
                args.append(t.reshape(length).contiguous())
            else:
                if t.numel() == length:
                    args += [t.reshape(length).contiguous(), 0]
                elif t.numel() == batch * length:
                    t = t.reshape(batch, length).contiguous()
                    args += [t, t.stride(0)]
                else:
                    raise ValueError(f"{kind} epilogue operand has {t.numel()} elements, expected {length} or {batch * length}")
        elif kind == "full":
            if full_shape is not None:
                shape = tuple(full_shape)
            else:
                shape = (M, N) if batch is None else (batch, M, N)
            t = t.expand(shape)
            if batch is None:
                args += [t] + list(t.stride())
            else:
                args += [t] + list(t.stride()[1:]) + [t.stride(0)]
        else:
            raise ValueError(f"unknown epilogue operand kind {kind!r}")
    return args


def _tma_descriptors(a, b, batch, BLOCK_M, BLOCK_N, BLOCK_K):
    """Tensor descriptors of A [M, K] and B^T [N, K] for the TMA path: both K-major (unit K
    stride), other strides and the base addresses 16-byte aligned."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    bt = b.t()
    for name, t in (("a", a), ("b.T", bt)):
        if batch is not None or t.stride(1) != 1 or (t.stride(0) * t.element_size()) % 16 \
                or t.data_ptr() % 16:
            raise ValueError(f"TMA needs 2-D K-major operands with 16-byte aligned rows; {name} has "
                             f"strides {tuple(t.stride())}")
    return (TensorDescriptor.from_tensor(a, [BLOCK_M, BLOCK_K]),
            TensorDescriptor.from_tensor(bt, [BLOCK_N, BLOCK_K]))
