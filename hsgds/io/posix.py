"""PosixReader: os.preadv into host memory (the CPU path and the reference), optional O_DIRECT."""

from __future__ import annotations

import mmap
import os
import threading
from typing import Any

import crc32c

from hsgds import defaults
from hsgds.errors import TileReadError
from hsgds.format import ALIGNMENT, open_tile
from hsgds.io.base import ChunkReader, TileSource

#: Windows opens files in text mode unless told otherwise (newline translation would corrupt tiles).
_O_BINARY = getattr(os, "O_BINARY", 0)


def _read_at(fd: int, view: memoryview, offset: int) -> int:
    """One positional read into ``view``: ``os.preadv`` where it exists (Linux, macOS, BSD); on Windows,
    which has no positional read in ``os``, a seek and a read (no lock: each read has its own descriptor,
    so reads in flight on several threads stay parallel)."""
    preadv = getattr(os, "preadv", None)
    if preadv is not None:
        return preadv(fd, [view], offset)
    os.lseek(fd, offset, os.SEEK_SET)
    data = os.read(fd, len(view))
    view[:len(data)] = data
    return len(data)


class PosixReader(ChunkReader):
    """Reads tiles with ``os.preadv`` straight into the destination's memory and checks crc32c.

    ``direct=True`` opens files with O_DIRECT (bypasses the page cache; cold-read benchmarks) and reads
    through a page-aligned bounce buffer when the destination is not aligned. A CUDA destination is
    filled through a pinned host buffer and an asynchronous copy (the GPU path without kvikio).
    """

    def __init__(self, source: TileSource, *, verify: bool | None = None, direct: bool = False) -> None:
        super().__init__(source)
        self.verify = bool(defaults.get("verify_reads")) if verify is None else verify
        self.direct = direct and hasattr(os, "O_DIRECT")
        self._lock = threading.Lock()
        self._local = threading.local()
        self._closed = False

    @property
    def name(self) -> str:  # type: ignore[override]
        return "posix-direct" if self.direct else "posix"

    def _open(self, tile_id: int) -> int:
        """Open a tile file for one read. Opening costs microseconds next to a MiB-sized read, and no
        descriptor stays open: a store of thousands of tiles never meets the open-files limit."""
        if self._closed:
            raise TileReadError("reader is closed (its loader was closed); create a new loader")
        flags = _O_BINARY | (os.O_DIRECT if self.direct else 0)
        path, local = self.source.paths[tile_id], self.source.local_id(tile_id)
        try:
            return open_tile(local, path, flags)  # refuses a FIFO, on which open(2) would block for ever
        except TileReadError:
            raise
        except OSError as exc:
            raise TileReadError(f"tile {local} ({path}): cannot open ({exc.strerror})") from None

    def _bounce(self, nbytes: int) -> Any:
        buf = getattr(self._local, "buf", None)
        if buf is None or len(buf) < nbytes:
            buf = mmap.mmap(-1, (nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT)  # page aligned
            self._local.buf = buf
        return buf

    def _read(self, tile_id: int, view: memoryview) -> None:
        fd = self._open(tile_id)
        n, done = len(view), 0
        path = self.source.paths[tile_id]
        try:
            try:
                while done < n:
                    got = _read_at(fd, view[done:], done)
                    if got == 0:
                        break
                    done += got
            except OSError as exc:
                raise TileReadError(f"tile {self.source.local_id(tile_id)} ({path}): read failed ({exc.strerror})"
                                    ) from None
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if done != n or size != n:
            raise self.source.size_error(tile_id, size)

    def read_into(self, tile_id: int, dest: Any) -> None:
        n = self.source.tile_nbytes(tile_id)
        if dest.is_cuda:
            host = self._pinned(dest)
            self._read_checked(tile_id, host)
            import torch

            with torch.cuda.stream(self._local.stream):
                dest.view(-1).copy_(host, non_blocking=True)
            # the pinned buffer is reused for the next tile, so the copy must have finished
            self._local.stream.synchronize()
        else:
            self._read_checked(tile_id, dest)
        with self._lock:  # the ring reads from several threads
            self.bytes_read += n

    def _read_checked(self, tile_id: int, dest: Any) -> None:
        arr = dest.view(-1).view(_u8()).numpy()
        view = memoryview(arr)
        if self.direct and arr.ctypes.data % ALIGNMENT:
            bounce = memoryview(self._bounce(len(view)))[:len(view)]
            self._read(tile_id, bounce)
            view[:] = bounce
        else:
            self._read(tile_id, view)
        if self.verify:
            self.source.check_crc(tile_id, crc32c.crc32c(view))

    def _pinned(self, dest: Any) -> Any:
        import torch

        host = getattr(self._local, "pinned", None)
        # grown to the largest tile, never shrunk: pinning is slow, and tiles of several sizes (a collection)
        # would otherwise pin a new buffer at every change of size
        if host is None or host.numel() < dest.numel() or host.dtype != dest.dtype:
            host = torch.empty(dest.numel(), dtype=dest.dtype, pin_memory=True)
            self._local.pinned = host
        if getattr(self._local, "stream", None) is None:
            self._local.stream = torch.cuda.Stream(device=dest.device)
        return host[:dest.numel()]

    def close(self) -> None:
        self._closed = True


class PinnedPosixReader(PosixReader):
    """The POSIX reader of a CUDA ring without kvikio: each tile is read into a pinned host buffer and
    copied to the device slot asynchronously (what :class:`PosixReader` does for any CUDA destination;
    this name says so in the loader's stats)."""

    @property
    def name(self) -> str:  # type: ignore[override]
        return "posix-pinned"


def _u8() -> Any:
    import torch

    return torch.uint8
