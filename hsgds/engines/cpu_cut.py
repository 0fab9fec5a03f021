"""The fused CPU cut: gather, cast, normalize, optional dihedral transform and layout in one compiled pass.

One call cuts a range of patches of a batch straight into the output buffer, from one scene's tiles or
from several scenes' (per-patch tables: tile side, values per pixel, band selection, normalization).
For each patch it gathers the p*p source pixels (B bands each, contiguous unless a band selection),
casting to float32 (float64 for a float64 output) and normalizing on the way, with vector instructions
along the bands. NHWC: that is the output itself.
NCHW: blocks of 8 pixels x 8 bands are loaded straight from the tile, cast, normalized (and rounded,
for 16-bit outputs) and transposed in vector registers into the B output planes, also for a band selection
made of runs of at least 8 consecutive stored bands (:func:`band_blocks`); other selections, or fewer
than 8 bands or pixels, go through a patch-sized scratch in the core's L2 cache first. So the
output is written once. An NCHW batch larger than the caches is written with non-temporal stores (each
patch finished in cache, then streamed out in one pass): a plain store reads each output line from
memory before writing it (see :func:`should_stream`). The kernel releases the GIL: the torch engine runs
one call per range of patches on its own threads.

Normalized tiles (16-bit outputs, where the rounding rather than the memory traffic bounds the cut): the
loader has each tile rewritten in place as the output's values as it lands in the ring
(:func:`normalize_tile`: each pixel's output bands cast, normalized and rounded exactly as the cut would,
8 bands at a time in vector registers) and then cuts by copying (:func:`copy_range`: the same layouts,
transforms and dropout, no arithmetic). Each value is then computed once per tile load instead of once
for every patch that reads it (up to p*p times). The same bits either way.

numba compiles the kernel (``pip install "hsgds[cpu]"``); :func:`available` says whether it can run,
and :func:`unavailable_reason` why not. Compiled code is cached on disk (numba's ``cache=True``: next to
this file, or in numba's per-user cache directory when the package folder is read-only, or in a private
folder of the temporary directory when both are: :mod:`hsgds._numba_cache`), so only the first process on
a machine pays the compile time of each (store dtype, output dtype) pair.

Arithmetic: ``(compute(x) - offset) * scale`` with ``compute`` float32 (float64 for a float64 output),
the exact operations of the torch engine; then one rounding to the output dtype. 16-bit outputs are
written as their bit patterns (uint16): bfloat16 rounds to nearest even exactly like torch's
``Tensor.to(torch.bfloat16)`` (NaN -> 0x7FC0); float16 rounds to nearest even with IEEE subnormals,
overflow to infinity and quiet NaNs, as torch's CPU conversion does.

Dihedral transforms (optional, one int8 code per sample): code ``c = 4*t + 2*v + h``; output pixel
(i, j) of a p x p patch reads source offset (a, b) where (a, b) = (j, i) if t else (i, j); then
a = p-1-a if v; b = p-1-b if h. Code 0 is the identity.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import numpy as np

from hsgds._numba_cache import NoCacheFolder, import_kernels
from hsgds._optional import pip_install

__all__ = ["MODES", "STREAM_BYTES", "Noise", "Tables", "available", "band_blocks", "cache_folder", "copy_range", "cut_range", "make_noise",
           "make_tables", "normalize_tile", "normalizes_tiles", "patch_starts", "should_stream", "unavailable_reason",
           "warm_up"]

# output conversions: the output array's dtype decides the store, the mode what the bits mean
MODES = {"float32": 0, "float64": 0, "bfloat16": 1, "float16": 2}

_lock = threading.Lock()
_state: dict[str, Any] = {}


def _build() -> Any:
    """The module of compiled kernels; raises ImportError when numba is missing
    (:class:`~hsgds._numba_cache.NoCacheFolder` when it has nowhere to keep compiled code)."""
    return import_kernels("hsgds.engines._cpu_kernel")


def _kernel() -> Any:
    """The module of compiled kernels, imported once per process; None when it cannot be (the reason kept)."""
    if "kernel" not in _state:
        with _lock:
            if "kernel" not in _state:
                try:
                    _state["kernel"] = _build()
                    _state["reason"] = None
                except NoCacheFolder as exc:
                    _state["kernel"], _state["reason"] = None, f"the fused CPU kernel cannot run: {exc}"
                except ImportError as exc:
                    _state["kernel"] = None
                    _state["reason"] = (f"the fused CPU kernel needs numba ({' '.join(str(exc).split())}); "
                                        f"{pip_install('cpu')}")
    return _state["kernel"]


def _compiled() -> Any:
    """The module of compiled kernels; RuntimeError naming the pip extra when it cannot run."""
    kernels = _kernel()
    if kernels is None:
        raise RuntimeError(unavailable_reason())
    return kernels


def available() -> bool:
    """Whether the compiled kernel can run in this process (numba imports)."""
    return _kernel() is not None


def unavailable_reason() -> str | None:
    """Why :func:`available` is False (a sentence naming the pip extra), or None."""
    _kernel()
    return _state["reason"]


def cache_folder() -> str | None:
    """The folder where numba keeps the kernel's compiled code (see the module's docstring); None when the
    kernel cannot run or numba does not say."""
    kernels = _kernel()
    cache = getattr(getattr(kernels, "cut_patches", None), "_cache", None)  # numba's FunctionCache
    path = getattr(cache, "_cache_path", None)
    return str(path) if path else None


class Tables(NamedTuple):
    """Per-table constants of the kernel: T tables (one for a single scene; see
    :class:`hsgds.engines.base.SceneTables`). Table t: tiles ``side[t]`` pixels wide with ``stride[t]``
    values per pixel, output band b read from stored band ``band[t, b]`` (``identity[t]``: the bands are
    0..B-1, read as one contiguous run), normalized by ``offset[t, b]`` / ``scale[t, b]`` (compute dtype).
    Its NCHW register blocks: ``block_start[u, :block_count[u]]`` with u = ``block_plan[t]``, one plan per
    distinct band map (:func:`band_blocks`; an archive's scenes share a few)."""

    side: np.ndarray  # (T,) int64
    stride: np.ndarray  # (T,) int64
    band: np.ndarray  # (T, B) int64
    identity: np.ndarray  # (T,) uint8
    offset: np.ndarray  # (T, B) float32 or float64
    scale: np.ndarray  # (T, B) float32 or float64
    block_plan: np.ndarray  # (T,) int64
    block_count: np.ndarray  # (U,) int64
    block_start: np.ndarray  # (U, B) int64


def make_tables(side: Any, stride: Any, band: Any, offset: Any, scale: Any, compute: Any) -> Tables:
    """:class:`Tables` from per-table values (offset/scale rounded once to the ``compute`` dtype)."""
    band = np.ascontiguousarray(np.atleast_2d(band), dtype=np.int64)
    identity = np.all(band == np.arange(band.shape[1]), axis=1).astype(np.uint8)
    if np.array_equal(band, np.broadcast_to(band[:1], band.shape)):  # one band map for all: one plan
        plan, maps = np.zeros(len(band), np.int64), band[:1]
    else:
        seen: dict[bytes, int] = {}
        plan = np.array([seen.setdefault(row.tobytes(), len(seen)) for row in band], np.int64)
        maps = band[np.unique(plan, return_index=True)[1]]
    block_count, block_start = band_blocks(maps)
    return Tables(np.ascontiguousarray(np.atleast_1d(side), dtype=np.int64),
                  np.ascontiguousarray(np.atleast_1d(stride), dtype=np.int64), band, identity,
                  np.ascontiguousarray(np.atleast_2d(offset).astype(compute)),
                  np.ascontiguousarray(np.atleast_2d(scale).astype(compute)), plan, block_count, block_start)


def band_blocks(band: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8-band blocks in which the kernel cuts NCHW patches in registers, for each row of the (T, B) band
    maps ``band`` (output band b reads stored band band[t, b]): (count (T,), starts (T, B)), ``starts[t,
    :count[t]]`` the first output band of each block, whose 8 bands are consecutive both in the output and in
    the store. A run of L >= 8 consecutive stored bands gives blocks at its start + 0, 8, 16, ..., the last
    one ending at the run's end (overlapping the one before). Count 0 when a run is shorter than 8 bands
    (e.g. every 4th band): such a table's patches go through the scratch path. -1 after each row's count."""
    band = np.atleast_2d(np.asarray(band, dtype=np.int64))
    tables, bands = band.shape
    count, starts = np.zeros(tables, np.int64), np.full(band.shape, -1, np.int64)
    if bands < 8:
        return count, starts
    first = np.ones(band.shape, bool)  # where a run of consecutive stored bands starts
    first[:, 1:] = np.diff(band, axis=1) != 1
    first[first.sum(axis=1) > bands // 8] = False  # more runs than B/8: one is short; no run kept below
    row, col = np.nonzero(first)  # every run, row by row: its table and first output band
    row_ends = np.append(row[1:] != row[:-1], True)
    end = np.where(row_ends, bands, np.append(col[1:], bands))  # each run's end (exclusive)
    short = np.zeros(tables, bool)
    short[row[end - col < 8]] = True
    keep = ~short[row]  # the runs of tables whose runs are all >= 8 bands
    row, col, end = row[keep], col[keep], end[keep]
    blocks = (end - col + 7) // 8
    run = np.repeat(np.arange(row.size), blocks)
    g = np.arange(run.size) - np.repeat(np.cumsum(blocks) - blocks, blocks)  # the block's index in its run
    block_row = row[run]
    count[:] = np.bincount(block_row, minlength=tables)
    k = np.arange(run.size) - (np.cumsum(count) - count)[block_row]  # the block's index in its table
    starts[block_row, k] = np.minimum(col[run] + 8 * g, end[run] - 8)
    return count, starts


class Noise(NamedTuple):
    """One batch's radiation noise and band dropout for the kernel (hsgds.augment's rules): patch n gets
    value <- alpha[n] * value + std * bank[start[n] + i] (i the value's pixel-major, NHWC, index in its
    patch) when start[n] >= 0, then its bands ``drop_band[drop_ptr[n]:drop_ptr[n + 1]]`` zeroed. Empty
    ``alpha`` / ``drop_ptr``: no noise / no dropout in the whole batch. ``bank`` covers every window."""

    alpha: np.ndarray  # (N,) float32
    start: np.ndarray  # (N,) int64
    bank: np.ndarray  # (M,) float32
    std: np.float32
    drop_ptr: np.ndarray  # (N + 1,) int64
    drop_band: np.ndarray  # (D,) int64


def make_noise(n: int, radiated: np.ndarray, alpha: np.ndarray, start: np.ndarray, bank: np.ndarray, std: float,
               dropped: np.ndarray | None) -> Noise:
    """:class:`Noise` for a batch of ``n`` patches from sparse draws: the ``radiated`` positions with their
    ``alpha`` and window ``start``; ``dropped`` (D, 2) (position, band) pairs sorted by position, or None
    to leave dropout to the caller."""
    if len(radiated):
        full_alpha = np.ones(n, np.float32)
        full_start = np.full(n, -1, np.int64)
        full_alpha[radiated], full_start[radiated] = alpha, start
    else:
        full_alpha, full_start = _NONE_FLOAT32, _NONE_INT64
    if dropped is not None and len(dropped):
        ptr = np.searchsorted(dropped[:, 0], np.arange(n + 1)).astype(np.int64)
        bands = np.ascontiguousarray(dropped[:, 1], dtype=np.int64)
    else:
        ptr, bands = _NONE_INT64, _NONE_INT64
    return Noise(full_alpha, full_start, bank, np.float32(std), ptr, bands)


def cut_range(src: np.ndarray, base: np.ndarray, table: np.ndarray | None, dihedral: np.ndarray | None,
              tables: Tables, out: np.ndarray, p: int, nchw: bool, mode: int, lo: int, hi: int,
              stream: bool = False, noise: Noise | None = None, phase: int | None = None) -> None:
    """Cut patches ``lo:hi`` of a batch into ``out``.

    ``src`` is the flat storage; ``base[n]`` (int64) the element of ``src`` where patch n's top-left pixel
    starts; ``table[n]`` its table (None: table 0 for all); ``dihedral[n]`` (int8) its dihedral code (None:
    identity). ``stream``: write the output with non-temporal stores (for outputs larger than the
    caches: see :func:`should_stream`). ``noise``: radiation noise and band dropout applied in the same
    pass (:class:`Noise`). ``phase``: out[0]'s element index within its 32-byte block, when the caller
    knows it (found from ``out`` otherwise). The caller validates: every patch lies inside its tile,
    ``tables`` are consistent, and ``out`` is flat and contiguous: float32/float64 for mode 0, uint16
    for modes 1 and 2. Calls on different threads may run at once (each has its own scratch) when they
    write different patches.
    """
    kernels = _compiled()
    out, phase = _kernel_output(out, mode, phase)
    kernels.cut_patches(src, base, _NONE_INT64 if table is None else table, _NONE_INT8 if dihedral is None else dihedral,
                        *tables, out, p, nchw, phase, stream, *(noise or _NO_NOISE), lo, hi)


def _kernel_output(out: np.ndarray, mode: int, phase: int | None) -> tuple[np.ndarray, int]:
    """``out`` as the kernels take it, and out[0]'s element index within its 32-byte block (found from
    ``out`` when ``phase`` is None): the kernel tells float16 bits (int16) from bfloat16 bits (uint16) by
    their integer type when it compiles."""
    if phase is None:
        phase = (out.ctypes.data // out.itemsize) % (32 // out.itemsize)
    return (out.view(np.int16) if mode == 2 else out), phase


def normalizes_tiles(store_dtype: Any, out_dtype: str, out_bands: int = 0, stored_bands: int = 0) -> bool:
    """Whether tiles of ``store_dtype`` can be rewritten in place as ``out_dtype`` values (a :data:`MODES`
    name) by :func:`normalize_tile`: a 16-bit output (bfloat16, float16), where the rounding bounds the cut
    rather than the memory traffic, and a store of at least 2 bytes per value, so that each value's output
    fits in its own bytes; and a pixel's ``out_bands`` output values fit in the bytes of its
    ``stored_bands`` values (the fewest of any scene): a band taken more than once (``bands=[0, 0, ...]``,
    several wavelengths nearest one band) can give a pixel more outputs than it stores, which written in
    place would run into the next pixel's."""
    try:
        itemsize = np.dtype(store_dtype).itemsize
    except TypeError:
        return False
    return out_dtype in ("bfloat16", "float16") and itemsize >= 2 and 2 * out_bands <= itemsize * stored_bands


def normalize_tile(src: np.ndarray, first: int, tables: Tables, t: int, dst: np.ndarray, dfirst: int,
                   dstride: int) -> None:
    """Write the tile of table ``t`` whose first pixel starts at ``src[first]`` as the output's values:
    pixel k's output band b at ``dst[dfirst + k*dstride + b]``, cast, normalized and rounded exactly as
    :func:`cut_range` computes it. ``dst`` (uint16: bfloat16 bits; int16: float16 bits) may be ``src``'s
    own memory, the tile rewritten in place, when each pixel's output values fit in its bytes (``dstride``
    covers the pixel's ``tables.stride[t]`` store values). Patches are then cut with :func:`copy_range`."""
    kernels = _compiled()
    kernels.normalize_tile(src, first, tables.side[t], tables.stride[t], tables.band[t], tables.identity[t] != 0,
                           tables.offset[t], tables.scale[t], dst, dfirst, dstride)


def copy_range(src: np.ndarray, base: np.ndarray, table: np.ndarray | None, dihedral: np.ndarray | None,
               tables: Tables, out: np.ndarray, p: int, nchw: bool, mode: int, lo: int, hi: int,
               stream: bool = False, noise: Noise | None = None, phase: int | None = None) -> None:
    """:func:`cut_range` for tiles that :func:`normalize_tile` has rewritten: ``src`` holds the output's
    values (the same 16-bit type as ``out``), ``tables`` give each table's side and stride in those
    values; the patches are copied, laid out, transformed and their dropped bands zeroed. ``noise`` may
    carry band dropout only (radiation noise needs the values before their rounding)."""
    kernels = _compiled()
    noise = noise or _NO_NOISE
    if len(noise.alpha):
        raise ValueError("radiation noise needs the tiles' values before rounding: cut them with cut_range")
    out, phase = _kernel_output(out, mode, phase)
    kernels.copy_patches(src.view(out.dtype), base, _NONE_INT64 if table is None else table,
                         _NONE_INT8 if dihedral is None else dihedral, tables.side, tables.stride,
                         tables.offset.shape[1], out, p, nchw, phase, stream, noise.drop_ptr, noise.drop_band, lo, hi)


def patch_starts(slot: np.ndarray, y: np.ndarray, x: np.ndarray, table: np.ndarray | None, tables: Tables,
                 slots: int, slot_elems: int, radius: int, check: bool) -> tuple[np.ndarray, int]:
    """(base, bad): each sample's ``base`` for :func:`cut_range` (the element where its patch's top-left
    pixel starts in the flat ring of ``slots`` slots of ``slot_elems`` values), from int64 ``slot``, ``y``,
    ``x`` (the patch centre) and ``table`` (None: table 0 for all). ``bad`` is the first sample whose table
    does not exist or, with ``check``, whose slot does not exist or whose patch leaves its tile; -1 when
    all are inside (``base`` is then complete)."""
    kernels = _compiled()
    base = np.empty(slot.shape[0], np.int64)
    bad = kernels.patch_starts(slot, y, x, _NONE_INT64 if table is None else table, tables.side, tables.stride,
                               slots, slot_elems, radius, check, base)
    return base, int(bad)


def warm_up(src_dtype: Any, out_dtype: str, normalized: bool = False) -> None:
    """Import numba and load (or compile) the kernel that cuts ``src_dtype`` tiles into ``out_dtype``
    patches (a :data:`MODES` name) on a background thread, once per pair and process, so that a loader's
    first batch does not wait for them: ~0.3 s of import and ~0.35 s of loading from numba's cache on the
    2-core VM (a first compile takes seconds). ``normalized``: the kernels of normalized tiles instead
    (:func:`normalize_tile`, :func:`copy_range`). The calls that need the kernel wait for the import and the
    load where they are not done yet (Python's import lock, numba's compiler lock). The thread is not a
    daemon: an interpreter that exits meanwhile waits for it rather than stopping it inside numba."""
    key = (np.dtype(src_dtype).str, out_dtype, normalized)
    with _lock:
        if key in _warming or out_dtype not in MODES:
            return
        _warming.add(key)
        thread = threading.Thread(target=_warm, args=(np.dtype(src_dtype), out_dtype, normalized),
                                  name="hsgds-warm-up")
        _warm_threads.append(thread)
    thread.start()


def wait_for_warm_up() -> None:
    """Wait until every :func:`warm_up` started so far has finished: a measurement taken right after a
    loader's construction (``hsgds bench``'s t_io) would otherwise share the interpreter with numba's
    import and time that too."""
    with _lock:
        threads = list(_warm_threads)
    for thread in threads:
        thread.join()


def _warm(src_dtype: np.dtype, out_dtype: str, normalized: bool = False) -> None:
    try:
        if _kernel() is None:
            return
        mode = MODES[out_dtype]
        out = np.zeros(0, np.uint16 if mode else out_dtype)
        compute = np.float64 if out_dtype == "float64" else np.float32
        tables = make_tables(1, 1, [0], [0.0], [1.0], compute)
        # no patch to cut: the calls only load the specializations for these argument types
        patch_starts(_NONE_INT64, _NONE_INT64, _NONE_INT64, None, tables, 1, 1, 0, True)
        src = np.zeros(8, src_dtype)
        if normalized and normalizes_tiles(src_dtype, out_dtype, 1, 1):
            flat = src.view(np.int16 if mode == 2 else np.uint16)
            normalize_tile(src, 0, tables, 0, flat, 0, src.itemsize // 2)
            copy_range(src, _NONE_INT64, None, None, tables, out, 1, True, mode, 0, 0, False)
        else:
            cut_range(src, _NONE_INT64, None, None, tables, out, 1, True, mode, 0, 0, False)
    except Exception:  # the first real cut reports whatever is wrong, with its context
        pass


_warming: set[tuple[str, str, bool]] = set()
_warm_threads: list[threading.Thread] = []


def should_stream(nbytes: int, nchw: bool) -> bool:
    """Whether an output of ``nbytes`` is written with non-temporal stores: NCHW batches of STREAM_BYTES
    or more. Such a batch cannot stay in a core's cache for its consumer anyway, and the B band planes of
    a patch are written 16 or 32 bytes at a time: with plain stores each output line is read from memory
    first. Each patch is finished in cache and streamed out in one sequential pass: an Indian Pines
    bfloat16 batch on the 2-core VM went from 1.8 to 3.7 GB/s on one thread
    (benchmarks/bench_cpu_roofline.py), the loader from 38-40k to 60-69k patches/s (alternated in fresh
    processes). NHWC, written sequentially, gained between nothing and 15% from run to run: it keeps plain
    stores."""
    return nchw and nbytes >= STREAM_BYTES


STREAM_BYTES = 4 << 20


_NONE_INT64 = np.zeros(0, dtype=np.int64)
_NONE_INT8 = np.zeros(0, dtype=np.int8)
_NONE_FLOAT32 = np.zeros(0, dtype=np.float32)
_NO_NOISE = Noise(_NONE_FLOAT32, _NONE_INT64, _NONE_FLOAT32, np.float32(0), _NONE_INT64, _NONE_INT64)
