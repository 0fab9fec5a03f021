"""Open descriptors stay bounded at any tile count: an epoch over a store of 2,025 tiles runs under an
open-files limit far below the tile count, and the descriptors counted in /proc/self/fd stay near where they
started (the POSIX reader opens a file per read; kvikio keeps a bounded cache of handles)."""

from __future__ import annotations

import contextlib
import os
import sys

import pytest

import hsgds
from hsgds import defaults
from hsgds.engines.base import TORCH_DTYPES
from hsgds.io import TileSource
from hsgds.io.kvikio_reader import KvikioReader
from hsgds.ring import TileRing
from hsgds.sampling import Interval
from tests.io.conftest import FakeCuFile, requires_cuda

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts /proc/self/fd (Linux)")

INFLIGHT = 4
BOUND = 16  # max_open_files for the kvikio reader
RING_SLOTS = 128  # of 4 KiB tiles: slots are reused many times in an epoch


def _fds() -> list[int]:
    return [int(fd) for fd in os.listdir("/proc/self/fd")]


@contextlib.contextmanager
def _open_files_limit(headroom: int):
    """Lower the soft RLIMIT_NOFILE to ``headroom`` descriptors above the highest open one: a reader that
    kept a descriptor per tile would fail to open (EMFILE) long before the end of the epoch."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = max(_fds()) + 1 + headroom
    assert limit < 2025 and (hard == resource.RLIM_INFINITY or limit <= hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_posix_epoch_over_2025_tiles_keeps_descriptors_bounded(many_tiles_store):
    counts = []
    with defaults.set(read_inflight=INFLIGHT):
        loader = hsgds.PatchLoader(many_tiles_store, patch_size=5, batch_size=64, split=None, device="cpu",
                                   reader="posix", ring_bytes=RING_SLOTS * 4096)
    with loader:
        assert loader.scene.grid.num_tiles == 2025
        before = len(_fds())
        with _open_files_limit(headroom=64):
            for _ in loader:
                counts.append(len(_fds()))
        assert loader.stats.tiles_loaded == 2025 and loader.stats.patches == 2025
    assert max(counts) <= before + INFLIGHT, (before, max(counts))


def test_fake_kvikio_ring_over_2025_tiles_keeps_handles_bounded(fake_kvikio, many_tiles_store):
    """The kvikio reader's handle cache under the ring's batched reads (kvikio's stand-in: one descriptor
    per handle)."""
    scene = hsgds.open_scene(many_tiles_store)
    n = scene.grid.num_tiles
    reader = KvikioReader(TileSource.from_scene(scene), max_open_files=BOUND)
    ring = TileRing(32, scene.grid.tile_shape, TORCH_DTYPES[scene.grid.dtype], "cpu", reader,
                    inflight=8)
    open_now = []
    try:
        before = len(_fds())
        with _open_files_limit(headroom=BOUND + 8 + 16):
            ring.start([Interval(t, t, t) for t in range(n)])
            for t in range(n):
                ring.acquire([t], timeout=30)
                ring.release_batch(t)
                open_now.append((reader.open_files, len(_fds())))
        assert ring.stats.tiles_loaded == n and len(FakeCuFile.opened) == n
        assert max(o for o, _ in open_now) <= BOUND + 8  # handles of reads in flight may exceed it briefly
        assert max(f for _, f in open_now) <= before + BOUND + 8
        assert reader.open_files <= BOUND
    finally:
        ring.close()
        reader.close()
    assert all(h.closed for h in FakeCuFile.handles)


@pytest.mark.gpu
@requires_cuda
def test_gpu_kvikio_epoch_over_2025_tiles_keeps_descriptors_bounded(kvikio_ok, many_tiles_store):
    """The real kvikio reader (GDS or compat mode) over 2,025 tiles with max_open_files=16: the descriptors
    open never grow by more than the handle cache and the reads in flight allow (a cuFile handle may hold
    two descriptors), where one handle per tile would add thousands."""
    # CUDA, kvikio and cuFile open their own descriptors on first use: start counting after a first read
    with hsgds.PatchLoader(many_tiles_store, patch_size=5, batch_size=64, split=None, device="cuda",
                           reader="kvikio") as warm:
        next(iter(warm))
    with defaults.set(max_open_files=BOUND, read_inflight=INFLIGHT):
        loader = hsgds.PatchLoader(many_tiles_store, patch_size=5, batch_size=64, split=None, device="cuda",
                                   reader="kvikio", ring_bytes=RING_SLOTS * 4096)
    counts = []
    with loader:
        before = len(_fds())
        for _ in loader:
            counts.append(len(_fds()))
        assert loader.stats.tiles_loaded == 2025 and loader.stats.reader.startswith("kvikio")
        assert loader._reader.open_files <= BOUND
    assert max(counts) <= before + 2 * (BOUND + INFLIGHT) + 8, (before, max(counts))
