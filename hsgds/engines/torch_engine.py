"""The torch patch engine: one gather per batch on the flattened ring storage, then a fused cast/normalize.

No Python runs per sample: the p*p pixel offsets of a patch inside the flattened (slots*S*S, B) storage are
computed once, so a batch is ``index_select(storage.view(-1, B), 0, base[:, None] + offsets)`` followed by
``(x - offset) * scale`` in float32 and a cast to the output dtype.
"""

from __future__ import annotations

import itertools
import math
import os
import sys
import threading
from typing import Any

import numpy as np
import torch

from hsgds import defaults
from hsgds.augment import dihedral_offsets
from hsgds.engines import cpu_cut, triton_cut
from hsgds.engines.base import (
    PatchEngine,
    PatchSpec,
    PendingCut,
    SceneTables,
    check_coords,
    check_dihedral,
    check_storage,
    check_store_dtype,
    is_store_dtype,
)
from hsgds.engines.cut_threads import CutThreads
from hsgds.errors import ConfigError, InputError

__all__ = ["RingCutter", "TorchEngine"]

# index_select/take are not implemented for torch's "barebones" unsigned types (uint16/32/64), but views
# and copy_ (conversion) are: gather through a same-size signed view, convert through the unsigned view.
_SIGNED_VIEW = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}
_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# numba CPU path: ranges of patches per thread and batch at most (small ranges even out threads slowed by
# other jobs on shared cores; each range costs a kernel call of ~10 us)
_RANGES_PER_THREAD = 4


class TorchEngine(PatchEngine):
    """Cut patches with one ``index_select`` per batch and normalize them with a few fused torch ops.

    Parameters
    ----------
    spec : PatchSpec
        Patch size, layout, output dtype and per-band ``offset``/``scale``. ``spec.tile_side`` is the
        padded side S = T + 2*halo of a stored tile; the gather follows the storage's actual side anyway.
    device : torch.device, str or None
        Where the storage lives (None: CPU). Outputs are made on the storage's device.
    max_batch_size : int or None
        Expected batch size. Accepted for every engine so that callers can build any engine the same way
        (the torch engine's CPU buffers are sized per chunk of patches, not per batch).
    check_bounds : bool or None
        Check that every patch lies inside its tile and slot (InputError otherwise). The check needs a
        device-to-host sync on CUDA, so the default (None) checks only coordinates that are on the CPU.

    Notes
    -----
    The arithmetic is ``(x.float() - offset) * scale`` in float32 (float64 when ``out_dtype`` is float64),
    then one rounding to ``out_dtype``; this is bit-for-bit what the DALI engine computes. On the CPU the
    fused compiled kernel of :mod:`hsgds.engines.cpu_cut` cuts each batch in one pass over the output
    when numba imports (setting ``numba``); ``reasons`` says which CPU path runs and why. Otherwise a
    batch is cut in cache-sized chunks of patches (gather, cast, normalize, then one transposing copy for
    NCHW), the chunk buffers are kept between batches, and output tensors come from a small pool that
    reuses a buffer only once no reference to it is left (fresh large allocations cost page faults);
    this makes one engine instance unsafe to share between threads without the internal lock, which
    serializes ``cut`` calls. On CUDA the caching allocator makes fresh temporaries cheap and stream-safe.
    """

    name = "torch"

    def __init__(
        self,
        spec: PatchSpec,
        device: Any = None,
        *,
        max_batch_size: int | None = None,
        check_bounds: bool | None = None,
    ) -> None:
        if max_batch_size is not None and (not isinstance(max_batch_size, (int, np.integer)) or max_batch_size < 1):
            raise ConfigError(f"max_batch_size must be a positive integer or None, got {max_batch_size!r}")
        super().__init__(spec, device)
        self._device = torch.device("cpu") if device is None else torch.device(device)
        self._out_dtype = out_dtype = spec.out_dtype
        # float32 arithmetic unless the caller asks for float64 output (then float32 would lose precision)
        self._compute = torch.float64 if out_dtype == torch.float64 else torch.float32
        self._offset_np = spec.offset
        self._scale_np = spec.scale
        # per device: (offset, scale); per ("tables", device): the per-scene tables as tensors
        self._consts: dict[Any, Any] = {}
        self._consts_for(self._device)
        self._check_bounds = check_bounds
        self._offsets: dict[tuple[Any, ...], torch.Tensor] = {}
        self._offsets_for(spec.tile_side, self._device)  # the usual side, computed once up front
        self._bufs: dict[tuple[Any, torch.dtype], torch.Tensor] = {}
        self._lock = threading.Lock()
        # CPU: output buffers handed out again once nobody holds them (see _output)
        self._outs: list[_PooledOutput] = []
        self._pool: CutThreads | None = None
        # CPU path tunables (docs/settings.md), read once per engine: output buffers kept for reuse (the
        # batch the caller holds, the one autograd may hold, ...), and at most this many cutting threads
        self._pool_max = int(defaults.get("torch_out_pool"))
        self._max_threads = int(defaults.get("torch_threads"))
        pixel = spec.patch_size**2 * spec.bands
        # CPU: patches per chunk, so that a chunk's gather and float work stay in the core's cache (setting
        # torch_chunk_bytes: bytes of float work per chunk; a core's L2 holds it with the gather and the cast)
        chunk_bytes = int(defaults.get("torch_chunk_bytes"))
        self._chunk = max(1, chunk_bytes // (pixel * (8 if self._compute == torch.float64 else 4)))
        # CPU: which path cuts (the fused kernel, or torch ops), and why
        self._numba = False
        if self._device.type == "cpu":
            if not defaults.get("numba"):
                self.reasons.append("CPU cut: torch ops (setting numba is off)")
            elif not cpu_cut.available():
                self.reasons.append(f"CPU cut: torch ops, because {cpu_cut.unavailable_reason()}")
            else:
                self._numba = True
                self.reasons.append("CPU cut: fused numba kernel (hsgds.engines.cpu_cut)")
            self._mode = cpu_cut.MODES[str(out_dtype).removeprefix("torch.")]
        self.fuses_noise = self._numba  # cut(noise=...): radiation noise and band dropout in the kernel
        self.cuts_ahead = self._numba  # start_cut() leaves the ranges of patches to the engine's threads

    # -- cached per-device constants ------------------------------------------------------------------
    def _consts_for(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        consts = self._consts.get(device)
        if consts is None:
            # round the float64 statistics once to the compute dtype, exactly as the DALI engine does
            off = torch.as_tensor(self._offset_np, dtype=self._compute).to(device)
            scl = torch.as_tensor(self._scale_np, dtype=self._compute).to(device)
            consts = self._consts[device] = (off, scl)
        return consts

    def _offsets_for(self, side: int, device: torch.device) -> torch.Tensor:
        """Flat pixel offsets dy*S + dx (int64, (p*p,)) of a patch relative to its top-left pixel."""
        key = (int(side), device)
        offsets = self._offsets.get(key)
        if offsets is None:
            d = torch.arange(self.spec.patch_size, dtype=torch.int64)
            offsets = self._offsets[key] = (d[:, None] * side + d[None, :]).reshape(-1).to(device)
        return offsets

    def _patch_offsets(self, side: int, device: torch.device, dihedral: torch.Tensor | None,
                       lo: int = 0, hi: int | None = None) -> torch.Tensor:
        """Pixel offsets of patches lo..hi: (p*p,) shared by all, or (k, p*p) per patch under its dihedral
        code (flips and quarter turns are a different read order, not an extra pass; hsgds.augment)."""
        if dihedral is None:
            return self._offsets_for(side, device)
        key = ("dihedral", int(side), device)
        table = self._offsets.get(key)
        if table is None:
            ab = self._dihedral_ab(device)
            table = self._offsets[key] = (ab[..., 0] * side + ab[..., 1]).reshape(8, -1)
        return table[dihedral[lo:hi].long()]

    def _dihedral_ab(self, device: torch.device) -> torch.Tensor:
        """(8, p, p, 2) source offsets (a, b) of output pixel (i, j) under each dihedral code."""
        key = ("dihedral-ab", device)
        ab = self._offsets.get(key)
        if ab is None:
            ab = self._offsets[key] = torch.from_numpy(dihedral_offsets(self.spec.patch_size)).to(device)
        return ab

    def _buffer(self, kind: Any, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """A reusable CPU buffer of at least ``numel`` elements (grown, never shrunk, until close())."""
        buf = self._bufs.get((kind, dtype))
        if buf is None or buf.numel() < numel:
            buf = self._bufs[(kind, dtype)] = _kept_empty(numel, dtype)
        return buf[:numel]

    # -- the batch ------------------------------------------------------------------------------------
    def cut(self, storage: Any, slot: Any, y: Any, x: Any, table: Any = None, dihedral: Any = None,
            noise: cpu_cut.Noise | None = None, normalized: bool = False) -> Any:
        """Cut, normalize and lay out one batch; see :class:`~hsgds.engines.base.PatchEngine`. ``noise``
        (only where :attr:`fuses_noise`): the batch's radiation noise and band dropout, applied in the cut.
        ``normalized``: every tile cut from went through :meth:`normalize_tile`, so the patches are copied."""
        return self._start(storage, slot, y, x, table, dihedral, noise, normalized, ahead=False)

    def start_cut(self, storage: Any, slot: Any, y: Any, x: Any, table: Any = None, dihedral: Any = None,
                  noise: cpu_cut.Noise | None = None, normalized: bool = False) -> PendingCut:
        """:meth:`cut`, started on the engine's threads. With the fused CPU kernel the checks and the patch
        starts are done here and the ranges of patches are left to the threads, so the caller can prepare
        the next batch meanwhile; the threads go from one batch's ranges to the next without a pause.
        Other paths cut before returning (CUDA kernels are asynchronous already)."""
        got = self._start(storage, slot, y, x, table, dihedral, noise, normalized, ahead=True)
        return got if isinstance(got, PendingCut) else PendingCut(got)

    def ring_cutter(self, storage: Any, normalized: bool = False) -> RingCutter | None:
        """The loader's per-batch path to :meth:`start_cut` with the fused CPU kernel (None on other paths):
        ``storage`` is checked once here instead of at every batch; see :class:`RingCutter`."""
        if not (self._numba and isinstance(storage, torch.Tensor) and storage.device.type == "cpu"):
            return None
        return RingCutter(self, storage, normalized)

    def _start(self, storage: Any, slot: Any, y: Any, x: Any, table: Any, dihedral: Any,
               noise: cpu_cut.Noise | None, normalized: bool, ahead: bool) -> Any:
        """The patches (``ahead``: or a PendingCut whose ranges the engine's threads cut)."""
        spec = self.spec
        check_dihedral(dihedral, slot)
        if noise is not None:
            self._check_noise(noise, storage, slot)
        if normalized:
            if not (isinstance(storage, torch.Tensor) and storage.device.type == "cpu"
                    and self.normalizes_tiles(storage.dtype)):
                raise InputError("normalized=True needs tiles that normalize_tile rewrote; see normalizes_tiles()")
            if noise is not None and len(noise.alpha):
                raise InputError("radiation noise needs the tiles' values before rounding: cut tiles that were "
                                 "not normalized (normalized=False)")
        if spec.tables is not None:
            return self._cut_tables(storage, slot, y, x, table, dihedral, noise, normalized, ahead)
        check_storage(storage, spec)
        fused = self._numba and storage.device.type == "cpu"  # the kernel's patch_starts checks the bounds
        check_coords(storage, slot, y, x, spec.radius, False if fused else self._check_bounds)
        if storage.device.type == "cpu":
            with self._lock:
                return self._cut(storage, slot, y, x, dihedral, noise, normalized, ahead)
        return self._cut(storage, slot, y, x, dihedral)

    def _check_noise(self, noise: cpu_cut.Noise, storage: Any, slot: Any) -> None:
        """InputError unless this path can apply ``noise`` and its arrays fit the batch."""
        if not (self._numba and isinstance(storage, torch.Tensor) and storage.device.type == "cpu"):
            raise InputError("noise= is applied inside the cut only by the fused CPU kernel (fuses_noise); "
                             "apply it after the cut (hsgds.augment) on this path")
        n, patch = len(slot), self.spec.patch_size ** 2 * self.spec.bands
        if len(noise.alpha) not in (0, n) or len(noise.start) != len(noise.alpha) or len(noise.drop_ptr) not in (0, n + 1):
            raise InputError(f"noise arrays must have one entry per sample ({n}), or none")
        if len(noise.alpha) and (noise.start.max() + patch > len(noise.bank)):
            raise InputError(f"a noise window runs past the bank's {len(noise.bank)} values")
        if len(noise.drop_band) and not (noise.drop_band.min() >= 0 and noise.drop_band.max() < self.spec.bands):
            raise InputError(f"dropped bands must be in 0..{self.spec.bands - 1}")

    def _cut(self, storage: torch.Tensor, slot: torch.Tensor, y: torch.Tensor, x: torch.Tensor,
             dihedral: torch.Tensor | None = None, noise: cpu_cut.Noise | None = None,
             normalized: bool = False, ahead: bool = False) -> Any:
        spec = self.spec
        p, r, bands = spec.patch_size, spec.radius, spec.bands
        n, side, device = slot.shape[0], storage.shape[1], storage.device
        cpu = device.type == "cpu"
        nchw = spec.layout == "NCHW"
        shape = (n, bands, p, p) if nchw else (n, p, p, bands)
        if n == 0:
            return torch.empty(shape, dtype=self._out_dtype, device=device)
        slot, y, x = (_as(t, device, torch.int64) for t in (slot, y, x))
        if dihedral is not None:
            dihedral = _as(dihedral, device, torch.int8)
        if cpu:
            if self._numba:  # the index arithmetic and the bounds in one compiled pass
                k = self._values_per_store_value(storage, normalized)
                kt = self._kernel_tables(side, k)
                starts, bad = cpu_cut.patch_starts(slot.numpy(), y.numpy(), x.numpy(), None, kt, storage.shape[0],
                                                   side * side * bands * k, r, self._check_bounds is not False)
                if bad >= 0:
                    check_coords(storage, slot, y, x, r, True)  # raises, naming the first sample outside
                    raise InputError(f"sample {bad} lies outside the ring storage")
                codes = None if dihedral is None else dihedral.numpy()
                return self._cut_numba(storage.view(-1).numpy(), starts, None, codes, kt, shape, noise, normalized, ahead)
            return self._cut_cpu(storage, slot, y, x, shape, dihedral)
        out = torch.empty(shape, dtype=self._out_dtype, device=device)
        if self._fused_kernel(storage.dtype):  # one pass on the GPU
            offset, scale = self._consts_for(device)
            return triton_cut.cut(storage, slot, y, x, offset, scale, out, p, nchw, dihedral)

        # one gather of n*p*p pixel rows (B values each) in the store's own dtype: 2 bytes for int16
        base = (slot * side + (y - r)) * side + (x - r)
        idx = (base[:, None] + self._patch_offsets(side, device, dihedral)).view(-1)
        src_dtype = storage.dtype
        flat = storage.view(-1, bands)
        if src_dtype in _SIGNED_VIEW:
            flat = flat.view(_SIGNED_VIEW[src_dtype])
        g = torch.index_select(flat, 0, idx)
        g = g.view(src_dtype).view(n, p, p, bands)  # back to the real (unsigned) dtype: a free view

        offset, scale = self._consts_for(device)
        if nchw:
            g = g.permute(0, 3, 1, 2)  # the cast below writes the contiguous NCHW result directly
            offset, scale = offset.view(bands, 1, 1), scale.view(bands, 1, 1)

        direct = self._out_dtype == self._compute
        work = out if direct else torch.empty(shape, dtype=self._compute, device=device)
        # CUDA kernels cast inputs on the fly, so sub() reads the native dtype and writes float32 in one
        # pass. Unsigned and float64 inputs take copy_: sub() lacks unsigned kernels, and it would
        # compute in float64 instead of rounding x to float32 first.
        fused = src_dtype not in _SIGNED_VIEW and not (
            src_dtype == torch.float64 and self._compute != torch.float64
        )
        if fused:
            torch.sub(g, offset, out=work)
        else:
            work.copy_(g)
            work.sub_(offset)
        if direct:
            work.mul_(scale)
        else:
            torch.mul(work, scale, out=out)  # computed in float32, rounded once to out_dtype
        return out

    def _output(self, shape: tuple[int, ...]) -> torch.Tensor:
        """A CPU output tensor of ``shape``: a pooled buffer that nobody else references any more, else a
        fresh one. A fresh large allocation is mmapped and page-faulted in on every batch, which costs
        more than the whole cut; a pooled buffer is reused only when nothing handed out earlier still
        references it (:class:`_PooledOutput`), so no caller ever sees a batch it holds change."""
        numel = math.prod(shape)
        for i, pooled in enumerate(self._outs):
            if pooled.shared():  # another process may map it, unseen here: never write it again
                del self._outs[i]
                return self._output(shape)
            if pooled.idle():
                if pooled.tensor.numel() < numel:  # a bigger batch: replace the idle buffer
                    pooled = self._outs[i] = _PooledOutput(_kept_empty(numel, self._out_dtype))
                buf = pooled.tensor
                return (buf if buf.numel() == numel else buf[:numel]).view(shape)
        buf = _kept_empty(numel, self._out_dtype)
        if _USE_COUNT is not None and len(self._outs) < self._pool_max:
            self._outs.append(_PooledOutput(buf))
        return buf.view(shape)

    def _workers(self, jobs: int) -> int:
        """Threads for ``jobs`` independent pieces of a CPU batch (at most ``torch.get_num_threads()`` and
        the setting ``torch_threads``); (re)starts the engine's pool when it needs more."""
        workers = max(1, min(jobs, torch.get_num_threads(), self._max_threads))
        if workers > 1:
            self._one_pool().grow(workers)
        return workers

    def _one_pool(self) -> CutThreads:
        """The engine's pool of cutting threads (:meth:`_workers` sizes it), started with one thread if
        it has not been started (it is only for more than one)."""
        if self._pool is None:
            self._pool = CutThreads(1, "hsgds-cut", _single_threaded_kernels)
        return self._pool

    def _kernel_tables(self, side: int | None = None, k: int = 1) -> cpu_cut.Tables:
        """The fused kernel's per-table constants: the spec's SceneTables, or (``side``) one table for a
        single scene whose tiles are ``side`` pixels wide; made once per engine (and side). ``k``: strides
        in units of 1/k of a store value (normalized tiles, read as 16-bit values: k = store bytes / 2)."""
        if k != 1:
            scaled = ("kernel-tables", side, k)
            if scaled not in self._consts:  # shares the arrays that set_table_rows updates
                kt = self._kernel_tables(side)
                self._consts[scaled] = kt._replace(stride=kt.stride * k)
            return self._consts[scaled]
        key = ("kernel-tables", side)
        got = self._consts.get(key)
        if got is None:
            spec, dt = self.spec, (np.float64 if self._compute == torch.float64 else np.float32)
            if side is None:
                tb = self._scene_tables()
                got = cpu_cut.make_tables(tb.side, tb.stride, tb.band, tb.offset, tb.scale, dt)
            else:
                got = cpu_cut.make_tables(side, spec.bands, np.arange(spec.bands), spec.offset, spec.scale, dt)
            self._consts[key] = got
        return got

    def _cut_numba(self, src: np.ndarray, base: np.ndarray, table: np.ndarray | None,
                   codes: np.ndarray | None, tables: cpu_cut.Tables, shape: tuple[int, ...],
                   noise: cpu_cut.Noise | None = None, normalized: bool = False, ahead: bool = False) -> Any:
        """The CPU path with the fused kernel: ranges of patches cut straight into the output by the
        calling thread and the engine's threads (the kernel releases the GIL). A range per
        ~``torch_chunk_bytes`` of work, so a small batch stays on the calling thread and threads share a
        big one dynamically: each takes the next range left. ``base``:
        each patch's first element in ``src`` (the flat storage); ``table``: each patch's table or None;
        ``codes``: each patch's int8 dihedral code (hsgds.augment) or None.
        ``normalized``: the tiles hold the output's values (normalize_tile); ``base`` and ``tables`` count
        16-bit values, and the patches are copied (cpu_cut.copy_range). ``ahead``: the engine's threads
        alone cut, one range each, and a PendingCut is returned at once."""
        n = base.shape[0]
        out = self._output(shape)
        flat = out.view(-1)
        dst = flat.view(torch.int16).numpy().view(np.uint16) if self._mode else flat.numpy()
        args = (src, base, table, codes, tables, dst, self.spec.patch_size, self.spec.layout == "NCHW", self._mode)
        stream = cpu_cut.should_stream(flat.numel() * flat.element_size(), self.spec.layout == "NCHW")
        phase = flat.data_ptr() // dst.itemsize % (32 // dst.itemsize)  # out[0]'s place in its 32-byte block
        cut_range = cpu_cut.copy_range if normalized else cpu_cut.cut_range
        parts = -(-n // self._chunk)
        workers = self._workers(parts)
        if ahead:
            # one range per thread, each a job of its own: a thread done early goes on to the next batch's
            # ranges, so the threads even out across batches, and each makes one kernel call per batch (each
            # call takes the GIL twice, which the preparing threads hold for tens of µs at a time)
            edges = [n * k // workers for k in range(workers + 1)]
            return PendingCut(out, [self._one_pool().start([(cut_range, (*args, lo, hi, stream, noise, phase))
                                                            for lo, hi in zip(edges[:-1], edges[1:]) if hi > lo])])
        if workers == 1:
            cut_range(*args, 0, n, stream, noise, phase)
            return out
        parts = min(parts, workers * _RANGES_PER_THREAD)
        edges = [n * k // parts for k in range(parts + 1)]
        ranges = [(lo, hi) for lo, hi in zip(edges[:-1], edges[1:]) if hi > lo]
        taken = itertools.count()
        lock = threading.Lock()

        def drain() -> None:  # take the next range until none is left
            while True:
                with lock:
                    i = next(taken)
                if i >= len(ranges):
                    return
                cut_range(*args, *ranges[i], stream, noise, phase)

        assert self._pool is not None  # _workers() made it for more than one worker
        # the calling thread cuts too (it would only wait): one hand-off per helper, not per range
        helpers = self._pool.start([(drain, ())] * (workers - 1))
        try:
            drain()
        finally:
            helpers.result()
        return out

    def _cut_cpu(self, storage: torch.Tensor, slot: torch.Tensor, y: torch.Tensor, x: torch.Tensor,
                 shape: tuple[int, ...], dihedral: torch.Tensor | None = None) -> torch.Tensor:
        """The CPU path. The batch is cut in chunks of patches small enough to stay in a core's cache:
        gather (store dtype), cast to float32, subtract, multiply (pixel-interleaved, so the per-band
        constants broadcast along the contiguous axis), round to the output dtype, and for NCHW one
        transposing copy into the output; only that last write leaves the cache, so a batch costs about
        one pass over its output bytes. Chunks are shared out to ``torch.get_num_threads()`` threads of
        the engine's own, each running torch's kernels single-threaded (OpenMP teams per small step
        would meet at a barrier after every step, which stalls badly when the cores are shared)."""
        spec = self.spec
        r, bands = spec.radius, spec.bands
        n, side = slot.shape[0], storage.shape[1]
        out = self._output(shape)
        base = (slot * side + (y - r)) * side + (x - r)  # top-left pixel of each patch
        offsets = self._offsets_for(side, storage.device) if dihedral is None else (side, dihedral)
        flat = storage.view(-1, bands)
        if flat.dtype in _SIGNED_VIEW:
            flat = flat.view(_SIGNED_VIEW[flat.dtype])
        chunks = [(i, min(self._chunk, n - i)) for i in range(0, n, self._chunk)]
        workers = self._workers(len(chunks))
        if workers == 1:
            self._cut_chunks(chunks, flat, storage.dtype, base, offsets, out)
            return out
        assert self._pool is not None  # _workers() made it for more than one worker
        futures = [self._pool.submit(self._cut_chunks, chunks[w::workers], flat, storage.dtype, base, offsets, out)
                   for w in range(workers)]
        for f in futures:
            f.result()
        return out

    def _cut_chunks(self, chunks: list[tuple[int, int]], flat: torch.Tensor, src_dtype: torch.dtype,
                    base: torch.Tensor, offsets: Any, out: torch.Tensor) -> None:
        """Cut ``chunks`` ((first patch, count) pairs) into ``out`` with this thread's own buffers.
        ``offsets``: the shared (p*p,) pixel offsets, or (side, dihedral codes) for per-patch ones."""
        spec = self.spec
        bands, pp = spec.bands, spec.patch_size**2
        nchw, direct = spec.layout == "NCHW", self._out_dtype == self._compute
        numel = max(k for _, k in chunks) * pp * bands
        me = threading.get_ident()
        ibuf = self._buffer(("index", me), torch.int64, numel // bands)
        gbuf = self._buffer(("gather", me), flat.dtype, numel)
        wbuf = self._buffer(("work", me), self._compute, numel)
        obuf = self._buffer(("cast", me), self._out_dtype, numel) if nchw and not direct else None
        offset, scale = self._consts_for(torch.device("cpu"))
        for i, k in chunks:
            rows = k * pp
            g = gbuf[:rows * bands].view(rows, bands)
            idx = ibuf[:rows]
            own = offsets if isinstance(offsets, torch.Tensor) else self._patch_offsets(
                offsets[0], flat.device, offsets[1], i, i + k)
            torch.add(base[i:i + k, None], own, out=idx.view(k, pp))  # every pixel of the chunk's patches
            torch.index_select(flat, 0, idx, out=g)
            dst = out[i:i + k].view(rows, bands)
            # NHWC float32 out: normalize in place in the output; otherwise in the cached work buffer
            w = dst if direct and not nchw else wbuf[:rows * bands].view(rows, bands)
            w.copy_(g.view(src_dtype))  # the cast, through the real (unsigned) dtype
            w.sub_(offset)
            w.mul_(scale)
            if not direct:  # one rounding to the 16-bit output dtype
                w = (obuf[:rows * bands].view(rows, bands) if obuf is not None else dst).copy_(w)  # NCHW: obuf
            if nchw:
                _transpose_into(out[i:i + k].view(k, bands, pp), w.view(k, pp, bands))

    # -- several scenes (per-scene tables) -----------------------------------------------------------
    def set_table_rows(self, tables: Any, offset: Any, scale: Any) -> None:
        """Rows ``tables`` of the spec's offset / scale, and of every copy made of them (the fused kernel's,
        each device's). On CUDA the rows are written on the current stream: cuts enqueued before read the
        old rows (of other tables; a table is filled before its first use), later ones the new."""
        tb = self._scene_tables()
        ids = np.asarray(tables, dtype=np.int64)
        offset, scale = np.asarray(offset, np.float64), np.asarray(scale, np.float64)
        tb.offset[ids], tb.scale[ids] = offset, scale
        for key, got in self._consts.items():
            if key == ("kernel-tables", None):
                got.offset[ids], got.scale[ids] = offset.astype(got.offset.dtype), scale.astype(got.scale.dtype)
            elif isinstance(key, tuple) and key[0] == "tables":
                index = torch.from_numpy(ids).to(key[1])
                off = torch.as_tensor(offset, dtype=self._compute).to(key[1])
                scl = torch.as_tensor(scale, dtype=self._compute).to(key[1])
                got["offset"][index], got["scale"][index] = off, scl
                got["norm"][index] = torch.cat([off, scl], dim=1)

    def _scene_tables(self) -> SceneTables:
        """The spec's per-scene tables (the per-scene-table cut runs only for a spec that has them)."""
        tables = self.spec.tables
        assert tables is not None
        return tables

    def _tables_for(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The spec's SceneTables as tensors on ``device`` (offset/scale rounded to the compute dtype once)."""
        key = ("tables", device)
        got = self._consts.get(key)
        if got is None:
            tb = self._scene_tables()
            # never inference tensors: set_table_rows writes a scene's rows in place when a batch first reaches
            # it, maybe outside the torch.inference_mode() the first batch was cut in
            with torch.inference_mode(False):
                got = self._consts[key] = {
                    "side": torch.as_tensor(np.asarray(tb.side, np.int64)).to(device),
                    "stride": torch.as_tensor(np.asarray(tb.stride, np.int64)).to(device),
                    "band": torch.as_tensor(np.asarray(tb.band, np.int64)).to(device),
                    "offset": torch.as_tensor(np.asarray(tb.offset, np.float64), dtype=self._compute).to(device),
                    "scale": torch.as_tensor(np.asarray(tb.scale, np.float64), dtype=self._compute).to(device),
                }
                got["norm"] = torch.cat([got["offset"], got["scale"]], dim=1).contiguous()  # one gather per chunk
        return got

    def _cut_tables(self, storage: Any, slot: Any, y: Any, x: Any, table: Any,
                    dihedral: torch.Tensor | None = None, noise: cpu_cut.Noise | None = None,
                    normalized: bool = False, ahead: bool = False) -> Any:
        """Cut from tiles of several scenes: per sample, its table's tile geometry, band selection and
        normalization. Still one gather per chunk of patches (per batch on CUDA) and one fused
        normalization: the per-sample tables only change the index arithmetic and the constants."""
        spec, tb = self.spec, self._scene_tables()
        if not isinstance(storage, torch.Tensor) or storage.ndim < 2 or not storage.is_contiguous():
            raise InputError("storage must be a contiguous (slots, ...) torch.Tensor")
        check_store_dtype(storage.dtype)
        if table is None:
            raise InputError("this engine cuts from several scenes: pass table= (each sample's scene table)")
        for name, t in (("slot", slot), ("y", y), ("x", x), ("table", table)):
            if not isinstance(t, torch.Tensor) or t.ndim != 1 or t.dtype.is_floating_point or t.dtype == torch.bool:
                raise InputError(f"{name} must be a 1-D integer torch.Tensor")
        if not slot.shape == y.shape == x.shape == table.shape:
            raise InputError("slot, y, x, table must have the same length")
        p, r, bands = spec.patch_size, spec.radius, spec.bands
        n, device = slot.shape[0], storage.device
        nchw = spec.layout == "NCHW"
        shape = (n, bands, p, p) if nchw else (n, p, p, bands)
        if n == 0:
            return torch.empty(shape, dtype=self._out_dtype, device=device)
        slot, y, x, table = (_as(t, device, torch.int64) for t in (slot, y, x, table))
        if dihedral is not None:
            dihedral = _as(dihedral, device, torch.int8)
        bounds = self._check_bounds if self._check_bounds is not None else device.type == "cpu"
        slot_elems = storage[0].numel()
        if device.type == "cpu" and self._numba:  # the index arithmetic and the bounds in one compiled pass
            k = self._values_per_store_value(storage, normalized)
            kt = self._kernel_tables(None, k)
            s, yy, xx, t = (v.numpy() for v in (slot, y, x, table))
            if bounds:
                self._check_slot_size(slot_elems)
            starts, bad = cpu_cut.patch_starts(s, yy, xx, t, kt, storage.shape[0], slot_elems * k, r, bounds)
            if bad >= 0:
                self._check_table_coords(storage, s, yy, xx, t)  # raises, naming the first sample outside
                raise InputError(f"sample {bad} lies outside the ring storage")
            codes = None if dihedral is None else dihedral.numpy()
            with self._lock:
                return self._cut_numba(storage.view(-1).numpy(), starts, t, codes, kt, shape, noise, normalized, ahead)
        if bounds:
            self._check_table_coords(storage, *(t.cpu().numpy() for t in (slot, y, x, table)))
        tab = self._tables_for(device)
        side, stride = tab["side"][table], tab["stride"][table]
        # first element of each patch's top-left pixel in the flattened ring
        base = slot * slot_elems + ((y - r) * side + (x - r)) * stride
        flat = storage.view(-1)
        if flat.dtype in _SIGNED_VIEW:
            flat = flat.view(_SIGNED_VIEW[flat.dtype])
        d = torch.arange(p, dtype=torch.int64, device=device)
        uniform = tb.uniform
        if uniform:  # one geometry, every band in order: gather whole pixel rows
            rows_base = base // bands
            pix = None
        else:  # element gather: pixel offsets and band offsets per sample
            rows_base = None
            if dihedral is None:
                pix = ((d[None, :, None] * side[:, None, None] + d[None, None, :])
                       * stride[:, None, None]).view(n, p * p)
            else:  # each patch's own read order (hsgds.augment): source (a, b) of output (i, j)
                ab = self._dihedral_ab(device)[dihedral.long()]  # (n, p, p, 2)
                pix = ((ab[..., 0] * side[:, None, None] + ab[..., 1]) * stride[:, None, None]).view(n, p * p)
        # per-sample constants are gathered chunk by chunk in the cutting threads: a whole-batch (n, B)
        # gather here would start an OpenMP team whose spinning competes with those threads
        consts = (table, tab)
        if device.type != "cpu":
            out = torch.empty(shape, dtype=self._out_dtype, device=device)
            self._cut_table_chunk(flat, storage.dtype, 0, n, base, rows_base, pix, consts, out, dihedral)
            return out
        with self._lock:
            out = self._output(shape)
            chunks = [(i, min(self._chunk, n - i)) for i in range(0, n, self._chunk)]
            workers = self._workers(len(chunks))

            def run(part: list[tuple[int, int]]) -> None:
                for i, k in part:
                    self._cut_table_chunk(flat, storage.dtype, i, k, base, rows_base, pix, consts, out, dihedral)

            # even one chunk is cut in a pool thread: its kernels run single-threaded there, while in the
            # caller's thread a small op would wait at an OpenMP barrier for a team member that the
            # reader threads keep off the cores (tens of ms per op on a busy machine)
            pool = self._one_pool()
            for f in [pool.submit(run, chunks[w::workers]) for w in range(workers)]:
                f.result()
            return out

    def _cut_table_chunk(self, flat: torch.Tensor, src_dtype: torch.dtype, i: int, k: int, base: torch.Tensor,
                         rows_base: torch.Tensor | None, pix: torch.Tensor | None, consts: tuple[torch.Tensor, dict],
                         out: torch.Tensor, dihedral: torch.Tensor | None = None) -> None:
        """Patches i..i+k: gather (store dtype), cast, per-sample normalize, lay out into ``out``. On the CPU
        the chunk's buffers are this thread's own and reused, as in the single-table path."""
        spec = self.spec
        bands, pp = spec.bands, spec.patch_size**2
        rows = k * pp
        cpu = flat.device.type == "cpu"
        me = threading.get_ident()
        table, tab = consts
        t = table[i:i + k]

        def buf(kind: str, dtype: torch.dtype, numel: int) -> torch.Tensor:
            if cpu:
                return self._buffer((kind, me), dtype, numel)
            return torch.empty(numel, dtype=dtype, device=flat.device)

        if rows_base is not None:  # whole pixel rows
            idx = buf("t-index", torch.int64, rows)
            torch.add(rows_base[i:i + k, None],
                      self._patch_offsets(int(self._scene_tables().side[0]), flat.device, dihedral, i, i + k),
                      out=idx.view(k, pp))
            g = buf("t-gather", flat.dtype, rows * bands).view(rows, bands)
            torch.index_select(flat.view(-1, bands), 0, idx, out=g)
        else:  # single values: per-sample pixel offsets plus per-scene band offsets
            assert pix is not None  # the element gather always has its pixel offsets
            idx = buf("t-index", torch.int64, rows * bands).view(k, pp, bands)
            torch.add(pix[i:i + k, :, None], tab["band"].index_select(0, t)[:, None, :], out=idx)
            idx.add_(base[i:i + k, None, None])
            g = buf("t-gather", flat.dtype, rows * bands)
            torch.take(flat, idx.view(-1), out=g)
        dst = out[i:i + k]
        nchw, direct = spec.layout == "NCHW", self._out_dtype == self._compute
        # NHWC in the compute dtype: normalize in place in the output; otherwise in a work buffer
        if direct and not nchw:
            w = dst.view(k, pp, bands)
        else:
            w = buf("t-work", self._compute, rows * bands).view(k, pp, bands)
        norm = tab["norm"].index_select(0, t)  # (k, 2B): this chunk's offsets, then scales
        # cast, then subtract (a mixed-dtype sub() would be one pass but is ~2x slower on the CPU)
        w.copy_(g.view(src_dtype).view(k, pp, bands))  # the cast, through the real (unsigned) dtype
        w.sub_(norm[:, None, :bands])
        w.mul_(norm[:, None, bands:])
        if not nchw:
            if not direct:
                dst.view(k, pp, bands).copy_(w)  # one rounding to the output dtype
        elif not cpu:
            dst.view(k, bands, pp).copy_(w.transpose(1, 2))  # one rounding to the output dtype
        else:
            if self._out_dtype != self._compute:
                w = buf("t-cast", self._out_dtype, rows * bands).view(k, pp, bands).copy_(w)
            _transpose_into(dst.view(k, bands, pp), w)

    def _check_table_coords(self, storage: torch.Tensor, slot: np.ndarray, y: np.ndarray, x: np.ndarray,
                            table: np.ndarray) -> None:
        """InputError unless every sample's table and slot exist and its patch lies inside its table's tile
        (host arrays: numpy's small-array ops cost a fraction of torch's)."""
        tb, r, slots = self._scene_tables(), self.spec.radius, storage.shape[0]
        ntab = len(tb)
        bad = (table < 0) | (table >= ntab) | (slot < 0) | (slot >= slots)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(f"sample {i} has table {int(table[i])} / slot {int(slot[i])}: tables are 0..{ntab - 1}, "
                             f"slots 0..{slots - 1}")
        side = np.asarray(tb.side, np.int64)[table]
        bad = (y < r) | (x < r) | (y > side - r - 1) | (x > side - r - 1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(f"sample {i} (slot {int(slot[i])}, y {int(y[i])}, x {int(x[i])}) is outside its "
                             f"{int(side[i])}-px tile for a {2 * r + 1}-px patch")
        self._check_slot_size(storage[0].numel())

    def _check_slot_size(self, slot_elems: int) -> None:
        """InputError unless a ring slot of ``slot_elems`` values holds every table's tile (once per size)."""
        key = ("slot-holds-tiles", slot_elems)
        if key not in self._consts:
            tb = self._scene_tables()
            need = int((np.asarray(tb.side, np.int64) ** 2 * np.asarray(tb.stride, np.int64)).max())
            if need > slot_elems:
                raise InputError(f"ring slots hold {slot_elems} values, a table's tile needs {need}")
            self._consts[key] = True

    # -- tiles normalized once, as they land in the ring -----------------------------------------------
    def normalizes_tiles(self, store_dtype: Any) -> bool:
        """Whether :meth:`normalize_tile` can rewrite tiles of ``store_dtype`` in place: the fused CPU kernel,
        a 16-bit output (bfloat16, float16: where its rounding, not the memory traffic, bounds the cut) and
        a store of at least 2 bytes per value, so that each value's output fits in its own bytes, and each
        pixel's output bands fit in its stored ones' bytes (not so where a band is taken twice)."""
        tables = self.spec.tables
        stored = self.spec.bands if tables is None else int(np.min(tables.stride))
        return (self._numba and is_store_dtype(store_dtype)
                and cpu_cut.normalizes_tiles(str(store_dtype).removeprefix("torch."), str(self._out_dtype).removeprefix("torch."),
                                             self.spec.bands, stored))

    def normalize_tile(self, storage: Any, slot: int, table: int = 0, offset: Any = None, scale: Any = None) -> None:
        """Rewrite the tile in ring slot ``slot`` (of table ``table``: its scene's geometry, band selection
        and normalization) in place as the output's values: each pixel's output bands cast, normalized and
        rounded exactly as the cut computes them, as 16-bit values at the start of the pixel's bytes. Then
        ``cut(..., normalized=True)`` copies patches from it: each value is computed once per tile load
        instead of once for every patch that reads it (up to p*p times). ``offset`` / ``scale`` (B,): the
        table's normalization when :meth:`set_table_rows` has not given it yet. Safe to call from a reader
        thread while other slots are cut (the kernel releases the GIL)."""
        if not (isinstance(storage, torch.Tensor) and storage.device.type == "cpu" and storage.is_contiguous()
                and self.normalizes_tiles(storage.dtype)):
            raise InputError("normalize_tile needs the fused CPU kernel, a bfloat16 or float16 output and a "
                             "contiguous CPU ring of a store dtype of at least 2 bytes; see normalizes_tiles()")
        tables = self.spec.tables
        if not 0 <= slot < storage.shape[0] or not 0 <= table < (1 if tables is None else len(tables)):
            raise InputError(f"slot {slot} / table {table} do not exist")
        k = self._values_per_store_value(storage, True)
        kt = self._kernel_tables(None if tables is not None else storage.shape[1])
        if offset is not None or scale is not None:
            rows = [np.ascontiguousarray(v, dtype=kt.offset.dtype) for v in (offset, scale)]
            if any(v.shape != (self.spec.bands,) for v in rows):
                raise InputError(f"offset and scale must both be given, {self.spec.bands} values each")
            kt = kt._replace(offset=rows[0][None], scale=rows[1][None], side=kt.side[table:table + 1],
                             stride=kt.stride[table:table + 1], band=kt.band[table:table + 1],
                             identity=kt.identity[table:table + 1], block_plan=kt.block_plan[table:table + 1])
            table = 0
        flat = storage.view(-1).numpy()
        first = slot * storage[0].numel()
        cpu_cut.normalize_tile(flat, first, kt, table, flat.view(np.int16 if self._mode == 2 else np.uint16),
                               first * k, int(kt.stride[table]) * k)

    @staticmethod
    def _values_per_store_value(storage: torch.Tensor, normalized: bool) -> int:
        """16-bit output values per store value in a normalized ring (1 otherwise)."""
        return storage.element_size() // 2 if normalized else 1

    def _fused_kernel(self, src_dtype: torch.dtype) -> bool:
        """Whether the one-pass Triton kernel serves this batch (setting ``triton``, HSGDS_TRITON)."""
        if self._compute != torch.float32 or not triton_cut.supports(src_dtype, self._out_dtype):
            return False
        return bool(defaults.get("triton")) and triton_cut.available()

    def close(self) -> None:
        """Drop the reusable CPU work buffers. Idempotent; the engine can still be used afterwards."""
        self._bufs.clear()
        self._outs.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class RingCutter:
    """:meth:`TorchEngine.start_cut` on the fused CPU kernel for the loader, which cuts every batch from
    one ring ``storage`` with index rows it built itself (:meth:`TorchEngine.ring_cutter`).

    The storage is checked, and its flat view and the kernel's tables made, once here; a batch's
    coordinates are the loader's own int64 numpy rows, passed as they are. At the ~1 ms a batch takes on
    two cores, the per-batch tensor checks and conversions of the public path cost the consuming thread
    a measurable share of a core. What could corrupt memory is still checked at every batch: the kernel's
    patch_starts checks each patch's slot and bounds (an outside patch is reported by the public path,
    which names it), and dihedral codes and noise arrays are checked as there.
    """

    def __init__(self, engine: TorchEngine, storage: torch.Tensor, normalized: bool) -> None:
        spec = engine.spec
        if normalized and not engine.normalizes_tiles(storage.dtype):
            raise InputError("normalized=True needs tiles that normalize_tile rewrote; see normalizes_tiles()")
        k = engine._values_per_store_value(storage, normalized)
        if spec.tables is None:
            check_storage(storage, spec)
            side = storage.shape[1]
            self._tables = engine._kernel_tables(side, k)
            slot_elems = side * side * spec.bands
            self._check = engine._check_bounds is not False
        else:
            if storage.ndim < 2 or not storage.is_contiguous():
                raise InputError("storage must be a contiguous (slots, ...) torch.Tensor")
            check_store_dtype(storage.dtype)
            self._tables = engine._kernel_tables(None, k)
            slot_elems = storage[0].numel()
            self._check = engine._check_bounds is not False
            if self._check:
                engine._check_slot_size(slot_elems)
        self._engine, self._storage, self._normalized = engine, storage, normalized
        self._src = storage.view(-1).numpy()
        self._slots, self._slot_elems, self._radius = storage.shape[0], slot_elems * k, spec.radius
        p = spec.patch_size
        self._tail = (spec.bands, p, p) if spec.layout == "NCHW" else (p, p, spec.bands)

    def start(self, slot: np.ndarray, y: np.ndarray, x: np.ndarray, table: np.ndarray | None = None,
              dihedral: np.ndarray | None = None, noise: cpu_cut.Noise | None = None) -> PendingCut:
        """Start cutting the batch of contiguous int64 ``slot``, ``y``, ``x`` (and ``table`` where the spec
        has tables) on the engine's threads; ``dihedral``: int8 codes or None."""
        engine, n = self._engine, len(slot)
        if dihedral is not None and len(dihedral) and ((dihedral < 0) | (dihedral > 7)).any():
            raise InputError("dihedral codes must be in 0..7 (4*transpose + 2*flip rows + flip columns)")
        if noise is not None:
            if self._normalized and len(noise.alpha):
                raise InputError("radiation noise needs the tiles' values before rounding: cut tiles that were "
                                 "not normalized (normalized=False)")
            engine._check_noise(noise, self._storage, slot)
        if n == 0:
            return PendingCut(torch.empty((0, *self._tail), dtype=engine._out_dtype))
        starts, bad = cpu_cut.patch_starts(slot, y, x, table, self._tables, self._slots, self._slot_elems,
                                           self._radius, self._check)
        if bad >= 0:  # the public path names the sample and what is wrong with it
            engine.start_cut(self._storage, torch.from_numpy(slot), torch.from_numpy(y), torch.from_numpy(x),
                             None if table is None else torch.from_numpy(table), normalized=self._normalized)
            raise InputError(f"sample {bad} lies outside the ring storage")
        with engine._lock:
            got = engine._cut_numba(self._src, starts, table, dihedral, self._tables, (n, *self._tail), noise,
                                    self._normalized, ahead=True)
        return got if isinstance(got, PendingCut) else PendingCut(got)


def _as(t: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``t`` as a contiguous ``dtype`` tensor on ``device``: ``t`` itself when it already is (the loader's rows are).
    A no-op ``.to()`` still goes through torch's dispatcher, which lets go of the GIL; taking it back waits for
    whichever thread took it (the batch thread, a cutting thread's kernel call): 15-80 µs per call measured."""
    if t.dtype == dtype and t.device == device and t.is_contiguous():
        return t
    return t.to(device=device, dtype=dtype).contiguous()


# how many C++ references a storage has (None if this torch cannot tell: then no pooling)
_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


class _PooledOutput:
    """A CPU output buffer of the engine's pool, and what references it while nobody else does.

    A tensor, view, numpy array (and memoryviews or tensors made from one) or DLPack capsule handed out
    holds a C++ reference to the storage: its use count. A storage handle (``t.untyped_storage()``,
    ``t.storage()``) does not: torch keeps one Python object per storage and hands out that object again,
    so a caller keeping only the storage holds a Python reference to it. The pool keeps that object
    itself, so both counts are back at their idle values exactly when the caller has let go of all of
    them. Raw addresses (``data_ptr()``, ``__array_interface__``) hold nothing and are not seen."""

    __slots__ = ("tensor", "storage", "idle_refs")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.storage = tensor.untyped_storage()
        self.idle_refs = self.refs()

    def refs(self) -> tuple[int, int]:
        """(use count, Python references) of the storage; measured the same way when idle and after."""
        assert _USE_COUNT is not None  # only made where torch can count
        return _USE_COUNT(self.storage._cdata), sys.getrefcount(self.storage)

    def idle(self) -> bool:
        """Whether nobody but the pool references the buffer."""
        return self.refs() == self.idle_refs

    def shared(self) -> bool:
        """Whether the buffer was moved to shared memory (``share_memory_()``, a torch.multiprocessing
        queue): another process may map it, with no reference here, so it is never reused."""
        return self.storage.is_shared()


def _single_threaded_kernels() -> None:
    """Pool-thread initializer: make torch's kernels run single-threaded in this thread only.

    ATen's intra-op parallelism asks OpenMP for this thread's team size; OpenMP keeps that setting per
    thread, so setting it to 1 here leaves the training loop's threads (and MKL) alone. Where the OpenMP
    runtime cannot be found (not Linux, or another backend), the kernels keep their default teams.
    """
    torch.get_num_threads()  # ATen initializes this thread's OpenMP settings first
    lib = _openmp()
    if lib is not None:
        lib.omp_set_num_threads(1)


def _openmp() -> Any:
    """The OpenMP runtime torch loaded (ctypes handle), or None. Pool threads start concurrently: the
    lookup is done once, under a lock, and published only when complete."""
    global _OPENMP
    with _OPENMP_LOCK:
        if _OPENMP is False:
            import ctypes

            found = None
            try:
                with open("/proc/self/maps") as f:
                    paths = {line.split()[-1] for line in f if "/lib" in line}
                torch_lib = os.path.dirname(torch.__file__)
                # prefer the runtime shipped inside torch (the one ATen's kernels use)
                for path in sorted(paths, key=lambda q: (not q.startswith(torch_lib), q)):
                    if os.path.basename(path).startswith(("libgomp", "libiomp5", "libomp")):
                        found = ctypes.CDLL(path)
                        break
            except (OSError, IndexError):
                found = None
            _OPENMP = found
        return _OPENMP


_OPENMP: Any = False
_OPENMP_LOCK = threading.Lock()


def _kept_empty(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """``torch.empty`` on the CPU for a buffer kept across batches, never an inference tensor: the engine's
    threads write it in place, and later batches may be cut outside torch.inference_mode() (which is per
    thread) though it was made inside; an inference tensor refuses in-place writes outside that mode."""
    with torch.inference_mode(False):
        return torch.empty(numel, dtype=dtype)


def _transpose_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst[k, b, s] = src[k, s, b] for contiguous CPU tensors of one dtype. numpy's strided copy is ~3x
    faster than torch's for this shape; the bits are moved through a same-size integer view, so any
    dtype (bfloat16 included) is copied exactly."""
    as_int = _INT_OF_SIZE[dst.element_size()]
    np.copyto(dst.view(as_int).numpy(), src.view(as_int).numpy().transpose(0, 2, 1))
