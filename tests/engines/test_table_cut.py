"""The torch engine's per-scene tables (several scenes, band selections) against a plain numpy cut."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hsgds import defaults
from hsgds.engines import make_engine
from hsgds.engines.base import PatchSpec, SceneTables
from hsgds.errors import ConfigError, InputError


@pytest.fixture(autouse=True, params=["numba", "torch-ops"])
def cpu_path(request: pytest.FixtureRequest):
    """Every test runs on both CPU paths: the fused numba kernel (when installed) and the torch ops."""
    if request.param == "numba":
        pytest.importorskip("numba")
    with defaults.set(numba=request.param == "numba"):
        yield request.param


def _storage(rng, dtype, slots, elems):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, (slots, elems), endpoint=True).astype(dtype)


def _reference(storage, tables, slot, y, x, table, p):
    r = p // 2
    out = []
    for s, yy, xx, t in zip(slot, y, x, table):
        side, stride = tables.side[t], tables.stride[t]
        tile = storage[s, :side * side * stride].reshape(side, side, stride).astype(np.float64)
        patch = tile[yy - r:yy + r + 1, xx - r:xx + r + 1][..., tables.band[t]]
        out.append((patch - tables.offset[t]) * tables.scale[t])
    return np.stack(out)  # (N, p, p, B)


@pytest.mark.parametrize("dtype", [np.int16, np.uint16])
@pytest.mark.parametrize("layout,out_dtype", [("NCHW", torch.float32), ("NHWC", torch.float32),
                                              ("NCHW", torch.bfloat16), ("NHWC", torch.float16)])
def test_mixed_geometry_and_band_selection_equal_numpy(dtype, layout, out_dtype, cpu_path):
    rng = np.random.default_rng(3)
    p, n = 5, 300
    # table 0: 12-px tiles of 5 bands; table 1: 10-px tiles of 7 bands; slots sized for the larger
    tables = SceneTables(side=np.array([12, 10]), stride=np.array([5, 7]), band=np.array([[4, 0, 2], [6, 1, 3]]),
                         offset=rng.normal(size=(2, 3)) * 100, scale=rng.uniform(0.001, 0.01, (2, 3)))
    storage = _storage(rng, dtype, 6, 12 * 12 * 7)
    table = rng.integers(0, 2, n)
    side = tables.side[table]
    y = rng.integers(2, side - 2)
    x = rng.integers(2, side - 2)
    slot = rng.integers(0, 6, n)
    spec = PatchSpec(p, 2, 3, 12, layout, out_dtype, np.zeros(3), np.ones(3), tables=tables)
    engine = make_engine("torch", spec, "cpu")
    assert any(("fused numba kernel" in why) == (cpu_path == "numba") for why in engine.reasons)
    got = engine.cut(torch.from_numpy(storage), *(torch.from_numpy(a) for a in (slot, y, x, table)))
    ref = _reference(storage, tables, slot, y, x, table, p)
    if layout == "NCHW":
        ref = ref.transpose(0, 3, 1, 2)
    assert got.dtype == out_dtype and got.shape == ref.shape
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[out_dtype]
    np.testing.assert_allclose(got.float().numpy(), ref, rtol=tol, atol=tol * 10)


def test_uniform_tables_equal_the_single_table_engine_bit_for_bit():
    rng = np.random.default_rng(4)
    s, b, p, n = 16, 6, 7, 400
    storage = torch.from_numpy(_storage(rng, np.int16, 5, s * s * b).reshape(5, s, s, b))
    off, scl = rng.normal(size=(3, b)) * 50, rng.uniform(0.01, 0.1, (3, b))
    tables = SceneTables(np.full(3, s), np.full(3, b), np.tile(np.arange(b), (3, 1)), off, scl)
    assert tables.uniform
    multi = make_engine("torch", PatchSpec(p, 3, b, s, "NCHW", torch.float32, off[0], scl[0], tables=tables), "cpu")
    slot, y, x = (torch.from_numpy(rng.integers(lo, hi, n)) for lo, hi in ((0, 5), (3, s - 3), (3, s - 3)))
    table = torch.from_numpy(rng.integers(0, 3, n))
    got = multi.cut(storage, slot, y, x, table)
    for t in range(3):  # each scene's rows are exactly what a single-scene engine with its constants cuts
        single = make_engine("torch", PatchSpec(p, 3, b, s, "NCHW", torch.float32, off[t], scl[t]), "cpu")
        rows = table == t
        assert torch.equal(got[rows], single.cut(storage, slot[rows], y[rows], x[rows]))


def test_bad_tables_and_coordinates_are_one_line_errors():
    tables = SceneTables(np.array([8]), np.array([4]), np.array([[4]]), np.zeros((1, 1)), np.ones((1, 1)))
    with pytest.raises(ConfigError, match="outside its scene's stored bands"):
        make_engine("torch", PatchSpec(3, 1, 1, 8, "NCHW", torch.float32, np.zeros(1), np.ones(1), tables=tables))
    tables = SceneTables(np.array([8]), np.array([4]), np.array([[3]]), np.zeros((1, 2)), np.ones((1, 1)))
    with pytest.raises(ConfigError, match=r"tables.offset must have shape \(1, 1\)"):
        make_engine("torch", PatchSpec(3, 1, 1, 8, "NCHW", torch.float32, np.zeros(1), np.ones(1), tables=tables))
    tables = SceneTables(np.array([8]), np.array([4]), np.array([[3]]), np.zeros((1, 1)), np.ones((1, 1)))
    engine = make_engine("torch", PatchSpec(3, 1, 1, 8, "NCHW", torch.float32, np.zeros(1), np.ones(1),
                                            tables=tables), "cpu")
    storage = torch.zeros((2, 8 * 8 * 4), dtype=torch.int16)
    one = torch.ones(1, dtype=torch.int64)
    with pytest.raises(InputError, match="table="):
        engine.cut(storage, one, one, one)
    with pytest.raises(InputError, match="outside its 8-px tile"):
        engine.cut(storage, one, one * 7, one, one * 0)
    with pytest.raises(InputError, match="tables are 0..0"):
        engine.cut(storage, one, one, one, one)
