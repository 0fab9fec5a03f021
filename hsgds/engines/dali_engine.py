"""The DALI patch engine: a DALI pipeline cuts, normalizes and lays out the patches.

Pipeline (built once per storage dtype/device, rebuilt only when a bigger batch arrives)::

    tiles  = external_source(no_copy=True)      # sample i: the (S, S, B) tile of sample i's slot
    starts = external_source()                  # sample i: int32 [y - r, x - r]  (CPU argument input)
    patch  = slice(tiles, start=starts, shape=[p, p], axes=[0, 1])   # (p, p, B), store dtype
    patch  = transpose(patch, perm=[2, 0, 1])   # NCHW only, still in the store dtype (cheapest bytes)
    patch  = (patch - offset) * scale           # float32 arithmetic, offset/scale per band

How the tiles are fed: DALI operators work sample by sample and cannot index into another input, and
``permute_batch`` needs equal input/output batch sizes, so the whole storage cannot be one sample or one
``slots``-sized batch. Instead sample i of the batch *is* the tile ``storage[slot[i]]``: a view, not a copy.
The per-slot views are made once per storage and reused, so a batch costs a Python list of N references
(list indexing, no tensor work); ``no_copy=True`` makes DALI read the ring's memory directly, and several
samples may share one tile. ``slice`` then copies only the p*p*B window of each sample.

Slice anchors are argument inputs, which DALI keeps on the host: coordinates on the GPU are copied to the
host (one small sync per batch). Bounds are checked there, before DALI sees them, because an out-of-bounds
slice makes DALI invalidate the whole pipeline.

Output: the pipeline emits float32 (float64 for float64 output) and torch rounds it to a 16-bit out_dtype.
DALI has no bfloat16, and its float32 -> float16 cast rounds halfway cases away from zero where torch
rounds them to even (1 ulp apart on exact ties), so rounding in torch keeps both engines bit-identical. On
the CPU this rounding is the copy out of DALI's buffer anyway; on the GPU it costs one extra elementwise
pass over float32. The result is copied into a torch tensor on the same device (``copy_to_external``
GPU to GPU on the current torch stream, no host round trip), because DALI reuses its output buffers on
the next run.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

import numpy as np
import torch

from hsgds import defaults
from hsgds._optional import pip_install
from hsgds.engines.base import PatchEngine, PatchSpec, check_coords, check_dihedral, check_storage
from hsgds.errors import ConfigError, DependencyError

__all__ = ["DaliEngine"]

_DEFAULT_MAX_BATCH = 256


def _import_dali() -> tuple[Any, Any, Any]:
    """(nvidia.dali, nvidia.dali.fn, nvidia.dali.types), or DependencyError naming the extra."""
    try:
        import nvidia.dali as dali
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types
    except ImportError as exc:
        raise DependencyError(
            f"the 'dali' engine needs NVIDIA DALI: {pip_install('cu13')} (or \"hsgds[cu12]\"); "
            f"for the CPU pipeline only: {pip_install('dali')}"
        ) from exc
    return dali, fn, types


def _default_threads() -> int:
    """The ``dali_threads`` setting; 0 (its default): the usable CPU cores, at most 16."""
    n = int(defaults.get("dali_threads"))
    if n > 0:
        return n
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 16))


#: why a DALI engine refuses per-scene tables (its pipeline slices one tile layout with one normalization)
NO_TABLES = ("engine='dali' cuts one scene with all its bands; for several scenes or a band selection "
             "use engine='torch'")


class DaliEngine(PatchEngine):
    """Cut patches with a DALI pipeline (GPU pipeline for CUDA devices, CPU pipeline otherwise).

    Parameters
    ----------
    spec : PatchSpec
        Patch size, layout, output dtype and per-band ``offset``/``scale``.
    device : torch.device, str or None
        None or "cpu": DALI CPU pipeline (``device_id=None``). "cuda[:k]": GPU pipeline on device k.
    max_batch_size : int
        The pipeline's batch size; use the loader's batch size. Smaller batches (the last one) run as they
        are; a bigger batch rebuilds the pipeline for that size.
    num_threads : int or None
        DALI worker threads (default: the ``dali_threads`` setting, ``HSGDS_DALI_THREADS``; its default 0
        means the usable CPU cores, at most 16).

    Notes
    -----
    Arithmetic is ``(x - offset) * scale`` in float32 (float64 when ``out_dtype`` is float64) with
    ``x`` converted exactly as torch's ``x.float()``, so the numbers equal :class:`TorchEngine`'s bit for bit.
    ``cut`` calls are serialized by a lock: a pipeline runs one batch at a time.
    """

    name = "dali"
    host_coords = True  # the pipeline's anchors and the tiles' list are made on the host

    def __init__(
        self,
        spec: PatchSpec,
        device: Any = None,
        *,
        max_batch_size: int = _DEFAULT_MAX_BATCH,
        num_threads: int | None = None,
    ) -> None:
        if spec.tables is not None:
            raise ConfigError(NO_TABLES)
        if not isinstance(max_batch_size, (int, np.integer)) or max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be a positive integer, got {max_batch_size!r}")
        if num_threads is not None and (not isinstance(num_threads, (int, np.integer)) or num_threads < 1):
            raise ConfigError(f"num_threads must be a positive integer or None, got {num_threads!r}")
        self._dali, self._fn, self._types = _import_dali()
        super().__init__(spec, device)
        self._device = torch.device("cpu") if device is None else torch.device(device)
        if self._device.type not in ("cpu", "cuda"):
            raise ConfigError(f"the 'dali' engine runs on 'cpu' or 'cuda', not {self._device.type!r}")
        self._out_dtype = out_dtype = spec.out_dtype
        self._compute = torch.float64 if out_dtype == torch.float64 else torch.float32
        np_compute = np.float64 if self._compute == torch.float64 else np.float32
        # rounded once to the compute dtype, like TorchEngine's device constants
        self._offset = spec.offset.astype(np_compute)
        self._scale = spec.scale.astype(np_compute)
        self._max_batch = int(max_batch_size)
        self._threads = int(num_threads) if num_threads is not None else _default_threads()
        self._pipe: Any = None
        self._pipe_key: tuple[Any, ...] | None = None
        self._views: tuple[tuple[Any, ...], list[Any], torch.Tensor] | None = None
        self._stats: list[Any] | None = None
        self._lock = threading.Lock()

    # -- pipeline -------------------------------------------------------------------------------------
    def _build(self, store_dtype: torch.dtype, gpu: bool, device_id: int | None, batch: int,
               geometric: bool) -> None:
        dali, fn, types = self._dali, self._fn, self._types
        spec = self.spec
        p, bands = spec.patch_size, spec.bands
        nchw = spec.layout == "NCHW"
        where = "gpu" if gpu else "cpu"

        # one batch in flight, run as soon as it is fed: the inputs are views of ring slots that the
        # ring may refill once cut() has returned, so nothing may be prefetched or run ahead. The
        # default (dynamic) executor is kept: it can bind outputs to the caller's CUDA stream.
        # Conditionals (a per-sample `if`, for the transposing dihedral codes) need AutoGraph's rewrite
        # of a pipeline_def function; without codes the graph has no branch.
        @dali.pipeline_def(batch_size=batch, num_threads=self._threads, device_id=device_id,
                           prefetch_queue_depth=1, enable_conditionals=geometric)
        def graph() -> Any:
            tiles = fn.external_source(name="tiles", device=where, no_copy=True, ndim=3, layout="HWC")
            starts = fn.external_source(name="starts", device="cpu", no_copy=True, ndim=1)
            x = fn.slice(tiles, start=starts, shape=[p, p], axes=[0, 1])
            if geometric:  # dihedral code 4t + 2v + h: flip the source's rows / columns, then swap axes
                t = fn.external_source(name="transpose", device="cpu", no_copy=True, ndim=0)
                v = fn.external_source(name="flip_rows", device="cpu", no_copy=True, ndim=0)
                h = fn.external_source(name="flip_cols", device="cpu", no_copy=True, ndim=0)
                x = fn.flip(x, horizontal=h, vertical=v)
                if t:
                    x = fn.transpose(x, perm=[1, 0, 2], output_layout="HWC")
            if nchw:
                x = fn.transpose(x, perm=[2, 0, 1])
                shape = (bands, 1, 1)
            else:  # (no annotations in here: DALI's AutoGraph rewrite of this function rejects them)
                shape = (bands,)  # type: ignore[assignment]
            if store_dtype == torch.float64 and self._compute == torch.float32:
                # float64 - float32 would compute in float64; round x first, as torch's x.float() does
                x = fn.cast(x, dtype=types.FLOAT)
            if self._compute == torch.float32:
                # integer - float32 promotes to float32 in DALI, converting x exactly as a C++ cast
                offset = types.Constant(self._offset.reshape(shape), dtype=types.FLOAT, device=where)
                scale = types.Constant(self._scale.reshape(shape), dtype=types.FLOAT, device=where)
                self._stats = None
            else:
                # DALI constants are float32 at most, so float64 statistics come in as inputs: one
                # (max_batch, B) array each, made here once and fed as a slice per batch (no copy)
                offset = fn.external_source(name="offset", device=where, no_copy=True, ndim=len(shape))
                scale = fn.external_source(name="scale", device=where, no_copy=True, ndim=len(shape))
                stats = [np.ascontiguousarray(np.broadcast_to(v.reshape(shape), (batch, *shape))) for v in
                         (self._offset, self._scale)]
                if gpu:
                    stats = [torch.from_numpy(v).to(f"cuda:{device_id}") for v in stats]  # type: ignore[misc]
                self._stats = stats
            return (x - offset) * scale  # no cast to float16 here: see the module notes (rounding of ties)

        pipe = graph()
        pipe.build()
        self._pipe = pipe

    def _pipeline(self, store_dtype: torch.dtype, device: torch.device, n: int, geometric: bool) -> Any:
        gpu = device.type == "cuda"
        device_id = (device.index if device.index is not None else torch.cuda.current_device()) if gpu else None
        key = (store_dtype, gpu, device_id, geometric)
        if self._pipe is None or self._pipe_key != key or n > self._max_batch:
            self._release_pipe()
            self._max_batch = max(self._max_batch, n)
            self._build(store_dtype, gpu, device_id, self._max_batch, geometric)
            self._pipe_key = key
        return self._pipe

    def _release_pipe(self) -> None:
        pipe, self._pipe, self._pipe_key = self._pipe, None, None
        del pipe  # DALI frees its buffers and threads when the Pipeline object goes

    def _slot_views(self, storage: torch.Tensor) -> list[Any]:
        """One zero-copy DALI tensor per slot, wrapping ``storage[i]``; made once per storage tensor.

        Wrapping up front keeps per-batch work to a list of references: DALI takes its own tensor objects
        as they are, whereas arrays would be inspected and wrapped sample by sample on every feed.
        """
        key = (storage.data_ptr(), tuple(storage.shape), storage.dtype, storage.device)
        if self._views is None or self._views[0] != key:
            tensors = self._dali.tensors
            if storage.device.type == "cpu":
                arr = storage.numpy()  # shares the tensor's memory
                views = [tensors.TensorCPU(arr[i], "HWC") for i in range(arr.shape[0])]
            else:
                index = storage.device.index
                views = [tensors.TensorGPU(storage[i], "HWC", index) for i in range(storage.shape[0])]
            # the storage itself is held too, so the wrapped memory outlives the views (until close())
            self._views = (key, views, storage)
        return self._views[1]

    # -- the batch ------------------------------------------------------------------------------------
    def cut(self, storage: Any, slot: Any, y: Any, x: Any, table: Any = None, dihedral: Any = None) -> Any:
        """Cut, normalize and lay out one batch; see :class:`~hsgds.engines.base.PatchEngine`."""
        spec = self.spec
        check_storage(storage, spec)
        check_dihedral(dihedral, slot)
        # always checked (on the host, where DALI needs the anchors anyway): DALI would otherwise fail
        # inside the pipeline and leave it unusable
        check_coords(storage, slot, y, x, spec.radius, False)  # types and lengths, on any device
        if slot.device.type == "cpu" and y.device.type == "cpu" and x.device.type == "cpu":
            slot_h, y_h, x_h = slot, y, x
        else:  # one device-to-host copy (and sync) for all three
            slot_h, y_h, x_h = torch.stack([t.to(storage.device, torch.int64) for t in (slot, y, x)]).cpu()
        check_coords(storage, slot_h, y_h, x_h, spec.radius, True)
        p, r, bands = spec.patch_size, spec.radius, spec.bands
        n = slot_h.shape[0]
        shape = (n, bands, p, p) if spec.layout == "NCHW" else (n, p, p, bands)
        out = torch.empty(shape, dtype=self._out_dtype, device=storage.device)
        if n == 0:
            return out
        starts = torch.stack((y_h - r, x_h - r), dim=1).to(torch.int32).numpy()
        with self._lock:
            views = self._slot_views(storage)
            tiles = [views[s] for s in slot_h.tolist()]
            pipe = self._pipeline(storage.dtype, storage.device, n, dihedral is not None)
            gpu = storage.device.type == "cuda"
            stream = torch.cuda.current_stream(storage.device) if gpu else None
            try:
                # GPU: DALI waits for the torch stream that wrote the ring before reading it
                pipe.feed_input("tiles", tiles, cuda_stream=stream)  # layout: set on the views
                pipe.feed_input("starts", starts)
                if dihedral is not None:
                    codes = dihedral.to("cpu", torch.int32).numpy()
                    pipe.feed_input("transpose", list((codes >> 2 & 1).astype(np.bool_)))
                    pipe.feed_input("flip_rows", list((codes >> 1 & 1).astype(np.int32)))
                    pipe.feed_input("flip_cols", list((codes & 1).astype(np.int32)))
                if self._stats is not None:
                    pipe.feed_input("offset", self._stats[0][:n], cuda_stream=stream)
                    pipe.feed_input("scale", self._stats[1][:n], cuda_stream=stream)
                (result,) = pipe.run(stream)  # GPU: outputs ready in stream order, no host sync
                self._deliver(result, out, stream)
                del result  # hand the output buffer back to DALI before the next run
            except RuntimeError:
                self._release_pipe()  # DALI invalidates a pipeline after an error: rebuild next time
                raise
        return out

    def _deliver(self, result: Any, out: torch.Tensor, stream: Any) -> None:
        """Copy DALI's output batch into ``out`` (same device), rounding it to a 16-bit dtype if asked."""
        if stream is None and result.is_dense_tensor():
            # CPU: read DALI's buffer in place; the copy into out is also the rounding to out.dtype
            out.copy_(torch.from_numpy(np.asarray(result.as_tensor())).view(out.shape))
            return
        # stage in the compute dtype, then round once in torch (same values as TorchEngine)
        staged = out if out.dtype == self._compute else torch.empty(out.shape, dtype=self._compute, device=out.device)
        ptr = ctypes.c_void_p(staged.data_ptr())
        if stream is not None:
            # device to device, ordered on torch's stream (the raw handle, as DALI's feed_ndarray passes it)
            result.copy_to_external(ptr, stream.cuda_stream, non_blocking=True)
        else:
            result.copy_to_external(ptr)
        if staged is not out:
            out.copy_(staged)

    def close(self) -> None:
        """Release the DALI pipeline and the cached slot views. Idempotent."""
        with self._lock:
            self._release_pipe()
            self._views = None
