"""Tiles normalized once in the ring (TorchEngine.normalize_tile, then cut(normalized=True)): the patches are
the bits of the fused kernel and of an independent numpy reference, for every layout, transform, dropout,
band map and tile geometry; the loader switches it on for 16-bit CPU outputs and gives the same batches."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numba")

from hsgds import Augment, PatchLoader, defaults  # noqa: E402
from hsgds.engines import PatchSpec, TorchEngine, cpu_cut  # noqa: E402
from hsgds.engines.base import SceneTables  # noqa: E402
from hsgds.errors import InputError  # noqa: E402

from .kernel_pairs import NORMALIZED_PAIRS  # noqa: E402
from .test_cpu_cut import _equal_bits, _reference, _storage  # noqa: E402


def _normalized(engine: TorchEngine, storage: torch.Tensor, tables=None) -> torch.Tensor:
    """A copy of ``storage`` with every slot normalized in place (slot s holding a tile of ``tables[s]``)."""
    ring = storage.clone()
    for s in range(ring.shape[0]):
        engine.normalize_tile(ring, s, 0 if tables is None else int(tables[s]))
    return ring


@pytest.mark.parametrize("store, out_dtype", NORMALIZED_PAIRS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("p, bands", [(9, 11), (3, 5), (5, 16)], ids=["blocks", "small", "no-tail"])
def test_normalized_tiles_give_the_fused_kernels_bits(store, out_dtype, layout, p, bands, monkeypatch):
    """Against numpy's slices and flips and torch's rounding, and the fused kernel on the raw tiles: with
    dihedral codes and band dropout, plain and streamed stores; a float store holds NaN and infinities.
    11 bands: the 8-band vectors and a tail; 5: no vector; 16: vectors only."""
    side, slots, n = 14, 3, 23
    storage = _storage(store, slots, side, bands, seed=p + bands)
    if store.startswith("float"):
        storage[0, 5, 5, :3] = [np.nan, np.inf, -np.inf]
    rng = np.random.default_rng(bands)
    r = p // 2
    slot, y, x = rng.integers(0, slots, n), rng.integers(r, side - r, n), rng.integers(r, side - r, n)
    slot[0], y[0], x[0] = 0, 5, 5  # the special values
    finite = storage[np.isfinite(storage)]
    lo, hi = float(finite.min()), float(finite.max())
    offset, scale = rng.uniform(lo, hi, bands), 8 / (hi - lo) * rng.uniform(0.5, 1.5, bands)
    codes = rng.integers(0, 8, n).astype(np.int8)
    dropped = np.argwhere(rng.random((n, bands)) < 0.2)
    noise = cpu_cut.make_noise(n, np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.int64),
                               np.zeros(0, np.float32), 0.0, dropped)
    ref = _reference(storage, slot, y, x, p, offset, scale, out_dtype, layout == "NCHW", codes)
    which, band = torch.from_numpy(dropped[:, 0]), torch.from_numpy(dropped[:, 1])
    if layout == "NCHW":
        ref[which, band] = 0
    else:
        ref[which, :, :, band] = 0
    engine = TorchEngine(PatchSpec(p, p // 2 + 1, bands, side, layout, getattr(torch, out_dtype), offset, scale))
    assert engine.normalizes_tiles(torch.from_numpy(storage).dtype)
    raw = torch.from_numpy(storage)
    ring = _normalized(engine, raw)
    co = [torch.from_numpy(a) for a in (slot, y, x)]
    codes_t = torch.from_numpy(codes)
    for stream_bytes in (cpu_cut.STREAM_BYTES, 0):
        monkeypatch.setattr(cpu_cut, "STREAM_BYTES", stream_bytes)
        got = engine.cut(ring, *co, dihedral=codes_t, noise=noise, normalized=True)
        # torch's vectorized rounding writes NaN as 0xFFFF, the kernels (and torch's scalar one) 0x7FC0:
        # NaN where the reference has NaN, the same bits everywhere else, and the fused kernel's bits
        nan = torch.isnan(ref)
        assert torch.equal(torch.isnan(got), nan)
        _equal_bits(got[~nan], ref[~nan])
        _equal_bits(got, engine.cut(raw, *co, dihedral=codes_t, noise=noise))


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_normalized_tiles_of_several_scenes_keep_each_tables_geometry_and_band_map(out_dtype, layout):
    """Slots holding tiles of three tables (sides, values per pixel, a permuting band map that reads bands
    the in-place rewrite has already passed, statistics of their own): the copy equals the fused cut."""
    rng = np.random.default_rng(10)
    p, n, slots = 5, 120, 6
    band = np.array([[0, 1, 2, 3, 4, 5, 6, 7, 8], [8, 0, 2, 4, 6, 1, 3, 5, 7], [3, 4, 5, 6, 7, 8, 9, 10, 11]])
    tables = SceneTables(side=np.array([12, 10, 11]), stride=np.array([9, 9, 12]), band=band,
                         offset=rng.uniform(0, 3e4, (3, 9)), scale=rng.uniform(1e-5, 1e-3, (3, 9)))
    storage = torch.from_numpy(rng.integers(0, 60000, (slots, 12 * 12 * 12)).astype(np.uint16))
    slot_table = np.arange(slots) % 3
    slot = rng.integers(0, slots, n)
    table = slot_table[slot]
    side = tables.side[table]
    co = [torch.from_numpy(a) for a in (slot, rng.integers(2, side - 2), rng.integers(2, side - 2), table)]
    spec = PatchSpec(p, 2, 9, 12, layout, getattr(torch, out_dtype), np.zeros(9), np.ones(9), tables=tables)
    engine = TorchEngine(spec)
    ring = _normalized(engine, storage, slot_table)
    codes = torch.from_numpy(rng.integers(0, 8, n).astype(np.int8))
    _equal_bits(engine.cut(ring, *co, dihedral=codes, normalized=True), engine.cut(storage, *co, dihedral=codes))
    given = storage.clone()  # a table's rows given with the call (a scene normalized on first use) act alike
    for s in range(slots):
        t = int(slot_table[s])
        engine.normalize_tile(given, s, t, tables.offset[t], tables.scale[t])
    assert torch.equal(given, ring)
    with pytest.raises(InputError, match="offset and scale must both be given"):
        engine.normalize_tile(given, 0, 0, tables.offset[0])


def test_normalized_tiles_are_refused_where_they_cannot_be_cut():
    spec = PatchSpec(3, 1, 4, 8, "NCHW", torch.bfloat16, np.zeros(4), np.ones(4))
    engine = TorchEngine(spec)
    ring = torch.zeros((2, 8, 8, 4), dtype=torch.int16)
    co = [torch.tensor([0]), torch.tensor([3]), torch.tensor([3])]
    assert engine.normalizes_tiles(torch.int16) and not engine.normalizes_tiles(torch.uint8)
    with pytest.raises(InputError, match="store dtype of at least 2 bytes"):
        engine.normalize_tile(torch.zeros((2, 8, 8, 4), dtype=torch.uint8), 0)
    with pytest.raises(InputError, match="slot 2"):
        engine.normalize_tile(ring, 2)
    radiated = cpu_cut.make_noise(1, np.array([0]), np.array([1.0], np.float32), np.array([0]),
                                  np.zeros(64, np.float32), 0.04, None)
    with pytest.raises(InputError, match="radiation noise"):
        engine.cut(ring, *co, noise=radiated, normalized=True)
    float32 = TorchEngine(PatchSpec(3, 1, 4, 8, "NCHW", torch.float32, np.zeros(4), np.ones(4)))
    assert not float32.normalizes_tiles(torch.int16)
    with pytest.raises(InputError, match="normalized=True"):
        float32.cut(ring, *co, normalized=True)
    with defaults.set(numba=False):
        assert not TorchEngine(spec).normalizes_tiles(torch.int16)
    # 5 output bands from a 4-band pixel (band 0 taken twice) fit in its bytes as float32, not as int16:
    # written in place they would run into the next pixel
    tables = SceneTables(side=np.array([8]), stride=np.array([4]), band=np.array([[0, 0, 1, 2, 3]]),
                         offset=np.zeros((1, 5)), scale=np.ones((1, 5)))
    doubled = TorchEngine(PatchSpec(3, 1, 5, 8, "NCHW", torch.bfloat16, np.zeros(5), np.ones(5), tables=tables))
    assert not doubled.normalizes_tiles(torch.int16) and doubled.normalizes_tiles(torch.float32)


def _batches(store, normalize: bool, **kw):
    with defaults.set(normalize_tiles=normalize):
        # batches of 100: the split's smallest tile has 102 train samples, so no batch of any epoch spans three
        # tiles (with 128, epochs 10, 17, 21, ... needed three, and the 2-tile ring is refused)
        with PatchLoader(store, patch_size=7, batch_size=100, device="cpu", ring_bytes=8 << 20, **kw) as loader:
            batches = [(x.clone(), y.clone()) for x, y in loader]
            return batches, loader.stats.reasons


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kw", [
    {},
    {"layout": "NHWC", "augment": Augment(flip=True, rot90=True, band_dropout=0.1, mixture_noise=0.2)},
    {"bands": list(range(199, 0, -3))},  # a band map: per-scene tables, read in reverse order
], ids=["plain", "augmented", "band-map"])
def test_the_loader_normalizes_tiles_once_and_yields_the_same_batches(indian_pines_store, dtype, kw):
    """A ring of 2 tiles, smaller than the split (tiles read again, slots reused), with and without the
    setting."""
    got, reasons = _batches(indian_pines_store, True, dtype=dtype, **kw)
    want, plain_reasons = _batches(indian_pines_store, False, dtype=dtype, **kw)
    assert any("tiles normalized once" in r for r in reasons)
    assert not any("tiles normalized once" in r for r in plain_reasons)
    assert len(got) == len(want) > 1
    for (x, y), (xw, yw) in zip(got, want):
        _equal_bits(x, xw)
        assert torch.equal(y, yw)


def test_the_loader_keeps_raw_tiles_for_radiation_noise_and_float32(indian_pines_store):
    """Radiation noise is added before the rounding, and float32 outputs gain nothing: both cut raw tiles."""
    for kw in ({"dtype": torch.bfloat16, "augment": Augment(radiation_noise=0.5)}, {"dtype": torch.float32}):
        with PatchLoader(indian_pines_store, patch_size=7, batch_size=64, device="cpu", **kw) as loader:
            next(iter(loader))
            assert not any("tiles normalized once" in r for r in loader.stats.reasons), kw


_WARM_UP_CHILD = """
import threading
import numpy as np, torch
from hsgds.engines import PatchSpec, TorchEngine, cpu_cut
from hsgds.engines._cpu_kernel import copy_patches, normalize_tile, patch_starts
cpu_cut.warm_up(np.int16, "bfloat16", normalized=True)
cpu_cut.wait_for_warm_up()
assert not any(t.name == "hsgds-warm-up" and t.is_alive() for t in threading.enumerate())
warmed = len(normalize_tile.signatures), len(copy_patches.signatures), len(patch_starts.signatures)
rng = np.random.default_rng(0)
ring = torch.from_numpy(rng.integers(-999, 999, (2, 20, 20, 12)).astype(np.int16))
engine = TorchEngine(PatchSpec(5, 3, 12, 20, "NCHW", torch.bfloat16, rng.uniform(0, 9, 12), rng.uniform(0.1, 1, 12)))
engine.normalize_tile(ring, 1)
engine.cut(ring, *[torch.tensor(v) for v in ([1, 1], [3, 9], [4, 10])], normalized=True)
print(*warmed, len(normalize_tile.signatures), len(copy_patches.signatures), len(patch_starts.signatures))
"""


def test_warm_up_loads_the_kernels_of_normalized_tiles():
    """The loader's warm-up, told that tiles will be normalized, loads the very specializations that
    normalize_tile and the copying cut then call (in a fresh process: none loaded before)."""
    proc = subprocess.run([sys.executable, "-c", _WARM_UP_CHILD], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["1"] * 6
