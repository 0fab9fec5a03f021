"""Issue 15: the kvikio path checks every tile it reads, on the device, with the store's wsum64 checksums.

In CI the reader's check runs over kvikio's CPU stand-in (the same torch code on CPU tensors); on the GPU
machine (gpu marker, benchmarks/gpu_check.sh) the real kvikio reads into CUDA memory and the check runs there.
"""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

import hsgds
from hsgds import checksum, defaults
from hsgds.errors import ChecksumError, HsgdsWarning
from hsgds.io import TileSource
from hsgds.io.kvikio_reader import KvikioReader
from hsgds.ring import TileRing
from hsgds.sampling import Interval
from hsgds.scene import open_scene
from tests.io.conftest import requires_cuda


def _copy(store, tmp_path):
    out = tmp_path / "store.zarr"
    shutil.copytree(store, out)
    return out


def _flip(path, at=None):
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2 if at is None else at] ^= 0x04
    path.write_bytes(bytes(blob))


def _overwrite_in_place(path, seed=0):
    """Same size, new bytes, same inode (as a job rewriting a store under a running loader)."""
    n = path.stat().st_size
    with open(path, "r+b") as f:
        f.write(np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes())


def _dest(source, device):
    import torch

    return torch.empty(source.nbytes, dtype=torch.uint8, device=device)


# ------------------------------------------------------------------------------------------------ CPU (CI)

def test_store_carries_device_checksums_that_match_the_tiles(tile_store, zarr_tile):
    scene = open_scene(tile_store)
    assert scene.meta.format_version == 2 and scene.meta.device_checksum_algorithm == "wsum64"
    for i in range(scene.grid.num_tiles):
        data = zarr_tile(tile_store, i)
        w = np.frombuffer(data, dtype="<u4").astype(np.uint64)
        with np.errstate(over="ignore"):
            want = (int(w.sum(dtype=np.uint64)), int((w * np.arange(1, len(w) + 1, dtype=np.uint64)).sum()))
        assert checksum.decode(scene.meta.device_checksums[i]) == want


def test_fake_kvikio_checks_every_tile_on_the_device_path_by_default(fake_kvikio, tile_store, tmp_path):
    store = _copy(tile_store, tmp_path)
    source = TileSource.from_scene(open_scene(store))
    _flip(source.paths[7])
    dest = _dest(source, "cpu")
    with KvikioReader(source) as reader:
        assert reader.verify and reader.on_device
        reader.read_into(6, dest)
        with pytest.raises(ChecksumError) as err:
            reader.read_into(7, dest)
        assert str(err.value).startswith(f"tile 7 ({source.paths[7]}) fails its wsum64 checksum")
        assert str(store) in str(err.value)
    for off in (KvikioReader(source, verify=False), _with_setting(lambda: KvikioReader(source), verify_reads=0)):
        with off as reader:  # checking turned off: the damaged bytes are read (sizes are still checked)
            assert not reader.verify
            reader.read_into(7, dest)


def _with_setting(make, **values):
    with defaults.set(**values):
        return make()


def test_fake_kvikio_v1_store_is_checked_on_the_host_with_a_warning(fake_kvikio, tile_store, tmp_path):
    store = _copy(tile_store, tmp_path)
    source = dataclasses.replace(TileSource.from_scene(open_scene(store)), device_checksums=None)
    _flip(source.paths[2])
    with pytest.warns(HsgdsWarning, match=r"format v1 \(no device checksums\).*on the host") as warned:
        reader = KvikioReader(source)
    assert len(warned) == 1 and str(warned[0].message).startswith(str(store))
    with reader:
        assert reader.verify and not reader.on_device
        with pytest.raises(ChecksumError, match=r"tile 2 \(.*\) fails its crc32c checksum"):
            reader.read_into(2, _dest(source, "cpu"))


def test_fake_kvikio_tile_overwritten_during_a_pass_is_caught(fake_kvikio, tile_store, tmp_path):
    """A tile rewritten under a running reader (not yet read) fails its check when it is read."""
    import torch

    store = _copy(tile_store, tmp_path)
    scene = open_scene(store)
    reader = KvikioReader(TileSource.from_scene(scene))
    ring = TileRing(2, scene.grid.tile_shape, torch.int16, "cpu", reader, inflight=1)
    try:
        ring.start([Interval(t, t, t) for t in range(12)])
        ring.acquire([0], timeout=10)
        _overwrite_in_place(scene.tile_paths[11])
        with pytest.raises(ChecksumError, match=r"tile 11 \(.*\) fails its wsum64 checksum: the store is damaged, "
                           r"or was converted again since it was opened; run `hsgds verify`: if it says ok, open"):
            for b in range(12):
                ring.acquire([b], timeout=10)
                ring.release_batch(b)
        assert b == 11  # every tile before it was delivered
    finally:
        ring.close()
        reader.close()


def test_fake_kvikio_deferred_collection_checks_each_scene_as_it_is_reached(fake_kvikio, tile_store, tmp_path):
    """Tiles of several stores whose sources are made on first read (a collection's deferred scenes): each
    store is opened once, when one of its tiles is first read, and its tiles are checked on the device."""
    stores = [shutil.copytree(tile_store, tmp_path / f"s{i}.zarr") for i in range(3)]
    sources = [TileSource.from_scene(open_scene(s)) for s in stores]
    n = len(sources[0].paths)
    made: list[int] = []

    def scene(i):
        made.append(i)
        return sources[i]

    source = TileSource.deferred([0, n, 2 * n, 3 * n], [sources[0].nbytes] * 3 * n, scene, device_checksums=True)
    _flip(sources[2].paths[5])
    dest = _dest(source, "cpu")
    with KvikioReader(source) as reader:
        assert reader.on_device and made == []  # nothing opened to build the reader
        reader.read_many([(n + 1, dest)])
        assert made == [1]
        for t in (0, n + 2, 2 * n + 4):
            reader.read_into(t, dest)
        assert made == [1, 0, 2]  # once per store
        with pytest.raises(ChecksumError, match=rf"tile 5 \({sources[2].paths[5]}\) fails its wsum64"):
            reader.read_into(2 * n + 5, dest)


# ------------------------------------------------------------------------------------- GPU (real kvikio)

@pytest.mark.gpu
@requires_cuda
def test_gpu_device_checksum_equals_the_cpu_one():
    """The same torch code on CUDA gives the CPU's values, including where the int64 sums wrap."""
    import torch

    rng = np.random.default_rng(5)
    tiles = torch.from_numpy(rng.integers(0, 256, (3, 4 << 20), dtype=np.uint8))  # 1 Mi words per tile
    tiles[0] = 255  # all-ones words: both sums wrap
    assert torch.equal(checksum.tile_checksums(tiles.cuda()).cpu(), checksum.tile_checksums(tiles))


@pytest.mark.gpu
@requires_cuda
def test_gpu_kvikio_flipped_byte_raises_checksum_error(kvikio_ok, tile_store, tmp_path):
    store = _copy(tile_store, tmp_path)
    source = TileSource.from_scene(open_scene(store))
    _flip(source.paths[5], at=123)
    with KvikioReader(source) as reader:  # default settings
        assert reader.on_device
        reader.read_into(4, _dest(source, "cuda"))
        with pytest.raises(ChecksumError, match=r"tile 5 \(.*\) fails its wsum64 checksum"):
            reader.read_into(5, _dest(source, "cuda"))
    # through the loader: raised in the consumer, naming the store and the tile
    with hsgds.PatchLoader(store, patch_size=5, batch_size=32, split=None, device="cuda", reader="kvikio") as loader:
        assert loader.stats.reader.startswith("kvikio")
        with pytest.raises(ChecksumError) as err:
            for _ in loader:
                pass
        assert f"tile 5 ({source.paths[5]})" in str(err.value) and "wsum64" in str(err.value)


@pytest.mark.gpu
@requires_cuda
def test_gpu_kvikio_tile_overwritten_during_an_epoch(kvikio_ok, tile_store, tmp_path):
    """Every tile file rewritten in place after the first batch: the next tile the reader reads fails its check
    in the consumer, before any patch is cut from it."""
    store = _copy(tile_store, tmp_path)
    scene = open_scene(store)
    with hsgds.PatchLoader(store, patch_size=5, batch_size=16, split=None, device="cuda", reader="kvikio",
                           shuffle=False, ring_bytes=4 * scene.grid.tile_nbytes) as loader:
        it = iter(loader)
        next(it)
        for i, path in enumerate(scene.tile_paths):
            _overwrite_in_place(path, seed=i)
        with pytest.raises(ChecksumError, match=r"tile \d+ \(.*\) fails its wsum64 checksum"):
            for _ in it:
                pass
