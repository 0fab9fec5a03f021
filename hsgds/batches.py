"""Per-batch host work done ahead of the training thread: index arrays on a thread of their own, and
reused pinned staging buffers for the one host-to-device copy per batch.

The loader's consuming thread (the training loop calling ``next(loader)``) then only waits for the
batch's tiles, writes their ring slots into the prepared index, starts one asynchronous copy and
launches the cut. Everything that grows with the batch or with the data set (sample lookups,
``np.unique``, stacking the rows, augmentation draws) happens here, one or more batches ahead.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["BatchPrep", "PinnedStaging", "Prepared"]


@dataclass
class Prepared:
    """One batch's host-side index, built ahead.

    ``rows`` is (R, N) int64: row 0 is left for the ring slots (filled by the consumer once the tiles
    are resident: ``rows[0] = slots_of_tiles[inverse]``), the other rows are the loader's (y, x, label,
    ...). ``extra`` carries whatever else the batch needs on the consuming thread (e.g. augmentation
    parameters)."""

    batch: int
    idx: np.ndarray
    tiles: np.ndarray
    inverse: np.ndarray
    rows: np.ndarray
    extra: Any = None


class BatchPrep:
    """Builds ``make(b)`` for batches ``first..stop-1`` in order on a daemon thread, ``depth`` ahead.

    Parameters
    ----------
    make : callable
        ``make(b) -> Prepared``; called on the preparing thread only (it must not touch CUDA state).
    first, stop : int
        The batches to prepare.
    depth : int
        Batches prepared ahead of the consumer (bounded memory: depth + 1 batches of indices).

    An exception raised by ``make`` is raised again by :meth:`get` for that batch. :meth:`close` stops
    the thread (idempotent); a generator that owns one closes it in its ``finally``.
    """

    def __init__(self, make: Callable[[int], Prepared], first: int, stop: int, depth: int = 2) -> None:
        self._make = make
        self._next = first
        self._stop = stop
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hsgds-batches", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for b in range(self._next, self._stop):
            if self._closed.is_set():
                return
            try:
                item: Any = self._make(b)
            except BaseException as exc:  # handed to the consumer, in order
                item = exc
            while not self._closed.is_set():
                try:
                    self._queue.put((b, item), timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, BaseException):
                return

    def get(self, b: int) -> Prepared:
        """The prepared batch ``b`` (batches must be asked for in order)."""
        while True:
            try:
                got, item = self._queue.get(timeout=0.1)
                break
            except queue.Empty:
                if self._closed.is_set():  # by another thread
                    raise RuntimeError(f"batch {b} will never be prepared: the loader was closed") from None
                # the thread puts every batch before it ends, so once it has ended an empty queue stays empty
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError(f"batch {b} will never be prepared: the preparing thread ended") from None
        if got != b:  # a programming error in the caller, never a data condition
            raise RuntimeError(f"batch {b} asked for, but batch {got} was prepared next")
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        """Stop preparing; the thread ends within ~0.1 s (it never blocks on anything else)."""
        self._closed.set()
        while True:  # unblock a put() in progress
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


class PinnedStaging:
    """A few page-locked host buffers, reused round-robin for the per-batch host-to-device copies.

    ``stage(rows)`` copies the (R, N) int64 array into the next buffer, starts an asynchronous copy to
    the device on the current stream and returns the device tensor; ``stage_all(arrays)`` does the same for
    several arrays at once, packed into one buffer (:func:`packing`): one copy. A buffer is written again
    only after the copy that last read it has finished (a CUDA event per buffer; by then it almost always
    has). Replaces a ``pin_memory()`` per batch, which allocates (or takes from torch's cache) and
    registers page-locked memory each time, and ``.to(device)`` of pageable memory, which waits for
    everything queued on the stream (the training step) before it copies.
    """

    def __init__(self, device: torch.device, count: int = 4) -> None:
        self.device = device
        self._bufs: list[torch.Tensor | None] = [None] * count
        self._events: list[Any] = [None] * count
        self._i = 0

    def stage(self, rows: np.ndarray) -> torch.Tensor:
        return self.stage_all([rows])[0]

    def stage_all(self, arrays: Sequence[np.ndarray]) -> list[torch.Tensor]:
        offsets, nbytes = packing(arrays)
        k = self._i
        self._i = (k + 1) % len(self._bufs)
        buf = self._bufs[k]
        if buf is None or buf.numel() < nbytes:
            buf = self._bufs[k] = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            self._events[k] = None
        if self._events[k] is not None:
            self._events[k].synchronize()  # the copy that read this buffer last has finished
        host = buf[:nbytes]
        pack(host.numpy(), arrays, offsets)
        out = host.to(self.device, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        self._events[k] = event
        return unpacked(out, arrays, offsets)


_ALIGN = 8  # every array starts on a multiple of the widest element, so each is a plain view of the bytes


def packing(arrays: Sequence[np.ndarray]) -> tuple[list[int], int]:
    """Where each of ``arrays`` starts in one byte buffer holding them all, and the buffer's size (at least 1)."""
    offsets, end = [], 0
    for a in arrays:
        offsets.append(end)
        end += -(-a.nbytes // _ALIGN) * _ALIGN
    return offsets, max(end, 1)


def pack(host: np.ndarray, arrays: Sequence[np.ndarray], offsets: list[int]) -> None:
    """Copy ``arrays`` into the uint8 buffer ``host`` at ``offsets`` (:func:`packing`)."""
    for a, o in zip(arrays, offsets):
        host[o:o + a.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def unpacked(flat: torch.Tensor, arrays: Sequence[np.ndarray], offsets: list[int]) -> list[torch.Tensor]:
    """The arrays :func:`pack` put in ``flat`` (a uint8 tensor, e.g. on the device), as views with their
    dtypes and shapes."""
    return [flat[o:o + a.nbytes].view(_TORCH_DTYPE[a.dtype]).view(a.shape) for a, o in zip(arrays, offsets)]


_TORCH_DTYPE = {np.dtype(t): getattr(torch, t) for t in ("int64", "int32", "int16", "int8", "uint8", "float64",
                                                          "float32", "bool")}
