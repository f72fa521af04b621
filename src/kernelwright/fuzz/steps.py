"""The zoo of steps a fuzz program chains: anchors (linear, convolutions, transposed convolution,
matmuls of inputs, pooling), normalisations, dropout, reductions, softmax, views and pointwise
epilogues (the op table's activations, scalar and broadcast-tensor arithmetic, residual adds,
`self.training` branches).

Every step is drawn in two halves: `draw(rng, dims)` picks its arguments for the shape it meets
(the dimensions after the batch dimension; None when it cannot apply there), and `emit(builder,
index, args)` writes its __init__ and forward lines, deriving everything shape-dependent (input
channels, groups, broadcast shapes) from the shape it meets then. So a recorded chain can be
rendered again with steps left out (shrinking): a step that no longer fits raises `Invalid`.
Arguments are JSON values, so a program can record its own chain.
"""
from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Callable

MAX_ELEMENTS = 10_000  # per sample: with batch sizes up to 5, at most 50k elements per tensor
MAX_RANK = 5
CHANNELS = [3, 4, 5, 6, 7, 8, 13, 16]
FEATURES = [5, 7, 8, 13, 16, 33, 48]
SCALARS = [0.5, 2.0, -1.5, 0.1, 3.0, 0.75]


class Invalid(Exception):
    """A step does not fit the shape it meets."""


class Builder:
    """A program being written: its __init__ lines, forward lines and inputs, and the name and
    shape (after the batch dimension) of every value the forward has computed so far."""

    def __init__(self, first_input: str, dims: tuple[int, ...], dtype: str):
        self.dtype = dtype  # "" or ", dtype=torch.float64": appended to every torch.randn of an input
        self.init: list[str] = []
        self.body: list[str] = []
        self.inputs: list[tuple[str, str]] = [("x0", first_input)]
        self.values: list[tuple[str, tuple[int, ...]]] = [("x0", tuple(dims))]

    @property
    def cur(self) -> str:
        return self.values[-1][0]

    @property
    def dims(self) -> tuple[int, ...]:
        return self.values[-1][1]

    def attr(self, name: str, ctor: str) -> str:
        """Declare `self.<name> = <ctor>` in __init__; returns the attribute expression."""
        self.init.append(f"self.{name} = {ctor}")
        return f"self.{name}"

    def add_input(self, expr: str) -> str:
        """A further forward argument drawn by get_inputs as `expr`; returns its name."""
        name = f"x{len(self.inputs)}"
        self.inputs.append((name, expr))
        return name

    def assign(self, index: int, expr: str, dims) -> None:
        """The forward line `h<index> = <expr>`, a value of shape (batch, *dims)."""
        dims = tuple(int(d) for d in dims)
        if any(d < 1 for d in dims):
            raise Invalid(f"empty dimension in {dims}")
        if math.prod(dims) > MAX_ELEMENTS or len(dims) + 1 > MAX_RANK:
            raise Invalid(f"shape {dims} is too large")
        self.body.append(f"h{index} = {expr}")
        self.values.append((f"h{index}", dims))

    def branch(self, index: int, train_expr: str, eval_expr: str) -> None:
        """An `if self.training:` branch assigning h<index> (same shape as the current value)."""
        dims = self.dims
        self.body += ["if self.training:", f"    h{index} = {train_expr}", "else:", f"    h{index} = {eval_expr}"]
        self.values.append((f"h{index}", dims))


@dataclass(frozen=True)
class Op:
    """One kind of step: its category (how often the generator draws it), how its arguments are
    drawn for a shape, how it is written, and how often it is drawn among its category's steps
    that fit the shape."""

    category: str
    draw: Callable[[random.Random, tuple[int, ...]], dict | None]
    emit: Callable[[Builder, int, dict], None]
    weight: float = 1.0


def _sizes(values) -> str:
    """A kernel size, stride or output size as written in a constructor: `3` or `(3, 5)`."""
    values = list(values)
    return str(values[0]) if len(set(values)) == 1 else "(" + ", ".join(map(str, values)) + ")"


def _smallest_divisor(n: int) -> int:
    return next(d for d in range(2, n + 1) if n % d == 0)


# --- anchors ------------------------------------------------------------------------------------


def _draw_linear(rng, dims):
    if not dims or dims[-1] > 512:
        return None
    return {"out": rng.choice(FEATURES), "bias": rng.random() < 0.8}


def _emit_linear(b, i, a):
    fc = b.attr(f"fc{i}", f"nn.Linear({b.dims[-1]}, {a['out']}, bias={a['bias']})")
    b.assign(i, f"{fc}({b.cur})", b.dims[:-1] + (a["out"],))


def _draw_conv(nd):
    def draw(rng, dims):
        if len(dims) != nd + 1:
            return None
        square = rng.random() < 0.7
        k0 = rng.randint(1, 5 if nd < 3 else 3)
        k = [k0] * nd if square else [rng.randint(1, 5 if nd < 3 else 3) for _ in range(nd)]
        stride = rng.choice([1, 1, 2] + ([3] if nd == 1 else []))
        dilation = rng.choice([1, 1, 1, 2])
        if stride == 1 and all(n % 2 for n in k) and rng.random() < 0.15:  # (even 'same' kernels pad unevenly)
            padding = "same"
        else:
            padding = rng.randint(0, (dilation * (max(k) - 1) + 1) // 2)
        mode = "zeros"
        if padding != 0 and padding != "same" and rng.random() < 0.15:
            mode = rng.choice(["reflect", "replicate", "circular"])
        return {"out": rng.choice(CHANNELS), "k": k, "stride": stride, "padding": padding, "dilation": dilation,
                "groups": rng.choice(["one", "one", "depthwise", "grouped"]), "mult": rng.choice([1, 2]),
                "bias": rng.random() < 0.8, "mode": mode}
    return draw


def _conv_groups(cin: int, a: dict) -> tuple[int, int]:
    """(groups, output channels) of a convolution step on `cin` channels."""
    if a["groups"] == "depthwise":
        return cin, cin * a["mult"]
    if a["groups"] == "grouped":
        g = _smallest_divisor(cin)
        return g, g * max(1, round(a["out"] / g))
    return 1, a["out"]


def _emit_conv(nd):
    def emit(b, i, a):
        cin, spatial = b.dims[0], b.dims[1:]
        if len(spatial) != nd or len(a["k"]) != nd:
            raise Invalid(f"conv{nd}d needs {nd} spatial dimensions")
        groups, out = _conv_groups(cin, a)
        p, d, s = a["padding"], a["dilation"], a["stride"]
        if p == "same":
            sizes = list(spatial)
        else:
            if a["mode"] != "zeros" and any(p >= n for n in spatial):
                raise Invalid("padding as wide as the input")
            sizes = [(n + 2 * p - d * (k - 1) - 1) // s + 1 for n, k in zip(spatial, a["k"])]
        pad = "'same'" if p == "same" else str(p)
        mode = "" if a["mode"] == "zeros" else f", padding_mode='{a['mode']}'"
        conv = b.attr(f"conv{i}", f"nn.Conv{nd}d({cin}, {out}, kernel_size={_sizes(a['k'])}, stride={s}, "
                                  f"padding={pad}, dilation={d}, groups={groups}, bias={a['bias']}{mode})")
        b.assign(i, f"{conv}({b.cur})", [out] + sizes)
    return emit


def _draw_conv_transpose(nd):
    def draw(rng, dims):
        if len(dims) != nd + 1:
            return None
        k, stride, dilation = rng.randint(1, 4 if nd < 3 else 3), rng.choice([1, 2, 2]), rng.choice([1, 1, 1, 2])
        return {"out": rng.choice(CHANNELS), "k": k, "stride": stride, "dilation": dilation,
                "padding": rng.randint(0, (dilation * (k - 1)) // 2),
                "output_padding": rng.randint(0, max(stride, dilation) - 1),
                "grouped": rng.random() < 0.25, "bias": rng.random() < 0.8}
    return draw


def _emit_conv_transpose(nd):
    def emit(b, i, a):
        if len(b.dims) != nd + 1:
            raise Invalid(f"conv_transpose{nd}d needs {nd} spatial dimensions")
        cin = b.dims[0]
        groups = _smallest_divisor(cin) if a["grouped"] else 1
        out = groups * max(1, round(a["out"] / groups))
        k, s, p, d, op = a["k"], a["stride"], a["padding"], a["dilation"], a["output_padding"]
        sizes = [(n - 1) * s - 2 * p + d * (k - 1) + op + 1 for n in b.dims[1:]]
        conv = b.attr(f"convt{i}", f"nn.ConvTranspose{nd}d({cin}, {out}, kernel_size={k}, stride={s}, padding={p}, "
                                   f"output_padding={op}, groups={groups}, bias={a['bias']}, dilation={d})")
        b.assign(i, f"{conv}({b.cur})", [out] + sizes)
    return emit


def _draw_matmul_input(rng, dims):
    if not dims:
        return None
    return {"n": rng.choice(FEATURES), "transposed": rng.random() < 0.3}


def _emit_matmul_input(b, i, a):
    k, n = b.dims[-1], a["n"]
    expr = f"torch.randn({n}, {k}{b.dtype}).t()" if a["transposed"] else f"torch.randn({k}, {n}{b.dtype})"
    y = b.add_input(expr)
    b.assign(i, f"torch.matmul({b.cur}, {y})", b.dims[:-1] + (n,))


def _draw_bmm_input(rng, dims):
    if len(dims) != 2:
        return None
    return {"n": rng.choice(FEATURES), "transposed": rng.random() < 0.3}


def _emit_bmm_input(b, i, a):
    if len(b.dims) != 2:
        raise Invalid("bmm needs a 3-d operand")
    k, n = b.dims[-1], a["n"]
    expr = (f"torch.randn(batch_size, {n}, {k}{b.dtype}).transpose(1, 2)" if a["transposed"]
            else f"torch.randn(batch_size, {k}, {n}{b.dtype})")
    y = b.add_input(expr)
    b.assign(i, f"torch.bmm({b.cur}, {y})", (b.dims[0], n))


def _draw_gram(rng, dims):
    return {} if len(dims) >= 2 else None


def _emit_gram(b, i, a):
    if len(b.dims) < 2:
        raise Invalid("a Gram matrix needs a 3-d value")
    x = b.cur
    b.assign(i, f"torch.matmul({x}, {x}.transpose(-1, -2)) / {b.dims[-1]}", b.dims[:-1] + (b.dims[-2],))


def _draw_recurrent(rng, dims):
    if len(dims) != 2:  # [batch, time, features]
        return None
    kind = rng.choice(["LSTM", "GRU", "RNN", "RNN_relu"])
    outs = ["out", "out", "h_n"] + (["c_n"] if kind == "LSTM" else [])
    return {"kind": kind, "hidden": rng.choice([5, 7, 8, 13, 16]), "layers": rng.choice([1, 1, 2]),
            "bidirectional": rng.random() < 0.3, "batch_first": rng.random() < 0.6, "bias": rng.random() < 0.8,
            "output": rng.choice(outs)}


def _emit_recurrent(b, i, a):
    """nn.LSTM / GRU / RNN over a [batch, time, features] value (time-major when not batch_first);
    the output sequence, or h_n / c_n with the batch moved first."""
    if len(b.dims) != 2:
        raise Invalid("a recurrent layer needs a [batch, time, features] value")
    t, f = b.dims
    kind = "RNN" if a["kind"] == "RNN_relu" else a["kind"]
    extra = ", nonlinearity='relu'" if a["kind"] == "RNN_relu" else ""
    dirs = 2 if a["bidirectional"] else 1
    rnn = b.attr(f"rnn{i}", f"nn.{kind}({f}, {a['hidden']}, num_layers={a['layers']}, bias={a['bias']}, "
                            f"batch_first={a['batch_first']}, bidirectional={a['bidirectional']}{extra})")
    x = b.cur if a["batch_first"] else f"{b.cur}.transpose(0, 1)"
    if a["output"] == "out":
        expr = f"{rnn}({x})[0]" + ("" if a["batch_first"] else ".transpose(0, 1)")
        b.assign(i, expr, (t, dirs * a["hidden"]))
    else:
        state = f"{rnn}({x})[1]"
        if kind == "LSTM":
            state += "[0]" if a["output"] == "h_n" else "[1]"
        b.assign(i, f"{state}.transpose(0, 1)", (a["layers"] * dirs, a["hidden"]))


def _draw_attention(rng, dims):
    if len(dims) != 2 or dims[-1] % 2 or dims[-1] > 64:  # [batch, sequence, embedding]
        return None
    heads = rng.choice([h for h in (1, 2, 4) if dims[-1] % h == 0])
    a = {"heads": heads, "module": rng.random() < 0.5, "causal": rng.random() < 0.5, "bias": rng.random() < 0.8}
    if not a["module"]:
        a["by_hand"] = rng.random() < 0.5
        if a["by_hand"]:
            a["score"] = rng.choice(["softmax", "softmax", "relu", "sigmoid"])
    return a


def _emit_attention(b, i, a):
    """Self-attention over a [batch, sequence, embedding] value: nn.MultiheadAttention (batch first,
    its weights not returned), or scaled_dot_product_attention over heads of the value itself, or
    the same attention written by hand (matmul, scale, a causal mask by masked_fill, softmax,
    matmul), which the pipeline's rewrite turns into one fused call, or with a ReLU or a sigmoid
    of the scores in place of the softmax (`score`; one elementwise-score kernel)."""
    if len(b.dims) != 2 or b.dims[-1] % a["heads"]:
        raise Invalid("attention needs a [batch, sequence, embedding] value with whole heads")
    t, e = b.dims
    x = b.cur
    if a["module"]:
        mha = b.attr(f"attn{i}", f"nn.MultiheadAttention({e}, {a['heads']}, bias={a['bias']}, batch_first=True)")
        mask = f", attn_mask=torch.ones({t}, {t}, dtype=torch.bool, device={x}.device).triu(1)" if a["causal"] else ""
        b.assign(i, f"{mha}({x}, {x}, {x}, need_weights=False{mask})[0]", (t, e))
    else:
        d = e // a["heads"]
        heads = f"{x}.view({x}.shape[0], {t}, {a['heads']}, {d}).transpose(1, 2)"
        if a.get("by_hand"):
            scores = f"(({heads} @ ({heads} * 0.5).transpose(-2, -1)) / {math.sqrt(d)!r})"
            if a["causal"]:
                scores += f".masked_fill(torch.ones({t}, {t}, dtype=torch.bool, device={x}.device).triu(1), float('-inf'))"
            weights = {"softmax": f"torch.softmax({scores}, dim=-1)", "relu": f"torch.relu({scores})",
                       "sigmoid": f"torch.sigmoid({scores})"}[a.get("score", "softmax")]
            b.assign(i, f"({weights} @ {heads}).transpose(1, 2).reshape({x}.shape)", (t, e))
            return
        b.assign(i, f"F.scaled_dot_product_attention({heads}, {heads} * 0.5, {heads}, is_causal={a['causal']})"
                    f".transpose(1, 2).reshape({x}.shape)", (t, e))


def _pool_size(n: int, k: int, s: int, p: int, ceil: bool) -> int:
    """PyTorch's pooled length (a last window starting in the right padding is dropped)."""
    if n + 2 * p < k:
        raise Invalid("pooling window larger than the input")
    span = n + 2 * p - k
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= n + p:
        out -= 1
    return out


def _draw_pool(nd):
    def draw(rng, dims):
        if len(dims) != nd + 1:
            return None
        kind = rng.choice(["max", "max", "avg", "avg", "adaptive_avg", "adaptive_max"])
        k = rng.randint(2, 3)
        return {"kind": kind, "k": k, "stride": rng.choice([0, 1, 2]), "padding": rng.randint(0, k // 2),
                "ceil": rng.random() < 0.2, "include_pad": rng.random() < 0.7, "module": rng.random() < 0.5,
                "size": [rng.randint(1, 3) for _ in range(nd)]}
    return draw


def _emit_pool(nd):
    def emit(b, i, a):
        spatial = b.dims[1:]
        if len(spatial) != nd:
            raise Invalid(f"pool{nd}d needs {nd} spatial dimensions")
        x, kind = b.cur, a["kind"]
        if kind.startswith("adaptive"):
            size = [min(o, n) for o, n in zip(a["size"], spatial)]
            fn = f"adaptive_{kind.split('_')[1]}_pool{nd}d"
            b.assign(i, f"F.{fn}({x}, {_sizes(size)})", [b.dims[0]] + size)
            return
        k, p, ceil = a["k"], a["padding"], a["ceil"]
        s = a["stride"] or k
        sizes = [_pool_size(n, k, s, p, ceil) for n in spatial]
        extra = f", ceil_mode={ceil}" + ("" if kind == "max" or a["include_pad"] else ", count_include_pad=False")
        if a["module"]:
            pool = b.attr(f"pool{i}", f"nn.{kind.capitalize()}Pool{nd}d({k}, stride={s}, padding={p}{extra})")
            b.assign(i, f"{pool}({x})", [b.dims[0]] + sizes)
        else:
            b.assign(i, f"F.{kind}_pool{nd}d({x}, {k}, stride={s}, padding={p}{extra})", [b.dims[0]] + sizes)
    return emit


# --- normalisation and dropout --------------------------------------------------------------------


def _draw_batchnorm(rng, dims):
    if not 1 <= len(dims) <= 4:
        return None
    return {"affine": rng.random() < 0.8, "track": rng.random() < 0.85, "momentum": rng.choice([0.1, 0.1, 0.3, None]),
            "eps": rng.choice([1e-5, 1e-3])}


def _emit_batchnorm(b, i, a):
    if not 1 <= len(b.dims) <= 4:
        raise Invalid("batch norm needs 2-d to 5-d values")
    nd = max(1, len(b.dims) - 1)
    bn = b.attr(f"bn{i}", f"nn.BatchNorm{nd}d({b.dims[0]}, eps={a['eps']}, momentum={a['momentum']}, "
                          f"affine={a['affine']}, track_running_stats={a['track']})")
    b.assign(i, f"{bn}({b.cur})", b.dims)


def _draw_layernorm(rng, dims):
    if not dims:
        return None
    return {"n": rng.choice([1, 1, 2]), "affine": rng.random() < 0.8, "bias": rng.random() < 0.8}


def _emit_layernorm(b, i, a):
    n = min(a["n"], len(b.dims))
    shape = b.dims[-n:]
    if math.prod(shape) < 4:
        raise Invalid("layer norm over fewer than 4 elements")
    ln = b.attr(f"ln{i}", f"nn.LayerNorm({list(shape)}, elementwise_affine={a['affine']}, bias={a['bias']})")
    b.assign(i, f"{ln}({b.cur})", b.dims)


def _draw_groupnorm(rng, dims):
    if not dims:
        return None
    return {"groups": rng.choice([1, 2, 0]), "affine": rng.random() < 0.8}  # 0: one group per channel


def _emit_groupnorm(b, i, a):
    c = b.dims[0]
    groups = {1: 1, 0: c}.get(a["groups"], _smallest_divisor(c))
    if c // groups * math.prod(b.dims[1:]) < 4:
        raise Invalid("group norm over fewer than 4 elements per group")
    gn = b.attr(f"gn{i}", f"nn.GroupNorm({groups}, {c}, affine={a['affine']})")
    b.assign(i, f"{gn}({b.cur})", b.dims)


def _draw_instancenorm(rng, dims):
    if not 2 <= len(dims) <= 4:
        return None
    return {"affine": rng.random() < 0.5, "track": rng.random() < 0.5}


def _emit_instancenorm(b, i, a):
    if not 2 <= len(b.dims) <= 4 or math.prod(b.dims[1:]) < 4:
        raise Invalid("instance norm needs 3-d to 5-d values with 4 elements per channel")
    norm = b.attr(f"inorm{i}", f"nn.InstanceNorm{len(b.dims) - 1}d({b.dims[0]}, affine={a['affine']}, "
                               f"track_running_stats={a['track']})")
    b.assign(i, f"{norm}({b.cur})", b.dims)


def _draw_dropout(rng, dims):
    return {"p": rng.choice([0.1, 0.2, 0.3, 0.5]), "module": rng.random() < 0.6}


def _module_or_function(b, i, module: bool, attr: str, ctor: str, call: str):
    """The step as a submodule (`self.<attr> = <ctor>`, called on the value) or as `call`."""
    b.assign(i, f"{b.attr(attr, ctor)}({b.cur})" if module else call, b.dims)


def _emit_dropout(b, i, a):
    _module_or_function(b, i, a["module"], f"drop{i}", f"nn.Dropout({a['p']})",
                        f"F.dropout({b.cur}, p={a['p']}, training=self.training)")


# --- reductions, softmax, views ------------------------------------------------------------------


def _draw_reduce(rng, dims):
    if not dims:
        return None
    fn = rng.choice(["sum", "mean", "amax", "max", "logsumexp"])
    several = rng.random() if fn != "max" and len(dims) >= 3 else 1.0
    if several < 0.15 or several < 0.3 and len(dims) == 3:
        dim = [-2, -1]
    elif several < 0.3:  # every dim after the channels: a global pool over a convolution's output
        dim = list(range(2 - len(dims), 0))
    else:
        dim = [-rng.randint(1, len(dims))]
    return {"fn": fn, "dim": dim, "keepdim": rng.random() < 0.5}


def _emit_reduce(b, i, a):
    dims, picked, keep = list(b.dims), a["dim"], a["keepdim"]
    if any(-d > len(dims) for d in picked):
        raise Invalid("reduction over a missing dimension")
    dim = str(picked[0]) if len(picked) == 1 else "(" + ", ".join(map(str, picked)) + ")"
    x = b.cur
    expr = {"sum": f"{x}.sum(dim={dim}, keepdim={keep})",
            "mean": f"torch.mean({x}, dim={dim}, keepdim={keep})",
            "amax": f"torch.amax({x}, dim={dim}, keepdim={keep})",
            "max": f"torch.max({x}, dim={dim}, keepdim={keep}).values",
            "logsumexp": f"torch.logsumexp({x}, dim={dim}, keepdim={keep})"}[a["fn"]]
    out = [1 if keep and (j - len(dims)) in picked else n for j, n in enumerate(dims)
           if keep or (j - len(dims)) not in picked]
    b.assign(i, expr, out)


def _draw_softmax(rng, dims):
    if not dims:
        return None
    return {"log": rng.random() < 0.3, "dim": -rng.randint(1, len(dims)), "module": rng.random() < 0.3}


def _emit_softmax(b, i, a):
    if -a["dim"] > len(b.dims):
        raise Invalid("softmax over a missing dimension")
    fn = "log_softmax" if a["log"] else "softmax"
    _module_or_function(b, i, a["module"], f"softmax{i}", f"nn.{'LogSoftmax' if a['log'] else 'Softmax'}(dim={a['dim']})",
                        f"torch.{fn}({b.cur}, dim={a['dim']})")


def _draw_flatten(rng, dims):
    if len(dims) < 2:
        return None
    return {"start": rng.choice([1, 1, 2]), "reshape": rng.random() < 0.4}


def _emit_flatten(b, i, a):
    start = a["start"] if len(b.dims) >= 3 else 1
    if len(b.dims) < 2:
        raise Invalid("nothing to flatten")
    kept = b.dims[:start - 1]
    out = kept + (math.prod(b.dims[start - 1:]),)
    x = b.cur
    if a["reshape"]:
        lead = ", ".join(f"{x}.shape[{j}]" for j in range(start))
        b.assign(i, f"{x}.reshape({lead}, -1)", out)
    else:
        b.assign(i, f"torch.flatten({x}, {start})", out)


def _draw_split(rng, dims):
    if not dims or len(dims) >= MAX_RANK - 1:
        return None
    return {"factor": rng.choice([2, 3, 4])}


def _emit_split(b, i, a):
    f = a["factor"]
    if not b.dims or b.dims[-1] % f or b.dims[-1] == f:
        raise Invalid(f"last dimension does not split by {f}")
    b.assign(i, f"{b.cur}.reshape(*{b.cur}.shape[:-1], {f}, -1)", b.dims[:-1] + (f, b.dims[-1] // f))


def _draw_permute(rng, dims):
    if len(dims) < 2:
        return None
    return {"pick": rng.randrange(1000), "swap": rng.random() < 0.5, "contiguous": rng.random() < 0.3}


def _emit_permute(b, i, a):
    n = len(b.dims)
    if n < 2:
        raise Invalid("nothing to permute")
    x, tail = b.cur, ".contiguous()" if a["contiguous"] else ""
    if a["swap"]:
        pairs = list(itertools.combinations(range(1, n + 1), 2))
        p, q = pairs[a["pick"] % len(pairs)]
        dims = list(b.dims)
        dims[p - 1], dims[q - 1] = dims[q - 1], dims[p - 1]
        b.assign(i, f"{x}.transpose({p}, {q}){tail}", dims)
        return
    perms = [p for p in itertools.permutations(range(1, n + 1)) if list(p) != list(range(1, n + 1))]
    perm = perms[a["pick"] % len(perms)]
    b.assign(i, f"{x}.permute(0, {', '.join(map(str, perm))}){tail}", [b.dims[j - 1] for j in perm])


# --- pointwise epilogues --------------------------------------------------------------------------

# activation -> (functional form, module form or None); all in the op table (codegen.triton_ops)
# or decomposed into ops in it
ACTIVATIONS = {
    "relu": ("torch.relu({x})", "nn.ReLU()"),
    "gelu": ("F.gelu({x})", "nn.GELU()"),
    "gelu_tanh": ("F.gelu({x}, approximate='tanh')", "nn.GELU(approximate='tanh')"),
    "tanh": ("torch.tanh({x})", "nn.Tanh()"),
    "sigmoid": ("torch.sigmoid({x})", "nn.Sigmoid()"),
    "silu": ("F.silu({x})", "nn.SiLU()"),
    "elu": ("F.elu({x})", "nn.ELU()"),
    "mish": ("F.mish({x})", "nn.Mish()"),
    "softplus": ("F.softplus({x})", "nn.Softplus()"),
    "abs": ("torch.abs({x})", None),
    "neg": ("-{x}", None),
    "sin": ("torch.sin({x})", None),
    "erf": ("torch.erf({x})", None),
    "where": ("torch.where({x} > 0, {x}, {x} * 0.1)", None),
}


def _draw_activation(rng, dims):
    return {"fn": rng.choice(sorted(ACTIVATIONS)), "module": rng.random() < 0.3}


def _emit_activation(b, i, a):
    functional, module = ACTIVATIONS[a["fn"]]
    if a["module"] and module is not None:
        act = b.attr(f"act{i}", module)
        b.assign(i, f"{act}({b.cur})", b.dims)
    else:
        b.assign(i, functional.format(x=b.cur), b.dims)


def _draw_clamp(rng, dims):
    lo, hi = rng.choice([-1.0, -0.5, 0.0]), rng.choice([0.5, 1.0, 2.0])
    return {"kind": rng.choice(["hardtanh", "clamp", "clamp_min", "clamp_max", "leaky_relu"]), "lo": lo, "hi": hi,
            "slope": rng.choice([0.01, 0.1, 0.2])}


def _emit_clamp(b, i, a):
    x, lo, hi = b.cur, a["lo"], a["hi"]
    expr = {"hardtanh": f"F.hardtanh({x}, min_val={lo}, max_val={hi})",
            "clamp": f"torch.clamp({x}, min={lo}, max={hi})",
            "clamp_min": f"torch.clamp({x}, min={lo})",
            "clamp_max": f"{x}.clamp(max={hi})",
            "leaky_relu": f"F.leaky_relu({x}, negative_slope={a['slope']})"}[a["kind"]]
    b.assign(i, expr, b.dims)


def _draw_scalar(rng, dims):
    return {"op": rng.choice(["mul", "add", "sub", "div", "rsub"]), "value": rng.choice(SCALARS)}


def _emit_scalar(b, i, a):
    x, v = b.cur, a["value"]
    expr = {"mul": f"{x} * {v}", "add": f"{x} + {v}", "sub": f"{x} - {v}", "div": f"{x} / {v}",
            "rsub": f"{v} - {x}"}[a["op"]]
    b.assign(i, expr, b.dims)


def _operand_shape(kind: str, dims: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of a broadcast operand: per channel (C, 1, ..., 1), per last dimension, the
    whole sample, or one element."""
    if kind == "channel" and len(dims) >= 2:
        return (dims[0],) + (1,) * (len(dims) - 1)
    if kind == "full" and dims:
        return dims
    if kind in ("channel", "last", "full") and dims:
        return (dims[-1],)
    return (1,)


def _draw_tensor_op(rng, dims):
    return {"op": rng.choice(["mul", "add", "sub"]), "source": rng.choice(["param", "param", "buffer", "input"]),
            "kind": rng.choice(["channel", "channel", "last", "full", "one"])}


def _emit_tensor_op(b, i, a):
    shape = _operand_shape(a["kind"], b.dims)
    draw = f"torch.randn{shape}"
    if a["source"] == "param":
        y = b.attr(f"w{i}", f"nn.Parameter({draw})")
    elif a["source"] == "buffer":
        b.init.append(f"self.register_buffer('c{i}', {draw})")
        y = f"self.c{i}"
    else:
        y = b.add_input(f"torch.randn({', '.join(map(str, shape))}{b.dtype})")
    sign = {"mul": "*", "add": "+", "sub": "-"}[a["op"]]
    b.assign(i, f"{b.cur} {sign} {y}", b.dims)


def _draw_residual(rng, dims):
    return {"pick": rng.randrange(1000)}


def _emit_residual(b, i, a):
    earlier = [name for name, dims in b.values[:-1] if dims == b.dims]
    if not earlier:
        raise Invalid("no earlier value of this shape")
    b.assign(i, f"{b.cur} + {earlier[a['pick'] % len(earlier)]}", b.dims)


def _draw_concat(rng, dims):
    if not dims:
        return None
    return {"dim": rng.randint(1, len(dims)),
            "with": rng.choice(["earlier", "tanh", "input", "branches", "dense", "conv_branches"]),
            "pick": rng.randrange(1000)}


def _emit_concat(b, i, a):
    """torch.cat of the value with an earlier value of a shape that fits, its tanh, or a new input
    (an Inception / DenseNet / U-Net join) along dim `dim` (1: channels, clamped to the rank); or
    of two branches computed from it (`branches`, an Inception module's join; `conv_branches`: two
    convolutions of it, 1x1 and 3x3 'same', one with a ReLU, joined on the channels: a SqueezeNet
    fire module, whose convolutions with their epilogues may write the join's slices; for one pick in
    three also a pool branch, a 'same' max or avg pool then a 1x1 convolution: an Inception
    module), or a
    growing feature list (`dense`: a DenseNet block's cats, each feature computed from the cat
    before)."""
    if not b.dims:
        raise Invalid("nothing to concatenate along")
    d = min(a["dim"], len(b.dims))
    x = b.cur
    dims = list(b.dims)
    if a["with"] == "conv_branches":
        nd = len(b.dims) - 1
        if nd not in (1, 2, 3):
            raise Invalid("convolution branches need 1 to 3 spatial dims")
        cin, o1, o3 = b.dims[0], 2 + a["pick"] % 5, 3 + a["pick"] % 4
        c1 = b.attr(f"cb{i}_1", f"nn.Conv{nd}d({cin}, {o1}, kernel_size=1)")
        c3 = b.attr(f"cb{i}_3", f"nn.Conv{nd}d({cin}, {o3}, kernel_size=3, padding=1, bias={a['pick'] % 2 == 0})")
        branches, out = [f"torch.relu({c1}({x}))", f"{c3}({x})"], o1 + o3
        if a["pick"] % 3 == 0:  # and a pool branch: a 'same' pool, then a 1x1 convolution (Inception)
            op = 1 + a["pick"] % 3 + a["pick"] % 7
            pool = ("F.max_pool{nd}d" if a["pick"] % 2 else "F.avg_pool{nd}d").format(nd=nd)
            cp = b.attr(f"cb{i}_p", f"nn.Conv{nd}d({cin}, {op}, kernel_size=1)")
            branches.append(f"torch.relu({cp}({pool}({x}, 3, stride=1, padding=1)))")
            out += op
        b.assign(i, f"torch.cat([{', '.join(branches)}], dim=1)", [out] + list(b.dims[1:]))
        return
    if a["with"] == "branches":
        dims[d - 1] *= 2
        b.assign(i, f"torch.cat([torch.relu({x}), torch.sigmoid({x}) * 2.0], dim={d})", dims)
        return
    if a["with"] == "dense":
        dims[d - 1] *= 3
        b.body += [f"h{i}_f1 = torch.relu({x})", f"h{i}_c1 = torch.cat([{x}, h{i}_f1], dim={d})",
                   f"h{i}_f2 = {x} * torch.sigmoid(h{i}_c1.mean(dim={d}, keepdim=True))"]
        b.assign(i, f"torch.cat([{x}, h{i}_f1, h{i}_f2], dim={d})", dims)
        return
    if a["with"] == "earlier":
        fits = [(n, dims) for n, dims in b.values[:-1] if len(dims) == len(b.dims)
                and all(p == q for j, (p, q) in enumerate(zip(dims, b.dims)) if j != d - 1)]
        if not fits:
            raise Invalid("no earlier value that concatenates")
        other, odims = fits[a["pick"] % len(fits)]
    elif a["with"] == "tanh":
        other, odims = f"torch.tanh({x})", b.dims
    else:
        other, odims = b.add_input(f"torch.randn(batch_size, {', '.join(map(str, b.dims))}{b.dtype})"), b.dims
    dims[d - 1] += odims[d - 1]
    b.assign(i, f"torch.cat([{x}, {other}], dim={d})", dims)


def _draw_glu(rng, dims):
    if not dims or dims[-1] % 2:
        return None
    return {"gate": rng.choice(["sigmoid", "gelu", "silu"])}


def _emit_glu(b, i, a):
    """The last dim's halves, one gating the other (GLU / GEGLU / SwiGLU): chunk and multiply."""
    if not b.dims or b.dims[-1] % 2:
        raise Invalid("an odd last dim does not split in halves")
    x = b.cur
    gate = {"sigmoid": "torch.sigmoid", "gelu": "F.gelu", "silu": "F.silu"}[a["gate"]]
    b.assign(i, f"(lambda u, v: u * {gate}(v))(*{x}.chunk(2, dim=-1))", b.dims[:-1] + (b.dims[-1] // 2,))


def _draw_resize(rng, dims):
    if len(dims) not in (2, 3, 4):  # [C, L], [C, H, W], [C, D, H, W]
        return None
    return {"kind": rng.choice(["nearest", "linear", "pad", "pad"]), "pad": rng.randint(1, 2),
            "mode": rng.choice(["constant", "reflect", "replicate"])}


def _emit_resize(b, i, a):
    """F.interpolate by 2 (nearest, or (bi/tri)linear), or F.pad of every spatial dim."""
    nd = len(b.dims) - 1
    if nd not in (1, 2, 3):
        raise Invalid("resizing needs 1-3 spatial dims")
    x = b.cur
    if a["kind"] == "pad":
        p = a["pad"]
        if a["mode"] == "reflect" and min(b.dims[1:]) <= p:
            raise Invalid("reflect padding wider than the input")
        value = ", value=0.5" if a["mode"] == "constant" else ""
        b.assign(i, f"F.pad({x}, {(p, p) * nd}, mode='{a['mode']}'{value})", [b.dims[0]] + [n + 2 * p for n in b.dims[1:]])
        return
    mode = "nearest" if a["kind"] == "nearest" else {1: "linear", 2: "bilinear", 3: "trilinear"}[nd]
    corners = "" if mode == "nearest" else ", align_corners=False"
    b.assign(i, f"F.interpolate({x}, scale_factor=2, mode='{mode}'{corners})", [b.dims[0]] + [2 * n for n in b.dims[1:]])


def _draw_position(rng, dims):
    if len(dims) != 2 or dims[0] > 64:  # [batch, sequence, embedding]
        return None
    return {"extra": rng.choice([0, 3]), "scale": rng.random() < 0.3}


def _emit_position(b, i, a):
    """A learned position embedding added to a [batch, sequence, embedding] value (GPT's wpe):
    nn.Embedding looked up with torch.arange, built in the forward."""
    if len(b.dims) != 2:
        raise Invalid("a position embedding needs a [batch, sequence, embedding] value")
    t, e = b.dims
    emb = b.attr(f"pos{i}", f"nn.Embedding({t + a['extra']}, {e})")
    x = b.cur
    scale = f" * {e ** 0.5:.4f}" if a["scale"] else ""
    b.assign(i, f"{x}{scale} + {emb}(torch.arange({t}, device={x}.device))", b.dims)


def _draw_branch(rng, dims):
    return {"scale": rng.choice([0.5, 2.0, 1.5]), "eval": rng.choice(["tanh", "identity", "shift"])}


def _emit_branch(b, i, a):
    x = b.cur
    eval_expr = {"tanh": f"torch.tanh({x})", "identity": x, "shift": f"{x} + 0.25"}[a["eval"]]
    b.branch(i, f"{x} * {a['scale']}", eval_expr)


OPS: dict[str, Op] = {
    "linear": Op("anchor", _draw_linear, _emit_linear, 3),
    "conv1d": Op("anchor", _draw_conv(1), _emit_conv(1), 4),
    "conv2d": Op("anchor", _draw_conv(2), _emit_conv(2), 8),
    "conv3d": Op("anchor", _draw_conv(3), _emit_conv(3), 6),
    "conv_transpose1d": Op("anchor", _draw_conv_transpose(1), _emit_conv_transpose(1), 1),
    "conv_transpose2d": Op("anchor", _draw_conv_transpose(2), _emit_conv_transpose(2), 3),
    "conv_transpose3d": Op("anchor", _draw_conv_transpose(3), _emit_conv_transpose(3), 3),
    "matmul_input": Op("anchor", _draw_matmul_input, _emit_matmul_input, 1),
    "recurrent": Op("anchor", _draw_recurrent, _emit_recurrent, 1.5),
    "attention": Op("anchor", _draw_attention, _emit_attention, 1.5),
    "bmm_input": Op("anchor", _draw_bmm_input, _emit_bmm_input, 3),
    "gram": Op("anchor", _draw_gram, _emit_gram, 0.5),
    "pool1d": Op("anchor", _draw_pool(1), _emit_pool(1), 2),
    "pool2d": Op("anchor", _draw_pool(2), _emit_pool(2), 3),
    "pool3d": Op("anchor", _draw_pool(3), _emit_pool(3), 2),
    "batchnorm": Op("norm", _draw_batchnorm, _emit_batchnorm, 3),
    "layernorm": Op("norm", _draw_layernorm, _emit_layernorm),
    "groupnorm": Op("norm", _draw_groupnorm, _emit_groupnorm),
    "instancenorm": Op("norm", _draw_instancenorm, _emit_instancenorm, 1.5),
    "dropout": Op("dropout", _draw_dropout, _emit_dropout),
    "reduce": Op("reduce", _draw_reduce, _emit_reduce, 2),
    "softmax": Op("reduce", _draw_softmax, _emit_softmax),
    "flatten": Op("view", _draw_flatten, _emit_flatten, 2),
    "split": Op("view", _draw_split, _emit_split),
    "permute": Op("view", _draw_permute, _emit_permute, 1.5),
    "activation": Op("pointwise", _draw_activation, _emit_activation, 4),
    "clamp": Op("pointwise", _draw_clamp, _emit_clamp, 1.5),
    "scalar": Op("pointwise", _draw_scalar, _emit_scalar, 2),
    "tensor_op": Op("pointwise", _draw_tensor_op, _emit_tensor_op, 2),
    "residual": Op("pointwise", _draw_residual, _emit_residual),
    "concat": Op("view", _draw_concat, _emit_concat, 1.5),
    "glu": Op("pointwise", _draw_glu, _emit_glu, 0.5),
    "position": Op("pointwise", _draw_position, _emit_position, 0.5),
    "resize": Op("view", _draw_resize, _emit_resize, 1),
    "branch": Op("branch", _draw_branch, _emit_branch),
}

# how often each category is drawn after the first step (which is an anchor or a norm)
CATEGORY_WEIGHTS = {"pointwise": 10, "anchor": 3, "norm": 2, "view": 2, "reduce": 1.5, "dropout": 0.7, "branch": 0.6}


def label(op: str, args: dict) -> str:
    """A step's short name in a chain description: `conv2d`, `relu`, `mul_param`, `bn`..."""
    if op == "activation":
        return args["fn"]
    if op == "clamp":
        return args["kind"]
    if op == "scalar":
        return f"{args['op']}_scalar"
    if op == "tensor_op":
        return f"{args['op']}_{args['source']}"
    if op.startswith("conv") and args.get("groups") in ("depthwise", "grouped"):
        return f"{op}_{'dw' if args['groups'] == 'depthwise' else 'g'}"
    if op.startswith("pool"):
        return f"{args['kind']}_{op}"
    if op == "reduce":
        return args["fn"]
    if op == "softmax":
        return "log_softmax" if args["log"] else "softmax"
    if op == "concat":
        return f"cat_{args['with']}"
    if op == "glu":
        return f"glu_{args['gate']}"
    if op == "resize":
        return args["kind"] if args["kind"] != "pad" else f"pad_{args['mode']}"
    if op == "recurrent":
        return f"{args['kind'].lower()}_{args['output']}"
    if op == "attention":
        return "mha" if args["module"] else "attn_by_hand" if args.get("by_hand") else "sdpa"
    return {"batchnorm": "bn", "layernorm": "ln", "groupnorm": "gn", "instancenorm": "in",
            "branch": "if_training", "permute": "permute"}.get(op, op)
