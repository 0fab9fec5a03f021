"""One contract, every reader: bytes equal to zarr-python's, checksum and size errors that name the store and
the tile, batched reads, close idempotent. CUDA readers run on the GPU machine (gpu marker); the kvikio
reader's own logic also runs in CI over a CPU stand-in of kvikio (``kvikio-fake-cpu``)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import Any

import pytest

from hsgds.errors import ChecksumError, ConfigError, TileReadError
from hsgds.io import READERS, ChunkReader, TileSource, make_reader
from hsgds.scene import open_scene
from tests.io.conftest import requires_cuda


@dataclass
class Case:
    registry_name: str
    device: str
    options: dict[str, Any]
    names: tuple[str, ...]  # what the reader may call itself

    def make(self, source: TileSource) -> ChunkReader:
        return make_reader(self.registry_name, source, **self.options)


CASES = [
    pytest.param(("posix", "cpu"), id="posix"),
    pytest.param(("kvikio", "fake"), id="kvikio-fake-cpu"),
    pytest.param(("posix-pinned", "cuda"), id="posix-pinned", marks=[pytest.mark.gpu, requires_cuda]),
    pytest.param(("kvikio", "cuda"), id="kvikio", marks=[pytest.mark.gpu, requires_cuda]),
]


@pytest.fixture(params=CASES)
def case(request) -> Case:
    name, where = request.param
    if name == "kvikio":
        request.getfixturevalue("fake_kvikio" if where == "fake" else "kvikio_ok")
        return Case(name, "cpu" if where == "fake" else "cuda", {}, ("kvikio-gds", "kvikio-compat"))
    return Case(name, where, {}, (name,))


def _source(store) -> tuple[TileSource, Any]:
    scene = open_scene(store)
    return TileSource.from_scene(scene), scene.grid


def _storage(grid, count: int, device: str):
    """Ring-like destinations: one slot of the store's dtype per row."""
    import torch

    from hsgds.engines.base import TORCH_DTYPES

    return torch.zeros((count, *grid.tile_shape), dtype=TORCH_DTYPES[grid.dtype], device=device)


def _bytes(t) -> bytes:
    import torch

    return t.reshape(-1).view(torch.uint8).cpu().numpy().tobytes()


def _damaged_copy(store, tmp_path):
    copy = tmp_path / "store.zarr"
    shutil.copytree(store, copy)
    return copy


def test_reads_equal_zarr_python(case, tile_store, zarr_tile):
    source, grid = _source(tile_store)
    n = grid.num_tiles
    storage = _storage(grid, n, case.device)
    with case.make(source) as reader:
        assert reader.name in case.names
        reader.register(storage)  # every reader accepts the ring's storage
        for i in range(n):
            reader.read_into(i, storage[i])
        for i in range(n):
            assert _bytes(storage[i]) == zarr_tile(tile_store, i), f"tile {i}"
        storage.zero_()
        reader.read_many([(i, storage[n - 1 - i]) for i in range(n)])  # one batch, slots in reverse
        for i in range(n):
            assert _bytes(storage[n - 1 - i]) == zarr_tile(tile_store, i), f"tile {i} (read_many)"
        reader.read_many([])
        assert reader.bytes_read == 2 * n * source.nbytes


def test_checksum_error_names_store_and_tile(case, tile_store, tmp_path, zarr_tile):
    store = _damaged_copy(tile_store, tmp_path)
    source, grid = _source(store)
    path = source.paths[5]
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 3] ^= 0x10  # one flipped bit, size unchanged
    path.write_bytes(bytes(blob))
    storage = _storage(grid, 3, case.device)
    with case.make(source) as reader:
        with pytest.raises(ChecksumError) as err:
            reader.read_into(5, storage[0])
        assert f"tile 5 ({path})" in str(err.value) and str(store) in str(err.value)
        with pytest.raises(ChecksumError, match=r"tile 5 \("):
            reader.read_many([(4, storage[0]), (5, storage[1]), (6, storage[2])])
        reader.read_into(6, storage[2])  # the reader stays usable after an error
        assert _bytes(storage[2]) == zarr_tile(tile_store, 6)


def test_short_long_and_missing_tile_files(case, tile_store, tmp_path):
    store = _damaged_copy(tile_store, tmp_path)
    source, grid = _source(store)
    n = source.nbytes
    with open(source.paths[1], "r+b") as f:
        f.truncate(n - 100)
    with open(source.paths[3], "ab") as f:
        f.write(b"x" * 4096)
    source.paths[2].unlink()
    storage = _storage(grid, 3, case.device)
    # (a reader cannot tell damage from a store converted again while open: `hsgds verify` can)
    expected = {1: f"tile 1 ({source.paths[1]}) has {n - 100} bytes, expected {n}: the store is damaged, or was "
                   "converted again since it was opened; run `hsgds verify`: if it says ok, open the store again (a new "
                   "loader), else convert the source again",
                2: f"tile 2 ({source.paths[2]}): cannot open (No such file or directory)",
                3: f"tile 3 ({source.paths[3]}) has {n + 4096} bytes, expected {n}: the store is damaged"}
    with case.make(source) as reader:
        for tile, message in expected.items():
            with pytest.raises(TileReadError) as err:
                reader.read_into(tile, storage[0])
            assert str(err.value).startswith(message)
        # in a batch: the error of the damaged tile, after the reads issued before it have finished
        with pytest.raises(TileReadError, match=r"tile 1 \("):
            reader.read_many([(0, storage[0]), (1, storage[1]), (4, storage[2])])
        reader.read_into(0, storage[0])


def test_close_is_idempotent_and_final(case, tile_store):
    source, grid = _source(tile_store)
    storage = _storage(grid, 1, case.device)
    reader = case.make(source)
    reader.read_into(0, storage[0])
    reader.close()
    reader.close()
    with pytest.raises(TileReadError, match="closed"):
        reader.read_into(0, storage[0])
    with pytest.raises(TileReadError, match="closed"):
        reader.read_many([(0, storage[0])])
    with case.make(source) as again:  # the context manager closes too
        pass
    again.close()


def test_registry_names_every_reader_the_device_choice_can_pick():
    from hsgds import choice

    assert sorted(READERS) == sorted(choice.READERS)
    with pytest.raises(ConfigError, match="unknown reader 'nvme'; choose one of posix, posix-pinned, kvikio"):
        make_reader("nvme", TileSource((), 4096, ()))


def _without_hanging(fn, fifo, seconds: float = 20.0):
    """Run ``fn`` on a thread; if it is still blocked after ``seconds`` (an open of the FIFO waiting for a
    writer), open the FIFO for writing to release it and fail, instead of hanging the test run."""
    import os
    import threading

    outcome: list[BaseException | None] = []

    def run():
        try:
            fn()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # a writer appears: the blocked open returns
        thread.join(seconds)
        pytest.fail(f"reading a FIFO planted as a tile chunk blocked for {seconds:g} s")
    return outcome[0]


def test_a_tile_that_is_a_fifo_or_a_folder_is_named_never_waited_on(case, tile_store, tmp_path):
    """A chunk replaced by a FIFO blocked open(2) for ever (no writer ever comes): the reader thread, and
    with it the loader or `hsgds verify`, hung. It is a TileReadError naming the tile, at once."""
    import os

    store = _damaged_copy(tile_store, tmp_path)
    source, grid = _source(store)
    source.paths[2].unlink()
    os.mkfifo(source.paths[2])
    source.paths[4].unlink()
    source.paths[4].mkdir()
    storage = _storage(grid, 2, case.device)
    with case.make(source) as reader:
        for tile, kind in ((2, "a FIFO"), (4, "a folder")):
            err = _without_hanging(lambda t=tile: reader.read_into(t, storage[0]), source.paths[2])
            assert isinstance(err, TileReadError), err
            assert str(err).startswith(f"tile {tile} ({source.paths[tile]}) is {kind}, not a chunk file"), err
        reader.read_into(3, storage[1])  # the reader stays usable
