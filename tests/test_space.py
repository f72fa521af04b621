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
    assert seeds[0] == base and seeds[1].template == "triton.row" and all(c in space for c in seeds)
    # contiguous rows keep the row space alone
    assert {c.template for c in group_space(M, R, False)} == {"triton.row"}
    # training batch norm over a [8192, 4096] GEMM result: 4096 strided rows of 8192 elements; 32
    # rows side by side are only 128 programs, so the split schedule is searched (and tried first)
    M, R = 4096, 8192
    assert strided_long_rows(M, R, False) and not strided_long_rows(M, 2048, False)
    seeds = seed_configs(M, R, False, r_contiguous=False)
    assert [c.template for c in seeds[:2]] == ["triton.split", "triton.row"]
    assert M * seeds[0]["SPLIT"] // seeds[0]["BLOCK_M"] >= 264
