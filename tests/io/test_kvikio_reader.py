"""KvikioReader specifics: its handle cache, thread pool, batches and errors, on a CPU stand-in of kvikio (CI)
and on the real one (gpu marker). The reader contract shared with the other readers is in
test_reader_contract.py."""

from __future__ import annotations

import dataclasses
import os
import sys

import pytest

from hsgds import defaults
from hsgds.errors import ChecksumError, ConfigError, DependencyError, TileReadError
from hsgds.io.kvikio_reader import KvikioReader
from hsgds.probe import probe
from tests.io.conftest import FakeCuFile, requires_cuda


def test_fake_kvikio_reads_and_reuses_cached_handles(fake_kvikio, tiles):
    import torch

    source, data = tiles(count=4, k=3)
    reader = KvikioReader(source, verify=True)
    assert reader.name == "kvikio-compat" and "compat mode" in reader.mode_reason and reader.batched
    assert fake_kvikio["num_threads"] == max(1, min(8, os.cpu_count() or 1))  # raised from kvikio's 1
    storage = torch.empty((4, source.nbytes // 2), dtype=torch.int16)  # like the ring: one slot per row
    reader.read_many([(i, storage[i]) for i in range(4)])
    for i in range(4):
        assert storage[i].view(torch.uint8).numpy().tobytes() == data[i]
    reader.read_into(2, storage[0])
    assert storage[0].view(torch.uint8).numpy().tobytes() == data[2]
    assert reader.bytes_read == 5 * source.nbytes
    assert len(FakeCuFile.opened) == 4 and reader.open_files == 4  # one handle per file, reused
    reader.close()
    reader.close()
    assert reader.open_files == 0 and all(h.closed for h in FakeCuFile.handles)
    with pytest.raises(TileReadError, match="closed"):
        reader.read_into(0, storage[0])


def test_fake_kvikio_handle_cache_is_bounded_and_least_recently_used(fake_kvikio, tiles):
    import torch

    source, data = tiles(count=6, k=1)
    dest = torch.empty(source.nbytes, dtype=torch.uint8)
    with KvikioReader(source, max_open_files=2) as reader:
        for i in (0, 1, 0, 2):  # 0 was used more recently than 1: 1 is evicted when 2 opens
            reader.read_into(i, dest)
            assert dest.numpy().tobytes() == data[i]
        assert reader.open_files == 2
        assert FakeCuFile.opened == [str(source.paths[i]) for i in (0, 1, 2)]
        assert [h.closed for h in FakeCuFile.handles] == [False, True, False]
        reader.read_into(0, dest)  # still cached: no open
        reader.read_into(1, dest)  # evicted before: opened again
        assert len(FakeCuFile.opened) == 4 and reader.open_files == 2
    with defaults.set(max_open_files=3):
        with KvikioReader(source) as reader:
            for i in range(6):
                reader.read_into(i, dest)
            assert reader.open_files == 3
    for bad in (0, -1):
        with pytest.raises(ConfigError, match="max_open_files must be >= 1"):
            KvikioReader(source, max_open_files=bad)


def test_fake_kvikio_never_closes_a_handle_with_a_read_in_flight(fake_kvikio, tiles):
    """More reads in flight than the cache holds: every handle stays open until its read is done (a read
    on a closed handle fails in the stand-in), then the cache shrinks back to its bound."""
    import torch

    source, data = tiles(count=5, k=1)
    FakeCuFile.delay = 0.05  # the reads are still running when the later handles are opened
    storage = torch.empty((5, source.nbytes), dtype=torch.uint8)
    with KvikioReader(source, max_open_files=1) as reader:
        reader.read_many([(i, storage[i]) for i in range(5)])
        for i in range(5):
            assert storage[i].numpy().tobytes() == data[i]
        assert reader.open_files == 1 and sum(not h.closed for h in FakeCuFile.handles) == 1


def test_fake_kvikio_threads_setting(fake_kvikio, tiles):
    source, _ = tiles(count=1)
    with defaults.set(kvikio_threads=3):
        KvikioReader(source).close()
    assert fake_kvikio["num_threads"] == 3
    KvikioReader(source, threads=5).close()
    assert fake_kvikio["num_threads"] == 5
    with pytest.raises(ConfigError, match=">= 0"):
        KvikioReader(source, threads=-1)


def test_fake_kvikio_batch_error_waits_for_issued_reads(fake_kvikio, tiles):
    import torch

    source, _ = tiles(count=4, k=2)
    with open(source.paths[1], "r+b") as f:
        f.truncate(source.nbytes - 100)
    storage = torch.empty((3, source.nbytes), dtype=torch.uint8)
    with KvikioReader(source) as kv:
        with pytest.raises(TileReadError, match="tile 1 .* has 8092 bytes, expected 8192"):
            kv.read_many([(0, storage[0]), (1, storage[1]), (3, storage[2])])
        assert kv._inflight == 0 and kv._busy == {}  # nothing left held by the failed batch
        with pytest.raises(ValueError):
            kv.read_into(0, torch.empty(10, dtype=torch.uint8))


def test_fake_kvikio_verify(fake_kvikio, tiles):
    import torch

    source, _ = tiles(count=2)
    s, p = source.device_checksums[0]
    bad = dataclasses.replace(source, device_checksums=((s, p ^ 1), source.device_checksums[1]))
    dest = torch.empty(source.nbytes, dtype=torch.uint8)
    with KvikioReader(bad) as reader:  # checked by default, on the device path
        reader.read_into(1, dest)
        with pytest.raises(ChecksumError, match="tile 0 .* wsum64"):
            reader.read_into(0, dest)
    with KvikioReader(bad, verify=False) as reader:  # sizes only
        reader.read_into(0, dest)


def test_fake_kvikio_gds_ring_that_cufile_cannot_register_still_reads(fake_kvikio, tiles, monkeypatch):
    """With GDS, cuFile refuses to register a buffer over cufile.json's pinned-memory limit (32 GiB by
    default: the default ring on an H200 is larger): the loader warns and reads unregistered, instead of
    failing to start; close() deregisters only what was registered."""
    import types

    import torch

    from hsgds.errors import HsgdsWarning

    kv = sys.modules["kvikio"]
    monkeypatch.setattr(kv.defaults, "is_compat_mode_preferred", lambda: False)
    monkeypatch.setattr(kv.defaults, "get", lambda name: {"compat_mode": "OFF"}.get(name, fake_kvikio.get(name)))
    driver = types.ModuleType("kvikio.cufile_driver")
    driver.get = lambda name: {"is_gds_available": True}[name]
    monkeypatch.setattr(kv, "cufile_driver", driver, raising=False)
    deregistered = []

    def refuse(buf):
        raise RuntimeError("cuFile error at: buffer.cpp:42: GPU memory pinning failed")

    monkeypatch.setattr(kv, "memory_register", refuse)
    monkeypatch.setattr(kv, "memory_deregister", deregistered.append)
    source, data = tiles(count=2)
    storage = torch.empty((2, source.nbytes), dtype=torch.uint8)
    reader = KvikioReader(source)
    assert reader.name == "kvikio-gds"
    with pytest.warns(HsgdsWarning, match=r"cuFile cannot register the 0 MiB ring .*pinning failed.*"
                                          r"max_device_pinned_mem_size_kb"):
        reader.register(storage)
    reader.read_many([(1, storage[0]), (0, storage[1])])
    assert storage[0].numpy().tobytes() == data[1] and storage[1].numpy().tobytes() == data[0]
    reader.close()
    assert deregistered == []


def test_kvikio_reader_without_kvikio_names_the_extra(monkeypatch, tiles):
    monkeypatch.setitem(sys.modules, "kvikio", None)
    source, _ = tiles(count=1)
    with pytest.raises(DependencyError, match=r'pip install "hsgds\[cu1[23]\]"'):
        KvikioReader(source)


# ------------------------------------------------------------------------------------ GPU (real kvikio)

@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("k", [1, 1029])  # one page, and a tile over kvikio's 4 MiB task size
def test_gpu_kvikio_reads_bit_identical(kvikio_ok, tiles, k):
    import torch


    source, data = tiles(count=3, k=k)
    with KvikioReader(source) as reader:
        assert reader.name == ("kvikio-gds" if probe().gds else "kvikio-compat")  # agrees with the probe
        for i, blob in enumerate(data):
            dest = torch.empty(source.nbytes, dtype=torch.uint8, device="cuda")
            reader.read_into(i, dest)
            assert dest.cpu().numpy().tobytes() == blob
        wide = torch.empty(source.nbytes // 2, dtype=torch.int16, device="cuda")  # the store's dtype
        reader.read_into(1, wide)
        assert wide.view(torch.uint8).cpu().numpy().tobytes() == data[1]
        assert reader.bytes_read == 4 * source.nbytes
    with KvikioReader(source, verify=True) as reader:
        dest = torch.empty(source.nbytes, dtype=torch.uint8, device="cuda")
        reader.read_into(2, dest)
        assert dest.cpu().numpy().tobytes() == data[2]


@pytest.mark.gpu
@requires_cuda
def test_gpu_kvikio_matches_posix_pinned(kvikio_ok, tiles):
    import torch

    from hsgds.io.posix import PosixReader

    source, _ = tiles(count=2, k=64)
    a = torch.empty(source.nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    with KvikioReader(source) as kv, PosixReader(source) as px:
        for i in range(2):
            kv.read_into(i, a)
            px.read_into(i, b)
            assert torch.equal(a, b)


@pytest.mark.gpu
@requires_cuda
def test_gpu_kvikio_read_many(kvikio_ok, tiles):
    import torch


    source, data = tiles(count=6, k=256)
    storage = torch.zeros((6, source.nbytes), dtype=torch.uint8, device="cuda")
    with KvikioReader(source, threads=4) as reader:
        reader.register(storage)
        reader.read_many([(i, storage[5 - i]) for i in range(6)])
        for i in range(6):
            assert storage[5 - i].cpu().numpy().tobytes() == data[i]
        assert reader.bytes_read == 6 * source.nbytes
        assert reader._inflight == 0
    # a cached handle still reads an unlinked file (as POSIX says), so a file missing before its first
    # read is the case to check
    source.paths[3].unlink()
    with KvikioReader(source, threads=4) as reader:
        with pytest.raises(TileReadError, match=r"tile 3 .*cannot open \(No such file or directory\)"):
            reader.read_many([(i, storage[i]) for i in (0, 3, 4)])
        assert reader._inflight == 0


@pytest.mark.gpu
@requires_cuda
def test_gpu_kvikio_truncated_missing_and_misuse(kvikio_ok, tiles):
    import torch

    from hsgds.io.posix import PosixReader

    source, _ = tiles(count=3, k=8)
    with open(source.paths[0], "r+b") as f:
        f.truncate(source.nbytes - 4096)
    source.paths[1].unlink()
    dest = torch.empty(source.nbytes, dtype=torch.uint8, device="cuda")
    with KvikioReader(source) as kv, PosixReader(source, verify=False) as px:
        for tile in (0, 1):
            with pytest.raises(TileReadError) as got:
                kv.read_into(tile, dest)
            with pytest.raises(TileReadError) as want:
                px.read_into(tile, dest)
            assert str(got.value) == str(want.value)
        assert "has 28672 bytes, expected 32768" in str(
            pytest.raises(TileReadError, kv.read_into, 0, dest).value)
        with pytest.raises(TypeError, match="CUDA tensors"):
            kv.read_into(2, torch.empty(source.nbytes, dtype=torch.uint8))
        with pytest.raises(ValueError, match="bytes"):
            kv.read_into(2, dest[:-1])
        kv.read_into(2, dest)
    kv.close()
    with pytest.raises(TileReadError, match="closed"):
        kv.read_into(2, dest)
