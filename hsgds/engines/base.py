"""The patch-engine interface: resident tiles + sample coordinates -> a normalized patch batch.

Everything the engines and the loader agree on lives here once: the torch dtypes of a store and of a
patch batch, :class:`PatchSpec` (which validates itself), and the checks of a batch's inputs.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

import numpy as np

from hsgds._optional import pip_install
from hsgds.errors import ConfigError, DependencyError, InputError, shown
from hsgds.format import DTYPES

try:
    import torch
except ImportError as exc:  # torch is an extra: users install the build matching their CUDA
    raise DependencyError(
        f"the patch engines need PyTorch: install the build for your CUDA, or {pip_install('torch')}"
    ) from exc

__all__ = ["LAYOUTS", "OUT_DTYPES", "TORCH_DTYPES", "PatchEngine", "PendingCut", "PatchSpec", "SceneTables", "check_coords",
           "check_dihedral", "check_storage", "check_store_dtype", "is_store_dtype", "resolve_out_dtype"]

LAYOUTS = ("NCHW", "NHWC")
#: store dtype (numpy name, :data:`hsgds.format.DTYPES`) -> the torch dtype of the ring holding its tiles
TORCH_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPES}
_STORE_TORCH_DTYPES = frozenset(TORCH_DTYPES.values())
#: dtypes a patch batch may have
OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def resolve_out_dtype(value: Any) -> torch.dtype:
    """A torch floating dtype from a ``torch.dtype`` or its name (e.g. "bfloat16").

    Raises
    ------
    ConfigError
        When ``value`` is not one of :data:`OUT_DTYPES`.
    """
    dtype = getattr(torch, value, None) if isinstance(value, str) else value
    if not isinstance(dtype, torch.dtype) or dtype not in OUT_DTYPES:  # (an array compared would be ambiguous)
        names = ", ".join(str(d).removeprefix("torch.") for d in OUT_DTYPES)
        raise ConfigError(f"dtype must be a torch floating dtype ({names}), got {shown(value)}")
    return dtype


@dataclass(frozen=True)
class SceneTables:
    """Per-scene tables for cutting from several scenes (or a band selection) in the same single pass.

    Table ``t`` describes the tiles of scene ``t``: padded tile side ``side[t]``, values per stored pixel
    ``stride[t]`` (its band count), the stored band of each output band ``band[t]``, and the output's
    per-band ``offset[t]`` / ``scale[t]``: out[..., b] = (tile[..., band[t, b]] - offset[t, b]) * scale[t, b].
    A slot holds one tile, laid out (side, side, stride) from the slot's first element.
    """

    side: np.ndarray  # (T,) int
    stride: np.ndarray  # (T,) int
    band: np.ndarray  # (T, B) int, 0 <= band < stride
    offset: np.ndarray  # (T, B) float64
    scale: np.ndarray  # (T, B) float64

    def __len__(self) -> int:
        return len(self.side)

    @property
    def uniform(self) -> bool:
        """Every table has one geometry and keeps every stored band in order (a plain pixel-row gather)."""
        b = self.band.shape[1]
        return bool(np.all(self.side == self.side[0]) and np.all(self.stride == b)
                    and np.array_equal(self.band, np.broadcast_to(np.arange(b), self.band.shape)))

    def check(self, bands: int, patch_size: int) -> None:
        """Raise ConfigError unless consistent: (T,) geometry, (T, bands) band/offset/scale."""
        t = len(self.side)
        if t < 1:
            raise ConfigError("tables must describe at least one scene")
        for what, arr in (("side", self.side), ("stride", self.stride)):
            if np.shape(arr) != (t,) or np.any(np.asarray(arr) < 1):
                raise ConfigError(f"tables.{what} must hold one positive value per table ({t}), got {arr!r}")
        if np.any(np.asarray(self.side) < patch_size):
            raise ConfigError(f"a table's tile side {int(np.min(self.side))} is smaller than patch_size {patch_size}")
        for what, arr in (("band", self.band), ("offset", self.offset), ("scale", self.scale)):
            if np.shape(arr) != (t, bands):
                raise ConfigError(f"tables.{what} must have shape ({t}, {bands}), got {np.shape(arr)}")
            if not np.all(np.isfinite(np.asarray(arr, dtype=np.float64))):
                raise ConfigError(f"tables.{what} has non-finite values; check the stores' band statistics")
        if np.any(self.band < 0) or np.any(self.band >= np.asarray(self.stride)[:, None]):
            raise ConfigError("tables.band selects a band outside its scene's stored bands")


@dataclass(frozen=True)
class PatchSpec:
    """What every batch looks like, validated on construction.

    ``offset``/``scale`` are per band: out = (x - offset) * scale, computed in float32 (float64 for a
    float64 output) then cast to ``out_dtype``. With ``tables`` (several scenes, or a band selection) the per-scene
    :class:`SceneTables` give the geometry, bands and normalization of each sample's table instead,
    ``bands`` is the output band count and ``offset``/``scale`` are unused (zeros and ones). After
    construction ``out_dtype`` is a torch dtype (a name such as "bfloat16" is accepted) and
    ``offset``/``scale`` are float64 arrays of shape (bands,).

    Raises
    ------
    ConfigError
        When a field is out of range or inconsistent with the others.
    """

    patch_size: int
    halo: int
    bands: int
    tile_side: int
    layout: str
    out_dtype: Any
    offset: np.ndarray
    scale: np.ndarray
    tables: SceneTables | None = None

    def __post_init__(self) -> None:
        p, halo, bands = self.patch_size, self.halo, self.bands
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 1 or p % 2 == 0:
            raise ConfigError(f"patch_size must be a positive odd integer (patches are pixel-centred), got {shown(p)}")
        if halo < 0:
            raise ConfigError(f"halo must be >= 0, got {halo}")
        if p // 2 > halo:
            max_p = 2 * halo + 1
            raise ConfigError(f"patch_size {p} is larger than this store serves ({max_p}x{max_p}, halo "
                              f"{halo}); convert again with --max-patch {p}")
        if bands < 1:
            raise ConfigError(f"bands must be >= 1, got {bands}")
        if self.tile_side < p:
            raise ConfigError(f"tile_side {self.tile_side} is smaller than patch_size {p}")
        if not isinstance(self.layout, str) or self.layout not in LAYOUTS:
            raise ConfigError(f"layout must be one of {', '.join(LAYOUTS)}, got {shown(self.layout)}")
        set_field = object.__setattr__  # frozen: store the normalized forms once, here
        set_field(self, "out_dtype", resolve_out_dtype(self.out_dtype))
        if self.tables is not None:
            self.tables.check(bands, p)
            set_field(self, "offset", np.zeros(bands))
            set_field(self, "scale", np.ones(bands))
            return
        for what in ("offset", "scale"):
            arr = np.asarray(getattr(self, what), dtype=np.float64).reshape(-1)
            if arr.shape != (bands,):
                raise ConfigError(f"{what} must hold one value per band ({bands}), got shape {arr.shape}")
            if not np.all(np.isfinite(arr)):
                raise ConfigError(f"{what} has non-finite values; check the store's band statistics")
            set_field(self, what, arr)

    @property
    def radius(self) -> int:
        return self.patch_size // 2


def is_store_dtype(dtype: Any) -> bool:
    """Whether ``dtype`` (a torch dtype) is one a store's tiles, hence a ring, can have."""
    return dtype in _STORE_TORCH_DTYPES


def check_store_dtype(dtype: Any) -> None:
    """Raise InputError unless ``dtype`` is one a store's tiles, hence a ring, can have."""
    if not is_store_dtype(dtype):
        raise InputError(f"storage dtype {dtype} is not a store dtype (one of {', '.join(TORCH_DTYPES)}); "
                         "cut from a ring that holds a store's tiles")


def check_storage(storage: Any, spec: PatchSpec) -> None:
    """Raise InputError unless ``storage`` is a contiguous (slots, S, S, B) tensor of a store dtype."""
    if not isinstance(storage, torch.Tensor):
        raise InputError(f"storage must be a torch.Tensor, got {type(storage).__name__}")
    if storage.ndim != 4 or storage.shape[1] != storage.shape[2] or storage.shape[3] != spec.bands:
        raise InputError(
            f"storage must have shape (slots, S, S, {spec.bands}), got {tuple(storage.shape)}"
        )
    if storage.shape[1] < spec.patch_size:
        raise InputError(f"storage tiles ({storage.shape[1]} px) are smaller than the patch ({spec.patch_size})")
    check_store_dtype(storage.dtype)
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
        # on the host, in numpy: a few µs per batch, where torch's small ops cost ~0.5 ms on a busy CPU
        s, yy, xx = (t.cpu().numpy() for t in (slot, y, x))
        bad = (s < 0) | (s >= slots) | (yy < lo) | (yy > hi) | (xx < lo) | (xx > hi)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(
                f"sample {i} (slot {int(slot[i])}, y {int(y[i])}, x {int(x[i])}) is outside the storage: slot must "
                f"be in [0, {slots}) and y, x in [{lo}, {hi}] so the {2 * radius + 1}-px patch stays in its tile"
            )


def check_dihedral(dihedral: Any, slot: torch.Tensor) -> None:
    """Raise InputError unless ``dihedral`` is None or one integer code in 0..7 per sample."""
    if dihedral is None:
        return
    if not isinstance(dihedral, torch.Tensor) or dihedral.ndim != 1 or dihedral.shape != slot.shape:
        raise InputError(f"dihedral must be None or a 1-D tensor with one code per sample ({len(slot)})")
    if dihedral.dtype.is_floating_point or dihedral.dtype == torch.bool:
        raise InputError(f"dihedral codes must be integers, got {dihedral.dtype}")
    codes = dihedral.numpy() if dihedral.device.type == "cpu" else None  # numpy: cheaper than torch's small ops
    if codes is not None and len(codes) and ((codes < 0) | (codes > 7)).any():
        raise InputError("dihedral codes must be in 0..7 (4*transpose + 2*flip rows + flip columns)")


class PendingCut:
    """A batch whose cut has started on an engine's own threads (:meth:`PatchEngine.start_cut`):
    :meth:`result` waits for it and returns the patches (raising what a cutting thread raised)."""

    def __init__(self, out: Any, futures: Any = ()) -> None:
        self._out = out
        self._futures = list(futures)

    def done(self) -> bool:
        """Whether every thread has finished its part of the batch."""
        return all(f.done() for f in self._futures)

    def result(self) -> Any:
        """The patches, once every part is cut (the first error raised by a part, after all have ended)."""
        error: BaseException | None = None
        for f in self._futures:
            try:
                f.result()
            except BaseException as exc:  # wait for the others too: none may still write into the output
                error = error or exc
        if error is not None:
            raise error
        return self._out


class PatchEngine(abc.ABC):
    """Cuts patches from the ring's storage.

    ``storage`` is the ring's contiguous tensor of shape (slots, S, S, B) in the store's dtype, on the
    engine's device. ``slot``, ``y``, ``x`` are int64 tensors (N,) on the same device: the slot holding
    each sample's tile and the sample's centre in that tile's padded coordinates (core + halo), so the
    patch is storage[slot, y-r:y+r+1, x-r:x+r+1, :]. Returns (N, B, p, p) for NCHW or (N, p, p, B) for
    NHWC, contiguous, ``spec.out_dtype``, on the storage's device. With ``spec.tables``, ``table`` (N,)
    gives each sample's table (its scene) and ``storage`` may be any (slots, ...) contiguous tensor.
    ``dihedral``, when given, is an (N,) integer tensor of codes 0..7 (hsgds.augment): each patch is cut
    flipped / turned, as a different read order.
    """

    name: str = "engine"
    #: whether cut() takes ``noise=`` (radiation noise and band dropout applied inside the cut; the torch
    #: engine's fused CPU kernel). Otherwise hsgds.augment applies them after the cut.
    fuses_noise: bool = False
    #: whether :meth:`start_cut` returns before the batch is cut (the engine's own threads cut it)
    cuts_ahead: bool = False
    #: whether the engine reads ``slot``, ``y``, ``x`` and ``dihedral`` on the host whatever its device (DALI feeds
    #: its pipeline host anchors): the loader then passes them on the host, where it made them, rather than its
    #: device copy, which the engine would copy back (a device-to-host copy waits for the stream every batch)
    host_coords: bool = False

    def __init__(self, spec: PatchSpec, device: Any) -> None:
        if not isinstance(spec, PatchSpec):
            raise ConfigError(f"spec must be a PatchSpec, got {type(spec).__name__}")
        self.spec = spec
        self.device = device
        # which code path cuts, and why (e.g. the CPU fallback when numba is missing): the loader adds
        # these to its stats.reasons
        self.reasons: list[str] = []

    @abc.abstractmethod
    def cut(self, storage: Any, slot: Any, y: Any, x: Any, table: Any = None, dihedral: Any = None) -> Any: ...

    def start_cut(self, storage: Any, slot: Any, y: Any, x: Any, table: Any = None, dihedral: Any = None,
                  noise: Any = None, normalized: bool = False) -> PendingCut:
        """:meth:`cut` (same arguments; ``noise`` and ``normalized`` where the engine takes them), started
        so that the calling thread can go on while the engine's own threads cut; where an engine has none,
        the batch is cut before this returns. The storage and the slots read must stay untouched until
        :meth:`PendingCut.result` has returned."""
        options: dict[str, Any] = {"noise": noise} if noise is not None else {}
        if normalized:
            options["normalized"] = True
        return PendingCut(self.cut(storage, slot, y, x, table, dihedral, **options))

    def ring_cutter(self, storage: Any, normalized: bool = False) -> Any:
        """A loader-internal fast path to :meth:`start_cut` for batches cut from one ring ``storage``
        (the torch engine's fused CPU kernel: :class:`~hsgds.engines.torch_engine.RingCutter`), or None
        where the engine has none and the loader calls :meth:`start_cut`."""
        return None

    def normalizes_tiles(self, store_dtype: Any) -> bool:
        """Whether this engine can normalize tiles of ``store_dtype`` once, as they land in the ring
        (:meth:`normalize_tile`), and then cut them with ``cut(..., normalized=True)``."""
        return False

    def normalize_tile(self, storage: Any, slot: int, table: int = 0, offset: Any = None, scale: Any = None) -> None:
        """Rewrite slot ``slot``'s tile (of table ``table``) in place as the output's values; only where
        :meth:`normalizes_tiles`. ``offset`` / ``scale`` (B,): the table's normalization when
        :meth:`set_table_rows` has not given it yet."""
        raise ConfigError(f"the {self.name} engine does not normalize tiles in the ring")

    def set_table_rows(self, tables: Any, offset: Any, scale: Any) -> None:
        """Fill the normalization of tables (scenes) ``tables`` known only now: ``offset`` / ``scale`` are
        (len(tables), B). Engines that take ``spec.tables`` implement it; the loader calls it on the
        consuming thread before the first cut that reads those tables."""
        raise ConfigError(f"the {self.name} engine has no per-scene tables to update")

    def close(self) -> None:
        """Release pipelines / buffers. Idempotent."""
