"""PosixReader specifics (the contract is in test_reader_contract.py)."""

from __future__ import annotations

import os

import pytest

from hsgds.errors import TileReadError


def test_posix_reader_without_preadv_as_on_windows(monkeypatch, tiles):
    """Native Windows has no os.preadv: the reader falls back to seek + read and gives the same bytes/errors."""
    import torch

    from hsgds.io.posix import PosixReader

    source, data = tiles(count=3, k=2)
    with open(source.paths[2], "r+b") as f:
        f.truncate(source.nbytes - 10)
    monkeypatch.delattr(os, "preadv")
    dest = torch.empty(source.nbytes, dtype=torch.uint8)
    with PosixReader(source) as reader:
        for i in (0, 1):
            reader.read_into(i, dest)
            assert dest.numpy().tobytes() == data[i]
        with pytest.raises(TileReadError, match="tile 2 .* has 8182 bytes, expected 8192"):
            reader.read_into(2, dest)




def test_reads_without_preadv_stay_parallel_across_threads(monkeypatch, tiles):
    """The ring reads on several threads; the seek + read fallback must not serialize them (each read has
    its own descriptor, so nothing is shared to lock)."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from hsgds.io.posix import PosixReader

    source, data = tiles(count=3, k=2)
    monkeypatch.delattr(os, "preadv")
    real_read, lock = os.read, threading.Lock()
    active, most = [0], [0]

    def slow_read(fd, n):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.2)  # long enough for the other threads' reads to start meanwhile
        try:
            return real_read(fd, n)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(os, "read", slow_read)
    dests = [torch.empty(source.nbytes, dtype=torch.uint8) for _ in range(3)]
    with PosixReader(source) as reader, ThreadPoolExecutor(3) as pool:
        list(pool.map(reader.read_into, range(3), dests))
    assert [d.numpy().tobytes() for d in dests] == data[:3]
    assert most[0] == 3
