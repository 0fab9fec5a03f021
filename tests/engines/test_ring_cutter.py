"""TorchEngine.ring_cutter, the loader's per-batch path to the fused CPU kernel: the patches of an independent
numpy reference and the public cut's bits, and the public path's errors for what could corrupt memory."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numba")

from hsgds import defaults  # noqa: E402
from hsgds.engines import PatchSpec, TorchEngine  # noqa: E402
from hsgds.engines.base import SceneTables  # noqa: E402
from hsgds.errors import InputError  # noqa: E402

from .test_cpu_cut import _equal_bits, _reference, _storage  # noqa: E402
from .test_table_cut import _reference as _tables_reference  # noqa: E402


def _coords(rng, n: int, slots: int, side: int, r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return rng.integers(0, slots, n), rng.integers(r, side - r, n), rng.integers(r, side - r, n)


@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_ring_cutter_gives_numpys_patches_and_the_public_cuts_bits(out_dtype, layout):
    side, slots, bands, p, n = 15, 4, 6, 5, 300
    storage = _storage("int16", slots, side, bands, seed=1)
    rng = np.random.default_rng(2)
    slot, y, x = _coords(rng, n, slots, side, p // 2)
    codes = rng.integers(0, 8, n).astype(np.int8)
    offset, scale = rng.normal(size=bands) * 100, rng.uniform(0.001, 0.01, bands)
    engine = TorchEngine(PatchSpec(p, 3, bands, side, layout, getattr(torch, out_dtype), offset, scale))
    ring = torch.from_numpy(storage)
    cutter = engine.ring_cutter(ring)
    assert cutter is not None
    nchw = layout == "NCHW"
    got = cutter.start(slot, y, x).result()
    _equal_bits(got, _reference(storage, slot, y, x, p, offset, scale, out_dtype, nchw))
    turned = cutter.start(slot, y, x, dihedral=codes).result()
    _equal_bits(turned, _reference(storage, slot, y, x, p, offset, scale, out_dtype, nchw, codes))
    co = [torch.from_numpy(a) for a in (slot, y, x)]
    _equal_bits(turned, engine.start_cut(ring, *co, dihedral=torch.from_numpy(codes)).result())
    engine.close()


def test_ring_cutter_of_several_scenes_keeps_each_tables_geometry_and_band_map():
    rng = np.random.default_rng(3)
    p, n = 5, 200
    tables = SceneTables(side=np.array([12, 10]), stride=np.array([5, 7]), band=np.array([[4, 0, 2], [6, 1, 3]]),
                         offset=rng.normal(size=(2, 3)) * 100, scale=rng.uniform(0.001, 0.01, (2, 3)))
    storage = rng.integers(-2000, 2000, (6, 12 * 12 * 7)).astype(np.int16)
    table = rng.integers(0, 2, n)
    side = tables.side[table]
    y, x, slot = rng.integers(2, side - 2), rng.integers(2, side - 2), rng.integers(0, 6, n)
    engine = TorchEngine(PatchSpec(p, 2, 3, 12, "NHWC", torch.float32, np.zeros(3), np.ones(3), tables=tables))
    cutter = engine.ring_cutter(torch.from_numpy(storage))
    assert cutter is not None
    got = cutter.start(slot, y, x, table).result()
    ref = _tables_reference(storage, tables, slot, y, x, table, p)
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-5, atol=1e-4)
    engine.close()


def test_ring_cutter_refuses_what_the_public_path_refuses():
    side, slots, bands, p = 9, 2, 3, 5
    engine = TorchEngine(PatchSpec(p, 2, bands, side, "NCHW", torch.float32, np.zeros(bands), np.ones(bands)))
    ring = torch.zeros((slots, side, side, bands), dtype=torch.int16)
    cutter = engine.ring_cutter(ring)
    assert cutter is not None
    ok = np.array([2, 4])
    with pytest.raises(InputError, match=r"sample 1 \(slot 2, y 4, x 4\) is outside the storage"):
        cutter.start(np.array([0, 2]), ok, ok)  # a slot past the ring
    with pytest.raises(InputError, match=r"sample 0 \(slot 0, y 1, x 2\)"):
        cutter.start(np.array([0, 1]), np.array([1, 4]), ok)  # a patch leaving its tile
    with pytest.raises(InputError, match="dihedral codes must be in 0..7"):
        cutter.start(np.array([0, 1]), ok, ok, dihedral=np.array([0, 8], np.int8))
    with pytest.raises(InputError, match="storage must have shape"):
        engine.ring_cutter(torch.zeros((slots, side, side, bands + 1), dtype=torch.int16))
    with pytest.raises(InputError, match="normalized=True needs tiles"):
        engine.ring_cutter(ring.to(torch.int8), normalized=True)
    engine.close()


def test_no_ring_cutter_without_the_fused_kernel():
    spec = PatchSpec(5, 2, 3, 9, "NCHW", torch.float32, np.zeros(3), np.ones(3))
    with defaults.set(numba=False):
        engine = TorchEngine(spec)
    assert engine.ring_cutter(torch.zeros((2, 9, 9, 3), dtype=torch.int16)) is None


def test_patch_starts_keeps_the_gil():
    """The training thread's one kernel call per batch (a few µs) does not let go of the GIL: a thread waiting
    for it (a cutting thread between ranges, the batch thread) would take it, and the training thread would
    sleep until it came back, at every batch."""
    from hsgds.engines import cpu_cut

    assert cpu_cut._compiled().patch_starts.targetoptions["nogil"] is False
    assert cpu_cut._compiled().cut_patches.targetoptions["nogil"] is True  # the cutting threads' kernel does
