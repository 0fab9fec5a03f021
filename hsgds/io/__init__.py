"""Tile readers: fill a ring slot with one tile's bytes (POSIX into host memory, kvikio into device memory).

:data:`READERS` names every reader; :func:`make_reader` builds one by name. The kvikio reader is
imported only when asked for (kvikio loads CUDA libraries).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from hsgds.errors import ConfigError, shown
from hsgds.io.base import ChunkReader, TileSource
from hsgds.io.posix import PinnedPosixReader, PosixReader

#: reader name -> "module:class" of its ChunkReader (imported on first use)
READERS: dict[str, str] = {
    "posix": "hsgds.io.posix:PosixReader",
    "posix-pinned": "hsgds.io.posix:PinnedPosixReader",
    "kvikio": "hsgds.io.kvikio_reader:KvikioReader",
}


def reader_class(name: str) -> type[ChunkReader]:
    """The ChunkReader class registered as ``name``; ConfigError naming the known ones otherwise."""
    target = READERS.get(name)
    if target is None:
        raise ConfigError(f"unknown reader {shown(name)}; choose one of {', '.join(READERS)}")
    module, cls = target.split(":")
    return getattr(import_module(module), cls)


def make_reader(name: str, source: TileSource, **options: Any) -> ChunkReader:
    """A reader of ``source`` by registry name (``options`` go to its constructor)."""
    return reader_class(name)(source, **options)


__all__ = ["READERS", "ChunkReader", "PinnedPosixReader", "PosixReader", "TileSource", "make_reader",
           "reader_class"]
