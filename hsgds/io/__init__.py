"""Tile readers: fill a ring slot with one tile's bytes (POSIX into host memory, kvikio into device memory)."""

from hsgds.io.base import ChunkReader, TileSource
from hsgds.io.posix import PosixReader

__all__ = ["ChunkReader", "PosixReader", "TileSource"]
