"""KvikioReader: ``kvikio.CuFile.pread`` straight into device memory (GDS, or compat mode)."""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import numpy as np

from hsgds import defaults
from hsgds.checksum import as_signed, tile_checksums
from hsgds.errors import ConfigError, HsgdsWarning, TileReadError, one_line
from hsgds.format import check_regular
from hsgds.io.base import ChunkReader, TileSource
from hsgds.io.kvikio_support import import_kvikio, kvikio_mode

_MAX_AUTO_THREADS = 8


class KvikioReader(ChunkReader):
    """Reads whole tiles into CUDA tensors with kvikio, several reads in flight at once.

    Tile files are read through ``kvikio.CuFile`` handles kept in a small least-recently-used cache:
    at most ``max_open_files`` stay open (each holds file descriptors and a cuFile registration), an
    evicted handle is closed, and a handle with a read in flight is never closed (so while more reads
    than that are in flight, as many handles are open as there are reads). A store of any tile count
    thus stays under the process's open-files limit. A read is a ``pread`` future executed by kvikio's
    C++ thread pool (no Python and no GIL in the transfer); :meth:`read_many` issues several before
    waiting for any. With GPUDirect Storage the bytes go from storage to device memory by DMA
    (``name == "kvikio-gds"``); otherwise kvikio or cuFile reads into host bounce buffers and copies to
    the device (``"kvikio-compat"``, e.g. WSL2, no nvidia-fs module, ``KVIKIO_COMPAT_MODE=ON``). Data is
    in device memory when a read returns: later work on any stream sees it.

    The destination must not be in use by pending GPU work; the ring guarantees that (it waits on the
    consumer's event before reusing a slot).

    Parameters
    ----------
    source : TileSource
        Paths, tile size and checksums.
    verify : bool, optional
        Check every tile's bytes after its read, before the ring hands the slot to the consumer (default:
        the ``verify_reads`` setting, on). A format v2 store is checked on the device: the ``wsum64``
        checksum (:mod:`hsgds.checksum`) of each tile of a batch, a few reductions on the GPU, compared
        with the store's; a mismatch raises ChecksumError naming the store and tile. A format v1 store has
        no device checksums: each tile is copied back to host memory and its crc32c checked (slow; a
        warning says so once per reader; convert the source again to get v2). Size and read count are
        always checked.
    threads : int, optional
        Size of kvikio's (process-wide) thread pool. Default: the ``kvikio_threads`` setting
        (``HSGDS_KVIKIO_THREADS``); 0 keeps ``KVIKIO_NTHREADS`` when set, else raises the pool to
        min(8, CPUs) threads (kvikio's own default of 1 would serialize the reads in flight).
    max_open_files : int, optional
        Most tile files kept open between reads. Default: the ``max_open_files`` setting
        (``HSGDS_MAX_OPEN_FILES``, 64).

    Raises
    ------
    DependencyError
        kvikio is missing or cannot load its libraries; the message names the pip extra.
    ConfigError
        ``threads`` < 0 or ``max_open_files`` < 1.
    """

    batched = True  # read_many issues every read before waiting for any

    def __init__(self, source: TileSource, *, verify: bool | None = None, threads: int | None = None,
                 max_open_files: int | None = None) -> None:
        super().__init__(source)
        self._max_open = int(defaults.get("max_open_files") if max_open_files is None else max_open_files)
        if self._max_open < 1:
            raise ConfigError(f"max_open_files must be >= 1, got {self._max_open}; see docs/settings.md")
        self._kvikio = import_kvikio(_torch_cuda_version())
        self.verify = bool(defaults.get("verify_reads")) if verify is None else bool(verify)
        self.on_device = self.verify and source.device_checksums is not None  # else crc32c on the host
        if self.verify and not self.on_device:
            warnings.warn(f"{source.store or 'the store'} is format v1 (no device checksums): the kvikio reader "
                          "checks every tile on the host, a copy back and crc32c per tile; convert the source "
                          "again for checks on the device", HsgdsWarning, stacklevel=2)
        self._expected: dict[Any, Any] = {}  # device -> ((tiles, 2) int64 wsum64 pairs, which rows are filled)
        self._streams = threading.local()  # a side stream per reader thread for the checks
        _configure_threads(self._kvikio, threads)
        try:
            self.gds, _, self.mode_reason = kvikio_mode(self._kvikio)
        except (RuntimeError, AttributeError, KeyError) as exc:  # libcufile refused to answer: not GDS
            self.gds, self.mode_reason = False, f"cannot ask cuFile about GDS ({exc}); compat mode"
        self.name = "kvikio-gds" if self.gds else "kvikio-compat"
        self._files: OrderedDict[int, Any] = OrderedDict()  # tile -> open handle, least recently used first
        self._busy: dict[int, int] = {}  # tile -> reads in flight on its handle (never closed while > 0)
        self._registered: list[Any] = []
        self._cond = threading.Condition()
        self._inflight = 0
        self._closed = False

    # -------------------------------------------------------------------------------- handles

    @property
    def open_files(self) -> int:
        """Tile files open now (at most ``max_open_files``, or the reads in flight when more)."""
        with self._cond:
            return len(self._files)

    def _acquire(self, tile_id: int) -> Any:
        """The open handle of ``tile_id`` (opened when not cached), held until :meth:`_release`."""
        with self._cond:
            if self._closed:
                raise TileReadError("reader is closed (its loader was closed); create a new loader")
            handle = self._files.get(tile_id)
            if handle is not None:
                self._files.move_to_end(tile_id)
            else:
                path, local = self.source.paths[tile_id], self.source.local_id(tile_id)
                try:
                    mode = os.stat(path).st_mode
                except OSError:  # a missing file: CuFile's own error below
                    mode = None
                if mode is not None:  # kvikio opens blocking: a FIFO planted as a chunk would hang this thread
                    check_regular(local, path, mode)
                try:
                    handle = self._kvikio.CuFile(path, "r")
                except RuntimeError as exc:  # kvikio reports open(2) failures as RuntimeError
                    raise TileReadError(f"tile {local} ({path}): cannot open ({_open_reason(path, exc)})") from None
                self._files[tile_id] = handle
            self._busy[tile_id] = self._busy.get(tile_id, 0) + 1
            self._trim()
            return handle

    def _release(self, tile_id: int) -> None:
        with self._cond:
            left = self._busy[tile_id] - 1
            if left:
                self._busy[tile_id] = left
            else:
                del self._busy[tile_id]
            self._trim()

    def _trim(self) -> None:
        """Close least recently used idle handles until at most ``max_open_files`` are open. Call with
        ``_cond`` held."""
        if len(self._files) <= self._max_open:
            return
        idle = [t for t in self._files if t not in self._busy]  # least recently used first
        for tile_id in idle[:len(self._files) - self._max_open]:
            self._files.pop(tile_id).close()

    def _size_error(self, tile_id: int, handle: Any) -> TileReadError | None:
        path, n = self.source.paths[tile_id], self.source.tile_nbytes(tile_id)
        try:
            size = os.fstat(handle.fileno()).st_size
        except OSError as exc:
            return TileReadError(f"tile {self.source.local_id(tile_id)} ({path}): read failed ({exc.strerror})")
        if size != n:
            return self.source.size_error(tile_id, size)
        return None

    def register(self, buffer: Any) -> None:
        """Register a device buffer (e.g. the ring's storage) with cuFile once, so GDS reads into it
        skip per-read pinning. A no-op in compat mode. Kept registered (and alive) until :meth:`close`.

        Registration only speeds reads up: when cuFile refuses it (a ring larger than cufile.json's
        ``max_device_pinned_mem_size_kb``, 32 GiB by default), a warning says so and reads go through
        cuFile's own bounce buffers."""
        if not self.gds:
            return
        with self._cond:
            if self._closed:
                raise TileReadError("reader is closed (its loader was closed); create a new loader")
            try:
                self._kvikio.memory_register(buffer)
            except RuntimeError as exc:  # libcufile's error, e.g. more than it may pin
                nbytes = buffer.numel() * buffer.element_size()
                warnings.warn(f"cuFile cannot register the {nbytes / 2**20:.0f} MiB ring for GPUDirect Storage "
                              f"({one_line(exc)}); reads go through cuFile's bounce buffers (slower); raise "
                              "max_device_pinned_mem_size_kb in /etc/cufile.json or pass a smaller ring_bytes",
                              HsgdsWarning, stacklevel=2)
                return
            self._registered.append(buffer)

    # -------------------------------------------------------------------------------- reads

    def _as_bytes(self, dest: Any, n: int) -> Any:
        """``dest`` as a flat uint8 CUDA tensor of ``n`` bytes over the same memory (checked, not assumed)."""
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
        """Fill ``dest`` (a contiguous CUDA tensor of ``source.tile_nbytes(tile_id)`` bytes) with tile ``tile_id``.

        Raises TileReadError (missing / truncated / I/O error, closed reader), ChecksumError
        (``verify=True`` only), TypeError / ValueError for a wrong destination.
        """
        self.read_many([(tile_id, dest)])

    def read_many(self, requests: Iterable[tuple[int, Any]]) -> None:
        """Read several tiles with all their reads in flight at once, then wait for every one.

        ``requests`` are ``(tile_id, dest)`` pairs with distinct destinations. Every read issued is waited
        for, even after an error (they write into the callers' buffers); then the first error is raised
        and the destinations are in an undefined state.
        """
        work = [(tile_id, self._as_bytes(dest, self.source.tile_nbytes(tile_id))) for tile_id, dest in requests]
        if not work:
            return
        pending: list[tuple[int, Any, Any, Any]] = []
        done: list[tuple[int, Any]] = []
        error: TileReadError | None = None
        with self._cond:
            if self._closed:
                raise TileReadError("reader is closed (its loader was closed); create a new loader")
            self._inflight += 1  # close() waits for this batch before closing the handles
        try:
            for tile_id, buf in work:
                try:
                    handle = self._acquire(tile_id)
                except TileReadError as exc:
                    error = exc
                    break
                try:
                    # a truncated tile would make kvikio fail or read short: say which tile it is first
                    error = self._size_error(tile_id, handle)
                    if error is None:
                        pending.append((tile_id, buf, handle, handle.pread(buf, buf.numel(), 0)))
                        continue
                except RuntimeError as exc:
                    error = _read_failed(self.source, tile_id, exc)
                self._release(tile_id)
                break
            for tile_id, buf, handle, future in pending:
                try:
                    try:
                        got = future.get()
                    except RuntimeError as exc:
                        error = error or _read_failed(self.source, tile_id, exc)
                        continue
                    if got != buf.numel():
                        error = error or self._size_error(tile_id, handle) or TileReadError(
                            f"tile {self.source.local_id(tile_id)} ({self.source.paths[tile_id]}): short read ({got} of "
                            f"{buf.numel()} bytes)")
                        continue
                    done.append((tile_id, buf))
                finally:
                    self._release(tile_id)
        finally:
            with self._cond:
                self._inflight -= 1
                self.bytes_read += sum(buf.numel() for _, buf in done)
                self._cond.notify_all()
        if error is not None:
            raise error
        if self.on_device:
            self._check_on_device(done)
        elif self.verify:
            import crc32c

            for tile_id, buf in done:
                self.source.check_crc(tile_id, crc32c.crc32c(buf.cpu().numpy()))

    def _check_on_device(self, done: list[tuple[int, Any]]) -> None:
        """Compare the wsum64 checksums of a batch of tiles, computed where they are, with the store's;
        raise ChecksumError for the first tile that differs. One synchronization per batch, on this
        thread's own stream (the consumer's stream is not waited for)."""
        import torch

        device = done[0][1].device
        stream = None
        if device.type == "cuda":
            stream = getattr(self._streams, "stream", None)
            if stream is None or stream.device != device:
                stream = self._streams.stream = torch.cuda.Stream(device=device)
        by_size: dict[int, list[int]] = {}  # tiles of one size are checked together (scenes may differ)
        for k, (_, buf) in enumerate(done):
            by_size.setdefault(buf.numel(), []).append(k)
        order = [k for ks in by_size.values() for k in ks]
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            expected = self._expected_on(device, [tile_id for tile_id, _ in done])
            flags = []
            for ks in by_size.values():
                ids = torch.as_tensor([done[k][0] for k in ks], dtype=torch.int64).to(device)
                got = tile_checksums(torch.stack([done[k][1] for k in ks]))
                flags.append((got != expected[ids]).any(1))
            bad = torch.cat(flags).cpu().tolist()  # one wait, for this stream only
        for k, wrong in sorted(zip(order, bad)):
            if wrong:
                raise self.source.device_checksum_error(done[k][0])

    def _expected_on(self, device: Any, tiles: list[int]) -> Any:
        """The store's wsum64 pairs as a (tiles, 2) int64 tensor on ``device``, its rows for ``tiles``
        filled in (each row uploaded once, when its tile is first checked: a collection's stores are
        opened as their tiles are first read, not all at the start)."""
        import torch

        with self._cond:
            got = self._expected.get(device)
            if got is None:
                n = len(self.source.paths)
                got = self._expected[device] = (torch.zeros((n, 2), dtype=torch.int64, device=device),
                                                np.zeros(n, dtype=bool))
            table, filled = got
            missing = sorted({t for t in tiles if not filled[t]})
            if missing:
                device_checksums = self.source.device_checksums
                assert device_checksums is not None  # checked on the device only then
                rows = torch.from_numpy(as_signed([device_checksums[t] for t in missing])).to(device)
                table[torch.as_tensor(missing, dtype=torch.int64).to(device)] = rows
                if table.is_cuda:  # written on this thread's stream; other threads' streams read the rows
                    torch.cuda.current_stream(device).synchronize()
                filled[missing] = True
            return table

    def close(self) -> None:
        """Wait for reads in flight, deregister buffers, close every handle. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: self._inflight == 0)
            files, self._files = self._files, OrderedDict()
            registered, self._registered = self._registered, []
        for buffer in registered:
            self._kvikio.memory_deregister(buffer)
        for handle in files.values():
            handle.close()


def _read_failed(source: TileSource, tile_id: int, exc: BaseException) -> TileReadError:
    return TileReadError(f"tile {source.local_id(tile_id)} ({source.paths[tile_id]}): read failed ({one_line(exc)})")


def _open_reason(path: Any, exc: BaseException) -> str:
    """The plain OS reason ("No such file or directory") when there is one, else kvikio's message."""
    try:
        with open(path, "rb"):
            pass
    except OSError as os_exc:
        return os_exc.strerror or str(os_exc)
    return one_line(exc)


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
        raise ConfigError(f"kvikio threads must be >= 0 (0 = automatic), got {n}; see docs/settings.md")
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
