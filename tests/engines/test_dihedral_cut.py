"""Flips and quarter turns inside the cut: every engine path gives exactly the numpy reference's
dihedral transform of each patch, in both layouts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hsgds import defaults
from hsgds.augment import apply_dihedral_numpy
from hsgds.engines import PatchSpec, TorchEngine, make_engine
from hsgds.errors import InputError


@pytest.mark.parametrize("engine_name", ["torch", "dali"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("store, out", [(np.uint16, torch.float32), (np.int16, torch.bfloat16),
                                        (np.float32, torch.float64)])
def test_engines_apply_each_patch_code(engine_name, layout, store, out):
    if engine_name == "dali":
        pytest.importorskip("nvidia.dali")
    rng = np.random.default_rng(5)
    slots, side, bands, p = 4, 11, 6, 7
    r = p // 2
    tiles = rng.integers(0, 3000, (slots, side, side, bands)).astype(store)
    n = 300  # several CPU chunks
    slot, y, x = rng.integers(0, slots, n), rng.integers(r, side - r, n), rng.integers(r, side - r, n)
    codes = rng.integers(0, 8, n).astype(np.int8)
    offset, scale = rng.normal(50, 5, bands), 1 / rng.uniform(5, 50, bands)
    spec = PatchSpec(patch_size=p, halo=r, bands=bands, tile_side=side, layout=layout, out_dtype=out,
                     offset=offset, scale=scale)
    engine = make_engine(engine_name, spec, max_batch_size=300)
    t = [torch.from_numpy(a) for a in (slot, y, x)]
    plain = engine.cut(torch.from_numpy(tiles), *t).clone()
    turned = engine.cut(torch.from_numpy(tiles), *t, dihedral=torch.from_numpy(codes))
    for k in range(n):
        a, b = (plain[k].permute(1, 2, 0) if layout == "NCHW" else plain[k]), None
        b = turned[k].permute(1, 2, 0) if layout == "NCHW" else turned[k]
        expect = apply_dihedral_numpy(a.view(torch.int16 if out == torch.bfloat16 else out).numpy(), int(codes[k]))
        got = b.view(torch.int16 if out == torch.bfloat16 else out).numpy()
        np.testing.assert_array_equal(got, expect)
    identity = engine.cut(torch.from_numpy(tiles), *t, dihedral=torch.zeros(n, dtype=torch.int8))
    if engine_name == "dali":  # the same numbers as the torch engine, bit for bit
        ref = TorchEngine(spec).cut(torch.from_numpy(tiles), *t, dihedral=torch.from_numpy(codes))
        assert torch.equal(ref.view(torch.int16) if out == torch.bfloat16 else ref,
                           turned.view(torch.int16) if out == torch.bfloat16 else turned)
    assert torch.equal(identity.view(torch.int16) if out == torch.bfloat16 else identity,
                       plain.view(torch.int16) if out == torch.bfloat16 else plain)


def test_bad_codes_are_input_errors():
    spec = PatchSpec(patch_size=3, halo=1, bands=2, tile_side=5, layout="NCHW", out_dtype=torch.float32,
                     offset=np.zeros(2), scale=np.ones(2))
    engine = TorchEngine(spec)
    storage = torch.zeros((1, 5, 5, 2), dtype=torch.int16)
    one = torch.ones(1, dtype=torch.int64)
    with pytest.raises(InputError, match="codes must be in 0..7"):
        engine.cut(storage, one * 0, one * 2, one * 2, dihedral=torch.tensor([8]))
    with pytest.raises(InputError, match="one code per sample"):
        engine.cut(storage, one * 0, one * 2, one * 2, dihedral=torch.tensor([1, 2]))


@pytest.mark.parametrize("numba", [True, False], ids=["numba", "torch-ops"])
@pytest.mark.parametrize("select", [False, True])
def test_per_scene_tables_apply_each_patch_code(select, numba):
    """Several scenes (per-scene tables), with and without a band selection: the turned cut equals the
    numpy dihedral transform of the plain cut, patch by patch."""
    from hsgds.engines.base import SceneTables

    rng = np.random.default_rng(8)
    slots, side, stride, p = 3, 9, 5, 5
    r = p // 2
    storage = torch.from_numpy(rng.integers(0, 4000, (slots, side, side, stride)).astype(np.int16))
    band = np.array([[0, 2, 4], [1, 3, 4]]) if select else np.tile(np.arange(stride), (2, 1))
    bands = band.shape[1]
    tables = SceneTables(side=np.array([side, side]), stride=np.array([stride, stride]), band=band,
                         offset=rng.normal(10, 1, (2, bands)), scale=1 / rng.uniform(5, 9, (2, bands)))
    spec = PatchSpec(patch_size=p, halo=r, bands=bands, tile_side=side, layout="NCHW", out_dtype=torch.float32,
                     offset=np.zeros(bands), scale=np.ones(bands), tables=tables)
    if numba:
        pytest.importorskip("numba")
    with defaults.set(numba=numba):
        engine = TorchEngine(spec)
    n = 120
    coords = [torch.from_numpy(a) for a in (rng.integers(0, slots, n), rng.integers(r, side - r, n),
                                            rng.integers(r, side - r, n), rng.integers(0, 2, n))]
    codes = rng.integers(0, 8, n).astype(np.int8)
    plain = engine.cut(storage, *coords).clone()
    turned = engine.cut(storage, *coords, dihedral=torch.from_numpy(codes))
    for k in range(n):
        expect = apply_dihedral_numpy(plain[k].permute(1, 2, 0).numpy(), int(codes[k]))
        np.testing.assert_array_equal(turned[k].permute(1, 2, 0).numpy(), expect)
