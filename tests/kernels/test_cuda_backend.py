"""CUDA C++ backend: templates render and compile with NVRTC (no GPU needed); build cache,
errors as data, resource usage; GPU tests launch every kernel and compare with torch."""

import ast
import itertools

import pytest
import torch

from kernelwright.codegen import cuda_kernels as ck

try:
    from kernelwright.build import nvrtc_available

    _NVRTC_OK, _NVRTC_WHY = nvrtc_available()
except Exception as e:  # pragma: no cover
    _NVRTC_OK, _NVRTC_WHY = False, str(e)

nvrtc = pytest.mark.skipif(not _NVRTC_OK, reason=f"NVRTC unavailable: {_NVRTC_WHY}")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
ARCHS = ("sm_80", "sm_90")


def pairwise(axes: dict) -> list[dict]:
    """A small set of configurations covering every pair of values of every two axes."""
    names = list(axes)
    rows = [dict(zip(names, vals)) for vals in itertools.product(*axes.values())]
    need = {(a, va, b, vb) for a, b in itertools.combinations(names, 2)
            for va in axes[a] for vb in axes[b]}
    chosen = []
    while need:
        best = max(rows, key=lambda r: sum((a, r[a], b, r[b]) in need
                                           for a, b in itertools.combinations(names, 2)))
        chosen.append(best)
        need -= {(a, best[a], b, best[b]) for a, b in itertools.combinations(names, 2)}
    return chosen


ROW_AXES = {"threads": [128, 256, 512], "vec": [1, 4], "warp_row": [False, True],
            "reg_items": [0, 4]}


def _specs():
    out = []
    for c in pairwise({"threads": [128, 256, 512], "vec": [1, 4], "unroll": [1, 2, 4]}):
        out.append(ck.render_pointwise("fmaxf(a * s + b, 0.0f) - expf(-fabsf(a))", ["a", "b"],
                                       ["s"], **c))
    out.append(ck.render_pointwise("tanhf(x0)", ["x0"]))
    for c in pairwise({**ROW_AXES, "log": [False, True], "online": [False, True]}):
        out.append(ck.render_row_softmax(**c))
    for c in pairwise({**ROW_AXES, "op": ["sum", "mean", "max", "min"]}):
        out.append(ck.render_row_reduce(**c))
    for c in pairwise({**ROW_AXES, "welford": [False, True], "has_weight": [False, True],
                       "has_bias": [False, True]}):
        out.append(ck.render_layernorm(**c))
    return out


# ---- rendering (no NVRTC) ---------------------------------------------------------------------

def test_render_shapes_and_geometry():
    pw = ck.render_pointwise("a + b", ["a", "b"], threads=128, vec=4, unroll=2)
    assert "extern \"C\" __global__" in pw.source and pw.name in pw.source
    assert "__launch_bounds__(THREADS)" in pw.source and "float4" in pw.source
    grid, block = pw.geometry(1 << 20, sms=132)
    assert block == 128 and grid == min(-(-(1 << 20) // (128 * 4 * 2)), 132 * 16 * 4)
    sm = ck.render_row_softmax(warp_row=True, threads=256)
    assert sm.geometry(1000, 64) == (125, 256)  # 8 rows per block
    assert ck.render_row_reduce("max").geometry(77, 5000) == (77, 256)
    v = sm.variant(THREADS=512, VEC=1)
    assert v.defines["THREADS"] == 512 and v.source == sm.source
    with pytest.raises(KeyError):
        sm.variant(NOPE=1)


def test_render_rejects_bad_input():
    with pytest.raises(ValueError):
        ck.render_pointwise("out + 1", ["out"])  # clashes with the output argument
    with pytest.raises(ValueError):
        ck.render_pointwise("a", ["a"], threads=100)
    with pytest.raises(ValueError):
        ck.render_row_reduce("prod")
    with pytest.raises(ValueError):
        ck.render_pointwise("1.0f", [])


def test_runtime_is_self_contained():
    tree = ast.parse(ck.runtime_source())
    mods = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            mods.add((node.module or "").split(".")[0])
    assert mods <= {"torch", "numpy", "cuda", "hashlib", "threading"}, mods


def test_standalone_module_text(tmp_path):
    specs = [ck.render_row_softmax(log=True, reg_items=4), ck.render_pointwise("a * 2.0f", ["a"])]
    text = "import torch\n" + ck.render_runtime_loader() + "".join(
        ck.render_standalone_launcher(s, f"K{i}") for i, s in enumerate(specs))
    mod_path = tmp_path / "model_new.py"
    mod_path.write_text(text)
    ck.write_runtime(tmp_path)
    ns = {"__file__": str(mod_path), "__name__": "model_new_test"}
    import sys

    sys.modules.pop(ck.RUNTIME_MODULE, None)
    try:
        exec(compile(text, str(mod_path), "exec"), ns)  # no GPU needed to build the objects
        assert ns["K0"].kind == "row_softmax" and ns["K0"].source == specs[0].source
        assert ns["K1"].defines == dict(specs[1].defines)
    finally:
        sys.modules.pop(ck.RUNTIME_MODULE, None)


# ---- NVRTC ------------------------------------------------------------------------------------

@pytest.mark.nvrtc
@nvrtc
def test_every_template_compiles(tmp_path):
    from kernelwright.build import CompileJob, compile_many

    specs = _specs()
    jobs = [CompileJob(s.source, s.name, arch, s.defines, tag=(s.kind, arch, dict(s.defines)))
            for s in specs for arch in ARCHS]
    results = compile_many(jobs, max_workers=2, cache_dir=False)
    bad = [(r.job.tag, r.message[:500]) for r in results if not r.ok]
    assert not bad, bad
    kinds = {r.name.split("_")[1] for r in results}
    assert len(results) == len(jobs) and len(kinds) >= 3
    for r in results:
        assert r.cubin[:4] == b"\x7fELF" and r.arch in ARCHS
        assert r.resources is not None and r.resources.registers > 0
        assert r.resources.spill_stores == 0, (r.name, r.defines, r.resources)


@pytest.mark.nvrtc
@nvrtc
def test_broken_source_raises_build_error():
    from kernelwright.build import BuildError, compile_cuda

    src = 'extern "C" __global__ void k(float* y) { y[0] = undefined_thing; }'
    with pytest.raises(BuildError) as ei:
        compile_cuda(src, "k", "sm_90", cache_dir=False)
    assert "undefined_thing" in ei.value.log and "undefined_thing" in str(ei.value)
    # a source that compiles but lacks the named kernel
    with pytest.raises(BuildError):
        compile_cuda('extern "C" __global__ void other(float* y) { y[0] = 1.f; }', "k", "sm_90",
                     cache_dir=False)


@pytest.mark.nvrtc
@nvrtc
def test_cache_returns_same_cubin(tmp_path):
    from kernelwright.build import STATS, compile_cuda

    s = ck.render_row_softmax(reg_items=2)
    before = STATS["compiles"]
    b1 = compile_cuda(s.source, s.name, "sm_90", s.defines, cache_dir=tmp_path)
    assert STATS["compiles"] == before + 1 and not b1.cached
    hits = STATS["cache_hits"]
    b2 = compile_cuda(s.source, s.name, "sm_90", s.defines, cache_dir=tmp_path)
    assert STATS["compiles"] == before + 1 and STATS["cache_hits"] == hits + 1
    assert b2.cached and b2.cubin == b1.cubin and b2.resources == b1.resources
    # other defines or another arch is another entry
    b3 = compile_cuda(s.source, s.name, "sm_90", {**s.defines, "THREADS": 128}, cache_dir=tmp_path)
    b4 = compile_cuda(s.source, s.name, "sm_80", s.defines, cache_dir=tmp_path)
    assert not b3.cached and not b4.cached and STATS["compiles"] == before + 3


@pytest.mark.nvrtc
@nvrtc
def test_compile_many_errors_are_data():
    from kernelwright.build import BuildFailure, CudaBuild, compile_many

    good = ck.render_row_reduce("sum")
    jobs = [dict(source=good.source, name=good.name, arch="sm_90", defines=good.variant(THREADS=t).defines)
            for t in (128, 256)]
    jobs.insert(1, dict(source="this is not C++", name="k", arch="sm_90"))
    res = compile_many(jobs, max_workers=2, cache_dir=False)
    assert [r.ok for r in res] == [True, False, True]
    assert isinstance(res[0], CudaBuild) and isinstance(res[1], BuildFailure)
    assert res[1].kind == "compile" and res[1].log


@pytest.mark.nvrtc
@nvrtc
def test_resource_usage_without_gpu():
    from kernelwright.build import compile_cuda, parse_ptxas_log, resource_usage

    s = ck.render_layernorm(reg_items=4)
    b = compile_cuda(s.source, s.name, "sm_90", s.defines, cache_dir=False)
    use, why = resource_usage(b, device=False)
    assert use is not None and use.registers > 0 and use.shared_bytes > 0, why
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
           "ptxas         .     24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 1 barriers, 4096 bytes smem\n")
    u = parse_ptxas_log(log, "k")
    assert (u.registers, u.shared_bytes, u.local_bytes, u.spill_stores, u.spill_loads) == \
        (255, 4096, 24, 8, 12) and u.spills


# ---- GPU --------------------------------------------------------------------------------------

def _close(a, b, tol=1e-4):
    excess = ((a.double() - b.double()).abs() - tol * b.double().abs()).max().item()
    assert excess <= tol, excess


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("vec,unroll", [(1, 1), (4, 1), (4, 4)])
def test_gpu_pointwise(vec, unroll, tmp_path):
    spec = ck.render_pointwise("fmaxf(a * s + b, 0.0f)", ["a", "b"], ["s"], vec=vec, unroll=unroll)
    run = ck.PointwiseLauncher(spec, cache_dir=tmp_path)
    for n in (1, 1003, 1 << 20):
        a, b = torch.randn(n + 1, device="cuda"), torch.randn(n, device="cuda")
        for aa in (a[:n], a[1:]):  # aligned and misaligned
            _close(run(aa, b, scalars=(0.5,)), torch.relu(aa * 0.5 + b))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("cfg", pairwise({**ROW_AXES, "log": [False, True], "online": [False, True]}))
def test_gpu_softmax(cfg, tmp_path):
    run = ck.RowSoftmaxLauncher(ck.render_row_softmax(**cfg), cache_dir=tmp_path)
    for m, n in ((7, 33), (64, 1024), (3, 5000), (130, 12)):
        x = torch.randn(m, n, device="cuda") * 4
        ref = torch.log_softmax(x, -1) if cfg["log"] else torch.softmax(x, -1)
        _close(run(x), ref)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("cfg", pairwise({**ROW_AXES, "op": ["sum", "mean", "max", "min"]}))
def test_gpu_row_reduce(cfg, tmp_path):
    run = ck.RowReduceLauncher(ck.render_row_reduce(**cfg), cache_dir=tmp_path)
    f = {"sum": lambda x: x.sum(-1), "mean": lambda x: x.mean(-1),
         "max": lambda x: x.amax(-1), "min": lambda x: x.amin(-1)}[cfg["op"]]
    for shape in ((7, 33), (64, 1024), (3, 5000), (2, 4, 12)):
        x = torch.randn(*shape, device="cuda")
        _close(run(x), f(x), 1e-4 if cfg["op"] in ("max", "min") else 1e-3)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("cfg", pairwise({**ROW_AXES, "welford": [False, True],
                                          "has_weight": [False, True], "has_bias": [False, True]}))
def test_gpu_layernorm(cfg, tmp_path):
    run = ck.LayerNormLauncher(ck.render_layernorm(**cfg), cache_dir=tmp_path)
    for m, n in ((7, 33), (64, 1024), (3, 5000)):
        x = torch.randn(m, n, device="cuda") * 3 + 1
        w = torch.randn(n, device="cuda") if cfg["has_weight"] else None
        b = torch.randn(n, device="cuda") if cfg["has_bias"] else None
        _close(run(x, w, b, 1e-5), torch.nn.functional.layer_norm(x, (n,), w, b, 1e-5))


@pytest.mark.gpu
@gpu
def test_gpu_standalone_module(tmp_path):
    import importlib.util
    import sys

    spec = ck.render_row_softmax(reg_items=4)
    text = "import torch\n" + ck.render_runtime_loader() + ck.render_standalone_launcher(spec, "SM")
    (tmp_path / "model_new.py").write_text(text)
    ck.write_runtime(tmp_path)
    sys.modules.pop(ck.RUNTIME_MODULE, None)
    m = importlib.util.spec_from_file_location("kw_model_new_t", tmp_path / "model_new.py")
    mod = importlib.util.module_from_spec(m)
    m.loader.exec_module(mod)
    x = torch.randn(33, 1000, device="cuda")
    _close(mod.SM(x), torch.softmax(x, -1))
    sys.modules.pop(ck.RUNTIME_MODULE, None)


@pytest.mark.gpu
@gpu
def test_gpu_resource_usage_from_driver(tmp_path):
    from kernelwright.build import resource_usage

    b = ck.render_row_softmax().compile(cache_dir=tmp_path)
    use, why = resource_usage(b, device=True)
    assert use is not None and use.source == "driver" and use.registers > 0, why
