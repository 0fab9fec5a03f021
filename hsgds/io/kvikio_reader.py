"""KvikioReader: ``kvikio.CuFile.pread`` straight into device memory (GDS, or compat mode)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from typing import Any

from hsgds import defaults
from hsgds.io.kvikio_support import import_kvikio, kvikio_mode
from hsgds.errors import ConfigError, TileReadError
from hsgds.io.base import ChunkReader, TileSource

_MAX_AUTO_THREADS = 8


class KvikioReader(ChunkReader):
    """Reads whole tiles into CUDA tensors with kvikio, several reads in flight at once.

    Each tile file gets a ``kvikio.CuFile`` handle, opened on first use and kept open until
    :meth:`close`. A read is a ``pread`` future executed by kvikio's C++ thread pool (no Python and no
    GIL in the transfer); :meth:`read_many` issues several before waiting for any. With GPUDirect
    Storage the bytes go from storage to device memory by DMA (``name == "kvikio-gds"``); otherwise
    kvikio or cuFile reads into host bounce buffers and copies to the device (``"kvikio-compat"``,
    e.g. WSL2, no nvidia-fs module, ``KVIKIO_COMPAT_MODE=ON``). Data is in device memory when a read
    returns: later work on any stream sees it.

    The destination must not be in use by pending GPU work; the ring guarantees that (it waits on the
    consumer's event before reusing a slot).

    Parameters
    ----------
    source : TileSource
        Paths, tile size and checksums.
    verify : bool, default False
        crc32c cannot be computed on the device cheaply, so by default **the bytes are not checked at
        read time** (size and read count are). With ``verify=True`` every tile is copied back to host
        memory after its read and checked with :meth:`TileSource.check_crc`, raising ChecksumError on
        a mismatch. That costs a device-to-host copy and a CPU checksum per tile: for debugging a
        suspect store or reader, not for training. To check a store once, run ``hsgds verify``.
    threads : int, optional
        Size of kvikio's (process-wide) thread pool. Default: the ``kvikio_threads`` setting
        (``HSGDS_KVIKIO_THREADS``); 0 keeps ``KVIKIO_NTHREADS`` when set, else raises the pool to
        min(8, CPUs) threads (kvikio's own default of 1 would serialize the reads in flight).

    Raises
    ------
    DependencyError
        kvikio is missing or cannot load its libraries; the message names the pip extra.
    """

    def __init__(self, source: TileSource, *, verify: bool = False, threads: int | None = None) -> None:
        super().__init__(source)
        self._kvikio = import_kvikio(_torch_cuda_version())
        self.verify = verify
        _configure_threads(self._kvikio, threads)
        try:
            self.gds, _, self.mode_reason = kvikio_mode(self._kvikio)
        except (RuntimeError, AttributeError, KeyError) as exc:  # libcufile refused to answer: not GDS
            self.gds, self.mode_reason = False, f"cannot ask cuFile about GDS ({exc}); compat mode"
        self.name = "kvikio-gds" if self.gds else "kvikio-compat"
        self._files: dict[int, Any] = {}
        self._registered: list[Any] = []
        self._cond = threading.Condition()
        self._inflight = 0
        self._closed = False

    # -------------------------------------------------------------------------------- handles

    def _file(self, tile_id: int) -> Any:
        """The open handle of ``tile_id`` (opened on first use). Call with ``_cond`` held."""
        if self._closed:
            raise TileReadError("reader is closed")
        handle = self._files.get(tile_id)
        if handle is None:
            path = self.source.paths[tile_id]
            try:
                handle = self._kvikio.CuFile(path, "r")
            except RuntimeError as exc:  # kvikio reports open(2) failures as RuntimeError
                raise TileReadError(f"tile {tile_id} ({path}): cannot open ({_open_reason(path, exc)})") from None
            self._files[tile_id] = handle
        return handle

    def _size_error(self, tile_id: int, handle: Any) -> TileReadError | None:
        path, n = self.source.paths[tile_id], self.source.nbytes
        try:
            size = os.fstat(handle.fileno()).st_size
        except OSError as exc:
            return TileReadError(f"tile {tile_id} ({path}): read failed ({exc.strerror})")
        if size != n:
            return self.source.size_error(tile_id, size)
        return None

    def register(self, buffer: Any) -> None:
        """Register a device buffer (e.g. the ring's storage) with cuFile once, so GDS reads into it
        skip per-read pinning. A no-op in compat mode. Kept registered (and alive) until :meth:`close`."""
        if not self.gds:
            return
        with self._cond:
            if self._closed:
                raise TileReadError("reader is closed")
            self._kvikio.memory_register(buffer)
            self._registered.append(buffer)

    # -------------------------------------------------------------------------------- reads

    def _as_bytes(self, dest: Any) -> Any:
        """``dest`` as a flat uint8 CUDA tensor over the same memory (checked, not assumed)."""
        n = self.source.nbytes
        if not getattr(dest, "is_cuda", False):
            raise TypeError(f"KvikioReader reads into CUDA tensors, got {type(dest).__name__} on "
                            f"{getattr(dest, 'device', 'the host')}; use PosixReader for host memory")
        if not dest.is_contiguous():
            raise ValueError("the destination tensor must be contiguous")
        nbytes = dest.numel() * dest.element_size()
        if nbytes != n:
            raise ValueError(f"the destination holds {nbytes} bytes, a tile is {n}")
        import torch

        return dest.reshape(-1).view(torch.uint8)

    def read_into(self, tile_id: int, dest: Any) -> None:
        """Fill ``dest`` (a contiguous CUDA tensor of ``source.nbytes`` bytes) with tile ``tile_id``.

        Raises TileReadError (missing / truncated / I/O error, closed reader), ChecksumError
        (``verify=True`` only), TypeError / ValueError for a wrong destination.
        """
        self.read_many([(tile_id, dest)])

    def read_many(self, items: Iterable[tuple[int, Any]]) -> None:
        """Read several tiles with all their reads in flight at once, then wait for every one.

        ``items`` are ``(tile_id, dest)`` pairs with distinct destinations. Every read issued is waited
        for, even after an error (they write into the callers' buffers); then the first error is raised
        and the destinations are in an undefined state.
        """
        n = self.source.nbytes
        work = [(tile_id, self._as_bytes(dest)) for tile_id, dest in items]
        if not work:
            return
        pending: list[tuple[int, Any, Any, Any]] = []
        done: list[tuple[int, Any]] = []
        error: TileReadError | None = None
        with self._cond:
            if self._closed:
                raise TileReadError("reader is closed")
            self._inflight += 1  # close() waits for this batch before closing the handles
        try:
            for tile_id, buf in work:
                try:
                    with self._cond:
                        handle = self._file(tile_id)
                    # a truncated tile would make kvikio fail or read short: say which tile it is first
                    error = self._size_error(tile_id, handle)
                    if error is not None:
                        break
                    pending.append((tile_id, buf, handle, handle.pread(buf, n, 0)))
                except TileReadError as exc:
                    error = exc
                    break
                except RuntimeError as exc:
                    error = _read_failed(self.source.paths[tile_id], tile_id, exc)
                    break
            for tile_id, buf, handle, future in pending:
                try:
                    got = future.get()
                except RuntimeError as exc:
                    error = error or _read_failed(self.source.paths[tile_id], tile_id, exc)
                    continue
                if got != n:
                    error = error or self._size_error(tile_id, handle) or TileReadError(
                        f"tile {tile_id} ({self.source.paths[tile_id]}): short read ({got} of {n} bytes)")
                    continue
                done.append((tile_id, buf))
        finally:
            with self._cond:
                self._inflight -= 1
                self.bytes_read += n * len(done)
                self._cond.notify_all()
        if error is not None:
            raise error
        if self.verify:
            import crc32c

            for tile_id, buf in done:
                self.source.check_crc(tile_id, crc32c.crc32c(buf.cpu().numpy()))

    def close(self) -> None:
        """Wait for reads in flight, deregister buffers, close every handle. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: self._inflight == 0)
            files, self._files = self._files, {}
            registered, self._registered = self._registered, []
        for buffer in registered:
            self._kvikio.memory_deregister(buffer)
        for handle in files.values():
            handle.close()


def _read_failed(path: Any, tile_id: int, exc: BaseException) -> TileReadError:
    return TileReadError(f"tile {tile_id} ({path}): read failed ({' '.join(str(exc).split())})")


def _open_reason(path: Any, exc: BaseException) -> str:
    """The plain OS reason ("No such file or directory") when there is one, else kvikio's message."""
    try:
        with open(path, "rb"):
            pass
    except OSError as os_exc:
        return os_exc.strerror or str(os_exc)
    return " ".join(str(exc).split())


def _torch_cuda_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.version.cuda


def _configure_threads(kvikio: Any, threads: int | None) -> None:
    """Size kvikio's thread pool (process-wide): several tiles in flight need several threads."""
    n = int(defaults.get("kvikio_threads")) if threads is None else int(threads)
    if n < 0:
        raise ConfigError(f"kvikio threads must be >= 0 (0 = automatic), got {n}")
    d = kvikio.defaults
    current = int(d.get("num_threads")) if hasattr(d, "get") else int(d.get_num_threads())
    if n == 0:
        if os.environ.get("KVIKIO_NTHREADS"):
            return  # the user sized kvikio's pool already
        n = max(current, min(_MAX_AUTO_THREADS, os.cpu_count() or 1))
    if n != current:
        if hasattr(d, "get"):
            d.set("num_threads", n)
        else:  # kvikio < 24.12
            d.num_threads_reset(n)
