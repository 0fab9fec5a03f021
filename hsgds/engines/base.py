"""The patch-engine interface: resident tiles + sample coordinates -> a normalized patch batch."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

import numpy as np

LAYOUTS = ("NCHW", "NHWC")


@dataclass(frozen=True)
class PatchSpec:
    """What every batch looks like. ``offset``/``scale`` are per band: out = (x - offset) * scale,
    computed in float32 then cast to ``out_dtype`` (a torch dtype)."""

    patch_size: int
    halo: int
    bands: int
    tile_side: int
    layout: str
    out_dtype: Any
    offset: np.ndarray
    scale: np.ndarray

    @property
    def radius(self) -> int:
        return self.patch_size // 2


class PatchEngine(abc.ABC):
    """Cuts patches from the ring's storage.

    ``storage`` is the ring's contiguous tensor of shape (slots, S, S, B) in the store's dtype, on the
    engine's device. ``slot``, ``y``, ``x`` are int64 tensors (N,) on the same device: the slot holding
    each sample's tile and the sample's centre in that tile's padded coordinates (core + halo), so the
    patch is storage[slot, y-r:y+r+1, x-r:x+r+1, :]. Returns (N, B, p, p) for NCHW or (N, p, p, B) for
    NHWC, contiguous, ``spec.out_dtype``, on the storage's device.
    """

    name: str = "engine"

    def __init__(self, spec: PatchSpec, device: Any) -> None:
        self.spec = spec
        self.device = device

    @abc.abstractmethod
    def cut(self, storage: Any, slot: Any, y: Any, x: Any) -> Any: ...

    def close(self) -> None:
        """Release pipelines / buffers. Idempotent."""
