"""Reader fixtures: tile files with known bytes, a kvikio stand-in for the CPU, CUDA / kvikio skips."""

from __future__ import annotations

import os
import sys
import threading
import time
import types
from pathlib import Path

import crc32c
import numpy as np
import pytest

from hsgds import checksum
from hsgds.errors import DependencyError
from hsgds.io.base import TileSource


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def kvikio_importable() -> bool:
    from hsgds.io.kvikio_support import import_kvikio

    try:
        import_kvikio()
    except DependencyError:
        return False
    return True


requires_cuda = pytest.mark.skipif(not cuda_available(), reason="needs a CUDA driver and GPU")


@pytest.fixture
def kvikio_ok():
    if not kvikio_importable():
        pytest.skip('kvikio not installed: pip install "hsgds[cu13]"')


def make_tiles(root: Path, count: int, nbytes: int, seed: int = 0) -> tuple[TileSource, list[bytes]]:
    """A store-like TileSource: ``count`` random tile files of ``nbytes`` bytes with their crc32c and wsum64
    checksums (as a format v2 store has)."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    paths, data = [], []
    for i in range(count):
        blob = rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes()
        path = root / f"{i // 2}.{i % 2}"
        path.write_bytes(blob)
        paths.append(path)
        data.append(blob)
    return TileSource(tuple(paths), nbytes, tuple(crc32c.crc32c(b) for b in data),
                      device_checksums=tuple(checksum.checksum_of(b) for b in data), store=root), data


@pytest.fixture
def tiles(tmp_path):
    def make(count: int = 4, k: int = 2, seed: int = 0) -> tuple[TileSource, list[bytes]]:
        return make_tiles(tmp_path / f"tiles{seed}", count, 4096 * k, seed)

    return make


# ------------------------------------------------------------------------------- fake kvikio (CPU)

class FakeFuture:
    def __init__(self, fn):
        self._done = threading.Event()
        self._result: int | BaseException = 0

        def run():
            try:
                self._result = fn()
            except RuntimeError as exc:
                self._result = exc
            self._done.set()

        threading.Thread(target=run, daemon=True).start()

    def get(self) -> int:
        self._done.wait()
        if isinstance(self._result, BaseException):
            raise self._result
        return self._result

    def done(self) -> bool:
        return self._done.is_set()


class FakeCuFile:
    """kvikio.CuFile's contract on the CPU: RuntimeError on open failure, pread -> future of a count.

    ``delay`` seconds pass before a read runs; a read that runs on a closed handle fails, as a read on a
    closed (or reused) descriptor would."""

    opened: list[str] = []
    handles: list[FakeCuFile] = []
    delay = 0.0

    def __init__(self, path, flags="r"):
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise RuntimeError(f"Unable to open file. Linux system/library function call error: "
                               f"{exc.strerror}") from None
        self.closed = False
        FakeCuFile.opened.append(str(path))
        FakeCuFile.handles.append(self)

    def fileno(self) -> int:
        return self._fd

    def pread(self, buf, size=None, file_offset=0, task_size=None):
        view = memoryview(buf.numpy())[:size]

        def read():
            time.sleep(FakeCuFile.delay)
            if self.closed:
                raise RuntimeError("pread on a closed handle")
            return os.preadv(self._fd, [view], file_offset)

        return FakeFuture(read)

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
            self.closed = True


@pytest.fixture
def fake_kvikio(monkeypatch):
    """A kvikio stand-in (compat mode) and a KvikioReader that accepts CPU tensors: the reader's own logic
    (handle cache, batching, errors) runs in CI; the GPU tests run the real kvikio."""
    from hsgds.io import kvikio_reader

    kv = types.ModuleType("kvikio")
    kv.__version__ = "0.0-fake"
    state = {"num_threads": 1}
    kv.defaults = types.ModuleType("kvikio.defaults")
    kv.defaults.get = lambda name: {"compat_mode": "AUTO"}.get(name, state.get(name))
    kv.defaults.set = lambda name, value: state.__setitem__(name, value)
    kv.defaults.is_compat_mode_preferred = lambda: True
    kv.CuFile = FakeCuFile
    kv.memory_register = kv.memory_deregister = lambda buf: None
    monkeypatch.setitem(sys.modules, "kvikio", kv)
    monkeypatch.setitem(sys.modules, "kvikio.defaults", kv.defaults)
    monkeypatch.delenv("KVIKIO_NTHREADS", raising=False)
    FakeCuFile.opened, FakeCuFile.handles, FakeCuFile.delay = [], [], 0.0

    def as_bytes(self, dest, n):  # the real one insists on CUDA memory
        import torch

        if dest.numel() * dest.element_size() != n:
            raise ValueError("wrong size")
        return dest.reshape(-1).view(torch.uint8)

    monkeypatch.setattr(kvikio_reader.KvikioReader, "_as_bytes", as_bytes)
    return state
