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


