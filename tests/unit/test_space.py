"""Unit tests for kernelwright.space: configs, axes, spaces."""
import json
import random

import pytest

from kernelwright.space import Axis, Config, Space, pow2_range, union


def test_pow2_range():
    assert pow2_range(128, 1024) == [128, 256, 512, 1024]
    assert pow2_range(100, 600) == [128, 256, 512]
    assert pow2_range(1, 1) == [1]
    with pytest.raises(ValueError):
        pow2_range(8, 4)


def test_config_make_get_and_order_independence():
    a = Config.make("rowwise", BLOCK_N=1024, num_warps=4)
    b = Config.make("rowwise", num_warps=4, BLOCK_N=1024)
    assert a == b and hash(a) == hash(b)
    assert a["BLOCK_N"] == 1024 and a.get("num_warps") == 4
    assert a.get("missing") is None and a.get("missing", 7) == 7
    with pytest.raises(KeyError):
        a["missing"]
    assert "BLOCK_N" in a and "x" not in a
    assert a.as_dict() == {"BLOCK_N": 1024, "num_warps": 4}
    assert a.replace(num_warps=8)["num_warps"] == 8 and a["num_warps"] == 4
    assert Config.make("rowwise", BLOCK_N=1024, num_warps=4) != Config.make("other", BLOCK_N=1024, num_warps=4)
    with pytest.raises(Exception):
        a.template = "x"  # frozen


def test_config_key_stable():
    c = Config.make("rowwise", num_warps=4, BLOCK_N=1024)
    assert c.key() == "rowwise[BLOCK_N=1024,num_warps=4]"
    assert str(c) == c.key()
    d = Config.make("mm", BLOCK_M=64, EVEN_K=True, layout="nt", scale=0.5)
    assert d.key() == "mm[BLOCK_M=64,EVEN_K=True,layout=nt,scale=0.5]"
    assert Config.from_key(d.key()) == d
    assert Config.from_key("empty[]") == Config("empty")


def test_config_rejects_bad_values():
    with pytest.raises(TypeError):
        Config.make("t", x=[1, 2])
    with pytest.raises(ValueError):
        Config.make("t", x="a,b")
    with pytest.raises(ValueError):
        Config("")


def test_config_numpy_scalars_normalised():
    np = pytest.importorskip("numpy")
    c = Config.make("t", BLOCK=np.int64(256), flag=np.bool_(True))
    assert c == Config.make("t", BLOCK=256, flag=True)
    assert type(c["BLOCK"]) is int and type(c["flag"]) is bool
    json.dumps(c.to_dict())


def test_config_json_round_trip():
    c = Config.make("mm", BLOCK_M=128, EVEN_K=False, layout="nn", alpha=1.5)
    s = c.to_json()
    assert isinstance(s, str)
    back = Config.from_json(s)
    assert back == c and back.key() == c.key()
    assert type(back["EVEN_K"]) is bool and type(back["BLOCK_M"]) is int
    assert Config.from_json(c.to_dict()) == c
    assert Config.from_json(json.loads(json.dumps(c.to_dict()))) == c


def _space():
    return Space("pointwise",
                 [Axis("BLOCK", pow2_range(128, 4096)), Axis("num_warps", [2, 4, 8]),
                  Axis("num_stages", [1, 2])],
                 [lambda c: c["BLOCK"] // (32 * c["num_warps"]) >= 1])


def test_space_product_size_and_constraints():
    sp = Space("pointwise", [Axis("BLOCK", pow2_range(128, 4096)), Axis("num_warps", [2, 4, 8]),
                             Axis("num_stages", [1, 2])])
    assert sp.product_size == 6 * 3 * 2 == len(sp)
    sp = _space()
    # BLOCK=128 excludes num_warps=8 (128 // 256 == 0): two configs dropped
    assert len(sp) == 36 - 2
    assert all(c["BLOCK"] // (32 * c["num_warps"]) >= 1 for c in sp.configs())
    assert Config.make("pointwise", BLOCK=128, num_warps=8, num_stages=1) not in sp
    assert Config.make("pointwise", BLOCK=128, num_warps=4, num_stages=1) in sp


def test_space_deterministic_order_and_fixed():
    a, b = _space().configs(), _space().configs()
    assert [c.key() for c in a] == [c.key() for c in b]
    # last axis varies fastest
    assert a[0] == Config.make("pointwise", BLOCK=128, num_warps=2, num_stages=1)
    assert a[1] == Config.make("pointwise", BLOCK=128, num_warps=2, num_stages=2)
    sp = Space("t", [Axis("B", [1, 2])], [lambda c: c["dtype"] == "f32"], fixed={"dtype": "f32"})
    assert [c.key() for c in sp] == ["t[B=1,dtype=f32]", "t[B=2,dtype=f32]"]


def test_space_dedupe():
    # repeated axis values are dropped...
    assert Axis("x", [1, 2, 2, 1]).values == (1, 2)
    # ...and so are configs that coincide after construction
    sp = Space("t", [Axis("a", [1, 2]), Axis("b", [1, 1, 3])])
    assert len(sp) == 4
    assert union(sp, sp.configs(), [Config.make("t", a=9, b=9)]) == sp.configs() + [Config.make("t", a=9, b=9)]
    with pytest.raises(ValueError):
        Space("t", [Axis("a", [1]), Axis("a", [2])])
    with pytest.raises(ValueError):
        Axis("empty", [])


def test_space_sample():
    sp = _space()
    s1 = sp.sample(10, 0)
    assert len(s1) == 10 and len(set(s1)) == 10 and all(c in sp for c in s1)
    assert s1 == sp.sample(10, 0)                        # same seed, same sample
    assert sp.sample(10, random.Random(0)) == s1
    assert set(sp.sample(1000, 1)) == set(sp.configs())  # capped at the space size
    np = pytest.importorskip("numpy")
    assert len(sp.sample(5, np.random.default_rng(0))) == 5


def test_long_strided_rows_search_split_and_row_schedules():
    from kernelwright.space.group_space import default_config, group_space, seed_configs, strided_long_rows

    # group norm over channels-last data: 512 rows of 401408 elements, 8 contiguous at a time
    M, R = 512, 401408
    assert strided_long_rows(M, R, False) and not strided_long_rows(M, R, True)
    space = group_space(M, R, False, r_contiguous=False)
    assert {c.template for c in space} == {"triton.split", "triton.row"}
    base = default_config(M, R, False, r_contiguous=False)
    assert base.template == "triton.split" and base["BLOCK_M"] == 64  # 64 rows side by side ...
    assert M * base["SPLIT"] // base["BLOCK_M"] >= 256  # ... and two programs per SM of 132
    seeds = seed_configs(M, R, False, r_contiguous=False)
    # the split tile half as wide next, then the row schedule
    assert seeds[0] == base and seeds[1] == base.replace(BLOCK_M=32) and seeds[2].template == "triton.row"
    assert all(c in space for c in seeds)
    # contiguous rows keep the row space alone
    assert {c.template for c in group_space(M, R, False)} == {"triton.row"}
    # training batch norm over a [8192, 4096] GEMM result: 4096 strided rows of 8192 elements; 32
    # rows side by side are only 128 programs, so the split schedule is searched (and tried first)
    M, R = 4096, 8192
    assert strided_long_rows(M, R, False) and not strided_long_rows(M, 2048, False)
    seeds = seed_configs(M, R, False, r_contiguous=False)
    assert [c.template for c in seeds[:3]] == ["triton.split", "triton.split", "triton.row"]
    assert M * seeds[0]["SPLIT"] // seeds[0]["BLOCK_M"] >= 264


def test_strided_rows_start_with_large_tiles_and_four_warps_and_never_stream_one_row():
    """A reduction over strided rows that fill the GPU (an instance norm over a channels-last
    result): the 64 x 128 default with 4 warps (16 KiB of loads a step), then the sample's
    runners-up: half the rows twice as long, a quarter of them four times as long with 16 warps,
    half the rows with 8 warps; no one-row streaming seed, whose row elements lie a cache line apart."""
    from kernelwright.space.group_space import default_config, group_space, seed_configs, strided_long_rows

    M, R = 16384, 15876
    assert not strided_long_rows(M, R, False)
    base = default_config(M, R, False, r_contiguous=False)
    seeds = seed_configs(M, R, False, r_contiguous=False)
    assert seeds[0] == base and (base["BLOCK_M"], base["BLOCK_R"], base["num_warps"]) == (64, 128, 4)
    assert [(c["BLOCK_M"], c["BLOCK_R"], c["num_warps"]) for c in seeds[1:4]] == [(32, 256, 4), (16, 512, 16), (32, 128, 8)]
    # rows shorter than the tile: one pass over a tile that holds them
    short = default_config(M, 100, False, r_contiguous=False)
    assert (short["BLOCK_M"], short["BLOCK_R"], short["one_pass"]) == (64, 128, True)
    assert short in set(group_space(M, 100, False, r_contiguous=False))
    space = group_space(M, R, False, r_contiguous=False)
    assert all(c["BLOCK_M"] > 1 for c in seeds) and set(seeds) <= set(space)
    # no tile narrower than 16 rows (one row alone reads a cache line per element); contiguous
    # rows keep one-row tiles
    assert min(c["BLOCK_M"] for c in space) == 16 and min(c["BLOCK_M"] for c in group_space(M, R, False)) == 1
    rows = [c for c in group_space(4, 1000, False, r_contiguous=False) if c.template == "triton.row"]
    assert min(c["BLOCK_M"] for c in rows) == 4  # all the rows there are
    # contiguous rows keep the streaming seed second
    assert seed_configs(M, R, False)[1]["BLOCK_M"] == 1


# ---- spaces sized by the device's DeviceSpec -------------------------------------------------

def _config_key(c) -> str:
    return c.key() if isinstance(c, Config) else ",".join(f"{k}={v}" for k, v in sorted(c.items()))


def _fingerprint(configs) -> tuple[int, list[str], str]:
    """(how many, the first two, a digest of the whole ordered list)."""
    import hashlib

    keys = [_config_key(c) for c in configs]
    return len(keys), keys[:2], hashlib.sha1("\n".join(keys).encode()).hexdigest()[:12]


def _node(fn, x, targets):
    from torch import nn

    from kernelwright.capture import capture
    from kernelwright.problem import from_module

    class Fn(nn.Module):
        def forward(self, x):
            return fn(x)

    graph = capture(from_module(Fn(), [x]))
    return graph, next(n for n in graph.nodes if n.target in targets)


def _cases(spec):
    """Representative spaces, seeds and defaults computed for the device `spec`."""
    import torch
    import torch.nn.functional as F

    from kernelwright.codegen.triton_pool import TARGETS as POOLS
    from kernelwright.codegen.triton_pool import TEMPLATE as POOL
    from kernelwright.codegen.triton_scan import TEMPLATE as SCAN
    from kernelwright.space.gemm_space import conv_space, gemm_space, rowreduce_space
    from kernelwright.space.group_space import default_config, group_space, seed_configs

    scan = _node(lambda x: torch.cumsum(x, 1), torch.randn(4, 64, 33), ("aten.cumsum.default",))
    pool = _node(lambda x: F.max_pool2d(x, 2), torch.randn(1, 16, 32, 32), POOLS)
    return {
        "gemm bf16 8192^3": gemm_space("bf16", M=8192, N=8192, K=8192, spec=spec),
        "gemm tf32 64x64x16384": gemm_space("tf32", M=64, N=64, K=16384, spec=spec),
        "gemm tf32 4096^3 tma": gemm_space("tf32", M=4096, N=4096, K=4096, max_configs=12, tma=True, spec=spec),
        "gemm fp32": gemm_space("fp32", spec=spec),
        "rowreduce bf16 8192x4096x4096": rowreduce_space("bf16", M=8192, N=4096, K=4096, elem_bytes=2, spec=spec),
        "rowreduce tf32 tile tma": rowreduce_space("tf32", M=32768, N=256, K=1024, reduce="tile", max_configs=200,
                                                   tma=True, spec=spec),
        "conv tf32": conv_space("tf32", batch=32, Cin=256, Cout=256, OH=56, OW=56, spec=spec),
        "group 65536x8192": group_space(65536, 8192, False, spec=spec),
        "group 512x401408 strided": group_space(512, 401408, False, False, spec=spec),
        "group 64x131072 split": group_space(64, 131072, False, spec=spec),
        "seeds 4096x8192 strided": seed_configs(4096, 8192, False, False, spec=spec),
        "seeds 128x200704 strided": seed_configs(128, 200704, False, False, spec=spec),
        "default 64x131072": [default_config(64, 131072, False, spec=spec)],
        "scan 4x64x33 dim 1": SCAN.space(*scan, spec),
        "scan 4x64x33 dim 1 default": [SCAN.default(*scan, spec)],
        "pool 1x16x32x32 default": [POOL.default(*pool, spec)],
    }


# Computed by the spaces as they were written with the H200's 132 SMs and 227 KiB of shared
# memory per block as literals (codegen/triton_gemm.py, space/group_space.py at `a30ae40`).
H200_FINGERPRINTS = {
    'gemm bf16 8192^3': (60, ['BLOCK_K=64,BLOCK_M=128,BLOCK_N=256,GROUP_M=8,SPLIT_K=1,num_stages=3,num_warps=8', 'BLOCK_K=64,BLOCK_M=256,BLOCK_N=128,GROUP_M=8,SPLIT_K=1,num_stages=3,num_warps=8'], '3ac84daba757'),  # noqa: E501
    'gemm tf32 64x64x16384': (48, ['BLOCK_K=32,BLOCK_M=64,BLOCK_N=64,GROUP_M=8,SPLIT_K=8,num_stages=4,num_warps=4', 'BLOCK_K=32,BLOCK_M=64,BLOCK_N=64,GROUP_M=8,SPLIT_K=4,num_stages=4,num_warps=4'], 'b56fb57f4559'),  # noqa: E501
    'gemm tf32 4096^3 tma': (12, ['BLOCK_K=32,BLOCK_M=128,BLOCK_N=256,GROUP_M=8,SPLIT_K=1,TMA=True,num_stages=3,num_warps=8', 'BLOCK_K=32,BLOCK_M=128,BLOCK_N=256,GROUP_M=8,SPLIT_K=1,num_stages=3,num_warps=8'], '50ef36816829'),  # noqa: E501
    'gemm fp32': (60, ['BLOCK_K=16,BLOCK_M=128,BLOCK_N=128,GROUP_M=8,SPLIT_K=1,num_stages=3,num_warps=8', 'BLOCK_K=32,BLOCK_M=128,BLOCK_N=128,GROUP_M=8,SPLIT_K=1,num_stages=3,num_warps=8'], 'c74ede78a13f'),  # noqa: E501
    'rowreduce bf16 8192x4096x4096': (40, ['BLOCK_K=64,BLOCK_M=64,BLOCK_N=256,GROUP_M=1,SPLIT_K=1,num_stages=4,num_warps=4', 'BLOCK_K=64,BLOCK_M=64,BLOCK_N=256,GROUP_M=1,SPLIT_K=1,num_stages=4,num_warps=8'], 'f45053bbd934'),  # noqa: E501
    'rowreduce tf32 tile tma': (106, ['BLOCK_K=32,BLOCK_M=128,BLOCK_N=256,GROUP_M=1,SPLIT_K=1,num_stages=3,num_warps=8', 'BLOCK_K=32,BLOCK_M=64,BLOCK_N=256,GROUP_M=1,SPLIT_K=1,num_stages=4,num_warps=4'], '3a7abc3d2242'),  # noqa: E501
    'conv tf32': (40, ['BLOCK_K=32,BLOCK_M=128,BLOCK_N=256,GROUP_M=8,SPLIT_K=1,num_stages=3,num_warps=8', 'BLOCK_K=32,BLOCK_M=256,BLOCK_N=128,GROUP_M=8,SPLIT_K=1,num_stages=3,num_warps=8'], '8e306632abd8'),  # noqa: E501
    'group 65536x8192': (321, ['triton.row[BLOCK_M=1,BLOCK_R=8192,EVICT=False,num_stages=1,num_warps=4,one_pass=True]', 'triton.row[BLOCK_M=1,BLOCK_R=8192,EVICT=False,num_stages=1,num_warps=8,one_pass=True]'], 'dfca0169df7f'),  # noqa: E501
    # (row tiles of strided rows take at least 16 rows: fewer configs than at `a30ae40`)
    'group 512x401408 strided': (453, ['triton.split[BLOCK_M=1,BLOCK_R=128,SPLIT=32,num_stages=1,num_warps=4,one_pass=False]', 'triton.split[BLOCK_M=1,BLOCK_R=256,SPLIT=32,num_stages=1,num_warps=4,one_pass=False]'], 'b17c84945456'),  # noqa: E501
    'group 64x131072 split': (383, ['triton.split[BLOCK_M=1,BLOCK_R=128,SPLIT=32,num_stages=1,num_warps=4,one_pass=False]', 'triton.split[BLOCK_M=1,BLOCK_R=128,SPLIT=64,num_stages=1,num_warps=4,one_pass=False]'], 'da833251c109'),  # noqa: E501
    'seeds 4096x8192 strided': (6, ['triton.split[BLOCK_M=64,BLOCK_R=64,SPLIT=32,num_stages=1,num_warps=4,one_pass=False]', 'triton.split[BLOCK_M=32,BLOCK_R=64,SPLIT=32,num_stages=1,num_warps=4,one_pass=False]'], 'da27f0f00957'),  # noqa: E501
    'seeds 128x200704 strided': (4, ['triton.split[BLOCK_M=64,BLOCK_R=64,SPLIT=128,num_stages=1,num_warps=4,one_pass=False]', 'triton.split[BLOCK_M=32,BLOCK_R=64,SPLIT=128,num_stages=1,num_warps=4,one_pass=False]'], 'e288c18386ba'),  # noqa: E501
    'default 64x131072': (1, ['triton.split[BLOCK_M=1,BLOCK_R=2048,SPLIT=32,num_stages=1,num_warps=8,one_pass=False]'], '5ce491117a44'),  # noqa: E501
    'scan 4x64x33 dim 1': (74, ['triton.scan[BLOCK_INNER=16,BLOCK_N=64,num_stages=1,num_warps=1,one_pass=True]', 'triton.scan[BLOCK_INNER=16,BLOCK_N=64,num_stages=1,num_warps=2,one_pass=True]'], '7a48b6a86b79'),  # noqa: E501
    'scan 4x64x33 dim 1 default': (1, ['triton.scan[BLOCK_INNER=16,BLOCK_N=64,num_stages=1,num_warps=4,one_pass=True]'], '928f2c9e7234'),  # noqa: E501
    'pool 1x16x32x32 default': (1, ['triton.pool[BLOCK=128,num_stages=1,num_warps=1]'], 'ec9cc82eacde'),
}


def test_spaces_on_the_h200_spec_match_the_h200_fingerprints():
    from kernelwright.analyze.device import H200

    got = {name: _fingerprint(cfgs) for name, cfgs in _cases(H200).items()}
    assert got == H200_FINGERPRINTS


def test_spaces_default_to_device_spec(monkeypatch):
    """Without a `spec` the spaces are the current device's: the H200 default without a GPU."""
    import dataclasses

    import kernelwright.analyze.device as device
    import kernelwright.space.group_space as gs
    from kernelwright.space.gemm_space import gemm_space
    from kernelwright.space.group_space import group_space

    monkeypatch.delenv("KERNELWRIGHT_CEILINGS", raising=False)
    monkeypatch.setattr(device, "current_cuda_device_name", lambda: None)
    assert gemm_space("tf32", M=4096, N=4096, K=4096, tma=True) == \
        gemm_space("tf32", M=4096, N=4096, K=4096, tma=True, spec=device.H200)
    assert group_space(64, 131072, False) == group_space(64, 131072, False, spec=device.H200)
    fewer = dataclasses.replace(device.H200, sms=66)  # what device_spec() says on a GPU with 66 SMs
    monkeypatch.setattr(gs, "device_spec", lambda *a, **k: fewer)
    assert group_space(200, 65536, False) == group_space(200, 65536, False, spec=fewer)


def test_spaces_follow_the_sm_count_and_shared_memory():
    import dataclasses

    from kernelwright.analyze.device import H200, KiB
    from kernelwright.codegen.cuda_kernels import render_pointwise
    from kernelwright.space.gemm_space import gemm_space, rowreduce_space
    from kernelwright.space.group_space import default_config, group_space, needs_split, strided_long_rows

    def sms(n):
        return dataclasses.replace(H200, sms=n)

    # rows: fewer than two per SM count as too few (a split reduction), on 66 SMs 200 rows do not
    assert needs_split(200, 65536, spec=H200) and not needs_split(200, 65536, spec=sms(66))
    assert {c.template for c in group_space(200, 65536, False, spec=H200)} == {"triton.split"}
    assert "triton.row" in {c.template for c in group_space(200, 65536, False, spec=sms(66))}
    assert strided_long_rows(8000, 8192, False, spec=H200) and not strided_long_rows(8000, 8192, False, spec=sms(66))
    # a split reduction of 8 long rows makes about eight programs per SM
    assert default_config(8, 131072, False, spec=H200)["SPLIT"] == 256
    assert default_config(8, 131072, False, spec=sms(66))["SPLIT"] == 128
    # pointwise spaces do not depend on the device
    assert group_space(1 << 20, 1, True, spec=H200) == group_space(1 << 20, 1, True, spec=sms(66))

    # GEMM: persistent variants where the tiles are at least twice the SMs; split-K below one tile per SM
    def persistent(spec):
        return sum(1 for c in gemm_space("tf32", M=4096, N=4096, K=4096, max_configs=12, tma=True, spec=spec)
                   if c.get("PERSISTENT"))
    assert (persistent(H200), persistent(sms(264))) == (4, 2)

    def split_k(spec):
        return max(c["SPLIT_K"] for c in gemm_space("tf32", M=2048, N=2048, K=16384, spec=spec))
    assert (split_k(H200), split_k(sms(264))) == (2, 4)
    # row-reduction GEMM: whole waves first (8192 rows: 64-row programs fill 132 SMs, 128-row ones 64)
    assert rowreduce_space("bf16", M=8192, N=4096, K=4096, elem_bytes=2, spec=H200)[0]["BLOCK_M"] == 64
    assert rowreduce_space("bf16", M=8192, N=4096, K=4096, elem_bytes=2, spec=sms(64))[0]["BLOCK_M"] == 128
    # shared memory per block bounds every tile's pipeline
    small = dataclasses.replace(H200, smem_per_block=99 * KiB)
    tiles = gemm_space("bf16", M=8192, N=8192, K=8192, spec=small)
    assert tiles != gemm_space("bf16", M=8192, N=8192, K=8192, spec=H200)
    assert all(c["num_stages"] * (c["BLOCK_M"] + c["BLOCK_N"]) * c["BLOCK_K"] * 2 <= 99 * KiB for c in tiles)
    # the CUDA pointwise grid: at most four full waves of the SMs
    pw = render_pointwise("a + 1.0f", ["a"])
    assert pw.geometry(1 << 26, sms=H200.sms) == (4224, 256) and pw.geometry(1 << 26, sms=66) == (2112, 256)


def test_node_template_defaults_follow_the_sm_count():
    import dataclasses

    import torch
    import torch.nn.functional as F

    from kernelwright.analyze.device import H200
    from kernelwright.codegen.triton_pool import TARGETS as POOLS
    from kernelwright.codegen.triton_pool import TEMPLATE as POOL
    from kernelwright.codegen.triton_scan import TEMPLATE as SCAN

    few = dataclasses.replace(H200, sms=1)
    scan = _node(lambda x: torch.cumsum(x, 1), torch.randn(4, 64, 33), ("aten.cumsum.default",))
    # 4 x 64 columns: 16 per program fill two programs per SM of the H200; 64 make 4 programs, enough for 1 SM
    assert SCAN.default(*scan, H200)["BLOCK_INNER"] == 16 and SCAN.default(*scan, few)["BLOCK_INNER"] == 64
    assert SCAN.default(*scan, few) in SCAN.space(*scan, few)
    pool = _node(lambda x: F.max_pool2d(x, 2), torch.randn(1, 16, 32, 32), POOLS)
    # 4096 outputs: 128 a program (32 programs) on the H200, 512 (8 programs, four per SM) on 2 SMs
    assert POOL.default(*pool, H200)["BLOCK"] == 128
    assert POOL.default(*pool, dataclasses.replace(H200, sms=2))["BLOCK"] == 512


def test_device_spec_reads_sms_and_shared_memory_from_the_gpu(monkeypatch):
    """With a GPU, the SM count and the opt-in shared memory per block are the device's (a MIG
    slice has fewer SMs than the table's entry); the rest comes from the table."""
    import types

    import torch

    import kernelwright.analyze.device as device

    monkeypatch.delenv("KERNELWRIGHT_CEILINGS", raising=False)
    monkeypatch.setattr(device, "current_cuda_device_name", lambda: "NVIDIA H200")
    props = types.SimpleNamespace(multi_processor_count=60, shared_memory_per_block_optin=200 * 1024,
                                  L2_cache_size=30 * 2**20)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    spec = device.device_spec()
    assert (spec.name, spec.sms, spec.smem_per_block) == ("NVIDIA H200", 60, 200 * 1024)
    assert spec.l2_bytes == device.H200.l2_bytes and spec.mem_bw_gbs == device.H200.mem_bw_gbs
    # a named device is the table's entry; a ceilings file may still set the fields
    assert device.device_spec("h200").sms == 132
    assert device.device_spec("h200", ceilings={"sm_count": 66, "smem": 100 * 1024}).smem_per_block == 100 * 1024


def test_a_selection_picks_the_configs_that_take_the_listed_values():
    from kernelwright.space.axes import parse_selection, selected

    sel = parse_selection("WAVE=1,BLOCK_H=16:32, num_warps=8")
    assert sel == {"WAVE": {"1"}, "BLOCK_H": {"16", "32"}, "num_warps": {"8"}}
    assert selected({"WAVE": True, "BLOCK_H": 32, "num_warps": 8}, sel)
    assert not selected({"WAVE": False, "BLOCK_H": 32, "num_warps": 8}, sel)
    assert not selected({"WAVE": True, "BLOCK_H": 64, "num_warps": 8}, sel)
    assert not selected({"BLOCK_H": 16, "num_warps": 8}, sel)  # an axis the config lacks reads as false
    assert selected({"BLOCK_H": 16, "num_warps": 8}, parse_selection("WAVE=0,BLOCK_H=16"))
    assert selected({"DOT": "ieee"}, {})  # no selection: every config
    for bad in ("WAVE", "=1", "BLOCK_H=", "WAVE=1,,num_warps=4"):
        with pytest.raises(ValueError, match="AXIS=V"):
            parse_selection(bad)
