"""The patch-engine interface: resident tiles + sample coordinates -> a normalized patch batch."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

import numpy as np

LAYOUTS = ("NCHW", "NHWC")


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


@dataclass(frozen=True)
class PatchSpec:
    """What every batch looks like. ``offset``/``scale`` are per band: out = (x - offset) * scale,
    computed in float32 then cast to ``out_dtype`` (a torch dtype). With ``tables`` (several scenes, or a
    band selection) the per-scene :class:`SceneTables` give the geometry, bands and normalization of each
    sample's table instead, ``bands`` is the output band count and ``offset``/``scale`` are unused."""

    patch_size: int
    halo: int
    bands: int
    tile_side: int
    layout: str
    out_dtype: Any
    offset: np.ndarray
    scale: np.ndarray
    tables: SceneTables | None = None

    @property
    def radius(self) -> int:
        return self.patch_size // 2


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

    def __init__(self, spec: PatchSpec, device: Any) -> None:
        self.spec = spec
        self.device = device

    @abc.abstractmethod
    def cut(self, storage: Any, slot: Any, y: Any, x: Any, table: Any = None, dihedral: Any = None) -> Any: ...

    def close(self) -> None:
        """Release pipelines / buffers. Idempotent."""
