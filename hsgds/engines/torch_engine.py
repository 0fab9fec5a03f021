"""The torch patch engine: one gather per batch on the flattened ring storage, then a fused cast/normalize.

No Python runs per sample: the p*p pixel offsets of a patch inside the flattened (slots*S*S, B) storage are
computed once, so a batch is ``index_select(storage.view(-1, B), 0, base[:, None] + offsets)`` followed by
``(x - offset) * scale`` in float32 and a cast to the output dtype.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from hsgds import defaults
from hsgds.engines.base import LAYOUTS, PatchEngine, PatchSpec
from hsgds.errors import ConfigError, DependencyError, InputError

try:
    import torch
except ImportError as exc:  # torch is an extra: users install the build matching their CUDA
    raise DependencyError(
        "the patch engines need PyTorch: install the build for your CUDA, or pip install 'hsgds[torch]'"
    ) from exc

from hsgds.engines import triton_cut  # noqa: E402 (needs torch, checked above)

__all__ = ["TorchEngine"]

_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_STORE_DTYPES = (
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.uint16,
    torch.int32,
    torch.uint32,
    torch.int64,
    torch.float32,
    torch.float64,
)
# index_select/take are not implemented for torch's "barebones" unsigned types (uint16/32/64), but views
# and copy_ (conversion) are: gather through a same-size signed view, convert through the unsigned view.
_SIGNED_VIEW = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


def resolve_out_dtype(value: Any) -> torch.dtype:
    """A torch floating dtype from ``spec.out_dtype`` (a ``torch.dtype`` or its name, e.g. "bfloat16")."""
    dtype = getattr(torch, value, None) if isinstance(value, str) else value
    if dtype not in _OUT_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in _OUT_DTYPES)
        raise ConfigError(f"out_dtype {value!r} is not supported; use one of: {names}")
    return dtype


def check_spec(spec: PatchSpec) -> tuple[torch.dtype, np.ndarray, np.ndarray]:
    """Validate a :class:`PatchSpec`; return (out dtype, offset, scale) with offset/scale as float64 (B,).

    Raises
    ------
    ConfigError
        When a field is out of range or inconsistent with the others.
    """
    p, halo, bands, side = spec.patch_size, spec.halo, spec.bands, spec.tile_side
    if not isinstance(p, (int, np.integer)) or p < 1 or p % 2 == 0:
        raise ConfigError(f"patch_size must be an odd integer >= 1 (a patch is centred on a pixel), got {p!r}")
    if halo < 0 or p // 2 > halo:
        raise ConfigError(
            f"patch_size {p} needs a halo of at least {p // 2}, but the store's halo is {halo}; "
            "use a smaller patch or re-convert the scene with a larger halo"
        )
    if bands < 1:
        raise ConfigError(f"bands must be >= 1, got {bands}")
    if side < p:
        raise ConfigError(f"tile_side {side} is smaller than patch_size {p}")
    if spec.layout not in LAYOUTS:
        raise ConfigError(f"layout must be one of {LAYOUTS}, got {spec.layout!r}")
    out_dtype = resolve_out_dtype(spec.out_dtype)
    offset = np.asarray(spec.offset, dtype=np.float64).reshape(-1)
    scale = np.asarray(spec.scale, dtype=np.float64).reshape(-1)
    for what, arr in (("offset", offset), ("scale", scale)):
        if arr.shape != (bands,):
            raise ConfigError(f"{what} must hold one value per band ({bands}), got shape {arr.shape}")
        if not np.all(np.isfinite(arr)):
            raise ConfigError(f"{what} has non-finite values; check the store's band statistics")
    return out_dtype, offset, scale


def check_storage(storage: Any, spec: PatchSpec) -> None:
    """Raise InputError unless ``storage`` is a contiguous (slots, S, S, B) tensor of a supported dtype."""
    if not isinstance(storage, torch.Tensor):
        raise InputError(f"storage must be a torch.Tensor, got {type(storage).__name__}")
    if storage.ndim != 4 or storage.shape[1] != storage.shape[2] or storage.shape[3] != spec.bands:
        raise InputError(
            f"storage must have shape (slots, S, S, {spec.bands}), got {tuple(storage.shape)}"
        )
    if storage.shape[1] < spec.patch_size:
        raise InputError(f"storage tiles ({storage.shape[1]} px) are smaller than the patch ({spec.patch_size})")
    if storage.dtype not in _STORE_DTYPES:
        raise InputError(f"storage dtype {storage.dtype} is not supported")
    if not storage.is_contiguous():
        raise InputError("storage must be contiguous (the ring allocates it so); got a strided view")


def check_coords(storage: torch.Tensor, slot: Any, y: Any, x: Any, radius: int, bounds: bool | None) -> None:
    """Raise InputError for mismatched coordinate tensors, or (``bounds``) patches outside their tile.

    ``bounds=None`` checks the bounds only when the coordinates are on the CPU (no device sync).
    """
    for name, t in (("slot", slot), ("y", y), ("x", x)):
        if not isinstance(t, torch.Tensor) or t.ndim != 1:
            raise InputError(f"{name} must be a 1-D torch.Tensor, got {type(t).__name__}")
        if t.dtype.is_floating_point or t.dtype == torch.bool:
            raise InputError(f"{name} must hold integers, got {t.dtype}")
    if not slot.shape == y.shape == x.shape:
        raise InputError(f"slot, y, x must have the same length, got {len(slot)}, {len(y)}, {len(x)}")
    if bounds is None:
        bounds = slot.device.type == "cpu"
    if bounds and len(slot):
        slots, side = storage.shape[0], storage.shape[1]
        lo, hi = radius, side - radius - 1
        bad = (slot < 0) | (slot >= slots) | (y < lo) | (y > hi) | (x < lo) | (x > hi)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise InputError(
                f"sample {i} (slot {int(slot[i])}, y {int(y[i])}, x {int(x[i])}) is outside the storage: slot must "
                f"be in [0, {slots}) and y, x in [{lo}, {hi}] so the {2 * radius + 1}-px patch stays in its tile"
            )


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
        Expected batch size; on the CPU the work buffers are sized for it up front (they grow if a bigger
        batch comes). Accepted for every engine so that callers can build any engine the same way.
    check_bounds : bool or None
        Check that every patch lies inside its tile and slot (InputError otherwise). The check needs a
        device-to-host sync on CUDA, so the default (None) checks only coordinates that are on the CPU.

    Notes
    -----
    The arithmetic is ``(x.float() - offset) * scale`` in float32 (float64 when ``out_dtype`` is float64),
    then one rounding to ``out_dtype``; this is bit-for-bit what the DALI engine computes. On the CPU the
    gather and float32 work buffers are kept between batches (fresh large allocations cost page faults);
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
        out_dtype, offset, scale = check_spec(spec)
        if max_batch_size is not None and (not isinstance(max_batch_size, (int, np.integer)) or max_batch_size < 1):
            raise ConfigError(f"max_batch_size must be a positive integer or None, got {max_batch_size!r}")
        super().__init__(spec, device)
        self._device = torch.device("cpu") if device is None else torch.device(device)
        self._out_dtype = out_dtype
        # float32 arithmetic unless the caller asks for float64 output (then float32 would lose precision)
        self._compute = torch.float64 if out_dtype == torch.float64 else torch.float32
        self._offset_np = offset
        self._scale_np = scale
        self._consts: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._consts_for(self._device)
        self._check_bounds = check_bounds
        self._offsets: dict[tuple[int, torch.device], torch.Tensor] = {}
        self._offsets_for(spec.tile_side, self._device)  # the usual side, computed once up front
        self._bufs: dict[tuple[str, torch.dtype], torch.Tensor] = {}
        self._lock = threading.Lock()
        if max_batch_size is not None and self._device.type == "cpu":
            # the work buffer exists only for 16-bit outputs; the gather buffer's dtype is known per batch
            numel = int(max_batch_size) * spec.patch_size**2 * spec.bands
            if out_dtype != self._compute:
                self._buffer("work", self._compute, numel)

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

    def _buffer(self, kind: str, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """A reusable CPU buffer of at least ``numel`` elements (grown, never shrunk, until close())."""
        buf = self._bufs.get((kind, dtype))
        if buf is None or buf.numel() < numel:
            buf = self._bufs[(kind, dtype)] = torch.empty(numel, dtype=dtype)
        return buf[:numel]

    # -- the batch ------------------------------------------------------------------------------------
    def cut(self, storage: Any, slot: Any, y: Any, x: Any) -> Any:
        """Cut, normalize and lay out one batch; see :class:`~hsgds.engines.base.PatchEngine`."""
        spec = self.spec
        check_storage(storage, spec)
        check_coords(storage, slot, y, x, spec.radius, self._check_bounds)
        if storage.device.type == "cpu":
            with self._lock:
                return self._cut(storage, slot, y, x)
        return self._cut(storage, slot, y, x)

    def _cut(self, storage: torch.Tensor, slot: torch.Tensor, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        spec = self.spec
        p, r, bands = spec.patch_size, spec.radius, spec.bands
        n, side, device = slot.shape[0], storage.shape[1], storage.device
        cpu = device.type == "cpu"
        nchw = spec.layout == "NCHW"
        shape = (n, bands, p, p) if nchw else (n, p, p, bands)
        out = torch.empty(shape, dtype=self._out_dtype, device=device)
        if n == 0:
            return out

        slot, y, x = (t.to(device=device, dtype=torch.int64) for t in (slot, y, x))
        if not cpu and self._fused_kernel(storage.dtype):  # one pass on the GPU
            offset, scale = self._consts_for(device)
            return triton_cut.cut(storage, slot, y, x, offset, scale, out, p, nchw)

        # one gather of n*p*p pixel rows (B values each) in the store's own dtype: 2 bytes for int16
        base = (slot * side + (y - r)) * side + (x - r)
        idx = (base[:, None] + self._offsets_for(side, device)).view(-1)
        src_dtype = storage.dtype
        flat = storage.view(-1, bands)
        if src_dtype in _SIGNED_VIEW:
            flat = flat.view(_SIGNED_VIEW[src_dtype])
        if cpu:
            g = self._buffer("gather", flat.dtype, n * p * p * bands).view(n * p * p, bands)
            torch.index_select(flat, 0, idx, out=g)
        else:
            g = torch.index_select(flat, 0, idx)
        g = g.view(src_dtype).view(n, p, p, bands)  # back to the real (unsigned) dtype: a free view

        offset, scale = self._consts_for(device)
        if nchw:
            g = g.permute(0, 3, 1, 2)  # the cast below writes the contiguous NCHW result directly
            offset, scale = offset.view(bands, 1, 1), scale.view(bands, 1, 1)

        direct = self._out_dtype == self._compute
        if direct:
            work = out
        elif cpu:
            work = self._buffer("work", self._compute, out.numel()).view(shape)
        else:
            work = torch.empty(shape, dtype=self._compute, device=device)
        # CUDA kernels cast inputs on the fly, so sub() reads the native dtype and writes float32 in one
        # pass. The CPU would materialize a promoted copy first, so there copy_ (the cast) then sub_.
        # Unsigned and float64 inputs always take copy_: sub() lacks unsigned kernels, and it would
        # compute in float64 instead of rounding x to float32 first.
        fused = not cpu and src_dtype not in _SIGNED_VIEW and not (
            src_dtype == torch.float64 and self._compute != torch.float64
        )
        if fused:
            torch.sub(g, offset, out=work)
        else:
            work.copy_(g)
            work.sub_(offset)
        if direct:
            work.mul_(scale)
        elif cpu:
            work.mul_(scale)
            out.copy_(work)
        else:
            torch.mul(work, scale, out=out)  # computed in float32, rounded once to out_dtype
        return out

    def _fused_kernel(self, src_dtype: torch.dtype) -> bool:
        """Whether the one-pass Triton kernel serves this batch (setting ``triton``, HSGDS_TRITON)."""
        if self._compute != torch.float32 or not triton_cut.supports(src_dtype, self._out_dtype):
            return False
        return bool(defaults.get("triton")) and triton_cut.available()

    def close(self) -> None:
        """Drop the reusable CPU work buffers. Idempotent; the engine can still be used afterwards."""
        self._bufs.clear()
