"""The loaders hsgds is measured against, all cutting the same patches with the same normalization.

Each yields (patches, labels) batches: patches (N, B, p, p) NCHW in ``out_dtype``, normalized as
``(x.float() - offset) * scale`` in float32 with hsgds's own per-band offset/scale, labels int64. They read
a ``.npy`` of the reflect-padded cube (padded by the patch radius), so the patch of a pixel at scene
(y, x) is ``padded[y:y+p, x:x+p]``.

1. :func:`naive_loader` — a ``Dataset`` whose ``__getitem__`` reads its patch from the memory-mapped .npy
   each time, converts and normalizes it; ``DataLoader(num_workers=0)``: what most HSI code does.
2. :func:`tuned_loader` — the cube in RAM, ``num_workers`` = cores, ``persistent_workers``,
   ``prefetch_factor``, ``pin_memory`` on GPU: the DataLoader tuned as its documentation says.
3. :class:`ShmRingLoader` — the multi-process ring design: spawn-safe resident workers, the cube in
   ``multiprocessing.shared_memory``, a ring of batch slots in shared memory with two semaphores
   (empty/full), workers attach by name, slice and write patches; the main process builds tensors and
   copies them to the device.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from multiprocessing import shared_memory
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

__all__ = ["PatchDataset", "ShmRingLoader", "naive_loader", "tuned_loader"]


def _cut(cube: np.ndarray, y: int, x: int, p: int, offset: np.ndarray, scale: np.ndarray) -> np.ndarray:
    patch = np.asarray(cube[y:y + p, x:x + p], dtype=np.float32)  # reads the file when cube is a memmap
    patch -= offset
    patch *= scale
    return patch


class PatchDataset(Dataset):
    """One patch per ``__getitem__``: slice, cast, normalize, to CHW in ``out_dtype``.

    ``cube`` is a path to the padded .npy (opened memory-mapped, lazily, in each process) or an array in RAM.
    """

    def __init__(self, cube: Any, ys: np.ndarray, xs: np.ndarray, labels: np.ndarray, p: int,
                 offset: np.ndarray, scale: np.ndarray, out_dtype: torch.dtype) -> None:
        self.path = cube if isinstance(cube, (str, os.PathLike)) else None
        self.cube = None if self.path is not None else cube
        self.ys, self.xs, self.labels = ys, xs, labels
        self.p, self.out_dtype = p, out_dtype
        self.offset = np.asarray(offset, np.float32)
        self.scale = np.asarray(scale, np.float32)

    def __len__(self) -> int:
        return len(self.ys)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.cube is None:
            self.cube = np.load(self.path, mmap_mode="r", allow_pickle=False)
        patch = _cut(self.cube, int(self.ys[i]), int(self.xs[i]), self.p, self.offset, self.scale)
        # the usual HSI code: HWC -> CHW in numpy, then a tensor (cast only for 16-bit outputs)
        t = torch.from_numpy(np.ascontiguousarray(patch.transpose(2, 0, 1)))
        if self.out_dtype != torch.float32:
            t = t.to(self.out_dtype)
        return t, int(self.labels[i])


def naive_loader(npy_path: str, ys, xs, labels, p, offset, scale, out_dtype, batch_size: int, seed: int = 0,
                 device: Any = "cpu") -> DataLoader:
    """The usual default: per-sample reads from the file on disk, no workers."""
    ds = PatchDataset(str(npy_path), ys, xs, labels, p, offset, scale, out_dtype)
    return DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=0,
                      generator=torch.Generator().manual_seed(seed))


def tuned_loader(cube: np.ndarray, ys, xs, labels, p, offset, scale, out_dtype, batch_size: int,
                 workers: int | None = None, seed: int = 0, device: Any = "cpu",
                 prefetch_factor: int = 4) -> DataLoader:
    """The DataLoader tuned by the book: cube in RAM, a worker per core, persistent, prefetching, pinned."""
    workers = (os.cpu_count() or 1) if workers is None else workers
    ds = PatchDataset(cube, ys, xs, labels, p, offset, scale, out_dtype)
    cuda = torch.device(device).type == "cuda"
    return DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=workers, persistent_workers=workers > 0,
                      prefetch_factor=prefetch_factor if workers > 0 else None, pin_memory=cuda,
                      generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------ shared-memory ring

_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
                torch.float64: "float64"}


def _ring_worker(spec: dict[str, Any], sem_empty: Any, sem_full: Any, counter: Any, tasks: Any) -> None:
    """A resident worker (spawned): attach the shared blocks by name, then fill ring slots per task."""
    torch.set_num_threads(1)
    # spawned children share the parent's resource tracker, so attaching registers nothing new; the
    # parent unlinks the blocks in close()
    blocks = {k: shared_memory.SharedMemory(name=spec["names"][k]) for k in spec["names"]}
    try:
        _fill(spec, blocks, sem_empty, sem_full, counter, tasks)
    finally:
        for blk in blocks.values():
            blk.close()


def _fill(spec: dict[str, Any], blocks: dict[str, Any], sem_empty: Any, sem_full: Any, counter: Any,
          tasks: Any) -> None:
    cube = np.ndarray(spec["cube_shape"], dtype=spec["cube_dtype"], buffer=blocks["cube"].buf)
    n, bs, slots, p, bands = spec["n"], spec["batch"], spec["slots"], spec["p"], spec["bands"]
    meta = np.ndarray((3, n), dtype=np.int64, buffer=blocks["meta"].buf)  # y, x, label
    order = np.ndarray((n,), dtype=np.int64, buffer=blocks["order"].buf)
    ready = np.ndarray((slots,), dtype=np.int64, buffer=blocks["ready"].buf)
    out_dtype = getattr(torch, spec["out_dtype"])
    item = torch.empty((), dtype=out_dtype).element_size()
    slot_bytes = bs * bands * p * p * item + bs * 8
    ring = blocks["ring"].buf
    offset = np.asarray(spec["offset"], np.float32)
    scale = np.asarray(spec["scale"], np.float32)
    work = np.empty((bs, p, p, bands), np.float32)
    while True:
        task = tasks.get()
        if task is None:
            return
        tag, nb = task
        while True:
            sem_empty.acquire()
            with counter.get_lock():  # counter = [current epoch tag, next batch to claim]
                b = nb
                if counter[0] == tag:
                    b = counter[1]
                    counter[1] = b + 1
            if b >= nb:  # this epoch is fully claimed (or a newer one began): wait for the next task
                sem_empty.release()
                break
            slot = b % slots
            idx = order[b * bs:min((b + 1) * bs, n)]
            k = len(idx)
            for j, i in enumerate(idx):  # slice each patch (per-sample work, spread over processes)
                y, x = meta[0, i], meta[1, i]
                work[j] = cube[y:y + p, x:x + p]
            w = work[:k]
            w -= offset
            w *= scale
            base = slot * slot_bytes
            dst = torch.frombuffer(ring, dtype=out_dtype, count=k * bands * p * p,
                                   offset=base).view(k, bands, p, p)
            dst.copy_(torch.from_numpy(w).permute(0, 3, 1, 2))
            lab = np.ndarray((k,), np.int64, buffer=ring, offset=base + bs * bands * p * p * item)
            lab[:] = meta[2, idx]
            del dst, lab
            ready[slot] = tag * (1 << 32) + b + 1  # written before the release: the consumer's signal
            sem_full.release()


class ShmRingLoader:
    """Resident spawned workers fill a shared-memory ring of batch slots; the main process yields tensors.

    Batches come out in order: slot ``b % slots`` holds batch ``b``; a worker claims the next batch number
    only after taking an ``empty`` token, so at most ``slots`` batches are in flight; ``full`` wakes the
    consumer. Call :meth:`close` (or use ``with``) to stop the workers and unlink the shared memory.
    """

    def __init__(self, cube: np.ndarray, ys, xs, labels, p: int, offset, scale, out_dtype: torch.dtype,
                 batch_size: int, workers: int | None = None, slots: int | None = None, seed: int = 0,
                 device: Any = "cpu", timeout: float = 120.0) -> None:
        self.workers = (os.cpu_count() or 1) if workers is None else workers
        self.slots = slots if slots is not None else max(4, 2 * self.workers)
        self.batch_size, self.p, self.seed, self.timeout = batch_size, p, seed, timeout
        self.device = torch.device(device)
        self.out_dtype = out_dtype
        self.n = len(ys)
        self.bands = cube.shape[2]
        self._epoch = 0
        self._blocks: dict[str, shared_memory.SharedMemory] = {}
        self._procs: list[Any] = []
        item = torch.empty((), dtype=out_dtype).element_size()
        self.patch_bytes = self.bands * p * p * item
        self.slot_bytes = batch_size * self.patch_bytes + batch_size * 8
        try:
            self._share("cube", cube.nbytes)
            np.ndarray(cube.shape, cube.dtype, buffer=self._blocks["cube"].buf)[...] = cube
            self._share("meta", 3 * self.n * 8)
            meta = np.ndarray((3, self.n), np.int64, buffer=self._blocks["meta"].buf)
            meta[0], meta[1], meta[2] = ys, xs, labels
            self._share("order", self.n * 8)
            self._share("ready", self.slots * 8)
            self._ready = np.ndarray((self.slots,), np.int64, buffer=self._blocks["ready"].buf)
            self._ready[:] = 0
            self._share("ring", self.slots * self.slot_bytes)
            ctx = mp.get_context("spawn")
            self._empty, self._full = ctx.Semaphore(self.slots), ctx.Semaphore(0)
            self._counter = ctx.Array("q", 2)
            self._tasks = ctx.Queue()
            spec = {"names": {k: b.name for k, b in self._blocks.items()}, "cube_shape": cube.shape,
                    "cube_dtype": cube.dtype.str, "n": self.n, "batch": batch_size, "slots": self.slots, "p": p,
                    "bands": self.bands, "out_dtype": _DTYPE_NAMES[out_dtype],
                    "offset": np.asarray(offset, np.float32).tolist(), "scale": np.asarray(scale, np.float32).tolist()}
            for _ in range(self.workers):
                proc = ctx.Process(target=_ring_worker, args=(spec, self._empty, self._full, self._counter,
                                                              self._tasks), daemon=True)
                proc.start()
                self._procs.append(proc)
        except BaseException:
            self.close()
            raise

    def _share(self, key: str, nbytes: int) -> None:
        self._blocks[key] = shared_memory.SharedMemory(create=True, size=max(1, nbytes))

    def __len__(self) -> int:
        return (self.n + self.batch_size - 1) // self.batch_size

    def __iter__(self):
        tag = self._epoch = self._epoch + 1
        order = np.ndarray((self.n,), np.int64, buffer=self._blocks["order"].buf)
        order[:] = np.random.default_rng((self.seed, tag)).permutation(self.n)
        nb = len(self)
        with self._counter.get_lock():
            self._counter[0], self._counter[1] = tag, 0
        for _ in self._procs:
            self._tasks.put((tag, nb))
        ring = self._blocks["ring"].buf
        for b in range(nb):
            slot = b % self.slots
            want = tag * (1 << 32) + b + 1
            deadline = time.monotonic() + self.timeout
            while self._ready[slot] != want:
                if not self._full.acquire(timeout=0.5):
                    if not all(p.is_alive() for p in self._procs):
                        raise RuntimeError("a shared-memory ring worker died")
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"batch {b} not produced in {self.timeout} s")
            k = min(self.batch_size, self.n - b * self.batch_size)
            base = slot * self.slot_bytes
            src = torch.frombuffer(ring, dtype=self.out_dtype, count=k * self.patch_bytes // _size(self.out_dtype),
                                   offset=base).view(k, self.bands, self.p, self.p)
            labels = torch.frombuffer(ring, dtype=torch.int64, count=k,
                                      offset=base + self.batch_size * self.patch_bytes)
            # the main process builds its own tensors (the slot is reused) and copies them to the device
            x = src.to(self.device, copy=True)
            y = labels.to(self.device, copy=True)
            self._ready[slot] = 0
            self._empty.release()
            yield x, y

    def close(self) -> None:
        for _ in self._procs:
            try:
                self._tasks.put(None)
            except (OSError, ValueError):
                pass
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        self._procs = []
        self._ready = None  # drop the numpy view before closing its block
        for blk in self._blocks.values():
            try:
                blk.unlink()
            except FileNotFoundError:
                pass
            try:
                blk.close()
            except BufferError:  # a suspended iterator still views the ring; the OS frees it with us
                pass
        self._blocks = {}

    def __enter__(self) -> ShmRingLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()

